"""Prove a plan in PyTorch itself: peak memory by PyTorch's own accounting, step time, and every
parameter gradient against the unplanned run on the same weights, inputs and seed."""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from ._apply import Plan, apply, load_plan
from ._capture import (
    ExampleInputs,
    Inputs,
    LossFn,
    ParamsWritten,
    _tensors,
    as_inputs,
    call,
    check_loss,
    default_loss,
    drop_grads,
    first_difference,
    held_grads,
    host_copies,
    leaves_the_model_as_it_was,
    model_device,
    own_leaves,
    put_back,
    refuse_compiled,
)
from ._errors import MeasureError

_T = TypeVar("_T")


class _StorageMeter(TorchDispatchMode):
    """Live bytes of a step on CPU, storage by storage: the parameters', buffers' and inputs'
    storages from the start, every storage an op allocates (views allocate none) from that op
    until it is freed; the peak is taken after each op. It holds no tensor and hooks no module,
    so the step it watches is the one the user runs. MemTracker counts the same way but hooks
    every module's inputs and outputs for their gradients, which changes how autograd sums the
    gradient of a module input that several of its ops read (NewGELUActivation's) and keeps a
    branch the loss leaves alone (a pooler's) alive: its peak is of another backward (docs/torch.md,
    "Measure"). It also hooks every parameter's gradient, which a parameter without one refuses
    (a frozen embedding, the base weights under LoRA)."""

    def __init__(self, external: Iterable[torch.Tensor]) -> None:
        super().__init__()
        # storage -> its size as counted, in a cell its finalizer shares: a storage resized in
        # place (`resize_`, an op's `out=` tensor grown to fit) is counted at its new size from
        # the op that resized it, and freed at the size it had then.
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.live = 0
        for t in external:
            self._add(t)
        self.peak = self.live

    def _add(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        cell = self.seen.get(st)
        if cell is not None:
            self.live += st.nbytes() - cell[0]
            cell[0] = st.nbytes()
            return
        cell = [st.nbytes()]
        self.seen[st] = cell
        self.live += cell[0]
        weakref.finalize(st, self._freed, cell)

    def _freed(self, cell: list[int]) -> None:
        self.live -= cell[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        # An in-place op returns what it wrote to; an op may also write an argument it does
        # not return (`out=` variants with several outputs return them all, `_foreach_` ops
        # none): the arguments a mutable schema writes are looked at too.
        written = _tensors(out)
        if func._schema.is_mutable:
            written += _written(func._schema, args, kwargs or {})
        for t in written:
            self._add(t)
        self.peak = max(self.peak, self.live)
        return out


def _written(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among an op's arguments that its schema marks as written (`Tensor(a!)`)."""
    out: list[torch.Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out += _tensors(value)
    return out


def peak_meter(model: nn.Module, device: torch.device) -> str:
    """What `measure` takes the peak with: `cuda` (the allocator's peak) or `storages`
    (`_StorageMeter`, on the CPU)."""
    return "cuda" if device.type == "cuda" else "storages"


def memtracker_runs(model: nn.Module, device: torch.device) -> bool:
    """Whether PyTorch's MemTracker can measure the step too (on the CPU, as a second opinion):
    it is there and every parameter takes a gradient."""
    if device.type == "cuda":
        return False
    try:
        from torch.distributed._tools.mem_tracker import MemTracker  # noqa: F401
    except ImportError:
        return False
    return all(p.requires_grad for p in model.parameters())


def _peak_step(
    model: nn.Module,
    inputs: ExampleInputs | Inputs,
    loss_fn: LossFn,
    seed: int,
    device: torch.device,
    meter: str | None = None,
    accumulate: bool = False,
) -> tuple[int, float, dict[str, torch.Tensor]]:
    """One step with its peak, by `meter` (default: what `peak_meter` names): `cuda`,
    torch.cuda.max_memory_allocated reset before the step; `storages`; `MemTracker`. With
    `accumulate`, the step begins with a zero gradient held for each parameter, as a
    micro-batch after the first of a gradient accumulation does (the gradients it returns are
    then the step's own, as without)."""
    inputs = as_inputs(inputs)
    drop_grads(model, inputs)
    held = held_grads(model) if accumulate else {}
    for p, g in held.items():
        p.grad = g
    torch.manual_seed(seed)
    meter = meter or peak_meter(model, device)
    tracker: Any = contextlib.nullcontext()
    if meter == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    elif meter == "MemTracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(model, *_tensors(inputs))
    else:
        tracker = _StorageMeter(
            [*model.parameters(), *model.buffers(), *_tensors(inputs), *held.values()]
        )
    with _tensor_hooks_kept(model), tracker:
        loss = loss_fn(call(model, inputs))
        check_loss(loss, MeasureError)
        loss.backward()
    if meter == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    elif meter == "MemTracker":
        snap = tracker.get_tracker_snapshot("peak")
        peak = max((d.get("Total", 0) for d in snap.values()), default=0)
    else:
        peak = tracker.peak
    value = float(loss.detach())
    del loss
    # On the host: a copy left on the device would count in the next step's CUDA peak (the
    # allocator's peak is the whole device's), the plan's step after the unplanned one's.
    grads = {
        n: _dense(p.grad.detach()).to("cpu", copy=True)
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    drop_grads(model, inputs)
    return int(peak), value, grads


@contextlib.contextmanager
def _tensor_hooks_kept(model: nn.Module) -> Iterator[None]:
    """Puts back the parameters' gradient hooks as they were, whatever the step left: MemTracker
    hooks each parameter's gradient after its module's forward and unhooks it in the backward,
    so a step that fails between the two (its hooks change the ops of some models: Mamba,
    DeBERTa) left hooks on the model, which changed every later step (a later `measure` found
    the least-peak plan 8 KiB over its budget)."""
    attrs = ("_backward_hooks", "_post_accumulate_grad_hooks")
    before = [
        (p, a, h, list(h) if h is not None else None)
        for p in model.parameters()
        for a in attrs
        if hasattr(p, a)
        for h in [getattr(p, a)]
    ]
    try:
        yield
    finally:
        for p, a, hooks, keys in before:
            now = getattr(p, a)
            if now is hooks and (hooks is None or list(hooks) == keys):
                continue
            if hooks is not None and keys is not None:
                for k in [k for k in hooks if k not in keys]:
                    del hooks[k]
            # Through the tensor's setter, which rewires autograd's hooks to this dict.
            setattr(p, a, hooks)


def _timed_step(
    model: nn.Module,
    inputs: ExampleInputs | Inputs,
    loss_fn: LossFn,
    seed: int,
    device: torch.device,
) -> float:
    inputs = as_inputs(inputs)
    drop_grads(model, inputs)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    loss = loss_fn(call(model, inputs))
    check_loss(loss, MeasureError)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    del loss
    drop_grads(model, inputs)
    return dt


class _OpTimer(TorchDispatchMode):
    """Times every aten op a step runs (the kernel and the dispatcher below this mode; the modes
    above it, such as checkpointing's own, and the Python between ops are not in it)."""

    def __init__(self, cuda: bool) -> None:
        super().__init__()
        self.cuda = cuda
        self.ops: list[Any] = []
        self.seconds: list[float] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds.append(time.perf_counter() - t0)
        self.ops.append(func)
        return out


def _op_timed_step(
    model: nn.Module,
    inputs: ExampleInputs | Inputs,
    loss_fn: LossFn,
    seed: int,
    device: torch.device,
) -> tuple[list[Any], list[float]]:
    """One step with each of its ops timed: the ops in the order they ran, and their seconds."""
    timer = _OpTimer(device.type == "cuda")
    with timer:
        _timed_step(model, inputs, loss_fn, seed, device)
    return timer.ops, timer.seconds


class _LeastOps:
    """Each op of a step at its least time over the rounds it was timed in; the rounds must run
    the same ops in the same order (the same step, the same seed)."""

    def __init__(self, which: str) -> None:
        self.which = which
        self.ops: list[Any] | None = None
        self.seconds: list[float] = []

    def add(self, ops: list[Any], seconds: list[float]) -> None:
        if self.ops is None:
            self.ops, self.seconds = ops, seconds
            return
        if ops != self.ops:
            k = first_difference(self.ops, ops)
            raise MeasureError(
                f"the {self.which} step ran other ops in another round (op {k}: "
                f"{self.ops[k] if k < len(self.ops) else '(end)'} then "
                f"{ops[k] if k < len(ops) else '(end)'}); its ops cannot be timed against "
                "each other"
            )
        self.seconds = [min(a, b) for a, b in zip(self.seconds, seconds, strict=True)]

    def total(self) -> float:
        return sum(self.seconds)


def alternating(
    model: nn.Module, plan: Plan, inputs: Inputs, pairs: int, step: Callable[[], _T]
) -> dict[str, list[_T]]:
    """`pairs` pairs of `step` without (`base`) and with `plan` applied (`plan`), after a
    warm-up pair; the order within a pair alternates too (the first step of a pair may find
    caches and the allocator in another state)."""
    out: dict[str, list[_T]] = {"base": [], "plan": []}
    for i in range(pairs + 1 if pairs else 0):
        for which in ("base", "plan") if i % 2 == 0 else ("plan", "base"):
            if which == "plan":
                with apply(model, plan, inputs):
                    result = step()
            else:
                result = step()
            if i > 0:
                out[which].append(result)
    return out


SPREAD_FACTOR = 8.0
"""How many times the unplanned step's own difference from itself a parameter's gradient may
differ from it by, where that is above the tolerance (nondeterministic kernels)."""


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A sparse gradient (an `nn.Embedding(sparse=True)`'s) as a strided tensor, which the
    gradient check compares element by element."""
    return t if t.layout == torch.strided else t.to_dense()


def _short(t: torch.Tensor | None) -> str:
    if t is None:
        return "missing"
    return str(t.tolist()) if t.numel() <= 4 else f"a {list(t.shape)} tensor"


def _rel_errs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per tensor of `b` that `a` has too: max|a - b| / max|b| (the difference itself where `b`
    is all zeros)."""
    out = {}
    for n, ref in b.items():
        if n not in a:
            continue
        if not ref.numel():
            out[n] = 0.0
            continue
        # Complex as complex: `.double()` of a complex tensor keeps its real part alone, and a
        # gradient wrong only in its imaginary part passed.
        wide = torch.complex128 if ref.is_complex() or a[n].is_complex() else torch.float64
        scale = float(ref.to(wide).abs().max())
        diff = float((a[n].to(wide) - ref.to(wide)).abs().max())
        out[n] = diff / scale if scale > 0 else diff
    return out


# What a gradient (or a buffer) may differ from the unplanned step's by, relative to its largest
# element, by its dtype: a few units in the last place of float32 (8 x its epsilon, 1.2e-7),
# stricter in float64, looser in the half-precision types.
TOLERANCES = {
    torch.float64: 1e-12,
    torch.complex128: 1e-12,
    torch.float32: 1e-6,
    torch.complex64: 1e-6,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def tolerance_of(dtype: torch.dtype) -> float:
    """The tolerance of a tensor of `dtype` (`TOLERANCES`; another floating type: 8 times its
    epsilon, at least float32's)."""
    if dtype in TOLERANCES:
        return TOLERANCES[dtype]
    try:
        return max(TOLERANCES[torch.float32], 8 * torch.finfo(dtype).eps)
    except TypeError:  # not a floating type: exact
        return 0.0


@dataclass(frozen=True)
class GradCheck:
    """The planned step's gradients against the unplanned step's (`reference`), judged against
    what the unplanned step differs from itself by (`again`, the same step run once more)."""

    worst: float
    """The largest relative error of a parameter's gradient (`grad_max_rel_err`)."""
    spread: float
    """The largest relative difference between the two unplanned runs (`grad_reference_rel_err`):
    0 where the step's kernels are deterministic."""
    worst_param: str | None
    """The parameter nearest to failing (or failing worst): its error over what it is allowed;
    `None` when every gradient equals the reference's."""
    problems: list[str]


def grad_check(
    planned: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    again: dict[str, torch.Tensor],
    tolerance: float | Mapping[str, float],
) -> GradCheck:
    """Each parameter's gradient may differ from the reference's by `tolerance` (relative to the
    reference's largest element; one for all, or per parameter by name) or by `SPREAD_FACTOR`
    times what the reference differs from itself there, whichever is more. Where the unplanned
    step repeats itself exactly the check is the tolerance alone; under nondeterministic kernels
    (CUDA's atomic sums) a gradient that is rounding noise (a key projection's bias, which
    softmax cannot see) differs from run to run by as much as the reference's scale, and is
    judged by that, while every other parameter still has to agree to the rounding its own runs
    show."""
    problems = []
    missing = sorted(set(reference) ^ set(planned))
    if missing:
        problems.append(f"gradients of {', '.join(missing[:5])} differ in presence")
    errs = _rel_errs(planned, reference)
    spreads = _rel_errs(again, reference)
    tol = {n: tolerance.get(n, 0.0) if isinstance(tolerance, Mapping) else tolerance for n in errs}
    allowed = {n: max(tol[n], SPREAD_FACTOR * spreads.get(n, 0.0)) for n in errs}

    def share(n: str) -> float:
        """The parameter's error over what it is allowed (a NaN above every other)."""
        return errs[n] / allowed[n] if errs[n] == errs[n] else float("inf")

    over = sorted((n for n in errs if share(n) > 1.0), key=share, reverse=True)
    for n in over[:3]:
        spread = spreads.get(n, 0.0)
        problems.append(
            f"gradient of {n} differs from the unplanned run's: relative error {errs[n]:.3g} > "
            + (
                f"{allowed[n]:.3g} ({SPREAD_FACTOR:g}x the {spread:.3g} by which the unplanned "
                "run differs from itself there)"
                if allowed[n] > tol[n]
                else f"{tol[n]:g}"
            )
        )
    if len(over) > 3:
        problems.append(f"and {len(over) - 3} more parameters' gradients differ")
    return GradCheck(
        worst=max(errs.values(), key=lambda e: (e != e, e), default=0.0),  # NaN above all
        spread=max(spreads.values(), default=0.0),
        worst_param=max((n for n in errs if errs[n] != 0.0), key=share, default=None),
        problems=problems,
    )


@leaves_the_model_as_it_was
def measure(
    model: nn.Module,
    example_inputs: ExampleInputs,
    plan: Plan | str,
    loss_fn: LossFn | None = None,
    *,
    rounds: int = 5,
    op_rounds: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Runs training steps with and without `plan` and reports, under the field names of a plan's
    `validation`: measured and predicted peak, step times (medians of `rounds` alternating pairs),
    the gradient check, the measured and predicted overhead, and the overhead of the steps' ops at
    their least (`measured_step_overhead`: every aten op timed in `op_rounds` more alternating
    pairs, each at its least; default `rounds`, 0 leaves it out). The model is left as it was."""
    for arg, given, fewest in (("rounds", rounds, 1), ("op_rounds", op_rounds, 0)):
        if given is not None and (
            isinstance(given, bool) or not isinstance(given, int) or given < fewest
        ):
            raise MeasureError(f"{arg} must be a whole number >= {fewest}, got {given!r}")
    op_rounds = rounds if op_rounds is None else op_rounds
    plan = load_plan(plan)
    refuse_compiled(model, MeasureError)
    inputs = own_leaves(as_inputs(example_inputs))
    loss_fn = loss_fn or default_loss
    device = model_device(model, inputs)
    buffers = host_copies(model)

    # The parameters the first step writes in place (`nn.Embedding(max_norm=...)`), as found.
    params = ParamsWritten(model)

    def restore_buffers() -> None:
        put_back(model, buffers, MeasureError)
        params.put_back()

    # A plan of a micro-batch after the first of an accumulation: its steps begin with the
    # gradients held (`capture(accumulate=True)`).
    acc = bool((plan.get("signature") or {}).get("accumulate"))
    # Whatever fails, the model's buffers and parameters are put back as they were found.
    try:
        with params:
            base_peak, base_loss, base_grads = _peak_step(
                model, inputs, loss_fn, seed, device, accumulate=acc
            )
        base_buffers = host_copies(model)
        restore_buffers()
        # The unplanned step once more: what it differs from itself by (nothing where its kernels
        # are deterministic, as on the CPU) is the gradient check's noise floor.
        _, _, again_grads = _peak_step(model, inputs, loss_fn, seed, device, accumulate=acc)
        restore_buffers()
        with apply(model, plan, inputs):
            peak, value, grads = _peak_step(model, inputs, loss_fn, seed, device, accumulate=acc)
            plan_buffers = host_copies(model)
            restore_buffers()
            # PyTorch's MemTracker on the planned step, a second opinion from another meter; its
            # hooks change the step it measures, so it is reported, not judged.
            memtracker_peak = None
            if memtracker_runs(model, device):
                try:
                    memtracker_peak, _, _ = _peak_step(
                        model, inputs, loss_fn, seed, device, "MemTracker", accumulate=acc
                    )
                except Exception as e:  # noqa: BLE001 - a second opinion that cannot run is none
                    # Its hooks can change the ops a region runs (a parametrized weight is computed
                    # in the module's pre-hook: `weight_norm`), which the plan's policy refuses.
                    warnings.warn(
                        f"remat.torch.measure: PyTorch's MemTracker could not measure the planned "
                        f"step ({type(e).__name__}: {e}); memtracker_peak_bytes is null",
                        stacklevel=2,
                    )
                restore_buffers()

        least = {"base": _LeastOps("unplanned"), "plan": _LeastOps("planned")}
        times = alternating(
            model, plan, inputs, rounds, lambda: _timed_step(model, inputs, loss_fn, seed, device)
        )
        t_base, t_plan = times["base"], times["plan"]
        ratios = [p / b - 1.0 for p, b in zip(t_plan, t_base, strict=True)]
        # The same alternation with every op timed, apart from the pairs above so that the
        # timer's own work is in none of their step times.
        op_times = alternating(
            model,
            plan,
            inputs,
            op_rounds,
            lambda: _op_timed_step(model, inputs, loss_fn, seed, device),
        )
        for which, timed_steps in op_times.items():
            for timed in timed_steps:
                least[which].add(*timed)
    finally:
        restore_buffers()

    def inexact(t: torch.Tensor) -> bool:
        return t.is_floating_point() or t.is_complex()

    buf_errs = _rel_errs(
        {k: v for k, v in plan_buffers.items() if inexact(v)},
        {k: v for k, v in base_buffers.items() if inexact(v)},
    )
    buf_err = max(buf_errs.values(), default=0.0)
    predicted = plan["predicted"]
    budget = plan.get("budget_bytes")
    # Each gradient by its own dtype (a float64 model's to float64's, a float16 head's to its
    # own), where one tolerance for the whole model was float32's only if every parameter was
    # float32, else 1e-3 for every parameter.
    tolerances = {n: tolerance_of(g.dtype) for n, g in base_grads.items()}
    tolerance = max(tolerances.values(), default=TOLERANCES[torch.float32])
    check = grad_check(grads, base_grads, again_grads, tolerances)
    problems = list(check.problems)
    # The forward runs the same ops with and without the plan, so the buffers it updates
    # (BatchNorm's running statistics, counters) end the same; a region's re-run that updated
    # them again would not.
    over = [
        (name, err)
        for name, err in buf_errs.items()
        if err > tolerance_of(base_buffers[name].dtype)
    ]
    for name, err in sorted(over, key=lambda kv: -kv[1])[:1]:
        problems.append(
            f"buffer {name} differs from the unplanned run's by {err:.3g} (relative): "
            "a re-run updated it again"
        )
    for name, ref in base_buffers.items():
        got = plan_buffers.get(name)
        if not inexact(ref) and (got is None or not torch.equal(got, ref)):
            problems.append(
                f"buffer {name} is {_short(got)} after the planned step, "
                f"{_short(ref)} after the unplanned one: a re-run updated it again"
            )
            break
    if budget is not None and plan.get("status") == "fits" and peak > budget:
        problems.append(f"measured peak {peak} bytes is above the budget {budget}")
    peak_rel = peak / predicted["peak_bytes"] - 1.0 if predicted["peak_bytes"] else 0.0
    if abs(peak_rel) > 0.02:
        problems.append(f"measured peak differs from the predicted one by {peak_rel:+.2%}")
    return {
        "ran": True,
        "device": f"torch-{device.type}",
        "ok": not problems,
        "problems": problems,
        "predicted_peak_bytes": predicted["peak_bytes"],
        "measured_peak_bytes": peak,
        "peak_rel_diff": peak_rel,
        "unplanned_measured_peak_bytes": base_peak,
        "unplanned_predicted_peak_bytes": plan.get("unplanned_peak_bytes"),
        "budget_bytes": budget,
        "fingerprint": plan.get("fingerprint"),
        "grad_max_rel_err": check.worst,
        "grad_tolerance": tolerance,
        "grad_reference_rel_err": check.spread,
        "grad_worst_param": check.worst_param,
        "params_checked": len(base_grads),
        "buffers_max_rel_err": buf_err,
        "loss": value,
        "store_all_loss": base_loss,
        "step_seconds": statistics.median(t_plan),
        "store_all_step_seconds": statistics.median(t_base),
        "measured_overhead": statistics.median(ratios),
        "measured_overhead_range": [min(ratios), max(ratios)],
        "timing_rounds": rounds,
        **(
            {
                "measured_step_overhead": least["plan"].total() / least["base"].total() - 1.0,
                "op_rounds": op_rounds,
                "ops_run": len(least["plan"].seconds),
                "store_all_ops_run": len(least["base"].seconds),
            }
            if op_rounds and least["base"].total() > 0
            else {}
        ),
        "predicted_overhead": predicted["overhead"],
        "peak_meter": peak_meter(model, device),
        "memtracker_peak_bytes": memtracker_peak,
        "torch": torch.__version__,
    }
