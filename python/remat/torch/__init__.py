"""remat for PyTorch: capture a training step, plan it under a byte budget, apply the plan with
PyTorch's own checkpointing (non-reentrant `torch.utils.checkpoint` with a selective policy per
region), and measure it in PyTorch.

    import remat.torch
    handle = remat.torch.checkpoint(model, (x,), budget="8GiB")
    print(handle.plan["predicted"])
"""

from ._apply import Applied, apply, load_plan
from ._capture import capture, default_loss, find_regions
from ._errors import (
    AppliedError,
    CaptureError,
    MeasureError,
    OpMismatchError,
    PlanMismatchError,
    RematTorchError,
)
from ._measure import measure
from ._plan import baseline, checkpoint, plan, simulate, sweep
from ._service import ServiceError, attach

__all__ = [
    "Applied",
    "AppliedError",
    "CaptureError",
    "MeasureError",
    "OpMismatchError",
    "PlanMismatchError",
    "RematTorchError",
    "ServiceError",
    "apply",
    "attach",
    "baseline",
    "capture",
    "checkpoint",
    "default_loss",
    "find_regions",
    "load_plan",
    "measure",
    "plan",
    "simulate",
    "sweep",
]
