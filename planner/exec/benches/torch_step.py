"""PyTorch's training step of a torchvision model, timed the same way as remat's executor bench.

Loss = mean of the logits (remat's loss on a model with one float output: the sum of the means).
Runs one warm-up step (allocators, kernels), prints `{"torch": version, "threads": n}` as one JSON
line, then runs one timed step for every line `step` it reads on stdin and answers each with
`{"seconds": s}`; it ends at end of input. The bench drives it step by step, alternating with
remat's steps, so that both sides' steps are measured minutes apart at most.
Called by `cargo bench -p remat-exec --bench executor`; never at test time.
"""
import argparse
import json
import sys
import time

import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="resnet18")
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--threads", type=int, required=True)
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = getattr(torchvision.models, a.model)(weights=None).to(a.device)
model.train()
x = (torch.rand(a.batch, 3, a.size, a.size) * 2 - 1).to(a.device)


def sync():
    if a.device == "cuda":
        torch.cuda.synchronize()


def step():
    model.zero_grad(set_to_none=False)
    sync()
    t0 = time.perf_counter()
    loss = model(x).mean()
    loss.backward()
    sync()
    return time.perf_counter() - t0


step()
print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "device": a.device}), flush=True)
for line in sys.stdin:
    if line.strip() != "step":
        print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
        continue
    print(json.dumps({"seconds": step()}), flush=True)
