"""`remat` binaries side by side on the executor: each validates the same plans, interleaved.

    python3 docs/bench/validate_ab.py PLANS_DIR LABEL=REMAT [LABEL=REMAT ...] [--pairs N]
        [--timing-rounds R]

PLANS_DIR is a `costmodel.py --validate` output folder (its `MODEL.plan.json`, the default-rates
plans at 0.1). For each of costmodel.py's models that has a plan there, N times (default 2), each
binary runs `remat validate MODEL --plan PLAN --json`, one after the other; a row per run: the
predicted and measured overhead, the range of the timing rounds, their number, the overhead of
the steps' least times (`measured_step_overhead`, where the binary reports it), store-all's step,
the run's wall time and the system time the process spent (page faults show there). With
`--timing-rounds R`, every run asks for at least R timing rounds.
"""

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from costmodel import FIXTURES, MODELS


def main(argv: list[str]) -> int:
    pairs = 2
    if "--pairs" in argv:
        i = argv.index("--pairs")
        pairs = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    rounds: list[str] = []
    if "--timing-rounds" in argv:
        i = argv.index("--timing-rounds")
        rounds = ["--timing-rounds", argv[i + 1]]
        argv = argv[:i] + argv[i + 2 :]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    plans = Path(argv[0])
    bins = [tuple(a.split("=", 1)) for a in argv[1:]]
    print(
        "| model | binary | predicted | measured | rounds' range | rounds | least steps | "
        "store-all step | wall | system time |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, file, dims in MODELS:
        plan = plans / f"{name}.plan.json"
        if not plan.exists():
            continue
        for _ in range(pairs):
            for label, remat in bins:
                args = [
                    remat,
                    "validate",
                    str(FIXTURES / file),
                    "--plan",
                    str(plan),
                    "--json",
                    *rounds,
                ]
                for d in dims:
                    args += ["--dim", d]
                before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
                start = time.monotonic()
                out = subprocess.run(args, capture_output=True, text=True, check=False)
                wall = time.monotonic() - start
                sys_s = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before
                if out.returncode not in (0, 1):
                    print(f"| {name} | {label} | failed: {out.stderr.strip()[:200]} |")
                    continue
                v = json.loads(out.stdout)
                v = v.get("validation", v)
                lo, hi = v["measured_overhead_range"]
                step = v.get("measured_step_overhead")
                steps = "" if step is None else f"{100 * step:+.2f}%"
                print(
                    f"| {name} | {label} | {100 * v['predicted_overhead']:+.2f}% | "
                    f"{100 * v['measured_overhead']:+.2f}% | {100 * lo:+.1f}% to {100 * hi:+.1f}% | "
                    f"{v['timing_rounds']} | {steps} | {v['store_all_step_seconds']:.3f} s | {wall:.1f} s | "
                    f"{sys_s:.1f} s |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
