"""Why `remat.torch.measure` counts storages on the CPU and not with MemTracker: the peak of one
step of the unplanned model, and of remat's plans, by the simulator, by the storage count
(`_StorageMeter`, which hooks nothing), by the same count under ModTracker's module hooks alone,
and by MemTracker (docs/torch.md, "Measure").

    python python/bench/meter_check.py

Models (random weights, CPU, float32): a 2-layer BERT with GPT-2's activation (`gelu_new`,
whose module reads its input three times) and with `gelu` (read once), and a 6-layer ALBERT with
its pooler, which the loss leaves alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed._tools.mod_tracker import ModTracker
from transformers import AlbertConfig, AlbertModel, BertConfig, BertModel

import remat.torch as rt
from remat.torch._measure import _StorageMeter


def bert(act: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        hidden_act=act,
    )
    return BertModel(cfg, add_pooling_layer=False)


def albert() -> nn.Module:
    torch.manual_seed(0)
    cfg = AlbertConfig(
        vocab_size=1000,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return AlbertModel(cfg)


def loss(out: Any) -> torch.Tensor:
    return out.last_hidden_state.mean()


def storages(model: nn.Module, ids: torch.Tensor, hooks: Any) -> int:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(0)
    with hooks, _StorageMeter([*model.parameters(), *model.buffers(), ids]) as meter:
        loss(model(ids)).backward()
    return meter.peak


def memtracker(model: nn.Module, ids: torch.Tensor) -> int:
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(0)
    tracker = MemTracker()
    tracker.track_external(model, ids)
    with tracker:
        loss(model(ids)).backward()
    snap = tracker.get_tracker_snapshot("peak")
    return max(d["Total"] for d in snap.values())


def main() -> None:
    print(f"torch {torch.__version__}")
    header = f"{'model':14} {'plan':5} {'predicted':>10} {'storages':>10} {'+ModTracker':>12}"
    print(header + f" {'MemTracker':>11}")
    for name, model in (
        ("bert gelu_new", bert("gelu_new")),
        ("bert gelu", bert("gelu")),
        ("albert", albert()),
    ):
        model.train()
        torch.manual_seed(1)
        ids = torch.randint(0, 1000, (4, 64))
        graph = rt.capture(model, (ids,), loss)
        for label, plan in (
            ("none", rt.baseline(graph, "none")),
            ("min", rt.plan(graph, "min")),
            ("0.6x", rt.plan(graph, "0.6x")),
        ):
            with rt.apply(model, plan, (ids,)):
                plain = storages(model, ids, contextlib.nullcontext())
                hooked = storages(model, ids, ModTracker())
                mt = memtracker(model, ids)
            predicted = plan["predicted"]["peak_bytes"]
            print(
                f"{name:14} {label:5} {predicted:>10} {plain:>10} {hooked:>12} {mt:>11}"
                f"   storages {plain / predicted - 1:+.2%}  MemTracker {mt / predicted - 1:+.2%}"
            )


if __name__ == "__main__":
    main()
