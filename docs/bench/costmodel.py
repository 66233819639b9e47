"""How well the solver's cost models predict what a plan costs on remat's CPU executor
(docs/cost-model.md).

    python docs/bench/costmodel.py TARGET_DIR OUT_DIR [--validate] [--runs N] [--also LABEL=RATES]

TARGET_DIR is the cargo target folder with release builds of `remat` and of the examples
`optimes` (remat-exec) and `fit_rates` (remat-planner). For each model below, at batch 1:

1. `optimes`, N times (5 by default; OUT_DIR/run1 ... runN): each training node's FLOPs,
   bytes moved and seconds (fastest of three store-all steps after a warm-up) on this machine;
   an op's time is its least over the N runs, since this machine's speed comes and goes in
   bursts that slow every op of a run alike (docs/cost-model.md);
2. `fit_rates` on the other eleven models' op times (leave one out): rates that never saw
   this model;
3. plans at 0.1, 0.25 and 0.5 of the way from the least peak to store-all's, with FLOPs, with
   remat's default rates, with the left-out rates and with the model's own rates (fitted to
   its own op times alone, what `remat calibrate MODEL` gives); each plan's predicted overhead against
   the *op-time overhead*: the same schedule's recomputations priced at the measured op times
   (what the step would cost if only its ops took time);
   `--also LABEL=RATES` (repeatable) adds plans with a rates file, e.g. an earlier version's
   defaults, side by side in the same run;
4. with `--validate`, `remat validate --plan` of the default-rates plan at 0.1: the executor's
   measured overhead (median of timed rounds against store-all, with their range).
"""

import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

MODELS = [
    ("resnet18", "models/resnet18.legacy.onnx", ["batch=1"]),
    ("mobilenet_v2", "models/mobilenet_v2.legacy.onnx", ["batch=1"]),
    ("vgg11", "models/vgg11.legacy.onnx", ["batch=1"]),
    ("gpt2", "models/gpt2.legacy.onnx", ["batch=1", "seq=32"]),
    ("bert", "models/bert.legacy.onnx", ["batch=1", "seq=32"]),
    ("deeplabv3_mnv3", "models/thirdparty/deeplabv3_mnv3.legacy17.onnx", ["batch=1"]),
    ("efficientnet_b0", "models/thirdparty/efficientnet_b0.legacy13.onnx", ["batch=1"]),
    ("llama", "models/thirdparty/llama.dynamo18.onnx", ["batch=1", "seq=32"]),
    ("vit_tiny", "models/thirdparty/vit_tiny.legacy17.onnx", ["batch=1"]),
    ("swin_small", "models/thirdparty/swin_small.legacy17.onnx", ["batch=1"]),
    ("convnext_tiny", "models/thirdparty/convnext_tiny.legacy15.onnx", ["batch=1"]),
    ("t5", "models/thirdparty/t5.legacy17.onnx", ["batch=1"]),
]
FRACTIONS = (0.1, 0.25, 0.5)
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def run(args: list[str], **kw) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True, **kw).stdout


def plan(remat: str, model: Path, dims: list[str], budget: int, extra: list[str]) -> dict:
    args = [
        remat,
        "plan",
        str(model),
        "--budget",
        str(budget),
        "--time-limit",
        "5",
        "--json",
        *extra,
    ]
    for d in dims:
        args += ["--dim", d]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    return json.loads(out.stdout)


def op_time_overhead(doc: dict, seconds: dict[str, float]) -> float:
    counts = Counter(s["node"] for s in doc["schedule"] if s["op"] == "compute")
    base = sum(seconds.values())
    extra = sum(seconds[n] * (c - 1) for n, c in counts.items() if c > 1)
    return extra / base


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    target, out = Path(argv[0]), Path(argv[1])
    validate = "--validate" in argv
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 5
    also = [
        tuple(argv[i + 1].split("=", 1)) for i, a in enumerate(argv) if a == "--also"
    ]
    out.mkdir(parents=True, exist_ok=True)
    remat = str(target / "release" / "remat")
    optimes = str(target / "release" / "examples" / "optimes")
    fit = str(target / "release" / "examples" / "fit_rates")
    # The runs interleave the models, so a slow spell of the machine slows one run of each.
    for i in range(1, runs + 1):
        (out / f"run{i}").mkdir(exist_ok=True)
        for name, file, dims in MODELS:
            tsv = out / f"run{i}" / f"{name}.tsv"
            if not tsv.exists():
                tsv.write_text(run([optimes, str(FIXTURES / file), *dims]))
    print("| model | budget | plan | predicted | op-time | error |")
    print("|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {
        "flops": [],
        "default rates": [],
        "left-out rates": [],
        "own rates": [],
    }
    for label, _ in also:
        errors[label] = []
    for name, file, dims in MODELS:
        seconds: dict[str, float] = {}
        for i in range(1, runs + 1):
            for line in (out / f"run{i}" / f"{name}.tsv").read_text().splitlines():
                r = line.split("\t")
                seconds[r[6]] = min(seconds.get(r[6], float("inf")), float(r[5]))
        others = [
            str(out / f"run{i}" / f"{n}.tsv")
            for n, _, _ in MODELS
            if n != name
            for i in range(1, runs + 1)
        ]
        loo = out / f"{name}.rates.json"
        loo.write_text(run([fit, *others]))
        own = out / f"{name}.own.rates.json"
        own.write_text(
            run([fit, *(str(out / f"run{i}" / f"{name}.tsv") for i in range(1, runs + 1))])
        )
        model = FIXTURES / file
        low = plan(remat, model, dims, 1, [])
        least, full = low["min_feasible_budget_bytes"], low["store_all_peak_bytes"]
        for frac in FRACTIONS:
            budget = int(least + frac * (full - least))
            for label, extra in (
                ("flops", ["--cost", "flops"]),
                ("default rates", []),
                ("left-out rates", ["--rates", str(loo)]),
                ("own rates", ["--rates", str(own)]),
                *((label, ["--rates", path]) for label, path in also),
            ):
                doc = plan(remat, model, dims, budget, extra)
                if doc.get("status") == "infeasible":
                    continue
                predicted = doc["predicted"]["overhead"]
                actual = op_time_overhead(doc, seconds)
                err = predicted / actual - 1 if actual > 0 else float("nan")
                if actual >= 0.01:
                    errors[label].append(abs(err))
                print(
                    f"| {name} | {frac} | {label} | {100 * predicted:+.2f}% | "
                    f"{100 * actual:+.2f}% | {100 * err:+.0f}% |",
                    flush=True,
                )
                if validate and label == "default rates" and frac == FRACTIONS[0]:
                    path = out / f"{name}.plan.json"
                    path.write_text(json.dumps(doc))
                    vargs = [remat, "validate", str(model), "--plan", str(path), "--json"]
                    for d in dims:
                        vargs += ["--dim", d]
                    v = json.loads(
                        subprocess.run(vargs, capture_output=True, text=True, check=False).stdout
                    )
                    v = v.get("validation", v)
                    lo, hi = v["measured_overhead_range"]
                    print(
                        f"| {name} | {frac} | executor | {100 * v['predicted_overhead']:+.2f}% | "
                        f"{100 * v['measured_overhead']:+.2f}% "
                        f"(rounds {100 * lo:+.1f}% to {100 * hi:+.1f}%) | |",
                        flush=True,
                    )
    print()
    print("| costs | plans (op-time overhead ≥ 1%) | median error | within ±25% |")
    print("|---|---|---|---|")
    for label, errs in errors.items():
        within = sum(1 for e in errs if e <= 0.25)
        med = statistics.median(errs) if errs else float("nan")
        print(f"| {label} | {len(errs)} | {100 * med:.0f}% | {within} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
