"""The torch.compile table of docs/bench/torch.md from compile_bench.py's JSON files.

python python/bench/compile_report.py a.json b.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}".replace("-", "−")


def span(r: list[float] | None) -> str:
    return "–" if not r else f"[{pct(r[0])}, {pct(r[1])}]"


def main() -> None:
    results: list[dict[str, Any]] = []
    for path in sys.argv[1:]:
        with open(path) as f:
            results += json.load(f)["results"]
    print(
        "| model | budget | compiled peak | its overhead vs compiled at 1.0 | vs eager | "
        "remat at that peak: measured peak | remat overhead (measured, range) | predicted |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m in results:
        print(
            f"| {m['model']} | 1.0 | {mib(m['compiled_unplanned_peak_bytes'])} | – | – | "
            f"unplanned eager: {mib(m['unplanned_peak_bytes'])} | – | – |"
        )
        for r in m["rows"]:
            ours = r["remat"]
            print(
                f"| {m['model']} | {r['activation_memory_budget']} | "
                f"{mib(r['measured_peak_bytes'])} | {pct(r['measured_overhead'])} "
                f"{span(r['measured_overhead_range'])} | {pct(r.get('overhead_vs_eager'))} "
                f"{span(r.get('overhead_vs_eager_range'))} | {mib(ours['measured_peak_bytes'])} "
                f"({ours['status']}) | {pct(ours['measured_overhead'])} "
                f"{span(ours['measured_overhead_range'])} | {pct(ours['predicted_overhead'])} |"
            )


if __name__ == "__main__":
    main()
