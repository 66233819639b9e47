"""Apply: wrap each planned region with non-reentrant `torch.utils.checkpoint` and a
selective-checkpoint policy keyed by (region, aten op, occurrence)."""

from __future__ import annotations

import functools
import json
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from ._capture import (
    AUTOCAST_CACHE,
    PARAMETRIZE_CACHE,
    ExampleInputs,
    Inputs,
    _tensors,
    as_inputs,
    autocast_caches,
    fingerprint,
    parametrize_cached,
    refuse_compiled,
    rerun_buffers,
    signature,
)
from ._errors import AppliedError, OpMismatchError, PlanMismatchError

Plan = dict[str, Any]


def load_plan(plan: Plan | str) -> Plan:
    if isinstance(plan, str):
        text = plan
        try:
            plan = json.loads(text)
        except json.JSONDecodeError as e:
            hint = (
                " (a file's path? pass json.load(open(path)) or its text)"
                if text.strip().endswith(".json")
                else ""
            )
            raise PlanMismatchError(
                f"the plan text is not JSON{hint}: {e}; pass the plan's dict or its JSON text"
            ) from None
    if not isinstance(plan, dict) or plan.get("format") != "remat.torch-plan":
        raise PlanMismatchError("not a remat.torch-plan document (its 'format' field differs)")
    if plan.get("version") != PLAN_VERSION:
        raise PlanMismatchError(
            f"the plan's version is {plan.get('version')!r}; this remat applies version "
            f"{PLAN_VERSION} (plan the model again with this remat)"
        )
    if plan.get("execution_model") != "torch-sac":
        raise PlanMismatchError(
            f"the plan's execution_model is {plan.get('execution_model')!r}, not 'torch-sac': "
            "apply runs PyTorch's checkpoint with a policy per region"
        )
    _check_regions(plan.get("regions"))
    return plan


PLAN_VERSION = 1


def _check_regions(regions: Any) -> None:
    """Refuses a plan whose `regions` `apply` cannot read as written (an edited or truncated
    document), naming the region and the field: every region has a string `fqn`, a whole
    `call` (0 when absent), a boolean `wrapped`, a list of op names `ops` and a list of
    `[op, occurrence]` pairs `keep`, each an op the region runs at least that many times."""
    if not isinstance(regions, list):
        raise PlanMismatchError("the plan's 'regions' is not a list")
    seen: set[tuple[str, int]] = set()
    for i, r in enumerate(regions):
        where = f"regions[{i}]"
        if not isinstance(r, dict):
            raise PlanMismatchError(f"{where} is not an object")
        if not isinstance(r.get("fqn"), str):
            raise PlanMismatchError(f"{where}: 'fqn' is missing or not a string")
        where = f"{where} ({r['fqn']})"
        call = r.get("call", 0)
        if isinstance(call, bool) or not isinstance(call, int) or call < 0:
            raise PlanMismatchError(f"{where}: 'call' {call!r} is not a whole number >= 0")
        if (r["fqn"], call) in seen:
            raise PlanMismatchError(f"{where}: a second entry for call {call} of this region")
        seen.add((r["fqn"], call))
        if not isinstance(r.get("wrapped"), bool):
            raise PlanMismatchError(f"{where}: 'wrapped' is missing or not true/false")
        if r["wrapped"] and r.get("writes_input"):
            raise PlanMismatchError(
                f"{where}: the plan wraps a region that writes an input or a buffer in place "
                f"({r['writes_input']}): a re-run would write it a second time (an edited plan; "
                "remat never wraps such a region)"
            )
        ops = r.get("ops")
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise PlanMismatchError(f"{where}: 'ops' is missing or not a list of op names")
        keep = r.get("keep")
        if not isinstance(keep, list):
            raise PlanMismatchError(f"{where}: 'keep' is missing or not a list")
        for k in keep:
            ok = (
                isinstance(k, list)
                and len(k) == 2
                and isinstance(k[0], str)
                and isinstance(k[1], int)
                and not isinstance(k[1], bool)
                and 0 <= k[1] < ops.count(k[0])
            )
            if not ok:
                raise PlanMismatchError(
                    f"{where}: 'keep' entry {k!r} is not [op, occurrence] of an op the region "
                    "runs that many times"
                )
            if _in_place(k[0]):
                # SAC caches a kept op's output and refuses it at backward once mutated.
                raise PlanMismatchError(
                    f"{where}: 'keep' entry {k!r} is an in-place op, whose output is its input "
                    "written over: selective checkpointing cannot keep it (an edited plan; "
                    "remat never keeps one)"
                )


# A slot the module did not hold when a re-run began (`apply` puts the module's own back).
_ABSENT: Any = object()


def _in_place(op: str) -> bool:
    """Whether an aten op's name (`aten.add_.Tensor`) is its in-place variant."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1].endswith("_") and not parts[1].endswith("__")


def check_fingerprint(model: nn.Module, inputs: Inputs | None, plan: Plan) -> None:
    """Refuses a plan made for another model, other shapes or other regions, naming what differs."""
    want = plan.get("signature") or {}
    regions = want.get("regions", [])
    have_params = [
        [n, list(p.shape), str(p.dtype).removeprefix("torch.")] for n, p in model.named_parameters()
    ]
    diffs = _diff("parameter", want.get("parameters", []), have_params)
    modules = dict(model.named_modules())
    diffs += [f"region {r!r} is not a module of this model" for r in regions if r not in modules]
    diffs += [
        f"the plan's region {r['fqn']!r} is not one of the regions it was captured with"
        for r in plan.get("regions", [])
        if r["fqn"] not in regions and r["fqn"] in modules  # not a module: named below
    ]
    if inputs is not None:
        sig = signature(model, inputs, regions)
        diffs += _diff(
            "input",
            [[str(i), *d] for i, d in enumerate(want.get("inputs", []))],
            [[str(i), *d] for i, d in enumerate(sig["inputs"])],
        )
        if not diffs and fingerprint(sig) != plan.get("fingerprint"):
            diffs.append("the buffers differ")
    if diffs:
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        raise PlanMismatchError(
            f"the plan was made for another model or other shapes ({plan.get('model')!r}): "
            + "; ".join(diffs[:5])
            + more
        )


def _diff(what: str, want: list[list[Any]], have: list[list[Any]]) -> list[str]:
    w = {str(x[0]): x[1:] for x in want}
    h = {str(x[0]): x[1:] for x in have}
    out = []
    for name, desc in w.items():
        if name not in h:
            out.append(f"{what} {name} is missing")
        elif h[name] != desc:
            out.append(f"{what} {name} is {_fmt(h[name])}, the plan's is {_fmt(desc)}")
    out += [f"{what} {name} is not in the plan" for name in h if name not in w]
    return out


def _fmt(desc: list[Any]) -> str:
    return f"{desc[0]} {desc[1]}" if len(desc) == 2 else str(desc)


class _Policy:
    """The SAC policy of one region: MUST_SAVE for the kept (op, occurrence), PREFER_RECOMPUTE
    otherwise; an op the capture did not see at that position is refused by name."""

    def __init__(
        self, module: nn.Module, fqn: str, ops: list[str], keep: set[tuple[str, int]]
    ) -> None:
        self.module = module
        self.fqn = fqn
        self.ops = ops
        self.keep = keep
        self.position = 0
        self.counter: dict[str, int] = defaultdict(int)

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        name = str(func)
        if getattr(ctx, "is_recompute", False):
            # Older torch asks again while recomputing: answer as in the forward.
            return self._decide(name, self.counter_re)
        if self.position >= len(self.ops) or self.ops[self.position] != name:
            expected = self.ops[self.position] if self.position < len(self.ops) else "(no more ops)"
            raise OpMismatchError(
                f"region {self.fqn!r} ran {name} as its op #{self.position}, where the captured "
                f"step ran {expected}: the forward differs from the capture (data-dependent "
                "control flow, such as mixture-of-experts routing or an attention mask with "
                "padding in one batch and none in the other; other shapes; another train/eval "
                "mode; or torch.autocast on in one and off in the other); capture again as the "
                "step runs"
            )
        self.position += 1
        return self._decide(name, self.counter)

    def ran_all(self) -> None:
        """After the forward: a forward that ended before the captured one did (the op check
        sees only the ops that run) ran other code than was planned."""
        if self.position < len(self.ops):
            raise OpMismatchError(
                f"region {self.fqn!r} ran {self.position} ops, where the captured step ran "
                f"{len(self.ops)} (the next was {self.ops[self.position]}): the forward differs "
                "from the capture (data-dependent control flow, other shapes, another train/"
                "eval mode); capture again as the step runs"
            )

    def _decide(self, name: str, counter: dict[str, int]) -> CheckpointPolicy:
        occ = counter[name]
        counter[name] += 1
        if (name, occ) in self.keep:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def contexts(self) -> tuple[Any, Any]:
        self.position = 0
        self.counter = defaultdict(int)
        self.counter_re: dict[str, int] = defaultdict(int)
        forward, recompute = create_selective_checkpoint_contexts(self)
        # Called as the forward starts: the re-run draws what it drew from Python's generators.
        return forward, _Rerun(
            self.module, self.fqn, recompute, _host_rng_state(), self._rerun_starts
        )

    def _rerun_starts(self) -> None:
        """Each re-run counts its ops from the start: a model called twice before one backward
        re-runs the second call's region, then the first's (older torch asks the policy in
        the re-run; a count carried over recomputed the first call's kept ops)."""
        self.counter_re = defaultdict(int)


class _Step:
    """Whether the forward of the model a plan was applied to is running (its depth)."""

    def __init__(self) -> None:
        self.depth = 0


class _Calls:
    """The policies of a wrapped module by call. A module run once per step has one, used by
    every call (as many steps as the caller likes); a module run more than once per step
    (ALBERT's shared layer group: a region, and a policy, per call) has one per call, taken in
    turn. The model's forward starts the count again, and within it a call past the captured
    ones is an error; called outside it (the module alone), the count starts again after the
    last call (the op-sequence check still holds every call to its captured ops)."""

    def __init__(self, fqn: str, policies: list[_Policy | None], step: _Step) -> None:
        self.fqn = fqn
        self.policies = policies
        self.step = step
        self.next = 0

    def take(self) -> _Policy | None:
        if len(self.policies) == 1:
            return self.policies[0]
        k = self.next
        if k >= len(self.policies) and not self.step.depth:
            k = 0
        elif k >= len(self.policies):
            raise OpMismatchError(
                f"region {self.fqn!r} ran a call #{k + 1} in one step, where the captured step "
                f"called it {len(self.policies)} times: the forward differs from the capture "
                "(data-dependent control flow or other shapes; or the model was not called "
                "through the module the plan was applied to, whose forward counts the calls "
                "of each step); capture again"
            )
        self.next = k + 1
        return self.policies[k]


class Applied:
    """What `apply` did; `remove()` restores the modules' own forward."""

    def __init__(self, plan: Plan, wrapped: dict[str, nn.Module], hooks: list[Any]) -> None:
        self.plan = plan
        self.wrapped = wrapped
        self.hooks = hooks

    def remove(self) -> None:
        for m in self.wrapped.values():
            if "forward" in m.__dict__:
                del m.forward
        for h in self.hooks:
            h.remove()
        self.wrapped = {}
        self.hooks = []

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply(
    model: nn.Module, plan: Plan | str, example_inputs: ExampleInputs | Inputs | None = None
) -> Applied:
    """Wraps every region the plan wraps with `torch.utils.checkpoint(use_reentrant=False)` and
    its selective-checkpoint policy. Refuses a plan made for another model (or, given
    `example_inputs`, other shapes). Returns a handle whose `remove()` undoes it."""
    plan = load_plan(plan)
    refuse_compiled(model, PlanMismatchError)
    inputs = None if example_inputs is None else as_inputs(example_inputs)
    check_fingerprint(model, inputs, plan)
    modules = dict(model.named_modules())
    # Each module's regions by call: one for a module run once per step, one per call for a
    # module run more than once (ALBERT's shared layer group).
    calls: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for region in plan["regions"]:
        calls[region["fqn"]][int(region.get("call", 0))] = region
    wrapped: dict[str, nn.Module] = {}
    counters: list[_Calls] = []
    step = _Step()
    # The regions the capture ran in eval mode (a frozen backbone's, a model captured in eval
    # mode): their plan is of that mode's ops.
    in_eval = set((plan.get("signature") or {}).get("eval_regions") or [])
    for fqn, by_call in calls.items():
        if not any(r["wrapped"] for r in by_call.values()):
            continue
        n = len(by_call)
        if sorted(by_call) != list(range(n)):
            raise PlanMismatchError(
                f"the plan's regions of module {fqn!r} are its calls {sorted(by_call)}, "
                f"not 0 to {n - 1}"
            )
        module = modules.get(fqn)
        if module is None or fqn == "":
            raise PlanMismatchError(
                f"the plan wraps region {fqn!r}, which is not a module of this model "
                "(an edited plan, or one made for another model)"
            )
        if "forward" in module.__dict__:
            raise PlanMismatchError(
                f"region {fqn!r} ({type(module).__name__}) is already wrapped "
                "(or has its own forward attribute): remove the earlier plan"
            )
        counter = _Calls(
            fqn,
            [
                _Policy(
                    module,
                    fqn if n == 1 else f"{fqn} (call {i + 1} of {n})",
                    list(r["ops"]),
                    {(op, occ) for op, occ in r["keep"]},
                )
                if r["wrapped"]
                else None
                for i, r in sorted(by_call.items())
            ],
            step,
        )
        if n > 1:
            counters.append(counter)
        original = module.forward

        def forward(
            *args: Any,
            _orig: Any = original,
            _calls: _Calls = counter,
            _training: bool = fqn not in in_eval,
            **kwargs: Any,
        ) -> Any:
            _policy = _calls.take()
            if (
                _policy is None
                or not torch.is_grad_enabled()
                # The plan is of the mode the capture ran the region in (training, as a rule):
                # a forward in the other mode with grad (saliency, adversarial examples in
                # eval mode) runs other ops, and runs unwrapped, with autograd keeping what it
                # keeps.
                or _orig.__self__.training != _training
                or (
                    not any(t.requires_grad for t in _tensors((args, kwargs)))
                    and not any(p.requires_grad for p in _orig.__self__.parameters())
                )
            ):
                return _orig(*args, **kwargs)
            if torch.compiler.is_compiling():
                raise AppliedError(
                    f"region {_calls.fqn!r} runs under torch.compile: a remat plan runs in "
                    "eager mode (torch.compile does not take the selective-checkpoint policy it "
                    "applies); train the model uncompiled"
                )
            devices = [t.device for t in _tensors((args, kwargs))]
            if devices and autocast_caches(devices[0]):
                raise OpMismatchError(f"region {_calls.fqn!r}: {AUTOCAST_CACHE}")
            if parametrize_cached(_orig.__self__):
                raise OpMismatchError(f"region {_calls.fqn!r}: {PARAMETRIZE_CACHE}")
            # The forward gets the caller's lists, tuples and dicts, so what it appends to them
            # (a mixture-of-experts block's auxiliary loss) reaches the caller, as without the
            # plan. Checkpointing, which keeps its arguments for the re-run, gets a copy taken
            # now (every container level, the tensors shared): the re-run must see what the
            # forward saw, and a list the caller keeps growing (DenseNet's features) would keep
            # what is added later alive until the region's backward.
            given_args, given_kwargs = tree_map(lambda x: x, (args, kwargs))
            # Checkpointing stashes an accelerator's generator state for the re-run only for
            # the devices of its positional tensors: a region given its tensors as keyword
            # arguments alone would re-run its dropouts with other masks on CUDA. A zero-size
            # tensor on each such device, passed positionally and dropped before the call,
            # makes it stash them.
            on = {t.device for t in _tensors(args) if t.device.type != "cpu"}
            anchors = [
                torch.empty(0, device=d)
                for d in sorted({t.device for t in _tensors(kwargs)} - on, key=str)
                if d.type != "cpu"
            ]
            n = len(args)
            callers = [(args, kwargs)]  # dropped by the first call: nothing else holds them
            del args, kwargs
            # The tensors the forward computes with: `torch.func.functional_call` (MAML's fast
            # weights) binds others for the call and puts these back before the backward
            # re-runs the region, which must compute with what the forward did.
            bound = [
                (slots, name, t)
                for m in _orig.__self__.modules()
                for slots in (m._parameters, m._buffers)
                for name, t in slots.items()
            ]

            def run(*a: Any, **k: Any) -> Any:
                if callers:
                    own_args, own_kwargs = callers.pop()
                    out = _orig(*own_args, **own_kwargs)
                    _policy.ran_all()
                    return out
                # The re-run: a copy of the copy, so that its own appends go nowhere.
                a, k = tree_map(lambda x: x, (a[:n], k))
                now = [(slots, name, slots.get(name, _ABSENT)) for slots, name, _ in bound]
                try:
                    for slots, name, t in bound:
                        slots[name] = t
                    return _orig(*a, **k)
                finally:
                    for slots, name, was in now:
                        if was is _ABSENT:  # not there when the re-run began
                            slots.pop(name, None)
                        else:
                            slots[name] = was

            return checkpoint(
                run,
                *given_args,
                *anchors,
                use_reentrant=False,
                preserve_rng_state=True,
                context_fn=_policy.contexts,
                **given_kwargs,
            )

        module.forward = functools.update_wrapper(_WrappedForward(forward, fqn), original)
        wrapped[fqn] = module
    hooks = []
    if counters:
        # The model's forward is a step: the calls are counted from its start, and strictly
        # while it runs.
        def begin(*_: Any) -> None:
            if not step.depth:
                for c in counters:
                    c.next = 0
            step.depth += 1

        def end(*_: Any) -> None:
            step.depth -= 1

        hooks.append(model.register_forward_pre_hook(begin))
        hooks.append(model.register_forward_hook(end, always_call=True))
    return Applied(plan, wrapped, hooks)


class _WrappedForward:
    """A wrapped region's forward, set on its module while a plan is applied. It runs the
    original module's forward, so a copy of the module (`copy.deepcopy`, an EMA or teacher model
    made after `apply`) would run the original's blocks, with the original's weights, its
    gradients landing in the original's parameters: copying or pickling it is refused, naming
    the region."""

    def __init__(self, fn: Any, fqn: str) -> None:
        self._fn = fn
        self._fqn = fqn
        # What `capture` looks for to refuse a model a plan is applied to.
        self.remat_region = fqn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def _refuse(self, what: str) -> AppliedError:
        return AppliedError(
            f"cannot {what} a model while a remat plan is applied to it (region {self._fqn!r} "
            "is wrapped, and its copy would run this model's region): copy it before applying "
            "the plan, or call remove() on the handle apply/checkpoint returned, copy, and "
            "apply again; torch.save(model.state_dict()) saves the weights either way"
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        raise self._refuse("copy")

    def __copy__(self) -> Any:
        raise self._refuse("copy")

    def __reduce__(self) -> Any:
        raise self._refuse("pickle")


class _Rerun:
    """The recompute context of a region. Checkpointing re-runs the region's forward during
    backward, which would update BatchNorm's running statistics a second time: the region's
    buffers that the re-run changed are put back as the first run left them once it ends
    (entered outside the SAC recompute mode, so the copies are not ops of the region). A re-run
    whose ops differ from the forward's (a cache mutated by the first run, data-dependent
    control flow) is reported naming the region and the op."""

    def __init__(
        self,
        module: nn.Module,
        fqn: str,
        inner: Any,
        rng: tuple[Any, Any],
        starts: Callable[[], None],
    ) -> None:
        self.module = module
        self.starts = starts
        self.fqn = fqn
        self.inner = inner
        self.saved: list[tuple[torch.Tensor, int, torch.Tensor]] = []
        self.forward_rng = rng
        self.backward_rng: tuple[Any, Any] = (None, None)

    def __enter__(self) -> Any:
        self.starts()
        with torch.no_grad():
            self.saved = [(b, b._version, b.clone()) for b in rerun_buffers(self.module)]
        # Python's and NumPy's generators as the forward began (torch's own are checkpoint's
        # preserve_rng_state), and put back as the backward had them after the re-run.
        self.backward_rng = _host_rng_state()
        _set_host_rng_state(self.forward_rng)
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            self.inner.__exit__(*exc)
            err = exc[1]
            if isinstance(err, RuntimeError) and "encountered during backward" in str(err):
                op = str(err).split(" encountered")[0]
                raise OpMismatchError(
                    f"region {self.fqn!r} ({type(self.module).__name__}) ran {op} when "
                    "checkpointing re-ran it in backward, which its forward did not run there: "
                    "the re-run differs from the forward (state the forward changed, such as a "
                    "key/value cache: pass use_cache=False to Hugging Face models; or "
                    "data-dependent control flow)"
                ) from err
            return False
        finally:
            _set_host_rng_state(self.backward_rng)
            # Only what the re-run changed (its version moved, or its values: BatchNorm's
            # kernel writes its statistics without moving their version): a buffer it only
            # read may be saved by a region that was not wrapped (a rotary module's cos and
            # sin, a mask, shared by every block; a looped block's frozen BatchNorm
            # statistics), and a write, even of the same values, moves its version, which
            # autograd then refuses in that region's backward ("modified by an inplace
            # operation").
            with torch.no_grad():
                for b, version, s in self.saved:
                    # torch.equal, not a NaN-aware comparison, which would allocate within
                    # the planned step (a NaN read as a change costs one copy).
                    if b._version != version or not torch.equal(b, s):
                        b.copy_(s)
            self.saved = []


def _host_rng_state() -> tuple[Any, Any]:
    """The states of Python's `random` and, where it is imported, NumPy's global generator."""
    np = sys.modules.get("numpy")
    return random.getstate(), (np.random.get_state() if np is not None else None)


def _set_host_rng_state(state: tuple[Any, Any]) -> None:
    py, npy = state
    if py is not None:
        random.setstate(py)
    np = sys.modules.get("numpy")
    if npy is not None and np is not None:
        np.random.set_state(npy)
