"""remat.torch on CUDA with dropout, where checkpointing must restore the CUDA generator: the
gradients of planned steps against the unplanned step's (run on a GPU machine; the CPU's
generator is always restored, so the CPU cannot show this).

    python python/bench/cuda_rng_check.py

Two models of blocks with dropout: one calls its blocks with the hidden state positionally, one
as a keyword argument. `torch.utils.checkpoint` stashes the CUDA generator's state only for the
devices of its positional tensor arguments; remat.torch.apply passes a zero-size tensor on each
device that only the keyword arguments hold, so the re-run draws the forward's dropout masks. For
contrast, PyTorch's own non-reentrant checkpoint of the keyword-called blocks is measured too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import remat.torch as rt


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(self.drop(torch.relu(self.fc1(x)))))


class Stack(nn.Module):
    def __init__(self, keyword: bool, d: int = 256, n: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.keyword = keyword
        self.raw_checkpoint = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            if self.raw_checkpoint:
                x = checkpoint(b, x=x, use_reentrant=False)
            else:
                x = b(x=x) if self.keyword else b(x)
        return x


def grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    model(x).mean().backward()
    return {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


def max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in b)


def main() -> None:
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    for keyword in (False, True):
        torch.manual_seed(0)
        model = Stack(keyword).to(dev)
        x = torch.randn(8, 128, 256, device=dev)
        graph = rt.capture(model, (x,))
        lo = rt.plan(graph, "min")["min_peak_bytes"]
        hi = rt.simulate(graph)["peak_bytes"]
        for frac in (0.0, 0.5):
            plan = rt.plan(graph, int(lo + frac * (hi - lo)))
            v = rt.measure(model, (x,), plan, rounds=1, op_rounds=0)
            print(
                f"{'keyword' if keyword else 'positional'} blocks, plan at {frac}: "
                f"{sum(r['wrapped'] for r in plan['regions'])} wrapped, grad err "
                f"{v['grad_max_rel_err']:.1e}, peak {v['measured_peak_bytes']} / predicted "
                f"{v['predicted_peak_bytes']}",
                flush=True,
            )
        if keyword:
            base = grads(model, x)
            model.raw_checkpoint = True
            print(
                f"PyTorch's checkpoint(block, x=h): grad err {max_rel(grads(model, x), base):.1e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
