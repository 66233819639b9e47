#!/usr/bin/env bash
# The measurements of docs/bench/transformers.md: exports the deep GPT-2 models (random weights,
# nothing downloaded), sweeps the 96-layer one, and asks for the largest batch that fits on
# resnet50 and the 12-layer GPT-2. Release build; run from anywhere:
#   docs/bench/transformers.sh [OUT_DIR]      (REMAT=path/to/remat, PYTHON=python with torch)
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/remat/target}"
PYTHON="${PYTHON:-$HOME/.cache/remat/venv/bin/python}"
OUT="${1:-/tmp/remat-transformers}"
if [ -z "${REMAT:-}" ]; then
  cargo build --release -q -p remat-server --bin remat
  REMAT="$CARGO_TARGET_DIR/release/remat"
fi
mkdir -p "$OUT"
"$PYTHON" docs/bench/transformers_models.py "$OUT" >/dev/null

echo "## GPT-2, 96 layers (n_embd 64, batch 2, seq 64): sweep, 10 s per point"
"$REMAT" inspect "$OUT/gpt2_96.onnx" --dim batch=2 --dim seq=64 | grep -E "^(training|store-all)" || true
"$REMAT" sweep "$OUT/gpt2_96.onnx" --dim batch=2 --dim seq=64 \
  --fractions 1.0,0.9,0.8,0.7,0.6,0.5,0.4,0.32 --time-limit 10 --json > "$OUT/sweep_gpt2_96.json"
"$PYTHON" - "$OUT/sweep_gpt2_96.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("| budget | overhead | solver | from a lower budget |")
print("|---|---|---|---|")
for p in doc["points"]:
    o = p["overhead"]
    shown = "infeasible" if o is None else f"{100 * o:+.2f}%"
    reused = p.get("reused_from_budget_bytes")
    print(f"| {p['fraction']}x | {shown} | {p['solver']} | {reused if reused is not None else ''} |")
PY

echo
echo "## The largest batch that fits (--time-limit 5 per value)"
for args in \
  "fixtures/models/resnet50.legacy.onnx --device-memory 4GiB --max-overhead 10%" \
  "fixtures/models/resnet50.legacy.onnx --device-memory 4GiB --max-overhead 0%" \
  "$OUT/gpt2_12.onnx --dim seq=512 --device-memory 8GiB --max-overhead 10%" \
  "$OUT/gpt2_12.onnx --dim seq=512 --device-memory 8GiB --max-overhead 0%"; do
  echo "### remat plan $args --maximize batch"
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$REMAT" plan $args --maximize batch --time-limit 5 | sed -n '/^maximize/,/^status/p'
  echo "(wall $(echo "$(date +%s.%N) - $start" | bc) s)"
done

echo
echo "## Run on the executor: resnet50's largest batch in 600 MB at 25% overhead"
"$REMAT" plan fixtures/models/resnet50.legacy.onnx --device-memory 600MB --max-overhead 25% \
  --maximize batch --time-limit 5 --validate --json > "$OUT/resnet50_600MB.json"
"$PYTHON" - "$OUT/resnet50_600MB.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m, v = d["maximize"], d["validation"]
print(f"batch {m['value']} fits (batch {m['next_value']} does not): predicted peak "
      f"{d['predicted']['peak_bytes']}, measured {v.get('measured_peak_bytes')}, budget "
      f"{d['budget_bytes']}, overhead {100 * d['predicted']['overhead']:+.2f}%, checks ok: {v.get('ok')}")
PY
