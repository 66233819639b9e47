"""The segment program on deep models: plans at 0.1, 0.25, 0.5 and 0.75 of the way from the
least feasible budget to store-all's peak, against the best baseline (docs/bench/transformers.md).

    python docs/bench/segments_bench.py REMAT MODEL[:DIM=V,DIM=V] ...
"""

import json
import subprocess
import sys


def plan(remat: str, model: str, dims: list[str], budget: str) -> dict:
    args = [remat, "plan", model, "--budget", budget, "--time-limit", "10", "--json"]
    for d in dims:
        args += ["--dim", d]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    doc = json.loads(out.stdout)
    return doc.get("report", doc)


def main() -> None:
    remat = sys.argv[1]
    print("| model | budget | bytes | remat | solver | s | best baseline | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in sys.argv[2:]:
        model, _, dimspec = spec.partition(":")
        dims = [d for d in dimspec.split(",") if d]
        low = plan(remat, model, dims, "1")
        least, full = low["min_feasible_budget_bytes"], low["store_all_peak_bytes"]
        for frac in (0.1, 0.25, 0.5, 0.75):
            budget = int(least + frac * (full - least))
            r = plan(remat, model, dims, str(budget))
            fits = [b for b in r["baselines"] if b["feasible"] and b["name"] != "store-all"]
            best = min(fits, key=lambda b: b["overhead"]) if fits else None
            o = r["predicted"]["overhead"] if r["status"] != "infeasible" else None
            shown = "infeasible" if o is None else f"{100 * o:+.2f}%"
            if best is None:
                base, ratio = "none fits", ""
            else:
                base = f"{best['name']} {100 * best['overhead']:+.2f}%"
                ratio = (
                    f"{o / best['overhead']:.2f}" if o is not None and best["overhead"] > 0 else ""
                )
            name = model.rsplit("/", 1)[-1]
            print(
                f"| {name} | {frac} | {budget:,} | {shown} | {r['solver']} | "
                f"{r['solve_seconds']:.1f} | {base} | {ratio} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
