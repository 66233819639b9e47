"""Peaks and gradients of remat's torch-sac plans, run by PyTorch: for each model (built as in
`torch_bench.py`), one step captured with FLOPs costs, plans at the given fractions of the way
from the least peak to the unplanned one, and `remat.torch.measure` of each: predicted against
measured peak, the largest gradient error, the overheads (with few pairs, not evidence), the
plan's time and how many regions it wraps and ops it keeps. One JSON line per plan.

    python python/bench/torch_peaks.py --models resnet18:0.25,0.5 gpt2:0.25,0.5,0.75 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import remat.torch as rt

sys.path.insert(0, str(Path(__file__).parent))
from torch_bench import build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet18:0.25,0.5"], help="NAME:FRACTIONS")
    ap.add_argument("--rounds", type=int, default=2, help="timed pairs per plan")
    args = ap.parse_args()
    for spec in args.models:
        name, _, fracs = spec.partition(":")
        model, inputs, _ = build(name)
        t0 = time.perf_counter()
        graph = rt.capture(model, inputs)
        capture_s = time.perf_counter() - t0
        low = rt.plan(graph, "min")
        least, unplanned = low["min_peak_bytes"], low["unplanned_peak_bytes"]
        for f in (float(x) for x in (fracs or "0.25,0.5,0.75").split(",")):
            budget = int(least + f * (unplanned - least))
            t0 = time.perf_counter()
            plan = rt.plan(graph, budget)
            plan_s = time.perf_counter() - t0
            v = rt.measure(model, inputs, plan, rounds=args.rounds)
            row = {
                "model": name,
                "at": f,
                "budget": budget,
                "least": least,
                "unplanned": unplanned,
                "predicted_peak": plan["predicted"]["peak_bytes"],
                "measured_peak": v["measured_peak_bytes"],
                "peak_meter": v["peak_meter"],
                "memtracker_peak": v["memtracker_peak_bytes"],
                "grad_max_rel_err": v["grad_max_rel_err"],
                "predicted_overhead": plan["predicted"]["overhead"],
                "measured_overhead": v["measured_overhead"],
                "plan_s": round(plan_s, 3),
                "capture_s": round(capture_s, 2),
                "wrapped": sum(r["wrapped"] for r in plan["regions"]),
                "kept": sum(len(r["keep"]) for r in plan["regions"]),
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
