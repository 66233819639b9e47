"""Where `auto` answers differently than "more time or more memory never costs more": plans of a
few models and graphs at several time limits, and at a budget near the least peak against the
least budget itself, with one or two remat binaries side by side.

    python3 docs/bench/search_monotone.py REMAT [OTHER_REMAT]

Each row: the model, the budget (a fraction of the way from the least budget to store-all's
peak, or of store-all's peak with an x), the time limit, and per binary the plan's overhead,
the solver that found it and the wall time. Needs ../shared/bench/graphs (Checkmate's graphs).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "fixtures" / "models" / "thirdparty"
GRAPHS = ROOT.parent / "shared" / "bench" / "graphs"

CASES = [
    (
        "gpt2_sdpa",
        [
            str(MODELS / "gpt2_sdpa.dynamo18.onnx"),
            "--dim",
            "batch=2",
            "--dim",
            "seq=32",
        ],
        [0.1],
        [3, 10, 30],
    ),
    (
        "distilbert",
        [
            str(MODELS / "distilbert.legacy13.onnx"),
            "--dim",
            "batch=2",
            "--dim",
            "seq=32",
        ],
        [0.1],
        [3, 10, 30],
    ),
    (
        "r3d_18",
        [str(MODELS / "r3d_18.legacy17.onnx"), "--dim", "batch=2"],
        ["min", 0.1, 0.25],
        [30],
    ),
    (
        "random n250",
        [str(GRAPHS / "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json")],
        ["min", "0.75x"],
        [2, 30],
    ),
    (
        "random n100",
        [str(GRAPHS / "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json")],
        ["0.7x"],
        [5, 30],
    ),
]


def plan(remat: str, args: list[str], budget: str, limit: float) -> str:
    start = time.time()
    out = subprocess.run(
        [
            remat,
            "plan",
            *args,
            "--budget",
            budget,
            "--time-limit",
            str(limit),
            "--json",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    seconds = time.time() - start
    doc = json.loads(out.stdout)
    if doc["status"] == "infeasible":
        return f"infeasible {seconds:.1f} s"
    return (
        f"{100 * doc['predicted']['overhead']:+.2f}% ({doc['solver']}, {seconds:.1f} s)"
    )


def way(remat: str, args: list[str], fraction: float) -> str:
    """The budget `fraction` of the way from the least budget to store-all's peak."""
    out = subprocess.run(
        [remat, "plan", *args, "--budget", "1", "--json"],
        check=False,
        capture_output=True,
        text=True,
    )
    doc = json.loads(out.stdout)
    low, high = doc["min_feasible_budget_bytes"], doc["store_all_peak_bytes"]
    return str(int(low + fraction * (high - low)))


def main() -> None:
    binaries = sys.argv[1:]
    if not binaries:
        sys.exit(__doc__)
    for name, args, budgets, limits in CASES:
        for b in budgets:
            budget = way(binaries[0], args, b) if isinstance(b, float) else b
            for limit in limits:
                cells = "   ".join(plan(r, args, budget, limit) for r in binaries)
                print(
                    f"{name:12s} {b!s:6s} ({budget:>10s} B)  {limit:>3} s   {cells}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
