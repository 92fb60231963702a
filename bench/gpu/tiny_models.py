"""Make two tiny models for a real-GPU serving check, offline and with the standard library only.

    python3 bench/gpu/tiny_models.py STORE      # -> STORE/tiny-qwen3, STORE/tiny-qwen3-dflash

`tiny-qwen3` is a Qwen3ForCausalLM config (4 layers, hidden 256, vocab 1024) with a word-level
tokenizer (tokenizer.json, the `tokenizers` format) and a chat template; `tiny-qwen3-dflash` is a
matching DFlash draft (DFlashDraftModel, 1 layer, block size 4, the mask token in the target's vocab).
Neither has weights: the services load them with `--load-format dummy` (random weights), which
is all a check of the install, the flags, the kernels and the serving path needs.
"""

import json
import sys
from pathlib import Path

VOCAB = 1024
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>", "<unk>"]
DIMS = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
}
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tokenizer_files(directory: Path) -> None:
    words = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
    vocab = {token: i for i, token in enumerate(SPECIAL + words)}
    added = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for t in SPECIAL
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "mask_token": "<|MASK|>",
        "model_max_length": 4096,
        "chat_template": TEMPLATE,
    }, indent=1))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "max_new_tokens": 16}))


def main(store: str) -> None:
    target = Path(store) / "tiny-qwen3"
    draft = Path(store) / "tiny-qwen3-dflash"
    for directory in (target, draft):
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer_files(directory)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 4, **DIMS,
    }, indent=1))
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1, **DIMS,
        "num_target_layers": 4,
        "dflash_config": {"block_size": 4, "mask_token": "<|MASK|>", "mask_token_id": SPECIAL.index("<|MASK|>")},
    }, indent=1))
    print(f"tiny models in {store}: {target.name}, {draft.name}")


if __name__ == "__main__":
    main(sys.argv[1])
