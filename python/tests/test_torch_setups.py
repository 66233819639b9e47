"""remat.torch in the training setups users have beyond a plain step: blocks that draw from
their own generator, fast weights through `torch.func.functional_call`, hooks on the blocks,
a model captured in eval mode, inputs that take a gradient (and a graph outside the model),
sparse gradients, compiled blocks, and a step PyTorch itself refuses. Each test failed (a wrong
gradient, an error blaming the user, a crash, a plan silently not applied) before its fix."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import pytest
import torch
from grads import same_grads
from torch import nn
from torch.nn import functional as F

import remat.torch as rt
from remat.torch._measure import _StorageMeter


class Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Stack(nn.Module):
    def __init__(self, n: int = 4, block: type[nn.Module] = Block) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block() for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def wrapped(handle: rt.Applied) -> int:
    return sum(1 for r in handle.plan["regions"] if r["wrapped"])


class NoisyBlock(Block):
    """Adds noise drawn from a generator of its own: checkpointing replays the default
    generators in the re-run, not this one."""

    def __init__(self, d: int = 32) -> None:
        super().__init__(d)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.ln(x)))
        h = h + 0.1 * torch.randn(h.shape, generator=self.gen)
        return x + self.fc2(h)


def test_a_block_drawing_from_its_own_generator_is_not_checkpointed() -> None:
    """Its re-run drew other numbers: gradients off by 11% relative, silently."""
    torch.manual_seed(0)
    planned = Stack(block=NoisyBlock)
    plain = copy.deepcopy(planned)
    x = torch.randn(8, 16, 32)
    graph = rt.capture(planned, (x,), loss_of)
    assert all("torch.Generator" in (r.get("writes_input") or "") for r in graph["regions"])
    handle = rt.apply(planned, rt.plan(graph, "min"), (x,))
    assert wrapped(handle) == 0
    for m in (planned, plain):
        for b in m.blocks:
            assert isinstance(b, NoisyBlock)
            b.gen.manual_seed(1)
        loss_of(m(x)).backward()
    same_grads(planned, plain)


def test_fast_weights_bound_by_functional_call_are_what_the_re_run_computes_with() -> None:
    """MAML's inner step: `functional_call` binds other weights for the forward and puts the
    module's own back before the backward re-runs the region (gradients 44% off)."""
    torch.manual_seed(0)
    planned = Stack()
    plain = copy.deepcopy(planned)
    x = torch.randn(8, 16, 32)
    handle = rt.checkpoint(planned, (x,), "min", loss_fn=loss_of)
    assert wrapped(handle) > 0

    def outer_loss(model: nn.Module) -> torch.Tensor:
        params = dict(model.named_parameters())
        inner = torch.autograd.grad(loss_of(model(x)), list(params.values()), create_graph=False)
        fast = {n: p - 0.1 * g for (n, p), g in zip(params.items(), inner, strict=True)}
        return loss_of(torch.func.functional_call(model, fast, (x,)))

    outer_loss(planned).backward()
    outer_loss(plain).backward()
    same_grads(planned, plain)


@pytest.mark.parametrize("hook", ["forward", "full_backward"])
def test_hooks_on_the_blocks_run_outside_the_region_in_capture_as_in_apply(hook: str) -> None:
    """The capture counted a forward hook's ops (and the views a full backward hook puts
    around a module) inside the region, `apply` outside it: every planned step failed with an
    OpMismatchError that blamed the model's control flow."""
    x = torch.randn(8, 16, 32)
    torch.manual_seed(0)
    planned = Stack()
    seen: list[float] = []
    for b in planned.blocks:
        if hook == "forward":
            b.register_forward_hook(lambda m, i, o: seen.append(float(o.detach().abs().mean())))
        else:
            b.register_full_backward_hook(lambda m, gi, go: seen.append(len(go)))
    plain = copy.deepcopy(planned)
    with warnings.catch_warnings():
        # A full backward hook on a module whose inputs take no gradient: PyTorch says so.
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        handle = rt.checkpoint(planned, (x,), "min", loss_fn=loss_of)
        assert wrapped(handle) > 0
        loss_of(planned(x)).backward()
        loss_of(plain(x)).backward()
    same_grads(planned, plain)
    assert seen


def test_a_model_captured_in_eval_mode_is_planned_for_eval_mode_steps() -> None:
    """The capture said nothing and `apply` ran every eval-mode region unwrapped: the plan was
    silently not applied (measured at the unplanned peak, 67% over its prediction)."""
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(8, 16, 32)
    with pytest.warns(UserWarning, match="eval mode"):
        graph = rt.capture(model, (x,), loss_of)
    assert graph["signature"]["eval_regions"] == [f"blocks.{i}" for i in range(4)]
    plan = rt.plan(graph, "min")
    report = rt.measure(model, (x,), plan, loss_of, rounds=1, op_rounds=0)
    assert report["ok"], report["problems"]
    unplanned = rt.baseline(graph, "none")["predicted"]["peak_bytes"]
    assert report["measured_peak_bytes"] < 0.8 * unplanned
    # In training mode the same plan leaves the regions to autograd (the ops may differ).
    model.train()
    with rt.apply(model, plan, (x,)):
        loss_of(model(x)).backward()


def test_inputs_taking_a_gradient_come_out_of_capture_and_measure_as_they_went_in() -> None:
    """A leaf input's .grad grew with every step capture and measure ran; a non-leaf input's
    graph (an encoder's outside the model) took their gradients and was freed, so the user's
    backward through it failed ('backward through the graph a second time')."""
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(8, 16, 32, requires_grad=True)
    graph = rt.capture(model, (x,), loss_of, cost="measured", wrap_rounds=1)
    plan = rt.plan(graph, "min")
    rt.measure(model, (x,), plan, loss_of, rounds=1, op_rounds=0)
    assert x.grad is None
    encoder = nn.Linear(32, 32)
    h = encoder(x)
    graph = rt.capture(model, (h,), loss_of, cost="measured", wrap_rounds=1)
    rt.measure(model, (h,), rt.plan(graph, "min"), loss_of, rounds=1, op_rounds=0)
    assert encoder.weight.grad is None and x.grad is None
    loss_of(model(h)).backward()  # the encoder's graph is still there
    assert encoder.weight.grad is not None


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Output:
    hidden: torch.Tensor
    extra: torch.Tensor


class BatchStack(Stack):
    """Takes its batch as a dataclass of tensors and returns another."""

    def forward(self, batch: Batch) -> Output:  # type: ignore[override]
        h = super().forward(batch.x * batch.scale)
        return Output(hidden=h, extra=h.mean(-1))


def test_dataclass_inputs_and_outputs_are_seen_through() -> None:
    """pytree takes a dataclass for a leaf: its tensors were in no signature (a plan applied at
    other shapes unrefused), capture wrote the input's .grad, and the default loss found "no
    floating-point tensor that requires grad" in a dataclass output."""
    torch.manual_seed(0)
    model = BatchStack()
    x = torch.randn(4, 8, 32, requires_grad=True)
    graph = rt.capture(model, (Batch(x),))
    assert graph["signature"]["inputs"] == [[[4, 8, 32], "float32"]]
    assert x.grad is None
    plan = rt.plan(graph, "min")
    with pytest.raises(rt.PlanMismatchError, match=r"input 0 is \[2, 8, 32\] float32"):
        rt.apply(model, plan, (Batch(torch.randn(2, 8, 32)),))
    v = rt.measure(model, (Batch(x),), plan, rounds=1, op_rounds=0)
    assert v["ok"], v["problems"]
    assert x.grad is None
    out = model(Batch(x))
    assert torch.equal(rt.default_loss(out), out.hidden.mean() + out.extra.mean())


class SparseNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32, sparse=True)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return x


def test_measure_compares_sparse_gradients() -> None:
    """`nn.Embedding(sparse=True)`: measure raised NotImplementedError ('aten::max' on
    SparseCPU) comparing the gradients."""
    torch.manual_seed(0)
    model = SparseNet()
    ids = torch.randint(0, 100, (8, 16))
    plan = rt.plan(rt.capture(model, (ids,), loss_of), "min")
    report = rt.measure(model, (ids,), plan, loss_of, rounds=1, op_rounds=0)
    assert report["ok"], report["problems"]
    assert report["grad_max_rel_err"] == 0.0


def test_a_block_compiled_by_torch_compile_is_named() -> None:
    """`torch.compile(block)` in the model: capture took it, and apply refused it as 'already
    wrapped (remove the earlier plan)', though nothing had been applied."""
    model = Stack()
    model.blocks[1] = torch.compile(model.blocks[1])  # type: ignore[assignment]
    with pytest.raises(rt.CaptureError, match=r"'blocks\.1' is a torch\.compile wrapper"):
        rt.capture(model, (torch.randn(2, 4, 32),), loss_of)


class InPlaceAfterSave(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(self.ln(x)), inplace=True)
        h.mul_(2)  # relu saved its output for the backward
        return x + self.fc2(h)


def test_a_step_that_writes_a_saved_value_in_place_is_refused() -> None:
    """PyTorch's own step refuses it at the backward ('modified by an inplace operation'); the
    capture's saved-tensor hooks skip that check, and it was captured and planned."""
    model = Stack(block=InPlaceAfterSave)
    x = torch.randn(2, 4, 32)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss_of(copy.deepcopy(model)(x)).backward()
    with pytest.raises(rt.CaptureError, match="aten.relu_.default saved for the backward"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rt.capture(model, (x,), loss_of)


def test_a_micro_batch_of_an_accumulation_is_planned_with_the_gradients_held() -> None:
    """A micro-batch after the first begins with every parameter's gradient held: its peak was
    the plan's prediction plus the gradients' bytes (+9.13% on a small GPT-2, over the budget),
    with no way to plan it."""
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(8, 16, 32)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    plain = rt.capture(model, (x,), loss_of)
    graph = rt.capture(model, (x,), loss_of, accumulate=True)
    assert graph["fixed_bytes"] == plain["fixed_bytes"] + grad_bytes
    assert graph["signature"]["accumulate"] is True
    assert all(p.grad is None for p in model.parameters())
    plan = rt.plan(graph, "0.7x")
    assert any(r["wrapped"] for r in plan["regions"])
    report = rt.measure(model, (x,), plan, loss_of, rounds=1, op_rounds=0)
    assert report["ok"], report["problems"]
    assert report["measured_peak_bytes"] <= plan["budget_bytes"]
    # The plan of a first step, measured as the accumulation runs it, is over its prediction.
    first = rt.plan(plain, "0.7x")
    with rt.apply(model, first, (x,)):
        loss_of(model(x)).backward()
        meter = _StorageMeter(
            [*model.parameters(), x, *(p.grad for p in model.parameters() if p.grad is not None)]
        )
        with meter:
            loss_of(model(x)).backward()
    assert meter.peak >= first["predicted"]["peak_bytes"] + grad_bytes // 2
    model.zero_grad(set_to_none=True)


def test_a_memtracker_step_that_fails_leaves_no_hooks_on_the_model() -> None:
    """MemTracker, `measure`'s second opinion, hooks each parameter's gradient after its
    module's forward and unhooks it in the backward; its hooks change Mamba's ops, so its step
    fails between the two (a warning, the second opinion null). The hooks stayed on the model,
    changing every later step: the next `measure` of the least-peak plan found it over budget."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(
        vocab_size=64,
        hidden_size=16,
        state_size=4,
        num_hidden_layers=3,
        expand=2,
        conv_kernel=4,
        use_cache=False,
    )
    model = MambaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 16))
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False}
    graph = rt.capture(model, inputs, lambda o: o.loss)
    for budget in ("0.8x", "min"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            v = rt.measure(model, inputs, rt.plan(graph, budget), lambda o: o.loss, rounds=1)
        assert v["ok"], (budget, v["problems"])
        hooked = [
            n
            for n, p in model.named_parameters()
            if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)
        ]
        assert not hooked, (budget, hooked)


class SetsUpOnFirstCall(nn.Module):
    """Infers a scale on its first call only, as torchvision's MultiScaleRoIAlign does (a
    two-stage detector's box head): the model's first step runs ops no later step runs."""

    def __init__(self) -> None:
        super().__init__()
        self.scale: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            self.scale = 1.0 / (1.0 + float(x.detach().abs().amax()))
        return x * self.scale


class Alternates(nn.Module):
    """Runs other ops every other call: data-dependent in effect."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x.exp() if self.calls % 2 else x.tanh()


@pytest.mark.parametrize("head", [SetsUpOnFirstCall, Alternates])
def test_a_module_that_sets_itself_up_on_its_first_call_is_captured_as_later_steps_run(
    head: type[nn.Module],
) -> None:
    """A freshly built torchvision Faster R-CNN was refused ("different ops in two runs ...
    data-dependent control flow") until one step had run: the capture's first run is the
    model's first call. It runs its first pass again on a difference; a forward that keeps
    changing is still refused."""
    torch.manual_seed(0)
    model = nn.Sequential(Stack(), head())
    x = torch.randn(4, 8, 32)
    if head is Alternates:
        with pytest.raises(rt.CaptureError, match=r"different ops in two runs .*after a first"):
            rt.capture(model, (x,), loss_of)
        return
    plain = copy.deepcopy(model)
    loss_of(plain(x)).backward()
    for p in plain.parameters():
        p.grad = None
    graph = rt.capture(model, (x,), loss_of)
    handle = rt.apply(model, rt.plan(graph, "min"), (x,))
    assert wrapped(handle) > 0
    for m in (model, plain):
        loss_of(m(x)).backward()
    same_grads(model, plain)


def test_a_model_called_twice_before_one_backward_recomputes_no_kept_op() -> None:
    """Two calls (two views of a batch) and one backward: each call's re-run counts its ops
    from its start. Under torch 2.5, which asks the policy in the re-run, the first call's
    re-run carried the second's count on and recomputed the first call's kept ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, f: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops[str(f)] = self.ops.get(str(f), 0) + 1
            return f(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = Stack(n=3)
    x1, x2 = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    graph = rt.capture(model, (x1,), loss_of)
    plans = (rt.plan(graph, f"{f}x") for f in (0.9, 0.8, 0.7, 0.6))
    plan = next(p for p in plans if any(r["keep"] and r["wrapped"] for r in p["regions"]))

    def backward_ops(calls: int) -> dict[str, int]:
        m = copy.deepcopy(model)
        with rt.apply(m, plan):
            losses = [loss_of(m(x)) for x in (x1, x2)[:calls]]
            count = Count()
            with count:
                torch.autograd.backward(losses)
        return count.ops

    one, two = backward_ops(1), backward_ops(2)
    kept = {op for r in plan["regions"] for op, _ in r["keep"]}
    assert {op: two.get(op, 0) for op in kept} == {op: 2 * one.get(op, 0) for op in kept}


class RoutedBlock(nn.Module):
    """Two experts, each taking the tokens its router sends it (`nonzero`), as a mixture of
    experts' loop over its experts does."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.router = nn.Linear(d, 2)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        choice = self.router(flat).argmax(-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            (rows,) = torch.nonzero(choice == e, as_tuple=True)
            out = out.index_add(0, rows, expert(flat[rows]))
        return x + out.reshape(x.shape)


def test_a_region_whose_ops_depend_on_the_data_is_warned_about_at_capture() -> None:
    """A mixture of experts' loop (transformers' eager experts) runs other ops on a batch that
    routes otherwise, which `apply` refuses (OpMismatchError) at that batch: capture says so
    first, naming the region and the op. A model without such an op is not warned about."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    with pytest.warns(UserWarning, match=r"'blocks.0', runs aten\.nonzero\.default"):
        rt.capture(Stack(n=2, block=RoutedBlock), (x,), loss_of)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.capture(Stack(n=2), (x,), loss_of)


class MaxNormBlock(nn.Module):
    """Looks its ids up in an embedding that renormalizes the rows it reads in place."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, d, max_norm=1.0)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x + self.emb(ids)))


class MaxNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([MaxNormBlock() for _ in range(3)])

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, ids)
        return x


def test_parameters_a_forward_writes_in_place_come_out_of_capture_and_measure_as_found() -> None:
    """`nn.Embedding(max_norm=...)` renormalizes its weight's rows in the forward: capture and
    measure put back gradients and buffers, and left those weights changed."""
    torch.manual_seed(0)
    model = MaxNormNet()
    x, ids = torch.randn(4, 8, 16), torch.randint(0, 20, (4, 8))
    before = copy.deepcopy(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # every region writes a weight it read: none wrapped
        graph = rt.capture(model, (x, ids), loss_of)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    rt.measure(model, (x, ids), rt.plan(graph, "min"), loss_of, rounds=1, op_rounds=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


class TanhMM(torch.autograd.Function):
    """Keeps its output on ctx (`ctx.y = y`, which PyTorch allows) rather than saving it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x @ w)
        ctx.save_for_backward(x, w)
        ctx.y = y
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        gy = g * (1 - ctx.y**2)
        return gy @ w.t(), x.reshape(-1, x.shape[-1]).t() @ gy.reshape(-1, gy.shape[-1])


class CtxBlock(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, 4 * d) / 8)
        self.fc = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(TanhMM.apply(x, self.w))


class StashBlock(Block):
    """Keeps its hidden activation on itself, as attention-map tools keep `last_attn`."""

    def __init__(self, d: int = 32) -> None:
        super().__init__(d)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.ln(x)))
        self.last = h.detach()
        return x + self.fc2(h)


def test_values_held_past_the_saved_tensor_hooks_are_warned_about_at_capture() -> None:
    """A custom Function's `ctx.y = y` (measured 25% over the predicted peak at "min") and a
    block's `self.last = h.detach()` (+9%) keep values checkpointing cannot drop, and a re-run
    makes them again: capture said nothing."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)
    with pytest.warns(UserWarning, match="") as caught:
        rt.capture(Stack(block=CtxBlock), (x,), loss_of)
    said = " ".join(str(w.message) for w in caught)
    assert (
        "autograd.Function TanhMM keeps a tensor on its ctx (ctx.y, made by aten.tanh.default in "
        "module 'blocks.0', a value of region 'blocks.0') (and 3 more)" in said
    ), said
    with pytest.warns(UserWarning, match="") as caught:
        rt.capture(Stack(block=StashBlock), (torch.randn(4, 8, 32),), loss_of)
    said = " ".join(str(w.message) for w in caught)
    assert "module 'blocks.0' keeps a value of region 'blocks.0' as its attribute 'last'" in said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.capture(Stack(), (torch.randn(4, 8, 32),), loss_of)
    # A module's own state the blocks read and the step writes is no value of a region.
    model = StateNet()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rt.capture(model, (torch.randn(4, 8, 32),), loss_of)
    assert not [w for w in seen if "keeps" in str(w.message)], [str(w.message) for w in seen]


class StateBlock(Block):
    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x + state)


class StateNet(nn.Module):
    """Holds a plain tensor, passed to its blocks, that its forward writes in place after."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([StateBlock() for _ in range(3)])
        self.state = torch.ones(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, self.state)
        with torch.no_grad():
            self.state.mul_(1.5)
        return x
