"""torch.compile's `activation_memory_budget` against remat at equal measured peak (CPU, float32,
random weights): the torch.compile table of docs/bench/torch.md.

torch.compile's knob is a fraction of the saved activations that AOTAutograd's min-cut
partitioner may keep, not a peak. Each budget is compiled with AOTAutograd, Inductor's
decompositions and that partitioner (the `aot_eager_decomp_partition` backend, with the budget
fixed per compiled module), and its graphs run as eager aten ops: the partitioner's choice of
what to save and what to recompute is Inductor's, and its steps run the same kernels as remat's
eager ones, so the overheads compare recomputation, not code generation. (Inductor's own C++
kernels allocate outside what a CPU memory tracker sees.)

Peaks of every variant are measured the same way, by PyTorch's profiler (`profile_memory=True`:
every allocation and free of the CPU allocator during one step, summed in time order) plus the
bytes resident before the step (parameters, buffers, inputs: the simulator's unplanned peak
minus the eager step's profiled peak). Overheads: alternating timed pairs after a warm-up,
compiled at the budget against compiled at 1.0 (its own step without a budget, which already
recomputes what the partitioner finds cheap) and against the eager step, in rotating rounds of
the three; remat's plan against the eager step (`remat.torch.measure`). remat is planned at
each compiled budget's measured peak.

    python python/bench/compile_bench.py --models resnet18,gpt2 --budgets 0.5,0.05 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import remat.torch as rt

sys.path.insert(0, str(Path(__file__).parent))
from torch_bench import build, mib  # noqa: E402


def backend_at(budget: float) -> Callable[..., Any]:
    """AOTAutograd with Inductor's decompositions and the min-cut partitioner at `budget`."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import get_nop_func
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import select_decomp_table

    def partition(*args: Any, **kwargs: Any) -> Any:
        with functorch_config.patch(activation_memory_budget=budget):
            return min_cut_rematerialization_partition(*args, **kwargs)

    return aot_autograd(
        fw_compiler=get_nop_func(),
        bw_compiler=get_nop_func(),
        decompositions=select_decomp_table(),
        partition_fn=partition,
    )


def step(run: nn.Module, params: nn.Module, inputs: tuple) -> dict[str, torch.Tensor]:
    """One training step of `run` (the model or its compiled form); the gradients of `params`."""
    for p in params.parameters():
        p.grad = None
    torch.manual_seed(0)
    rt.default_loss(run(*inputs)).backward()
    grads = {n: p.grad.detach().clone() for n, p in params.named_parameters() if p.grad is not None}
    for p in params.parameters():
        p.grad = None
    return grads


def profiled_peak(fn: Callable[[], Any]) -> int:
    """The most bytes the CPU allocator held above what it held before `fn`, in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    cur = best = 0
    for e in events:
        cur += e.nbytes()
        best = max(best, cur)
    return best


def timed(run: nn.Module, params: nn.Module, inputs: tuple) -> float:
    for p in params.parameters():
        p.grad = None
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rt.default_loss(run(*inputs)).backward()
    dt = time.perf_counter() - t0
    for p in params.parameters():
        p.grad = None
    return dt


def rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    worst = 0.0
    for n, ref in b.items():
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((a[n].double() - ref.double()).abs().max()) / scale)
    return worst


def run_model(name: str, budgets: list[float], rounds: int) -> dict[str, Any]:
    model, inputs, desc = build(name)
    print(f"\n## {name}: {desc}", flush=True)
    graph = rt.capture(model, inputs, rt.default_loss, cost="measured")
    eager_grads = step(model, model, inputs)
    eager_step_peak = profiled_peak(lambda: step(model, model, inputs))
    resident = rt.simulate(graph)["peak_bytes"] - eager_step_peak
    least = rt.plan(graph, "min")["min_peak_bytes"]
    print(
        f"eager step peak {mib(eager_step_peak)} MiB + {mib(resident)} MiB resident; "
        f"remat's least peak {mib(least)} MiB",
        flush=True,
    )

    def compiled(budget: float) -> tuple[nn.Module, float, int, float]:
        c = torch.compile(model, backend=backend_at(budget))
        t0 = time.perf_counter()
        grads = step(c, model, inputs)
        t_compile = time.perf_counter() - t0
        step(c, model, inputs)
        peak = profiled_peak(lambda: step(c, model, inputs)) + resident
        return c, t_compile, peak, rel_err(grads, eager_grads)

    base, t_base_compile, base_peak, base_err = compiled(1.0)
    print(
        f"  compiled at 1.0: peak {mib(base_peak)} MiB, compile {t_base_compile:.0f} s, "
        f"grad err vs eager {base_err:.1e}",
        flush=True,
    )
    rows = []
    for b in budgets:
        c, t_compile, peak, err = compiled(b)
        # Rounds of three steps (eager, compiled at 1.0, compiled at the budget), the order
        # rotating, after a warm-up round: the budget's step against both.
        ratios, vs_eager = [], []
        variants = [model, base, c]
        for i in range(rounds + 1):
            order = variants[i % 3 :] + variants[: i % 3]
            times = {id(m): timed(m, model, inputs) for m in order}
            if i:
                ratios.append(times[id(c)] / times[id(base)] - 1.0)
                vs_eager.append(times[id(c)] / times[id(model)] - 1.0)
        row: dict[str, Any] = {
            "activation_memory_budget": b,
            "compile_seconds": t_compile,
            "measured_peak_bytes": peak,
            "measured_overhead": statistics.median(ratios),
            "measured_overhead_range": [min(ratios), max(ratios)],
            "overhead_vs_eager": statistics.median(vs_eager),
            "overhead_vs_eager_range": [min(vs_eager), max(vs_eager)],
            "grad_max_rel_err_vs_eager": err,
        }
        plan = rt.plan(graph, peak)
        ours = rt.measure(model, inputs, plan, rt.default_loss, rounds=rounds)
        with rt.apply(model, plan, inputs):
            ours_profiled = profiled_peak(lambda: step(model, model, inputs)) + resident
        row["remat"] = {
            "status": plan["status"],
            "profiled_peak_bytes": ours_profiled,
            **ours,
        }
        rows.append(row)
        print(
            f"  budget {b}: peak {mib(peak)} MiB, overhead {row['measured_overhead']:+.1%} "
            f"[{min(ratios):+.1%}, {max(ratios):+.1%}] (vs eager {row['overhead_vs_eager']:+.1%} "
            f"[{min(vs_eager):+.1%}, {max(vs_eager):+.1%}]), compile {t_compile:.0f} s, grad err "
            f"{err:.1e}; remat at {mib(peak)} MiB ({plan['status']}): peak "
            f"{mib(ours['measured_peak_bytes'])} MiB (profiled {mib(ours_profiled)}), overhead "
            f"{ours['measured_overhead']:+.1%} predicted {ours['predicted_overhead']:+.1%}",
            flush=True,
        )
        del c
    return {
        "model": name,
        "description": desc,
        "eager_step_peak_bytes": eager_step_peak,
        "resident_bytes": resident,
        "remat_least_peak_bytes": least,
        "unplanned_peak_bytes": rt.simulate(graph)["peak_bytes"],
        "compiled_unplanned_peak_bytes": base_peak,
        "compiled_unplanned_grad_max_rel_err": base_err,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="resnet18,resnet50,gpt2,llama,bert")
    ap.add_argument("--budgets", default="0.5,0.2,0.05")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [float(b) for b in args.budgets.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    results = []
    for m in args.models.split(","):
        results.append(run_model(m, budgets, args.rounds))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"torch": torch.__version__, "rounds": args.rounds, "results": results},
                    f,
                    indent=1,
                )


if __name__ == "__main__":
    main()
