"""Capture: one training step, recorded as PyTorch's autograd and its checkpoint policy see it.

The step runs twice on the same weights, inputs and RNG seed:

* pass A, forward only, with saved-tensor hooks that keep nothing: when every storage would die if
  autograd held none of them (its *natural* death, set by the Python code's references alone);
* pass B, the ordinary step (forward, loss, backward): every aten op with its module path, region
  and occurrence, the storages it allocates (views and in-place results share their base: a
  storage is counted once, by the op that allocated it), when each storage really dies, which
  storages autograd saves and from which op, and when backward first unpacks a region's saved
  values (the point where non-reentrant checkpointing re-runs that region).

The result is the `remat.torch-graph` JSON document (docs/torch.md) that the solver's `torch-sac`
execution model reads. Nothing here computes a plan figure: the trace is data.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import time
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, ParamSpec, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map
from torch.utils.checkpoint import SAC_IGNORED_OPS
from torch.utils.weak import WeakIdKeyDictionary

from ._errors import CaptureError

FORMAT = "remat.torch-graph"
VERSION = 1

RegionSpec = Sequence[str] | Callable[[str, nn.Module], bool] | None
LossFn = Callable[[Any], torch.Tensor]


class Inputs(NamedTuple):
    """A step's inputs: the positional and keyword arguments of the model's forward."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


# A tensor, a sequence (positional arguments) or a mapping (keyword arguments: Hugging Face's
# `{"input_ids": ..., "attention_mask": ..., "labels": ...}`).
ExampleInputs = torch.Tensor | Sequence[Any] | Mapping[str, Any]


def as_inputs(example_inputs: ExampleInputs | Inputs) -> Inputs:
    if isinstance(example_inputs, Inputs):
        return example_inputs
    if isinstance(example_inputs, torch.Tensor):
        return Inputs((example_inputs,), {})
    if isinstance(example_inputs, Mapping):
        return Inputs((), dict(example_inputs))
    if isinstance(example_inputs, tuple | list):
        return Inputs(tuple(example_inputs), {})
    # A string or an array would be split into its elements, each passed as an argument.
    raise TypeError(
        "example_inputs must be a tensor, a tuple or list of the forward's positional "
        f"arguments, or a dict of its keyword arguments; got {type(example_inputs).__name__}"
    )


def own_leaves(inputs: Inputs) -> Inputs:
    """`inputs` with each tensor that requires grad replaced by a leaf of its own (the same
    data, detached): the steps capture and measure run backpropagate into the model and stop
    at its inputs, so an input's `.grad`, and the graph that computed an input outside the
    model (an encoder's, which a second backward could not go through), stay as they were."""
    own = map_tensors(
        lambda x: x.detach().requires_grad_() if x.requires_grad else x,
        (inputs.args, inputs.kwargs),
    )
    return Inputs(*own)


def held_grads(model: nn.Module) -> dict[torch.Tensor, torch.Tensor]:
    """A zero gradient for each parameter that takes one: what a micro-batch after the first
    of a gradient accumulation finds held (`capture(accumulate=True)`)."""
    with torch.no_grad():
        return {p: torch.zeros_like(p) for p in model.parameters() if p.requires_grad}


def drop_grads(model: nn.Module, inputs: Inputs) -> None:
    """Sets the gradients of the model's parameters and of the inputs that require grad (the
    leaves `own_leaves` made) to None: each step remat runs starts without them, as the
    first did, and its own die after it."""
    for t in [*model.parameters(), *_tensors(inputs)]:
        if t.requires_grad:
            t.grad = None


def refuse_applied(model: nn.Module, error: type[Exception]) -> None:
    """Raises `error` when a remat plan is applied to `model`: its wrapped regions would run
    their checkpoints inside the capture (or a second plan's), which is not the step as it is."""
    for fqn, m in model.named_modules():
        if hasattr(m.__dict__.get("forward"), "remat_region"):
            raise error(
                f"a remat plan is applied to this model (region {fqn!r} is wrapped): call "
                "remove() on the handle that apply or checkpoint returned first"
            )


def call(model: nn.Module, inputs: Inputs) -> Any:
    return model(*inputs.args, **inputs.kwargs)


def check_loss(loss: Any, error: type[Exception]) -> None:
    """Raises `error` naming `loss_fn` when its value cannot be backpropagated: not a
    one-element tensor, or one that does not require grad (nothing it depends on does)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise error(f"loss_fn must return a one-element tensor, got {shape}")
    if not loss.requires_grad:
        raise error(
            "loss_fn returned a tensor that does not require grad: nothing it depends on does "
            "(parameters frozen, grad disabled, or a loss computed from detached values)"
        )


def default_loss(output: Any) -> torch.Tensor:
    """The ONNX path's loss rule: the sum of the means of the floating-point outputs."""
    leaves = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not leaves:
        raise CaptureError(
            "the model's output has no floating-point tensor that requires grad; pass loss_fn"
        )
    if all(_softmax_output(t) for t in leaves):
        warnings.warn(
            "remat.torch: the default loss (the sum of the outputs' means) is constant for this "
            "model: its outputs are Softmax outputs, whose mean is the same whatever the "
            "parameters, so every gradient is zero and measure's gradient check compares zeros; "
            "pass loss_fn (the executor weights such outputs instead: docs/executor.md)",
            stacklevel=2,
        )
    total = leaves[0].mean()
    for t in leaves[1:]:
        total = total + t.mean()
    return total


# Autograd nodes of ops that only move or regroup their input's elements.
_MOVES = {
    "ViewBackward0",
    "UnsafeViewBackward0",
    "ReshapeAliasBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "SqueezeBackward0",
    "SqueezeBackward1",
    "UnsqueezeBackward0",
    "CloneBackward0",
}


def _softmax_output(t: torch.Tensor) -> bool:
    """Whether `t` is a Softmax's output, read directly or through moves: its mean is
    constant (every slice along the softmax's axis sums to 1)."""
    node = t.grad_fn
    for _ in range(64):
        if node is None:
            return False
        name = type(node).__name__
        if name.startswith("SoftmaxBackward"):
            return True
        if name not in _MOVES or not node.next_functions:
            return False
        node = node.next_functions[0][0]
    return False


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _tensors(x: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in `x`: its pytree's leaves, and the fields of the dataclass instances among
    them (a `Batch` dataclass of tensors, which pytree takes for a leaf), recursively."""
    out: list[torch.Tensor] = []
    for leaf in tree_flatten(x)[0]:
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif _is_dataclass_instance(leaf) and depth < _DEPTH:
            out += _tensors([getattr(leaf, f.name) for f in dataclasses.fields(leaf)], depth + 1)
    return out


def map_tensors(fn: Callable[[torch.Tensor], Any], x: Any, depth: int = 0) -> Any:
    """`x` with `fn` applied to each of `_tensors(x)`: its containers rebuilt (a dataclass
    instance copied, its fields set on the copy), the rest as it is."""

    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return fn(v)
        if not _is_dataclass_instance(v) or depth >= _DEPTH:
            return v
        fields = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
        mapped = {k: map_tensors(fn, w, depth + 1) for k, w in fields.items()}
        if all(mapped[k] is fields[k] for k in fields):
            return v
        new = copy.copy(v)
        for k, w in mapped.items():
            object.__setattr__(new, k, w)  # a frozen dataclass's too
        return new

    return tree_map(leaf, x)


# How deep `_tensors` looks into dataclasses within dataclasses.
_DEPTH = 16


def _is_dataclass_instance(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def find_regions(model: nn.Module, regions: RegionSpec = None) -> list[str]:
    """The modules a user would checkpoint.

    Default: the repeated blocks, i.e. the children of an `nn.ModuleList` / `nn.Sequential` /
    `nn.ModuleDict` that share one class with at least one sibling (GPT2Block, LlamaDecoderLayer,
    BasicBlock), and the children of any other module that share a class and hold no
    `nn.ModuleList` (Inception's blocks, held as attributes; not T5's encoder and decoder, which
    hold the blocks), outermost only. Without such blocks, plain `nn.Sequential`s of layers in
    a container (`nn.ModuleList(nn.Sequential(...) for _ in range(n))`). PyTorch's own layers
    without submodules (`nn.Linear`, `nn.BatchNorm2d`, `nn.ReLU`) are layers, not blocks:
    regions only in a model that has none of those (VGG's `features`). `regions` may name FQNs
    instead, or be a predicate on (fqn, module).
    """
    modules = dict(model.named_modules())
    if isinstance(regions, str):
        raise CaptureError(
            f"regions must be a list of module names or a predicate, got the string {regions!r} "
            f"(one region: regions=[{regions!r}])"
        )
    if regions is not None and not callable(regions):
        names = list(regions)
        for fqn in names:
            if fqn not in modules:
                raise CaptureError(f"region {fqn!r} is not a module of the model")
            if fqn == "":
                raise CaptureError("the whole model cannot be a region: name its blocks")
        chosen = names
    elif callable(regions):
        chosen = [fqn for fqn, m in modules.items() if fqn and regions(fqn, m)]
    else:
        # Blocks: repeated children of containers, and repeated children of any module that
        # hold no stack of layers themselves (Inception's blocks; not T5's encoder and decoder,
        # two T5Stacks each holding its blocks in a ModuleList). Layers only without blocks.
        blocks = _repeated_children(modules, containers_only=True, layers=False) + [
            fqn
            for fqn in _repeated_children(modules, containers_only=False, layers=False)
            if not any(isinstance(m, nn.ModuleList) for m in modules[fqn].modules())
        ]
        chosen = (
            list(dict.fromkeys(blocks))
            or _sequential_blocks(modules)
            or _repeated_children(modules, containers_only=True, layers=True)
        )
    # Outermost only: a region inside another region is dropped.
    chosen_set = set(chosen)
    out = []
    dropped = []
    for fqn in chosen:
        parts = fqn.split(".")
        outer = [".".join(parts[:i]) for i in range(1, len(parts))]
        if any(o in chosen_set for o in outer):
            dropped.append((fqn, next(o for o in outer if o in chosen_set)))
            continue
        out.append(fqn)
    if dropped and regions is not None:
        inner, outer_fqn = dropped[0]
        more = f" (and {len(dropped) - 1} more)" if len(dropped) > 1 else ""
        warnings.warn(
            f"region {inner!r} is inside region {outer_fqn!r}{more}: regions do not nest, "
            "the outer one is kept",
            stacklevel=3,
        )
    return out


_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _repeated_children(
    modules: dict[str, nn.Module], containers_only: bool, layers: bool
) -> list[str]:
    """The children (of containers, or of any module) that share a class with a sibling and
    are not containers; PyTorch's own layers without submodules only when `layers`."""
    chosen = []
    for fqn, m in modules.items():
        if containers_only and not isinstance(m, _CONTAINERS):
            continue
        kids = [
            (name, c)
            for name, c in m.named_children()
            if not isinstance(c, _CONTAINERS)
            and (
                layers or not (type(c).__module__.startswith("torch.nn.") and not any(c.children()))
            )
        ]
        by_class: dict[type, int] = defaultdict(int)
        for _, c in kids:
            by_class[type(c)] += 1
        chosen += [f"{fqn}.{name}" if fqn else name for name, c in kids if by_class[type(c)] >= 2]
    return chosen


def _sequential_blocks(modules: dict[str, nn.Module]) -> list[str]:
    """Blocks written as plain `nn.Sequential`s of layers in a container (`nn.ModuleList(
    nn.Sequential(nn.Linear(...), nn.GELU(), nn.Linear(...)) for _ in range(n))`): the
    children of a container that are exactly `nn.Sequential`, share that class with a sibling
    and hold no block themselves (a module with submodules that is not a container). For models
    without other blocks: a stage of blocks (ResNet's `layer1`) is never one."""

    def holds_block(m: nn.Module) -> bool:
        return any(
            any(d.children()) and not isinstance(d, _CONTAINERS) for d in m.modules() if d is not m
        )

    chosen = []
    for fqn, m in modules.items():
        if not isinstance(m, _CONTAINERS):
            continue
        kids = [
            (name, c)
            for name, c in m.named_children()
            if type(c) is nn.Sequential and not holds_block(c)
        ]
        if len(kids) >= 2:
            chosen += [f"{fqn}.{name}" if fqn else name for name, _ in kids]
    return chosen


def repeated_calls(model: nn.Module, calls: Mapping[str, int]) -> list[str]:
    """The blocks (modules with submodules, not containers) whose forward ran more than once in
    one step, outermost only: a block shared across depth, as ALBERT's layer group."""
    chosen = [
        fqn
        for fqn, m in model.named_modules()
        if fqn and calls.get(fqn, 0) > 1 and any(m.children()) and not isinstance(m, _CONTAINERS)
    ]
    chosen_set = set(chosen)
    return [
        fqn
        for fqn in chosen
        if not any(".".join(fqn.split(".")[:i]) in chosen_set for i in range(1, fqn.count(".") + 1))
    ]


def signature(model: nn.Module, inputs: Inputs, regions: Iterable[str]) -> dict:
    """What a plan is made for: parameter and buffer shapes, the inputs' shapes (positional, then
    keyword), the regions."""

    def desc(t: torch.Tensor) -> list[Any]:
        return [list(t.shape), str(t.dtype).removeprefix("torch.")]

    return {
        "parameters": [[n, *desc(p)] for n, p in model.named_parameters()],
        "buffers": [[n, *desc(b)] for n, b in model.named_buffers()],
        "inputs": [desc(t) for t in _tensors(inputs)],
        "regions": list(regions),
    }


def fingerprint(sig: dict) -> str:
    return hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:16]


def model_device(model: nn.Module, inputs: Inputs) -> torch.device:
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    devices |= {t.device for t in _tensors(inputs)}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise CaptureError(
            f"the model and its inputs are on more than one device ({names}); "
            "remat plans one device at a time"
        )
    return devices.pop() if devices else torch.device("cpu")


def refuse_lazy(model: nn.Module) -> None:
    """A lazy module (`nn.LazyLinear`) has no weights until its first call: the capture cannot
    size what it has not made (PyTorch's own error named no module)."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
            raise CaptureError(
                f"{name!r} is not initialized yet (a lazy module, such as nn.LazyLinear, makes "
                "its weights at its first call): run the model once on the example inputs "
                "before capturing it"
            )


def refuse_compiled(model: nn.Module, error: type[Exception]) -> None:
    """Refuses a `torch.compile`d model: plans run in eager mode (PyTorch's compiler takes
    selective-checkpoint policies of another form, and fails inside its own code)."""
    if hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
        raise error(
            "the model is compiled with torch.compile: remat.torch captures, applies and "
            "measures plans in eager mode (torch.compile does not take the selective-checkpoint "
            "policy a plan applies); use the module it wraps, model._orig_mod, uncompiled"
        )
    for fqn, m in model.named_modules():
        if fqn and hasattr(m, "_orig_mod") and type(m).__name__ == "OptimizedModule":
            raise error(
                f"module {fqn!r} is a torch.compile wrapper (OptimizedModule) of a "
                f"{type(m._orig_mod).__name__}: remat.torch wraps a region's forward in eager "
                "mode, which the wrapper's compiled frame would not call; compile the module "
                "in place instead (module.compile(), whose compiled code runs remat's "
                "checkpointing as it is) or put the uncompiled module back"
            )


PARAMETRIZE_CACHE = (
    "torch.nn.utils.parametrize.cached() is on: the forward computes each parametrized weight "
    "once and reuses it, and a region re-run by checkpointing, outside the context, computes "
    "it again (other ops than its forward ran); run capture, measure and the training steps "
    "without it"
)


def parametrize_cached(module: nn.Module) -> bool:
    """Whether `torch.nn.utils.parametrize.cached()` is on while `module` holds a
    parametrized weight."""
    from torch.nn.utils import parametrize

    return bool(getattr(parametrize, "_cache_enabled", 0)) and any(
        parametrize.is_parametrized(m) for m in module.modules()
    )


def autocast_caches(device: torch.device) -> bool:
    """Whether `torch.autocast` is on for `device` with its cast cache (`cache_enabled`, on
    by default): the first forward casts the weights, the next one, and a region's re-run,
    reuse the casts, so the op sequences differ."""
    try:
        on = torch.is_autocast_enabled(device.type)
    except TypeError:  # torch < 2.4: no device argument
        on = (
            torch.is_autocast_cpu_enabled() if device.type == "cpu" else torch.is_autocast_enabled()
        )
    return bool(on) and torch.is_autocast_cache_enabled()


AUTOCAST_CACHE = (
    "torch.autocast is on with its cast cache (cache_enabled=True, the default): its first "
    "forward casts the weights, later ones reuse the casts, so a region re-run by checkpointing "
    "runs other ops than its forward did; use torch.autocast(..., cache_enabled=False) around "
    "capture, measure and every training step (the plan is made for the autocast it was "
    "captured under)"
)


def _is_kv_cache(x: Any) -> bool:
    """A Hugging Face key/value cache (`DynamicCache`, `EncoderDecoderCache`): what a
    decoder's blocks append to."""
    return hasattr(x, "update") and hasattr(x, "get_seq_length") and not isinstance(x, dict)


@dataclass
class _Storage:
    bytes: int
    producer: int
    free_after: int | None = None
    natural_free_after: int | None = None
    saves: list[dict[str, int | None]] = field(default_factory=list)
    mutated: bool = False


@dataclass
class _Op:
    op: str
    phase: str
    module: str
    region: int | None
    occurrence: int | None
    cost: float
    outputs: list[int]
    random: bool = False
    transient: int = 0


class _Saved:
    """What the capture's pack hook returns for a saved tensor."""

    __slots__ = ("tensor", "regions", "version", "saved_by", "__weakref__")

    def __init__(
        self, tensor: torch.Tensor, regions: tuple[int, ...], saved_by: tuple[str, str]
    ) -> None:
        self.tensor = tensor
        self.regions = regions
        # Autograd checks a saved value's version when it unpacks it, unless saved-tensor
        # hooks hold it, as the capture's do: the capture checks it instead.
        self.version = tensor._version
        self.saved_by = saved_by


class _Tracer(TorchDispatchMode):
    """Records every aten op, the storages it allocates and when they die."""

    def __init__(self, rec: _Recording, cost: str) -> None:
        super().__init__()
        self.rec = rec
        self.cost = cost

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.rec.phase == "forward" and _top_saved_tensors_hooks is not None:
            top = _top_saved_tensors_hooks(False)
            if top is None or top[0] != self.rec.pack:
                module = self.rec.module_stack[-1] if self.rec.module_stack else "(top level)"
                raise CaptureError(
                    f"{func} in module {module!r} ran under saved-tensor hooks of the model's "
                    "own: it checkpoints or offloads activations itself (torch.utils.checkpoint, "
                    "torch.autograd.graph.save_on_cpu), so what autograd saves is hidden from "
                    "the capture; turn that off and let remat plan the checkpointing"
                )
        timed = self.cost == "measured" and not self.rec.forward_only
        # On CUDA, what the kernel allocates for itself and frees before it returns (cuDNN's
        # convolution workspaces, the attention kernels'): the allocator's peak during the op
        # above what it holds after it, on the model's device. No op outputs it, and it counts
        # in a measured peak. (This resets the device's peak statistics at every op.)
        # One synchronization before and one after serve the timer and the peak alike.
        watch = self.rec.cuda and not self.rec.forward_only
        dev = self.rec.device
        if watch:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter() if timed else 0.0
        out = func(*args, **kwargs)
        if watch:
            torch.cuda.synchronize(dev)
        seconds = time.perf_counter() - t0 if timed else 0.0
        transient = 0
        if watch:
            top = torch.cuda.max_memory_allocated(dev)
            transient = max(0, top - torch.cuda.memory_allocated(dev))
        self.rec.on_op(func, args, kwargs, out, seconds, self.cost, transient)
        return out


class _Recording:
    def __init__(
        self, model: nn.Module, region_fqns: list[str], device: torch.device, forward_only: bool
    ) -> None:
        self.model = model
        self.region_fqns = region_fqns
        self.region_index = {f: i for i, f in enumerate(region_fqns)}
        # The regions are calls: (index in region_fqns, call number) of each call of a region's
        # module, in the order they began (a module run several times per step, as ALBERT's
        # shared layer, is a region per call); the dictionaries below are keyed by call.
        self.calls: list[tuple[int, int]] = []
        # How many times each module's forward ran in the forward pass.
        self.module_calls: dict[str, int] = defaultdict(int)
        self.cuda = device.type == "cuda"
        self.device = device
        self.forward_only = forward_only
        self.ops: list[_Op] = []
        self.storages: list[_Storage] = []
        # storage -> its index, or -1 for a storage that existed before the step
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.phase = "forward"
        self.module_stack: list[str] = []
        self.region_stack: list[int] = []
        self.region_calls: dict[int, int] = defaultdict(int)  # by index in region_fqns
        self.region_first: dict[int, int] = {}
        self.region_last: dict[int, int] = {}
        self.region_counter: dict[int, dict[str, int]] = {}
        self.region_inputs: dict[int, set[int]] = defaultdict(set)
        # storage -> the regions it was passed to (parameters and the model's inputs included)
        self.input_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # region -> why it is never wrapped: the first in-place op of its forward that wrote
        # one of its inputs, or a value it read written after its read, ...
        self.region_writes: dict[int, str] = {}
        # The model's buffers (storage -> True): a region that writes one of another module
        # in place is never wrapped.
        self.buffers: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # Per storage a region call read and did not make (a buffer, an input, a tensor held
        # by a module or a closure): the first op of each such call that read it; per storage
        # the last op of the forward that wrote it in place (its index and name). A re-run
        # reads what the storage holds at the backward: a write after the region's first read
        # (spectral norm's power iteration reads `u`, then updates it; `x += block(x)` after
        # the block), or a read after a write since then (a buffer updated by one op and read
        # after it: `mean.lerp_(...)`, a step counter's `add_`) gives the re-run another value.
        self.first_reads: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.last_write: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # Per region call: the first op of its forward whose output's shape depends on the
        # data (`nonzero`: mixture-of-experts routing), for the capture's warning.
        self.data_shaped: dict[int, str] = {}
        # Per region call: the storages of its module's own buffers (a re-run puts those back,
        # `remat.torch.apply`'s `_Rerun`), and every buffer slot of the model as the call began
        # (module, name, tensor): a forward that writes another module's buffer in place (a
        # BatchNorm held outside the block and called in it) or binds a new tensor to any
        # buffer (`self.steps = self.steps + 1`) would do it again when re-run, where nothing
        # puts it back.
        self.region_own: dict[int, set[int]] = {}
        self.region_slots: dict[int, list[tuple[nn.Module, str, torch.Tensor | None]]] = {}
        self.module_names = {id(m): n for n, m in model.named_modules()}
        self.region_stop: dict[int, int] = {}
        self.region_trigger: dict[int, int] = {}
        self.fixed_bytes = 0
        self.forward_end = 0
        # The first module whose forward ran during the backward pass (checkpointing's re-run)
        self.rerun_in_backward: str | None = None
        # A saved value written in place after it was saved (the op that saved it, its
        # module, and the versions): what PyTorch's own step refuses at its backward.
        self.modified_saved: tuple[str, str, int, int] | None = None
        # Values of region calls a custom autograd.Function keeps on its ctx: (the Function,
        # the attribute, the op that made the value, its module, the region call).
        self.ctx_held: list[tuple[str, str, str, str, int]] = []

    # -- storages -------------------------------------------------------------------------
    def register_external(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            st = _storage(t)
            if st is not None and st not in self.known:
                self.known[st] = -1
                self.fixed_bytes += st.nbytes()

    def register_buffers(self, tensors: Iterable[torch.Tensor]) -> None:
        for t in tensors:
            st = _storage(t)
            if st is not None:
                self.buffers[st] = True

    def _died(self, index: int) -> None:
        s = self.storages[index]
        last = len(self.ops) - 1
        if self.phase == "forward" or self.forward_only:
            s.natural_free_after = last
        if s.free_after is None:
            s.free_after = last

    def index_of(self, t: torch.Tensor) -> int | None:
        st = _storage(t)
        if st is None:
            return None
        i = self.known.get(st)
        return None if i is None or i < 0 else i

    # -- ops ------------------------------------------------------------------------------
    def on_op(
        self,
        func: Any,
        args: Any,
        kwargs: Any,
        out: Any,
        seconds: float,
        cost_kind: str,
        transient: int = 0,
    ) -> None:
        index = len(self.ops)
        region = self.region_stack[-1] if self.region_stack and self.phase == "forward" else None
        occurrence = None
        name = str(func)
        if region is not None and func not in SAC_IGNORED_OPS:
            counter = self.region_counter[region]
            occurrence = counter[name]
            counter[name] += 1
        outputs: list[int] = []
        mutable = bool(getattr(func, "_schema", None) is not None and func._schema.is_mutable)
        for t in _tensors(out):
            st = _storage(t)
            if st is None:
                continue
            known = self.known.get(st)
            if known is not None:
                if mutable and known >= 0:
                    self.storages[known].mutated = True
                continue
            sid = len(self.storages)
            self.storages.append(_Storage(bytes=st.nbytes(), producer=index))
            self.known[st] = sid
            weakref.finalize(st, self._died, sid)
            outputs.append(sid)
        written = _written(func, args, kwargs) if mutable else []
        if region is not None:
            self._read_after_write(region, index, func, args, kwargs, written)
            if getattr(func, "_overloadpacket", None) in _DATA_SHAPED:
                self.data_shaped.setdefault(region, name)
        if mutable:
            if self.phase == "forward":
                self._written_after_read(region, index, name, written)
            for a in written:
                i = self.index_of(a)
                if i is not None and i not in outputs:
                    self.storages[i].mutated = True
                st = _storage(a)
                if region is not None and st is not None and region in self.input_of.get(st, ()):
                    self.region_writes.setdefault(region, name)
                if (
                    region is not None
                    and st is not None
                    and st in self.buffers
                    and id(st) not in self.region_own.get(region, ())
                ):
                    self.region_writes.setdefault(
                        region, f"{name} on a buffer of a module outside the region"
                    )
        random = _draws_random(func, args, kwargs)
        if random and region is not None and kwargs.get("generator") is not None:
            # Checkpointing replays the default generators' state in the re-run, not one the
            # forward passes itself: the re-run would draw other numbers.
            self.region_writes.setdefault(region, f"{name} with its own torch.Generator")
        cost = seconds
        if cost_kind == "flops":
            cost = float(_flops(func, args, kwargs, out))
        self.ops.append(
            _Op(
                op=name,
                phase=self.phase,
                module=self.module_stack[-1] if self.module_stack else "",
                region=region,
                occurrence=occurrence,
                cost=cost,
                outputs=outputs,
                random=random,
                transient=transient,
            )
        )
        if region is not None:
            self.region_first.setdefault(region, index)
            self.region_last[region] = index

    def _made_in(self, st: Any, region: int) -> bool:
        """Whether an op of `region` (this call) made the storage `st`: its re-run makes it
        again."""
        i = self.known.get(st)
        if i is None or i < 0:
            return False
        producer = self.storages[i].producer
        # This op's own output (an `out=` it allocated) is not recorded yet: made here.
        return producer >= len(self.ops) or self.ops[producer].region == region

    def _read_after_write(
        self,
        region: int,
        index: int,
        func: Any,
        args: Any,
        kwargs: Any,
        written: list[torch.Tensor],
    ) -> None:
        """Records the first read, by `region`, of each storage it did not make, and marks the
        region `writes_input` when it reads one that was written in place since its first
        read of it (an update by one op, `lerp_` or `add_`, then a read: the re-run would
        start from the updated value). What an op overwrites whole (`copy_`, `fill_`,
        `zero_`) is not read by it."""
        overwritten = (
            {id(s) for a in written if (s := _storage(a)) is not None}
            if getattr(func, "_overloadpacket", None) in _OVERWRITES
            else set()
        )
        for t in _tensors((args, kwargs)):
            st = _storage(t)
            if st is None or id(st) in overwritten or self._made_in(st, region):
                continue
            reads = self.first_reads.get(st)
            if reads is None:
                reads = self.first_reads[st] = {}
            first = reads.setdefault(region, index)
            write = self.last_write.get(st)
            if write is not None and first <= write[0] < index:
                self.region_writes.setdefault(
                    region, f"{write[1]}, then a read of what it wrote (a re-run reads it again)"
                )

    def _written_after_read(
        self, region: int | None, index: int, name: str, written: list[torch.Tensor]
    ) -> None:
        """Marks `writes_input` every region call that read, before this op, a storage this op
        writes in place (in that region, another one or outside every region: `x += block(x)`
        writes the block's input after it; a buffer a block reads, advanced by the model's
        forward after it): a re-run of that region would read the written value."""
        for a in written:
            st = _storage(a)
            if st is None:
                continue
            self.last_write[st] = (index, name)
            for r, first in (self.first_reads.get(st) or {}).items():
                if first < index:
                    where = self.module_stack[-1] if self.module_stack else ""
                    self.region_writes.setdefault(
                        r,
                        f"{name} in {where or 'the model'} after the region read it "
                        "(a re-run would read the written value)",
                    )

    # -- saved tensors --------------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> Any:
        index = self.index_of(t)
        op = len(self.ops) - 1
        if self.phase == "forward" and self.region_stack:
            r = self.region_stack[-1]
            self.region_stop[r] = op
        save: dict[str, int | None] = {}
        if index is not None and self.phase == "forward":
            region = self.region_stack[-1] if self.region_stack else None
            save = {"after_op": op, "region": region, "released_after": None}
            self.storages[index].saves.append(save)
        if self.forward_only:
            return None  # keep nothing: pass A measures natural lifetimes
        # The holder keeps the values without their history: an op that saves its own output
        # (tanh, softmax, exp) would otherwise hold a reference cycle, output -> its node ->
        # holder -> output, which outlives its graph where the loss does not reach it (a
        # pooler's output the loss leaves alone: dropped by the caller, freed only by the
        # garbage collector) and the capture would count it held to the end of the step;
        # PyTorch's own saved outputs hold no such link, and autograd gives an unpacked value
        # its history back. The detach runs outside the capture's dispatch mode: it is no op
        # of the step.
        with _disable_current_modes():
            value = t.detach()
        saver = self.ops[op] if op >= 0 else None
        holder = _Saved(
            value,
            tuple(self.region_stack),
            (saver.op, saver.module) if saver is not None else ("(no op)", ""),
        )
        if save:
            # Autograd drops the holder when it frees the saved value (after its node ran).
            weakref.finalize(holder, self._released, save)
        return holder

    def _released(self, save: dict[str, int | None]) -> None:
        save["released_after"] = len(self.ops) - 1

    def unpack(self, holder: _Saved) -> torch.Tensor:
        if self.modified_saved is None and holder.tensor._version != holder.version:
            self.modified_saved = (*holder.saved_by, holder.version, holder.tensor._version)
        position = len(self.ops)
        for r in holder.regions:
            self.region_trigger.setdefault(r, position)
        return holder.tensor

    # -- what holds values past the saved-tensor hooks -------------------------------------
    def _made_by(self, t: torch.Tensor) -> tuple[str, str, int] | None:
        """The op and module that made `t` in the step's forward and its region call, where an
        op of a region call made it (not an in-place op: a tensor from before the step, such
        as a module's state, counts from the first op that wrote it)."""
        i = self.index_of(t)
        if i is None or self.storages[i].producer >= self.forward_end:
            return None
        op = self.ops[self.storages[i].producer]
        name = op.op.split(".")
        if op.region is None or (len(name) > 1 and name[1].endswith("_")):
            return None
        return op.op, op.module, op.region

    def region_name(self, r: int) -> str:
        m, k = self.calls[r]
        n = self.region_calls[m]
        return self.region_fqns[m] + (f" (call {k + 1} of {n})" if n > 1 else "")

    def find_ctx_held(self, loss: torch.Tensor) -> None:
        """The tensors a custom `autograd.Function` keeps as attributes of its ctx (`ctx.y = y`,
        which PyTorch allows) where an op of a region made them: no saved-tensor hook sees them,
        so checkpointing cannot drop them, and a re-run makes them again (`ctx_held`)."""
        from torch.autograd.function import BackwardCFunction

        # By id, the nodes kept: a node's Python object may be made on each access (torch
        # 2.5), and a dropped one's id given to the next.
        seen: dict[int, Any] = {}
        todo = [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            todo += [n for n, _ in node.next_functions]
            if not isinstance(node, BackwardCFunction):
                continue
            for attr, value in vars(node).items():
                for t in _tensors(value):
                    made = self._made_by(t)
                    if made is not None:
                        fn = getattr(getattr(node, "_forward_cls", None), "__name__", None)
                        self.ctx_held.append((fn or type(node).__name__, attr, *made))

    def module_held(self) -> list[tuple[str, str, str, str, int]]:
        """The tensors of region calls that the model's modules keep as attributes after the
        step (`self.last_attn = att.detach()`): (module, attribute, op, op's module, region).
        A re-run stores its own value there, which outlives the step too."""
        held = []
        for fqn, m in self.model.named_modules():
            for attr, value in vars(m).items():
                if attr.startswith("_") or isinstance(value, nn.Module):
                    continue
                for t in _tensors(value):
                    made = self._made_by(t)
                    if made is not None:
                        held.append((fqn, attr, *made))
                        break
        return held

    # -- modules --------------------------------------------------------------------------
    def hooks(self) -> list[Any]:
        handles: list[Any] = []
        for fqn, m in self.model.named_modules():
            handles.append(m.register_forward_pre_hook(self._pre(fqn), with_kwargs=True))
            handles.append(m.register_forward_hook(self._post(fqn), always_call=True))
            if fqn in self.region_index:
                handles.append(_RegionForward(self, fqn, m))
        return handles

    def _pre(self, fqn: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if self.phase == "backward" and self.rerun_in_backward is None:
                self.rerun_in_backward = fqn
            if self.phase != "forward":
                return
            self.module_stack.append(fqn)
            self.module_calls[fqn] += 1

        return hook

    def _post(self, fqn: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.phase != "forward":
                return
            if self.module_stack and self.module_stack[-1] == fqn:
                self.module_stack.pop()

        return hook

    def enter_region(self, fqn: str, module: nn.Module, args: Any, kwargs: Any) -> bool:
        """A region's forward begins (its own forward, as `apply` wraps it: the module's hooks,
        and the views PyTorch's backward hooks put around its arguments and outputs, run
        outside it). False when it is no region call of the captured forward."""
        m = self.region_index.get(fqn)
        if m is None or self.phase != "forward":
            return False
        cache = next((x for x in tree_leaves((args, kwargs)) if _is_kv_cache(x)), None)
        if cache is not None:
            raise CaptureError(
                f"region {fqn!r} ({type(module).__name__}) is given a key/value cache "
                f"({type(cache).__name__}): checkpointing re-runs the region in the "
                "backward, which would append to the cache again; train without one: "
                "use_cache=False in the inputs, or model.config.use_cache = False (as "
                "Hugging Face's own gradient checkpointing does)"
            )
        r = len(self.calls)
        self.calls.append((m, self.region_calls[m]))
        self.region_calls[m] += 1
        self.region_stack.append(r)
        self.region_counter[r] = defaultdict(int)
        self.region_own[r] = {id(st) for x in module.buffers() if (st := _storage(x)) is not None}
        self.region_slots[r] = [
            (owner, slot, t) for owner in self.model.modules() for slot, t in owner._buffers.items()
        ]
        for t in _tensors((args, kwargs)):
            i = self.index_of(t)
            if i is not None:
                self.region_inputs[r].add(i)
            st = _storage(t)
            if st is not None:
                self.input_of[st] = self.input_of.get(st, frozenset()) | {r}
        return True

    def leave_region(self, fqn: str) -> None:
        m = self.region_index.get(fqn)
        if m is not None and self.region_stack and self.calls[self.region_stack[-1]][0] == m:
            r = self.region_stack.pop()
            for owner, slot, t in self.region_slots.pop(r, []):
                if owner._buffers.get(slot) is not t:
                    where = ".".join(x for x in (self.module_names.get(id(owner)), slot) if x)
                    self.region_writes.setdefault(r, f"a new tensor bound to buffer {where!r}")


class _RegionForward:
    """Marks a region's calls where `apply` wraps them: around the module's `forward` (its own
    attribute for the capture, put back by `remove`), inside its hooks."""

    def __init__(self, rec: _Recording, fqn: str, module: nn.Module) -> None:
        self.module = module
        self.own = module.__dict__.get("forward")
        inner = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not rec.enter_region(fqn, module, args, kwargs):
                return inner(*args, **kwargs)
            try:
                return inner(*args, **kwargs)
            finally:
                rec.leave_region(fqn)

        module.forward = functools.update_wrapper(forward, inner)  # type: ignore[method-assign]

    def remove(self) -> None:
        if self.own is None:
            del self.module.forward
        else:
            self.module.forward = self.own  # type: ignore[method-assign]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def leaves_the_model_as_it_was(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn(model, example_inputs, ...)` with the global random generators ([`own_rng`]) and the
    model's parameter gradients put back as they were after it, whether it returns or raises:
    what it runs seeds the generators and computes gradients, and a user's training around it
    (dropout masks, shuffles, gradients accumulated over steps) must not change because of it."""

    @functools.wraps(fn)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        model = args[0] if args else kwargs.get("model")
        example = args[1] if len(args) > 1 else kwargs.get("example_inputs")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        try:
            device = model_device(model, as_inputs(example))  # type: ignore[arg-type]
        except Exception:
            return fn(*args, **kwargs)
        grads = {p: p.grad for p in model.parameters()}
        try:
            with own_rng(device):
                return fn(*args, **kwargs)
        finally:
            for p, g in grads.items():
                p.grad = g

    return wrapped


@contextlib.contextmanager
def own_rng(device: torch.device) -> Iterator[None]:
    """Runs the block with the global random generators (the CPU's, and `device`'s on CUDA) put
    back as they were after it: the steps remat runs seed them, and a user's later dropout masks
    and shuffles must not depend on a capture or a measurement having run."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def _stop_op(stop: int | None, first: int) -> int | None:
    return None if stop is None or stop < first else stop


# Which saved-tensor hooks are innermost, where torch tells (2.15 does, 2.5 does not: no check).
_top_saved_tensors_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def _draws_random(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether the op draws from a random generator: aten tags it `nondeterministic_seeded`,
    unless its dropout probability is 0 or it runs in eval mode (`native_dropout(x, 0.1,
    train=False)`, an attention kernel with `dropout_p` 0). Such an op is never kept: a kept
    op is not run again in the re-run, so a random op after it would draw other numbers."""
    tags = getattr(func, "tags", ())
    if torch.Tag.nondeterministic_seeded not in tags:
        return False
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    for i, arg in enumerate(schema.arguments):
        if arg.name not in ("p", "dropout_p", "train"):
            continue
        if arg.name == "p" and "dropout" not in schema.name:
            continue
        value = kwargs.get(arg.name, args[i] if i < len(args) else arg.default_value)
        if arg.name == "train" and value is False:
            return False
        if arg.name != "train" and isinstance(value, (int, float)) and value == 0:
            return False
    return True


# Ops whose output's shape depends on the values of their input: a region that runs one (the
# experts loop of a mixture of experts selects each expert's tokens with `nonzero`) may run
# other ops on another batch.
_DATA_SHAPED = {
    torch.ops.aten.nonzero,
    torch.ops.aten.masked_select,
    torch.ops.aten._unique2,
    torch.ops.aten.unique_consecutive,
    torch.ops.aten.unique_dim,
}

# Ops that overwrite the whole of what they write: they do not read it.
_OVERWRITES = {torch.ops.aten.copy_, torch.ops.aten.fill_, torch.ops.aten.zero_}


def _written(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments an op writes in place (`add_`'s self, an `out=`)."""
    written: list[torch.Tensor] = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        written.extend(_tensors(value))
    return written


def _flops(func: Any, args: Any, kwargs: Any, out: Any) -> int:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func._overloadpacket) if hasattr(func, "_overloadpacket") else None
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that cannot read these arguments counts nothing
        return 0


def _run(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: LossFn,
    rec: _Recording,
    cost: str,
    seed: int,
    held: Mapping[torch.Tensor, torch.Tensor],
) -> torch.Tensor | None:
    # A micro-batch after the first of an accumulation: the gradients are there before the
    # step, and its own are added into them.
    for p, g in held.items():
        p.grad = g.zero_()
    torch.manual_seed(seed)
    hooks = rec.hooks()
    loss = None
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(
                rec.pack, rec.unpack if not rec.forward_only else (lambda x: x)
            ),
            _Tracer(rec, cost),
        ):
            out = call(model, inputs)
            loss = loss_fn(out)
            check_loss(loss, CaptureError)
            del out
            if rec.forward_only:
                rec.forward_end = len(rec.ops)
                del loss
                return None
            rec.forward_end = len(rec.ops)
            rec.find_ctx_held(loss)
            rec.phase = "backward"
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return loss


@leaves_the_model_as_it_was
def capture(
    model: nn.Module,
    example_inputs: ExampleInputs,
    loss_fn: LossFn | None = None,
    *,
    regions: RegionSpec = None,
    cost: str = "flops",
    name: str | None = None,
    seed: int = 0,
    timing_rounds: int = 3,
    wrap_rounds: int = 5,
    accumulate: bool = False,
) -> dict:
    """Record one training step of `model` on `example_inputs` as a `remat.torch-graph` document.

    `example_inputs`: a tensor, a sequence of positional arguments or a mapping of keyword ones.

    `cost`: "flops" (torch.utils.flop_counter's formulas; ops without one cost 0) or "measured"
    (each op's time on the model's device: its least over `timing_rounds` recorded steps).
    With measured costs, what checkpointing's own work costs is priced too (`wrap_cost`: the
    unplanned step against full checkpointing, medians of `wrap_rounds` alternating pairs; 0
    leaves it out and only the re-run ops are priced). The model's gradients and buffers
    (BatchNorm's running statistics) are left as they were before the call.

    `accumulate`: the step of a micro-batch after the first of a gradient accumulation, which
    begins with every parameter's gradient held (and adds its own into them): the plan counts
    them from the step's start, and `measure` runs its steps so.
    """
    inputs = own_leaves(as_inputs(example_inputs))
    if cost not in ("flops", "measured"):
        raise CaptureError(f"cost must be 'flops' or 'measured', got {cost!r}")
    for arg, given, fewest in (
        ("timing_rounds", timing_rounds, 1),
        ("wrap_rounds", wrap_rounds, 0),
    ):
        if isinstance(given, bool) or not isinstance(given, int) or given < fewest:
            raise CaptureError(f"{arg} must be a whole number >= {fewest}, got {given!r}")
    loss_fn = loss_fn or default_loss
    refuse_compiled(model, CaptureError)
    refuse_applied(model, CaptureError)
    refuse_lazy(model)
    device = model_device(model, inputs)
    if autocast_caches(device):
        raise CaptureError(AUTOCAST_CACHE)
    if parametrize_cached(model):
        raise CaptureError(PARAMETRIZE_CACHE)
    hf = [
        n for n, m in model.named_modules() if getattr(m, "gradient_checkpointing", False) is True
    ]
    if hf:
        # transformers 5 renamed the call; the attribute on the modules is the same.
        off = (
            "activation_checkpointing_disable"
            if hasattr(model, "activation_checkpointing_disable")
            else "gradient_checkpointing_disable"
        )
        raise CaptureError(
            f"module {hf[0] or '(top level)'!r} has Hugging Face's gradient checkpointing on, "
            f"which hides what autograd saves from the capture: call model.{off}() "
            "and let remat plan the checkpointing"
        )
    region_fqns = find_regions(model, regions)
    # The captured steps run in training mode: BatchNorm's running statistics (and any other
    # buffer a step updates) go back to what they were, as the gradients do (the decorator
    # `leaves_the_model_as_it_was` puts those back).
    saved_buffers = host_copies(model)
    params = ParamsWritten(model)
    drop_grads(model, inputs)
    if not isinstance(accumulate, bool):
        raise CaptureError(f"accumulate must be True or False, got {accumulate!r}")
    held = held_grads(model) if accumulate else {}
    externals = [*model.parameters(), *model.buffers(), *_tensors(inputs), *held.values()]
    try:
        # Pass A: natural lifetimes (autograd keeps nothing). The first step: a parameter
        # its forward writes in place (`nn.Embedding(max_norm=...)`) is copied as it was.
        a = _Recording(model, region_fqns, device, forward_only=True)
        a.register_external(externals)
        with params:
            _run(model, inputs, loss_fn, a, cost, seed, held)
        idle = _idle_regions(a)
        if idle and regions is not None and not callable(regions):
            fqn, why = next(iter(idle.items()))
            raise CaptureError(
                f"region {fqn!r} {why}: it cannot be checkpointed; name modules the step runs"
            )
        if idle:
            # A block the forward skips (a stack run to its k-th layer, layerdrop) or that
            # returns its input as it is: nothing to checkpoint there, and the others are.
            unused = [f for f, why in idle.items() if why.startswith("was not called")]
            empty = [f for f in idle if f not in unused]
            said = [
                f"{_names(unused)} {'was' if len(unused) == 1 else 'were'} not called in the "
                "captured step"
                if unused
                else "",
                f"{_names(empty)} ran no op" if empty else "",
            ]
            warnings.warn(
                f"remat.torch: region{'s' if len(idle) > 1 else ''} "
                + " and ".join(x for x in said if x)
                + ": left out of the plan (a step that runs them runs them unwrapped)",
                stacklevel=3,
            )
            region_fqns = [f for f in region_fqns if f not in idle]
        if not region_fqns and regions is None:
            # No repeated blocks: the blocks that run more than once instead (ALBERT's one
            # shared layer group), each call a region.
            region_fqns = repeated_calls(model, a.module_calls)
            if not region_fqns:
                warnings.warn(
                    f"no repeated blocks found in {type(model).__name__}: nothing to checkpoint, "
                    "the plan can only run the step as it is; name the modules to checkpoint "
                    "(regions=[fqn, ...] or a predicate)",
                    # The caller of `capture` (past `leaves_the_model_as_it_was`'s wrapper).
                    stacklevel=3,
                )
        # Pass B: the ordinary step; with measured costs, again until each op has been timed
        # `timing_rounds` times, keeping its least time (a kernel's first call may pay for its
        # setup, a page fault or a busy machine slows a single run).
        b = _pass_b(model, inputs, loss_fn, region_fqns, device, externals, cost, seed, held)
        _warn_held(b)
        if cost == "measured":
            for _ in range(timing_rounds - 1):
                again = _pass_b(
                    model, inputs, loss_fn, region_fqns, device, externals, cost, seed, held
                )
                _least_times(b, again)
        sig = signature(model, inputs, region_fqns)
        if _forward_difference(a, b) is not None:
            # A module that sets itself up on its first call (torchvision's MultiScaleRoIAlign
            # infers its scales then) runs other ops in pass A, the model's first step, than
            # in every later one: pass A again, as the steps the plan will run are.
            put_back(model, saved_buffers)
            a = _Recording(model, region_fqns, device, forward_only=True)
            a.register_external(externals)
            _run(model, inputs, loss_fn, a, cost, seed, held)
        doc = _document(a, b, sig, device, cost, name or type(model).__name__)
        # Not in the fingerprint: a plan is applied to the model in any mode, and wraps a
        # region's forward when it runs in the mode it was captured in.
        modules = dict(model.named_modules())
        doc["signature"]["eval_regions"] = [f for f in region_fqns if not modules[f].training]
        if accumulate:
            doc["signature"]["accumulate"] = True
        if not model.training:
            warnings.warn(
                f"{type(model).__name__} is in eval mode (as from_pretrained returns it): the "
                "plan is of an eval-mode step (dropout off, BatchNorm on its running "
                "statistics) and checkpoints forwards in eval mode only; call model.train() "
                "before the capture to plan training steps",
                stacklevel=3,
            )
        if b.data_shaped:
            r, op = next(iter(b.data_shaped.items()))
            fqn = region_fqns[b.calls[r][0]]
            warnings.warn(
                f"{len(b.data_shaped)} region call(s) run an op whose output's shape depends on "
                f"the data (the first, {fqn!r}, runs {op}; a mixture of experts' routing): a "
                "batch that makes them run other ops than this one did is refused when the plan "
                "is applied (OpMismatchError); capture on a batch like those it trains on, or "
                "use an implementation without the data-dependent loop (transformers' "
                "grouped_mm experts)",
                stacklevel=3,
            )
        writing = [r for r in doc["regions"] if r.get("writes_input")]
        if writing and len(writing) == len(doc["regions"]):
            first = writing[0]
            warnings.warn(
                f"every region changes what its re-run would change again or see changed (an "
                f"input or a buffer written, a generator of its own: the first, "
                f"{first['fqn']!r}, runs {first['writes_input']}), so none can be checkpointed "
                "and the plan can only run the step as it is (docs/torch.md, 'writes_input'); "
                "name other modules (regions=[fqn, ...])",
                stacklevel=3,
            )
        if cost == "measured" and wrap_rounds:
            from ._wrapcost import price_wrapping  # it plans and applies: imported late

            doc["wrap_cost"] = price_wrapping(
                model, inputs, doc, loss_fn, rounds=wrap_rounds, seed=seed, device=device
            )
    finally:
        put_back(model, saved_buffers)
        params.put_back()
    return doc


class ParamsWritten(TorchDispatchMode):
    """While on, copies to the host each parameter of `model` an op is about to write in place
    (`nn.Embedding(max_norm=...)` renormalizes rows of its weight in the forward), once;
    `put_back()` writes those copies back where the parameter differs from them. Run the first
    step remat runs under it: the parameters as the caller left them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.by_storage: dict[int, list[torch.Tensor]] = defaultdict(list)
        for p in model.parameters():
            st = _storage(p)
            if st is not None:
                self.by_storage[st.data_ptr()].append(p)
        self.copies: dict[torch.Tensor, torch.Tensor] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is not None and schema.is_mutable:
            for t in _written(func, args, kwargs):
                st = _storage(t)
                for p in self.by_storage.get(st.data_ptr(), []) if st is not None else []:
                    if p not in self.copies:
                        self.copies[p] = p.detach().to("cpu", copy=True)
        return func(*args, **kwargs)

    def put_back(self) -> None:
        with torch.no_grad():
            for p, host in self.copies.items():
                if not same_values(p, host):
                    p.copy_(host)


def _warn_held(b: _Recording) -> None:
    """Warns of the values of region calls that something other than autograd's saved-tensor
    hooks keeps (a custom Function's ctx attribute, a module's attribute): checkpointing does
    not drop them, a re-run makes them again, and the plans' predicted peaks leave that out."""
    if b.ctx_held:
        fn, attr, op, module, r = min(b.ctx_held, key=lambda h: h[4])
        more = f" (and {len(b.ctx_held) - 1} more)" if len(b.ctx_held) > 1 else ""
        warnings.warn(
            f"remat.torch: autograd.Function {fn} keeps a tensor on its ctx (ctx.{attr}, made "
            f"by {op} in module {module or '(top level)'!r}, a value of region "
            f"{b.region_name(r)!r}){more}, where no saved-tensor hook sees it: checkpointing "
            "cannot drop it and a re-run makes it again, so a plan that wraps the region peaks "
            "above its prediction; keep it with ctx.save_for_backward instead",
            stacklevel=4,
        )
    held = b.module_held()
    if held:
        fqn, attr, op, module, r = held[0]
        more = f" (and {len(held) - 1} more)" if len(held) > 1 else ""
        warnings.warn(
            f"remat.torch: module {fqn or '(top level)'!r} keeps a value of region "
            f"{b.region_name(r)!r} as its attribute {attr!r} (made by {op} in module "
            f"{module or '(top level)'!r}){more} past the step: a re-run of the region stores "
            "its own value there, which outlives the step too, and the plans' predicted peaks "
            "leave it out (measure reports the peak over it); keep it only when not training, "
            "or take it from a forward hook on the region",
            stacklevel=4,
        )


def _idle_regions(rec: _Recording) -> dict[str, str]:
    """The regions of a recorded step that were not called or that ran no op in a call, each
    with what it did (`was not called in the captured step`, `ran no op in the captured step`,
    with the call where the module ran more than once)."""
    idle: dict[str, str] = {}
    for fqn, m in rec.region_index.items():
        n = rec.region_calls[m]
        if not n:
            idle[fqn] = "was not called in the captured step"
            continue
        calls = [k for r, (mm, k) in enumerate(rec.calls) if mm == m and r not in rec.region_first]
        if calls:
            which = f" (call {calls[0] + 1} of {n})" if n > 1 else ""
            idle[fqn] = f"ran no op in the captured step{which}"
    return idle


def _names(fqns: list[str]) -> str:
    shown = ", ".join(repr(f) for f in fqns[:5])
    return shown + (f" (and {len(fqns) - 5} more)" if len(fqns) > 5 else "")


def host_copies(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's buffers (BatchNorm's running statistics, ...), copied to the host."""
    return {n: b.detach().to("cpu", copy=True) for n, b in model.named_buffers()}


def put_back(
    model: nn.Module, buffers: dict[str, torch.Tensor], error: type[Exception] = CaptureError
) -> None:
    """Writes `host_copies` back into the model's buffers, in place: those that changed only
    (a write moves a buffer's version, which autograd checks where a graph saved it, and a
    buffer that is an expanded view, `torch.full((1, d), 0.5).expand(t, d)`, cannot be written
    in place at all). One that changed and cannot be written back raises `error`, naming it."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            saved = buffers[n]
            if same_values(b, saved):
                continue
            try:
                b.copy_(saved)
            except RuntimeError as e:
                raise error(
                    f"buffer {n!r} changed in the step and cannot be put back in place ({e}); "
                    "register a tensor of its own (a clone) instead of a view"
                ) from None


def same_values(t: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether `t` holds what `before` (its copy, on any device) does, NaNs in the same
    places."""
    if t.shape != before.shape or t.dtype != before.dtype:
        return False
    now = t.detach().to(before.device)
    if torch.equal(now, before):
        return True
    if not (now.is_floating_point() or now.is_complex()):
        return False
    return bool(((now == before) | (now.isnan() & before.isnan())).all())


def rerun_buffers(module: nn.Module) -> list[torch.Tensor]:
    """The buffers of a region `apply` copies before a re-run, to put back those the re-run
    writes: every buffer but one whose elements overlap (an expanded view), which no op
    writes in place."""
    return [b for b in module.buffers() if not _overlaps(b)]


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of `t` share memory (a stride 0 along a dimension of size > 1)."""
    if t.layout != torch.strided:
        return False
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True))


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The first index where two sequences differ (the shorter one's length when one is the
    other's start)."""
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def _pass_b(
    model: nn.Module,
    inputs: Inputs,
    loss_fn: LossFn,
    region_fqns: list[str],
    device: torch.device,
    externals: list[torch.Tensor],
    cost: str,
    seed: int,
    held: Mapping[torch.Tensor, torch.Tensor],
) -> _Recording:
    b = _Recording(model, region_fqns, device, forward_only=False)
    b.register_external(externals)
    b.register_buffers(model.buffers())
    loss = _run(model, inputs, loss_fn, b, cost, seed, held)
    del loss
    b.phase = "done"
    if b.rerun_in_backward is not None:
        # Raised after the step, not in the hook, which runs inside autograd's backward.
        raise CaptureError(
            f"module {b.rerun_in_backward or '(top level)'!r} ran its forward again during the "
            "backward pass: the model checkpoints activations itself (torch.utils.checkpoint, "
            "reentrant or not), so the capture sees its recomputation instead of what autograd "
            "would save; turn that off and let remat plan the checkpointing"
        )
    if b.modified_saved is not None:
        op, module, saved, now = b.modified_saved
        raise CaptureError(
            f"a value {op} saved for the backward (in module {module or '(top level)'!r}) was "
            f"written in place after it was saved (version {saved}, {now} when the backward "
            "read it): PyTorch's own step refuses this ('modified by an inplace operation'), "
            "and its gradients would be wrong; make the in-place op out of place"
        )
    drop_grads(model, inputs)  # the step's gradients die here: after the last op
    return b


def _least_times(b: _Recording, again: _Recording) -> None:
    """Each op of `b` gets the lesser of its time in `b` and in `again`, a recording of the same
    step; a step that ran other ops (data-dependent control flow) is refused, naming the op."""
    ran = [(o.op, o.module) for o in b.ops]
    if ran != [(o.op, o.module) for o in again.ops]:
        k = first_difference(ran, [(o.op, o.module) for o in again.ops])
        where = (b.ops[k].op, b.ops[k].module) if k < len(b.ops) else ("(end)", "")
        raise CaptureError(
            f"the step ran different ops in two timing rounds with the same inputs and seed: op "
            f"{k} {where[0]} in module {where[1]!r}; data-dependent control flow cannot be planned"
        )
    for x, y in zip(b.ops, again.ops, strict=True):
        x.cost = min(x.cost, y.cost)


def _forward_difference(a: _Recording, b: _Recording) -> str | None:
    """Where the forwards of two recordings of one step first differ, or `None`."""
    fwd_a = [(o.op, o.module) for o in a.ops[: a.forward_end]]
    fwd_b = [(o.op, o.module) for o in b.ops[: b.forward_end]]
    if fwd_a == fwd_b:
        return None
    k = first_difference(fwd_a, fwd_b)
    where = fwd_b[k] if k < len(fwd_b) else ("(end)", "")
    return f"op {k} {where[0]} in module {where[1]!r}"


def _document(
    a: _Recording, b: _Recording, sig: dict, device: torch.device, cost: str, name: str
) -> dict:
    differs = _forward_difference(a, b)
    if differs is not None:
        raise CaptureError(
            f"the forward ran different ops in two runs with the same inputs and seed (after a "
            f"first one, where a module may set itself up): {differs}; data-dependent control "
            "flow cannot be planned"
        )
    # Natural deaths from pass A, matched by (producer op, output slot).
    natural: dict[tuple[int, int], int | None] = {}
    for sid, s in enumerate(a.storages):
        slot = a.ops[s.producer].outputs.index(sid)
        nat = s.natural_free_after
        natural[(s.producer, slot)] = nat if nat is not None and nat < a.forward_end else None
    storages = []
    for sid, s in enumerate(b.storages):
        slot = b.ops[s.producer].outputs.index(sid)
        nat = natural.get((s.producer, slot)) if s.producer < b.forward_end else s.free_after
        storages.append(
            {
                "bytes": s.bytes,
                "producer": s.producer,
                "free_after": s.free_after,
                "natural_free_after": nat,
                "saves": s.saves,
                "mutated": s.mutated,
            }
        )
    regions = []
    modules = dict(b.model.named_modules())
    idle = _idle_regions(b)
    if idle:
        fqn, why = next(iter(idle.items()))
        raise CaptureError(f"region {fqn!r} {why}: it cannot be checkpointed")
    for r, (m, k) in enumerate(b.calls):
        fqn = b.region_fqns[m]
        module = modules[fqn]
        regions.append(
            {
                "fqn": fqn,
                # Which call of the module this region is (0 unless it runs more than once).
                "call": k,
                "class": type(module).__name__,
                "first_op": b.region_first[r],
                "last_op": b.region_last[r],
                # A region whose saves all came before its first op (the inputs of that op)
                # re-runs nothing: its checkpoint holds those values already.
                "stop_op": _stop_op(b.region_stop.get(r), b.region_first[r]),
                "trigger_op": b.region_trigger.get(r),
                "inputs": sorted(b.region_inputs[r]),
                # remat.torch.apply copies the region's buffers while it re-runs (BatchNorm's
                # running statistics are put back after it).
                "rerun_extra_bytes": sum(
                    x.numel() * x.element_size() for x in rerun_buffers(module)
                ),
                # A re-run would write the checkpoint's saved input again: never wrapped.
                "writes_input": b.region_writes.get(r),
            }
        )
    ops = [
        {
            "op": o.op,
            "phase": o.phase,
            "module": o.module,
            "region": o.region,
            "occurrence": o.occurrence,
            "cost": o.cost,
            "outputs": o.outputs,
            **({"random": True} if o.random else {}),
            **({"transient": o.transient} if o.transient else {}),
        }
        for o in b.ops
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "device": str(device),
        "torch": torch.__version__,
        "cost_unit": "flop" if cost == "flops" else "second",
        "fingerprint": fingerprint(sig),
        "signature": sig,
        "fixed_bytes": b.fixed_bytes,
        "forward_ops": b.forward_end,
        "regions": regions,
        "ops": ops,
        "storages": storages,
    }
