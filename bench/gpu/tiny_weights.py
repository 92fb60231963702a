"""Give a tiny model real (random, initialised) weights, so that its greedy output depends on its state.

    VENV/bin/python bench/gpu/tiny_weights.py STORE/tiny-qwen35-hybrid STORE/tiny-qwen35-hybrid-w

`--load-format dummy` fills every weight with small uniform noise: the tiny hybrid target then answers the same
token over and over whatever it was asked, so two services that disagree about the linear-attention state still print
the same text. This builds the model from its config with transformers' own initialisation (normal, std
`initializer_range`; the Gated DeltaNet's A_log and dt_bias as transformers sets them), seed 0, and saves it as a
safetensors checkpoint (bf16) beside the config, tokenizer and processor files: served with `load-format: auto` (and
the draft kept `speculative-draft-load-format: dummy`), plain decoding and every speculative algorithm must give the
same greedy text. Needs torch, transformers and safetensors: run it with a service venv's python.
"""

import shutil
import sys
from pathlib import Path


def main(source: str, dest: str) -> None:
    import torch
    import transformers
    from transformers import AutoConfig

    src, out = Path(source), Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    config = AutoConfig.from_pretrained(src)
    model_class = getattr(transformers, config.architectures[0])
    torch.manual_seed(0)
    model = model_class(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    size = sum(p.numel() for p in model.parameters())
    print(f"{out.name}: {config.architectures[0]} with initialised weights, {size / 1e6:.1f} M parameters, seed 0")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
