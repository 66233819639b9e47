"""`remat sweep` on captured PyTorch graphs: the torch-sac frontier at eight budgets from the least
reachable peak to the unplanned one, with full checkpointing beside it, and the command's wall time
(release build, one process per graph). The tables of docs/bench/torch.md, "The sweep".

    python python/bench/torch_bench.py --graphs /tmp/graphs      # capture the five models
    python python/bench/torch_sweep.py /tmp/graphs/*.torch.json --remat target/release/remat
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import remat.torch as rt


def fractions(graph: dict, count: int = 8) -> list[float]:
    """`count` budgets as fractions of the unplanned peak, from the least reachable peak up (the
    viewer's grid: web/js/charts.js, sweepFractions)."""
    least = rt.plan(graph, "min")["min_peak_bytes"]
    unplanned = rt.simulate(graph)["peak_bytes"]
    lo = max(0.01, -(-least * 1000 // unplanned) / 1000)
    return [round(lo + (1 - lo) * i / (count - 1), 3) for i in range(count)]


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.2f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("graphs", nargs="+", type=Path)
    ap.add_argument("--remat", default="target/release/remat", help="the remat binary")
    args = ap.parse_args()
    for path in args.graphs:
        graph = json.loads(path.read_text())
        fr = fractions(graph)
        cmd = [args.remat, "sweep", str(path), "--fractions", ",".join(map(str, fr)), "--json"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - t0
        doc = json.loads(out)
        print(
            f"\n### {path.name}: {doc['graph']['nodes']} ops, {len(graph['regions'])} regions, "
            f"unplanned peak {doc['store_all_peak_bytes']:,} bytes; `remat sweep` {seconds:.2f} s\n"
        )
        print("| budget (of unplanned) | bytes | remat | status | gap (bound) | full |")
        print("|---|---|---|---|---|---|")
        for p in doc["points"]:
            full = dict(p["baselines"]).get("full")
            gap = "—"
            if p["gap"] is not None:
                gap = f"{p['gap'] * 100:.2f}% ({p['bound_source']})"
            print(
                f"| {p['fraction']:.3f} | {p['budget_bytes']:,} | {pct(p['overhead'])} | "
                f"{p['status']} | {gap} | {pct(full)} |"
            )


if __name__ == "__main__":
    main()
