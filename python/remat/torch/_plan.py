"""Plan a captured graph in the torch-sac model (through the Rust extension), and the one call that
captures, plans and applies."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from .. import _remat
from ._apply import Applied, Plan, apply
from ._capture import ExampleInputs, LossFn, RegionSpec, capture


def _budget(budget: int | str) -> str:
    if isinstance(budget, bool) or not isinstance(budget, int | str):
        raise TypeError(
            f"budget must be bytes (int) or a string such as '8GiB', '0.5x' or 'min', "
            f"got {type(budget).__name__}"
        )
    return str(budget)


def plan(graph: dict[str, Any] | str, budget: int | str) -> Plan:
    """Plans a captured graph under `budget`: bytes, a size ("8GiB", "800MB"), a fraction of the
    unplanned peak ("0.5x") or "min". A budget below the least reachable peak answers with the
    least-peak plan, `status` "infeasible" and `min_peak_bytes`."""
    text = graph if isinstance(graph, str) else json.dumps(graph)
    try:
        return json.loads(_remat.plan(text, _budget(budget)))
    except ValueError as e:
        raise ValueError(f"remat plan: {e}") from None


def baseline(graph: dict[str, Any] | str, name: str) -> Plan:
    """A fixed policy as a plan, for comparison: "none" (nothing wrapped) or "full" (every region
    checkpointed, nothing kept: what `checkpoint every block` does)."""
    text = graph if isinstance(graph, str) else json.dumps(graph)
    try:
        return json.loads(_remat.baseline(text, name))
    except ValueError as e:
        raise ValueError(f"remat baseline: {e}") from None


def sweep(
    graph: dict[str, Any] | str,
    fractions: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """The plans at `fractions` of the unplanned peak (None: `remat sweep`'s defaults, 1.0 down
    to 0.2 in steps of 0.1), as `remat sweep` gives them: per budget
    `budget_bytes`, `status` ("optimal" where the plan's lower bound closes the gap,
    "feasible", or "infeasible" below the least reachable peak), `overhead`, `gap` with
    `bound_source` (what it is against: "chain_program", "pinned_chain_program" or
    "unplanned_step"), and
    `baselines`: `[name, overhead or None]` for "none" (PyTorch's own step) and "full" (every
    region checkpointed), None where its peak is over the budget. The overhead never rises with
    the budget: a plan found at a smaller budget is kept where it is cheaper
    (`reused_from_budget_bytes`)."""
    text = graph if isinstance(graph, str) else json.dumps(graph)
    if isinstance(fractions, (str, bytes)) or (
        fractions is not None
        and not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in fractions)
    ):
        raise ValueError(
            f"remat sweep: fractions must be a list of numbers (fractions of the unplanned "
            f"peak, e.g. [0.5, 0.7]), got {fractions!r}"
        )
    values = None if fractions is None else [float(f) for f in fractions]
    try:
        return json.loads(_remat.sweep(text, values))
    except ValueError as e:
        raise ValueError(f"remat sweep: {e}") from None


def simulate(graph: dict[str, Any] | str, plan: Plan | str | None = None) -> dict[str, Any]:
    """The simulator's figures of `plan` on `graph` (of the unplanned step without a plan)."""
    text = graph if isinstance(graph, str) else json.dumps(graph)
    p = None if plan is None else (plan if isinstance(plan, str) else json.dumps(plan))
    return json.loads(_remat.simulate(text, p))


def checkpoint(
    model: nn.Module,
    example_inputs: ExampleInputs,
    budget: int | str,
    loss_fn: LossFn | None = None,
    *,
    regions: RegionSpec = None,
    cost: str = "flops",
    timing_rounds: int = 3,
    wrap_rounds: int = 5,
    accumulate: bool = False,
) -> Applied:
    """Captures one step, plans it under `budget` and applies the plan; returns the handle
    (`.plan` is the plan it applied, `.remove()` undoes it). A budget below the least peak a
    plan reaches applies the least-peak plan (`status` "infeasible") and warns. `accumulate`:
    plan the micro-batches of a gradient accumulation after the first (`capture`)."""
    graph = capture(
        model,
        example_inputs,
        loss_fn,
        regions=regions,
        cost=cost,
        timing_rounds=timing_rounds,
        wrap_rounds=wrap_rounds,
        accumulate=accumulate,
    )
    p = plan(graph, budget)
    if p.get("status") == "infeasible":
        warnings.warn(
            f"budget {budget!r} is below the least peak a plan of this model reaches "
            f"({p.get('min_peak_bytes')} bytes): the least-peak plan is applied, and its peak "
            f"({p.get('predicted', {}).get('peak_bytes')} bytes) is over the budget",
            stacklevel=2,
        )
    return apply(model, p, example_inputs)
