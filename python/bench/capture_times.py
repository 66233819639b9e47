"""How close a capture's measured op times are to the ops' least times in later steps.

For each model: capture with `cost="measured"` and `timing_rounds` 1 and 3, then time every aten op
of `--steps` plain steps (no plan), each op at its least; prints the sum of each capture's op times
against that least sum (docs/torch.md, "How capture works").

    python python/bench/capture_times.py --models resnet18 --steps 6 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
from torch_bench import build

import remat.torch as rt
from remat.torch._measure import _LeastOps, _op_timed_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in args.models.split(","):
        model, inputs, _ = build(name)
        sums = {}
        for rounds in (1, 3):
            t0 = time.perf_counter()
            g = rt.capture(model, inputs, rt.default_loss, cost="measured", timing_rounds=rounds)
            sums[rounds] = (sum(o["cost"] for o in g["ops"]), time.perf_counter() - t0)
        least = _LeastOps("unplanned")
        for _ in range(args.steps):
            least.add(*_op_timed_step(model, inputs, rt.default_loss, 0, torch.device("cpu")))
        total = least.total()
        print(
            f"{name}: ops at their least over {args.steps} steps {total:.3f} s; capture, "
            + "; ".join(
                f"{r} round(s): {s:.3f} s = {s / total:.2f}x (captured in {t:.1f} s)"
                for r, (s, t) in sums.items()
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
