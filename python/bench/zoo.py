"""Architectures beyond the benchmark's five, as a new user would bring them: small configs with
random weights of Hugging Face decoders (Mistral, Qwen2, Gemma, Phi, GPT-NeoX, the mixtures of
experts Mixtral and Qwen2-MoE), GPT-2 fine-tuned with LoRA adapters in bfloat16 autocast,
encoders and encoder-decoders (DistilBERT, ViT, T5, Whisper with its frozen positional
embedding) and torchvision's image models. For each: one step captured
(FLOPs costs), its default regions, plans at ¼, ½ and ¾ of the way from the least peak to the
unplanned one, each measured in PyTorch (`remat.torch.measure`, one pair): measured against
predicted peak, the largest gradient error, `ok`. A line per model and a JSON line per plan.

    python python/bench/zoo.py                  # every model
    python python/bench/zoo.py --models t5 swin_t
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision.models as tv
import transformers as hf
from torch import nn

import remat.torch as rt

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "vocab_size": 1000,
}


def ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, 1000, (batch, seq))


class Logits(nn.Module):
    """A Hugging Face model called by keyword, its logits out, no key/value cache."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...], cache: bool) -> None:
        super().__init__()
        self.model, self.keys, self.cache = model, keys, cache

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = dict(zip(self.keys, args, strict=True))
        if self.cache:
            kwargs["use_cache"] = False
        return self.model(**kwargs).logits


def decoder(cls: Any, config: Any, **extra: Any) -> Callable[[], tuple[nn.Module, tuple]]:
    return lambda: (Logits(cls(config(**SMALL, **extra)), ("input_ids",), True), (ids(2, 32),))


def torchvision(name: str, size: int = 64, **kw: Any) -> Callable[[], tuple[nn.Module, tuple]]:
    return lambda: (getattr(tv, name)(num_classes=10, **kw), (torch.randn(2, 3, size, size),))


def t5() -> tuple[nn.Module, tuple]:
    config = hf.T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    model = Logits(hf.T5ForConditionalGeneration(config), ("input_ids", "decoder_input_ids"), True)
    return model, (ids(2, 32), ids(2, 16))


def whisper() -> tuple[nn.Module, tuple]:
    config = hf.WhisperConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
    )
    model = Logits(
        hf.WhisperForConditionalGeneration(config), ("input_features", "decoder_input_ids"), True
    )
    return model, (torch.randn(2, 16, 64), ids(2, 8))


def vit() -> tuple[nn.Module, tuple]:
    config = hf.ViTConfig(**{**SMALL, "vocab_size": 0}, image_size=64, patch_size=4)
    return Logits(hf.ViTForImageClassification(config), ("pixel_values",), False), (
        torch.randn(2, 3, 64, 64),
    )


def distilbert() -> tuple[nn.Module, tuple]:
    config = hf.DistilBertConfig(vocab_size=1000, dim=64, hidden_dim=128, n_layers=3, n_heads=4)
    return Logits(hf.DistilBertForMaskedLM(config), ("input_ids",), False), (ids(2, 32),)


class LoRA(nn.Module):
    """A rank-4 adapter beside a frozen GPT-2 `Conv1D` (weight stored in × out)."""

    def __init__(self, base: nn.Module, rank: int = 4) -> None:
        super().__init__()
        self.base = base
        d_in, d_out = base.weight.shape
        self.a = nn.Parameter(torch.randn(d_in, rank) * 0.01)
        self.b = nn.Parameter(torch.zeros(rank, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a) @ self.b


class Bf16(nn.Module):
    """The forward under CPU autocast to bfloat16, logits back in float32."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(input_ids=ids).logits.float()


def gpt2_lora_bf16() -> tuple[nn.Module, tuple]:
    """Fine-tuning as many do it: base weights frozen, adapters on the attention's input
    projection, the step in bfloat16 autocast."""
    config = hf.GPT2Config(
        n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=1000, use_cache=False
    )
    model = hf.GPT2LMHeadModel(config)
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.transformer.h:
        block.attn.c_attn = LoRA(block.attn.c_attn)
    return Bf16(model), (ids(2, 64),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    "mistral": decoder(
        hf.MistralForCausalLM, hf.MistralConfig, num_key_value_heads=2, sliding_window=16
    ),
    "qwen2": decoder(hf.Qwen2ForCausalLM, hf.Qwen2Config, num_key_value_heads=2),
    "gemma": decoder(hf.GemmaForCausalLM, hf.GemmaConfig, num_key_value_heads=1, head_dim=16),
    "phi": decoder(hf.PhiForCausalLM, hf.PhiConfig),
    "gpt_neox": decoder(hf.GPTNeoXForCausalLM, hf.GPTNeoXConfig),
    "mixtral": decoder(
        hf.MixtralForCausalLM,
        hf.MixtralConfig,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "qwen2_moe": decoder(
        hf.Qwen2MoeForCausalLM,
        hf.Qwen2MoeConfig,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    ),
    "gpt2_lora_bf16": gpt2_lora_bf16,
    "distilbert": distilbert,
    "vit": vit,
    "t5": t5,
    "whisper": whisper,
    "swin_t": torchvision("swin_t"),
    "convnext_tiny": torchvision("convnext_tiny"),
    "efficientnet_b0": torchvision("efficientnet_b0"),
    "mobilenet_v3_small": torchvision("mobilenet_v3_small"),
    "mnasnet0_5": torchvision("mnasnet0_5"),
    "regnet_y_400mf": torchvision("regnet_y_400mf"),
    "shufflenet_v2_x0_5": torchvision("shufflenet_v2_x0_5"),
    "resnext50_32x4d": torchvision("resnext50_32x4d"),
    "densenet121": torchvision("densenet121"),
    "squeezenet1_0": torchvision("squeezenet1_0"),
    "googlenet": torchvision("googlenet", aux_logits=False, init_weights=False),
    "inception_v3": torchvision("inception_v3", 299, aux_logits=False, init_weights=False),
    "vgg11": torchvision("vgg11"),
    "maxvit_t": torchvision("maxvit_t", 224),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args()
    failed = 0
    for name in args.models:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        model, inputs = MODELS[name]()
        model.train()
        graph = rt.capture(model, inputs)
        least = rt.plan(graph, "min")
        lo, hi = least["min_peak_bytes"], least["unplanned_peak_bytes"]
        classes = sorted({r["class"] for r in graph["regions"]})
        print(
            f"{name}: {len(graph['ops'])} ops, {len(graph['regions'])} regions "
            f"({', '.join(classes) or 'none'}), least peak {lo}, unplanned {hi}",
            file=sys.stderr,
        )
        for f in (0.25, 0.5, 0.75):
            budget = int(lo + f * (hi - lo))
            plan = rt.plan(graph, budget)
            v = rt.measure(model, inputs, plan, rounds=1, op_rounds=0)
            failed += not v["ok"]
            print(
                json.dumps(
                    {
                        "model": name,
                        "fraction": f,
                        "budget_bytes": budget,
                        "status": plan["status"],
                        "predicted_peak_bytes": v["predicted_peak_bytes"],
                        "measured_peak_bytes": v["measured_peak_bytes"],
                        "peak_meter": v["peak_meter"],
                        "memtracker_peak_bytes": v["memtracker_peak_bytes"],
                        "predicted_overhead": v["predicted_overhead"],
                        "grad_max_rel_err": v["grad_max_rel_err"],
                        "wrapped": sum(r["wrapped"] for r in plan["regions"]),
                        "ok": v["ok"],
                        "problems": v["problems"],
                    }
                ),
                flush=True,
            )
        print(f"  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
