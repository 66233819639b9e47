"""One PyTorch training step of a torchvision model, timed the same way as remat's executor bench.

Prints one JSON line: {"torch": version, "threads": n, "seconds": [per step...]}.
Loss = mean of the logits (remat's loss on a model with one float output: the sum of the means).
Called by `cargo bench -p remat-planner --bench executor`; never at test time.
"""
import argparse
import json
import time

import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet18")
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--threads", type=int, required=True)
ap.add_argument("--iters", type=int, default=3)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = getattr(torchvision.models, a.model)(weights=None)
model.train()
x = torch.rand(a.batch, 3, a.size, a.size) * 2 - 1
times = []
for i in range(a.iters + 1):
    model.zero_grad(set_to_none=False)
    t0 = time.perf_counter()
    loss = model(x).mean()
    loss.backward()
    dt = time.perf_counter() - t0
    if i > 0:  # the first step warms up allocators and kernels
        times.append(dt)
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "seconds": times}))
