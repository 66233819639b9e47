"""Renders torch_bench.py's JSON as the Markdown tables of docs/bench/torch.md.

python python/bench/torch_report.py out.json [more.json ...]   # runs of the same settings, merged
"""

from __future__ import annotations

import json
import sys


def mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def main() -> None:
    data = json.load(open(sys.argv[1]))
    for more in sys.argv[2:]:
        other = json.load(open(more))
        keys = ("torch", "threads", "rounds", "op_rounds", "timing_rounds", "cost")
        differ = [k for k in keys if other.get(k) != data.get(k)]
        if differ:
            sys.exit(f"{more}: other settings than {sys.argv[1]}: {', '.join(differ)}")
        data["results"] += other["results"]
    print(
        f"torch {data['torch']}, {data['threads']} thread(s), {data['rounds']} timed pairs, "
        f"{data.get('op_rounds', 0)} op-timed pairs, cost={data['cost']} "
        f"({data.get('timing_rounds', 1)} capture rounds)\n"
    )
    print("| model | ops (fwd) | regions | capture+plan+apply | least peak MiB | unplanned MiB |")
    print("|---|---|---|---|---|---|")
    for r in data["results"]:
        print(
            f"| {r['description']} | {r['ops']} ({r['forward_ops']}) | {r['regions']} | "
            f"{r['capture_plan_apply_seconds_flops']:.1f} s | {mib(r['min_peak_bytes'])} | "
            f"{mib(r['unplanned_peak_bytes'])} |"
        )
    print(
        "\n| model | at | budget MiB | predicted MiB | measured MiB | diff | grad err | "
        "overhead predicted | measured (median) | range | ops at their least | "
        "predicted / least − 1 | predicted / median − 1 | without the wrap price: predicted, "
        "/ median − 1 | plan |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    within: list[bool] = []
    within_median: list[bool] = []
    within_median_ops_only: list[bool] = []
    priced = any(r.get("wrap_cost") for r in data["results"])
    for r in data["results"]:
        for row in r["rows"]:
            lo, hi = row["measured_overhead_range"]
            least = row.get("measured_step_overhead")
            rel = row["predicted_overhead"] / least - 1 if least else None
            if rel is not None:
                within.append(abs(rel) <= 0.25)
            median = row["measured_overhead"]
            vs_median = row["predicted_overhead"] / median - 1 if median > 0 else None
            within_median.append(vs_median is not None and abs(vs_median) <= 0.25)
            ops_only = row.get("predicted_overhead_ops_only")
            old = ops_only / median - 1 if median > 0 and ops_only is not None else None
            if priced and ops_only is not None:
                within_median_ops_only.append(old is not None and abs(old) <= 0.25)
            print(
                f"| {r['model']} | {row['fraction']} | {mib(row['budget_bytes'])} | "
                f"{mib(row['predicted_peak_bytes'])} | {mib(row['measured_peak_bytes'])} | "
                f"{row['peak_rel_diff'] * 100:+.2f}% | {row['grad_max_rel_err']:.1e} | "
                f"{pct(row['predicted_overhead'])} | {pct(row['measured_overhead'])} | "
                f"[{pct(lo)}, {pct(hi)}] | {pct(least) if least is not None else '–'} | "
                f"{f'{rel * 100:+.0f}%' if rel is not None else '–'} | "
                f"{f'{vs_median * 100:+.0f}%' if vs_median is not None else '–'} | "
                f"{pct(ops_only) if ops_only is not None else '–'}, "
                f"{f'{old * 100:+.0f}%' if old is not None else '–'} | "
                f"{row['plan_seconds'] * 1000:.0f} ms, "
                f"{row['wrapped']} wrapped, {row['kept_ops']} kept |"
            )
    if within:
        print(f"\npredicted within ±25% of the ops at their least: {sum(within)} of {len(within)}")
    print(
        f"predicted within ±25% of the step-time median: {sum(within_median)} of "
        f"{len(within_median)}"
    )
    if within_median_ops_only:
        print(
            "without the wrap price (the captured ops only), within ±25% of the median: "
            f"{sum(within_median_ops_only)} of {len(within_median_ops_only)}"
        )
        print("\n| model | wrap price per op | unplanned step | how it was measured |")
        print("|---|---|---|---|")
        for r in data["results"]:
            w = r.get("wrap_cost") or {}
            if w:
                print(
                    f"| {r['model']} | {w['per_op'] * 1e6:.1f} µs | {w['step'] * 1e3:.2f} ms | "
                    f"{w['source']} |"
                )
    print(
        "\n| model | PyTorch's option | its peak MiB | its overhead | remat's peak MiB | "
        "remat's overhead | remat / theirs |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in data["results"]:
        for c in r["compare"]:
            t, o = c["theirs"], c["remat"]
            ratio = (1 + o["measured_overhead"]) / (1 + t["measured_overhead"])
            print(
                f"| {r['model']} | {c['baseline']} | {mib(t['measured_peak_bytes'])} | "
                f"{pct(t['measured_overhead'])} | {mib(o['measured_peak_bytes'])} | "
                f"{pct(o['measured_overhead'])} ({c['remat_status']}) | {ratio:.3f} |"
            )


if __name__ == "__main__":
    main()
