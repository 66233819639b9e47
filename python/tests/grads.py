"""What the tests compare a planned step with: every parameter's gradient, exactly."""

from __future__ import annotations

import torch
from torch import nn


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def same_grads(a: nn.Module, b: nn.Module) -> None:
    ga, gb = grads_of(a), grads_of(b)
    assert ga.keys() == gb.keys()
    for n in ga:
        assert torch.equal(ga[n], gb[n]), n
