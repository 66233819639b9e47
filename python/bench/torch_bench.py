"""remat.torch on real models, in PyTorch (float32, random weights; CPU, or CUDA with
--device cuda): the tables of docs/bench/torch.md.

For each model: capture one step (cost="measured"), plan at ¼, ½ and ¾ of the way from the least
reachable peak to the unplanned peak, apply each plan and measure it in PyTorch (peak storage by
storage, alternating timed pairs, every gradient against the unplanned run). Then PyTorch's own
options — full checkpointing of every block, torchtitan's op-level SAC policy — are measured, and
remat is planned at each one's measured peak and measured too: overheads at equal peak, one run.

    python python/bench/torch_bench.py --models resnet18,gpt2 --rounds 3 --json out.json

On CUDA the peak is `torch.cuda.max_memory_allocated` (rt.measure's meter there), and the run is
made deterministic (`torch.use_deterministic_algorithms(True)`, cuDNN's deterministic algorithms,
a small cuBLAS workspace) so that the gradients of a plan can equal the unplanned run's; a model
with an op that has no deterministic CUDA kernel (ResNet's pooling backwards) runs again with
`warn_only=True`, and its row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import remat.torch as rt
from remat.torch._measure import _peak_step, _timed_step


class LM(nn.Module):
    """A Hugging Face model whose forward takes ids and returns its own training loss."""

    def __init__(self, inner: nn.Module, kind: str) -> None:
        super().__init__()
        self.m = inner
        self.kind = kind

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, labels=ids).loss


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], str]:
    torch.manual_seed(0)
    if name in ("resnet18", "resnet50"):
        import torchvision

        model = getattr(torchvision.models, name)()
        return model, (torch.randn(8, 3, 224, 224),), f"torchvision {name}, batch 8, 224x224"
    import transformers as tf

    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512, use_cache=False)
        model = LM(tf.GPT2LMHeadModel(cfg), name)
        desc = "GPT-2 (12 layers, n_embd 768), seq 512, batch 2"
        vocab = cfg.vocab_size
    elif name == "llama":
        cfg = tf.LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=512,
            use_cache=False,
        )
        model = LM(tf.LlamaForCausalLM(cfg), name)
        desc = "Llama-style (8 layers, hidden 1024, 16 heads / 4 KV heads), seq 512, batch 2"
        vocab = cfg.vocab_size
    elif name == "bert":
        cfg = tf.BertConfig(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
        )
        model = LM(tf.BertForMaskedLM(cfg), name)
        desc = "BERT-base-like encoder (12 layers, 768), masked LM, seq 512, batch 2"
        vocab = cfg.vocab_size
    else:
        raise SystemExit(f"unknown model {name!r}")
    model.train()
    return model, (torch.randint(0, vocab, (2, 512)),), desc


# torchtitan's default op-level SAC (torchtitan/distributed/activation_checkpoint.py): save the
# outputs of these ops, except every second mm.
_TITAN_SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten.max.default,
} | (
    {torch.ops.aten._scaled_dot_product_cudnn_attention.default}
    if hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention")
    else set()
)


def titan_policy() -> Callable[..., Any]:
    meta: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if getattr(ctx, "is_recompute", False) else "forward"
        key = f"{mode}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in _TITAN_SAVE and not (
            func == torch.ops.aten.mm.default and meta[key] % 2 == 0
        )
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def wrap_titan(model: nn.Module, regions: list[str]) -> Callable[[], None]:
    modules = dict(model.named_modules())
    for fqn in regions:
        m = modules[fqn]
        orig = m.forward

        def fwd(*a: Any, _o: Any = orig, **k: Any) -> Any:
            return checkpoint(
                _o,
                *a,
                use_reentrant=False,
                preserve_rng_state=True,
                context_fn=lambda: create_selective_checkpoint_contexts(titan_policy()),
                **k,
            )

        m.forward = fwd

    def remove() -> None:
        for fqn in regions:
            del modules[fqn].forward

    return remove


def measure_custom(
    model: nn.Module, inputs: tuple, wrap: Callable[[], Callable[[], None]], rounds: int
) -> dict[str, Any]:
    """Peak and overhead of a policy remat did not make (same accounting as rt.measure)."""
    device = inputs[0].device
    loss = rt.default_loss
    base_peak, _, base_grads = _peak_step(model, inputs, loss, 0, device)
    remove = wrap()
    try:
        peak, _, grads = _peak_step(model, inputs, loss, 0, device)
    finally:
        remove()
    ratios = []
    for _ in range(rounds):
        tb = _timed_step(model, inputs, loss, 0, device)
        remove = wrap()
        try:
            tp = _timed_step(model, inputs, loss, 0, device)
        finally:
            remove()
        ratios.append(tp / tb - 1.0)
    err = max(
        float((grads[n] - g).abs().max() / max(float(g.abs().max()), 1e-30))
        for n, g in base_grads.items()
    )
    return {
        "measured_peak_bytes": peak,
        "unplanned_measured_peak_bytes": base_peak,
        "measured_overhead": statistics.median(ratios),
        "measured_overhead_range": [min(ratios), max(ratios)],
        "grad_max_rel_err": err,
    }


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def run_model(
    name: str,
    rounds: int,
    cost: str,
    timing_rounds: int,
    op_rounds: int,
    compare_options: bool,
    device: torch.device,
    wrap_rounds: int = 5,
) -> dict[str, Any]:
    model, inputs, desc = build(name)
    model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    loss = rt.default_loss
    print(f"\n## {name}: {desc}", flush=True)
    t0 = time.perf_counter()
    g_flops = rt.capture(model, inputs, loss)
    p_flops = rt.plan(g_flops, "0.5x")
    with rt.apply(model, p_flops, inputs):
        pass
    quick = time.perf_counter() - t0
    print(f"capture + plan + apply (cost=flops): {quick:.1f} s", flush=True)
    t0 = time.perf_counter()
    graph = rt.capture(
        model, inputs, loss, cost=cost, timing_rounds=timing_rounds, wrap_rounds=wrap_rounds
    )
    t_capture = time.perf_counter() - t0
    # The same graph without checkpointing's own work priced: the prediction before it was.
    ops_only = {k: v for k, v in graph.items() if k != "wrap_cost"}
    if "wrap_cost" in graph:
        print(f"wrap cost: {graph['wrap_cost']}", flush=True)
    fwd = graph["forward_ops"]
    print(
        f"capture (cost={cost}): {t_capture:.1f} s, {len(graph['ops'])} ops ({fwd} forward), "
        f"{len(graph['storages'])} storages, {len(graph['regions'])} regions "
        f"({graph['regions'][0]['class'] if graph['regions'] else '-'})",
        flush=True,
    )
    lo = rt.plan(graph, "min")["min_peak_bytes"]
    hi = rt.simulate(graph)["peak_bytes"]
    rows = []
    for frac in (0.25, 0.5, 0.75):
        budget = int(lo + frac * (hi - lo))
        t0 = time.perf_counter()
        plan = rt.plan(graph, budget)
        t_plan = time.perf_counter() - t0
        v = rt.measure(model, inputs, plan, loss, rounds=rounds, op_rounds=op_rounds)
        row = {
            "fraction": frac,
            "budget_bytes": budget,
            "plan_seconds": t_plan,
            "status": plan["status"],
            "wrapped": sum(r["wrapped"] for r in plan["regions"]),
            "kept_ops": sum(len(r["keep"]) for r in plan["regions"]),
            "predicted_overhead_ops_only": rt.simulate(ops_only, plan)["overhead"],
            **v,
        }
        rows.append(row)
        print(
            f"  {frac:.2f}: budget {mib(budget)} MiB, predicted {mib(v['predicted_peak_bytes'])}"
            f", measured {mib(v['measured_peak_bytes'])} ({v['peak_rel_diff']:+.2%}), grad err "
            f"{v['grad_max_rel_err']:.1e}, overhead predicted {v['predicted_overhead']:+.1%} "
            f"(ops only {row['predicted_overhead_ops_only']:+.1%}) "
            f"measured {v['measured_overhead']:+.1%} "
            f"[{v['measured_overhead_range'][0]:+.1%}, {v['measured_overhead_range'][1]:+.1%}]"
            f" ops at their least {v.get('measured_step_overhead', float('nan')):+.2%}"
            f", plan {t_plan * 1000:.0f} ms, {row['wrapped']} wrapped, {row['kept_ops']} kept",
            flush=True,
        )
    regions = [r["fqn"] for r in graph["regions"]]
    compare = []
    full = rt.baseline(graph, "full")
    options = (
        (
            "full checkpointing of every block",
            lambda: rt.measure(model, inputs, full, loss, rounds=rounds),
        ),
        (
            "torchtitan op-level SAC (save mm but every other, attention)",
            lambda: measure_custom(model, inputs, lambda: wrap_titan(model, regions), rounds),
        ),
    )
    for label, meas in options if compare_options else ():
        theirs = meas()
        budget = theirs["measured_peak_bytes"]
        plan = rt.plan(graph, budget)
        ours = rt.measure(model, inputs, plan, loss, rounds=rounds)
        compare.append(
            {
                "baseline": label,
                "theirs": theirs,
                "budget_bytes": budget,
                "remat_status": plan["status"],
                "remat": ours,
            }
        )
        print(
            f"  vs {label}: their peak {mib(budget)} MiB overhead "
            f"{theirs['measured_overhead']:+.1%}; remat at that budget: peak "
            f"{mib(ours['measured_peak_bytes'])} MiB overhead {ours['measured_overhead']:+.1%}"
            f" ({plan['status']})",
            flush=True,
        )
    return {
        "model": name,
        "description": desc,
        "capture_plan_apply_seconds_flops": quick,
        "capture_seconds": t_capture,
        "wrap_cost": graph.get("wrap_cost"),
        "ops": len(graph["ops"]),
        "forward_ops": fwd,
        "storages": len(graph["storages"]),
        "regions": len(regions),
        "min_peak_bytes": lo,
        "unplanned_peak_bytes": hi,
        "rows": rows,
        "compare": compare,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="resnet18,resnet50,gpt2,llama,bert")
    ap.add_argument("--rounds", type=int, default=3, help="timed pairs of steps per plan")
    ap.add_argument(
        "--op-rounds",
        type=int,
        default=None,
        help="pairs of steps with every op timed, per plan (default: --rounds; 0: none)",
    )
    ap.add_argument(
        "--timing-rounds", type=int, default=3, help="capture's rounds for cost=measured"
    )
    ap.add_argument(
        "--wrap-rounds",
        type=int,
        default=5,
        help="capture's pairs pricing checkpointing's own work (cost=measured; 0: not priced)",
    )
    ap.add_argument("--no-compare", action="store_true", help="leave out PyTorch's own options")
    ap.add_argument("--cost", default=None, choices=["measured", "flops"], help="default: measured")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--json", help="write the results here (after every model)")
    ap.add_argument(
        "--graphs",
        help="only capture each model's step (with --cost; flops unless given) into "
        "DIR/NAME.torch.json (NAME.measured.torch.json for measured costs), and stop",
    )
    args = ap.parse_args()
    cost_given = args.cost
    args.cost = args.cost or "measured"
    if args.device.startswith("cuda"):
        # Deterministic kernels, so that a plan's gradients can equal the unplanned run's
        # (cuBLAS needs its workspace setting before its first use).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.graphs:
        out = Path(args.graphs)
        out.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            model, inputs, _ = build(name)
            if cost_given == "measured":
                graph = rt.capture(
                    model,
                    inputs,
                    rt.default_loss,
                    cost="measured",
                    timing_rounds=args.timing_rounds,
                    wrap_rounds=args.wrap_rounds,
                )
                (out / f"{name}.measured.torch.json").write_text(json.dumps(graph))
            else:
                graph = rt.capture(model, inputs, rt.default_loss)
                (out / f"{name}.torch.json").write_text(json.dumps(graph))
            print(f"{name}: {len(graph['ops'])} ops, {len(graph['regions'])} regions", flush=True)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor()}, "
        f"python {sys.version.split()[0]}",
        flush=True,
    )
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device {torch.cuda.get_device_name(device)}", flush=True)
    op_rounds = args.rounds if args.op_rounds is None else args.op_rounds
    results = []
    for m in args.models.split(","):

        def run(m: str = m) -> dict[str, Any]:
            compare = not args.no_compare
            return run_model(
                m,
                args.rounds,
                args.cost,
                args.timing_rounds,
                op_rounds,
                compare,
                device,
                args.wrap_rounds,
            )

        try:
            result = run()
            result["deterministic"] = torch.are_deterministic_algorithms_enabled()
        except RuntimeError as err:
            if device.type != "cuda" or "deterministic" not in str(err):
                raise
            print(f"{m}: {str(err).splitlines()[0]}; again with warn_only=True", flush=True)
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                result = run()
            finally:
                torch.use_deterministic_algorithms(True)
            result["deterministic"] = "warn_only"
        results.append(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "torch": torch.__version__,
                        "device": torch.cuda.get_device_name(device)
                        if device.type == "cuda"
                        else platform.processor(),
                        "threads": torch.get_num_threads(),
                        "rounds": args.rounds,
                        "op_rounds": op_rounds,
                        "timing_rounds": args.timing_rounds,
                        "wrap_rounds": args.wrap_rounds,
                        "cost": args.cost,
                        "results": results,
                    },
                    f,
                    indent=1,
                )


if __name__ == "__main__":
    main()
