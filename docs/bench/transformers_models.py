"""Deep GPT-2 models for docs/bench/transformers.md, random weights, nothing downloaded.

    python docs/bench/transformers_models.py OUT_DIR

writes gpt2_12.onnx (GPT-2 small: 12 layers, n_embd 768, 12 heads, vocab 50257) and
gpt2_96.onnx (96 layers, n_embd 64, 4 heads, vocab 1024), both through the legacy
(TorchScript) exporter at opset 17 without weights, with `batch` and `seq` symbolic.
"""

import sys
import warnings
from pathlib import Path

import torch
import transformers

MODELS: dict[str, dict[str, int]] = {
    "gpt2_12": {
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    },
    "gpt2_96": {"n_layer": 96, "n_embd": 64, "n_head": 4, "vocab_size": 1024, "n_positions": 128},
}


class Logits(torch.nn.Module):
    """GPT2LMHeadModel on input_ids alone (an all-ones mask built inside), returning the logits."""

    def __init__(self, config: transformers.GPT2Config) -> None:
        super().__init__()
        self.model = transformers.GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def export(name: str, out: Path) -> Path:
    config = transformers.GPT2Config(
        **MODELS[name],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = Logits(config).eval()
    ids = torch.zeros(2, 64, dtype=torch.long)
    path = out / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (ids,),
            str(path),
            dynamo=False,
            export_params=False,
            opset_version=17,
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=False,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
        )
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        print(export(name, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
