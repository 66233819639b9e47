"""Sweeps every fixtures/manifest.json model with two remat binaries and compares them.

    python docs/bench/sweep_compare.py OLD_REMAT NEW_REMAT [--time-limit 0.3]

Each model is swept at the same budgets (fractions of its store-all peak) by both binaries;
prints, per binary, how many sweeps are not monotone (a larger budget costing more), and per
point whether the new overhead is lower, equal or higher, with the largest changes.
"""

import argparse
import json
import subprocess
from pathlib import Path

FRACTIONS = [0.99, 0.97, 0.95, 0.92, 0.9, 0.85, 0.8, 0.7, 0.6]
ROOT = Path(__file__).resolve().parents[2]


def sweep(remat: str, entry: dict, time_limit: float) -> list[dict]:
    args = [remat, "sweep", str(ROOT / "fixtures" / entry["file"]), "--json"]
    args += ["--time-limit", str(time_limit), "--fractions", ",".join(map(str, FRACTIONS))]
    for k, v in entry.get("dims", {}).items():
        args += ["--dim", f"{k}={v}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return sorted(json.loads(out)["points"], key=lambda p: p["budget_bytes"])


def not_monotone(points: list[dict]) -> bool:
    last = None
    for p in points:
        o = p["overhead"]
        if last is not None and (o is None or o > last + 1e-12):
            return True
        last = o if o is not None else last
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--time-limit", type=float, default=0.3)
    a = ap.parse_args()
    models = json.loads((ROOT / "fixtures/manifest.json").read_text())["models"]
    bad = {"old": [], "new": []}
    lower = equal = higher = 0
    changes: list[tuple[float, str]] = []
    for entry in models:
        old = sweep(a.old, entry, a.time_limit)
        new = sweep(a.new, entry, a.time_limit)
        for key, pts in (("old", old), ("new", new)):
            if not_monotone(pts):
                bad[key].append(entry["name"])
        for p, q in zip(old, new, strict=True):
            po, qo = p["overhead"], q["overhead"]
            if po is None and qo is None:
                continue
            if po is None or (qo is not None and qo < po - 1e-12):
                lower += 1
            elif qo is None or qo > po + 1e-12:
                higher += 1
            else:
                equal += 1
            if po is not None and qo is not None and abs(qo - po) > 1e-12:
                was = f"{100 * po:+.2f}% ({p['solver']})"
                now = f"{100 * qo:+.2f}% ({q['solver']})"
                changes.append((qo - po, f"{entry['name']} at {p['fraction']}x: {was} -> {now}"))
    print(f"models: {len(models)}, budgets per model: {len(FRACTIONS)}")
    for key in ("old", "new"):
        print(f"{key}: {len(bad[key])} sweeps not monotone {bad[key]}")
    print(f"new against old, per feasible point: {lower} lower, {equal} equal, {higher} higher")
    changes.sort()
    print("largest decreases:")
    for _d, line in changes[:8]:
        print(f"  {line}")
    print("increases:")
    for _d, line in [c for c in changes if c[0] > 0][-8:]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
