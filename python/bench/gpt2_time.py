"""Times capture + plan + apply of the 12-layer GPT-2 of torch_bench.py (docs/bench/torch.md)."""

import time

import torch
from torch_bench import build

import remat.torch as rt

model, inputs, desc = build("gpt2")
t0 = time.perf_counter()
g = rt.capture(model, inputs)
t1 = time.perf_counter()
p = rt.plan(g, "0.5x")
t2 = time.perf_counter()
h = rt.apply(model, p, inputs)
t3 = time.perf_counter()
print(
    f"{desc}: torch threads {torch.get_num_threads()}: capture {t1 - t0:.1f} s, "
    f"plan {t2 - t1:.2f} s, apply {t3 - t2:.3f} s, total {t3 - t0:.1f} s"
)
