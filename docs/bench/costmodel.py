"""How well the solver's cost models predict what a plan costs on remat's CPU executor
(docs/cost-model.md).

    python docs/bench/costmodel.py TARGET_DIR OUT_DIR [--validate]

TARGET_DIR is the cargo target folder with release builds of `remat` and of the examples
`optimes` (remat-exec) and `fit_rates` (remat-planner). For each model below, at batch 1:

1. `optimes`: each training node's FLOPs, bytes moved and seconds (fastest of three store-all
   steps after a warm-up) on this machine;
2. `fit_rates` on the other eleven models' op times (leave one out): rates that never saw
   this model;
3. plans at 0.1, 0.25 and 0.5 of the way from the least peak to store-all's, with FLOPs, with
   remat's default rates and with the left-out rates; each plan's predicted overhead against
   the *op-time overhead*: the same schedule's recomputations priced at the measured op times
   (what the step would cost if only its ops took time);
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
    out.mkdir(parents=True, exist_ok=True)
    remat = str(target / "release" / "remat")
    optimes = str(target / "release" / "examples" / "optimes")
    fit = str(target / "release" / "examples" / "fit_rates")
    for name, file, dims in MODELS:
        tsv = out / f"{name}.tsv"
        if not tsv.exists():
            tsv.write_text(run([optimes, str(FIXTURES / file), *dims]))
    print("| model | budget | plan | predicted | op-time | error |")
    print("|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"flops": [], "default rates": [], "left-out rates": []}
    for name, file, dims in MODELS:
        rows = [line.split("\t") for line in (out / f"{name}.tsv").read_text().splitlines()]
        seconds = {r[6]: float(r[5]) for r in rows}
        others = [str(out / f"{n}.tsv") for n, _, _ in MODELS if n != name]
        loo = out / f"{name}.rates.json"
        loo.write_text(run([fit, *others]))
        model = FIXTURES / file
        low = plan(remat, model, dims, 1, [])
        least, full = low["min_feasible_budget_bytes"], low["store_all_peak_bytes"]
        for frac in FRACTIONS:
            budget = int(least + frac * (full - least))
            for label, extra in (
                ("flops", ["--cost", "flops"]),
                ("default rates", []),
                ("left-out rates", ["--rates", str(loo)]),
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
