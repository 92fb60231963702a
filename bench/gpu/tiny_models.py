"""Make tiny models for a real-GPU serving check, offline and with the standard library only.

    python3 bench/gpu/tiny_models.py STORE      # -> STORE/tiny-qwen3, STORE/tiny-qwen3-dflash,
                                                #    STORE/tiny-qwen35-hybrid, STORE/tiny-qwen35-hybrid-dflash

`tiny-qwen3` is a Qwen3ForCausalLM config (4 layers, hidden 256, vocab 1024) with a word-level
tokenizer (tokenizer.json, the `tokenizers` format) and a chat template; `tiny-qwen3-dflash` is a
matching DFlash draft (DFlashDraftModel, 1 layer, block size 4, the mask token in the target's vocab).

`tiny-qwen35-hybrid` is the architecture sglang 0.5.13 serves Qwen3.5/3.6 checkpoints with (Qwen3.6-27B's
config.json names Qwen3_5ForConditionalGeneration, model_type qwen3_5; sglang's models/qwen3_5.py registers only
the ConditionalGeneration classes, and treats them as hybrid: mamba radix cache, the `mamba-*` flags): a text
model of 8 layers, three Gated DeltaNet (linear attention) layers then one gated full-attention layer, twice
(`full_attention_interval` 4, as Qwen3.6-27B's 64), with Qwen3.6-27B's head shapes (attention head_dim 256,
partial rotary 0.25 with interleaved M-RoPE; linear key/value heads of 128, fp32 SSM state) at hidden 256, vocab
1024, and a one-block vision tower (never run: no request carries an image, but sglang builds it and its
processor). `tiny-qwen35-hybrid-dflash` is a matching DFlash draft: 2 layers, block size 16 (Qwen3.6-27B-DFlash's),
hidden = the target's, `target_layer_ids` [1, 3, 6] (two linear layers and a full-attention one: DFlash reads the
target's hidden states after those layers, `set_dflash_layers_to_capture`), `num_target_layers` 8.

None has weights: the services load them with `--load-format dummy` (random weights), which
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


def tokenizer_files(directory: Path, special: list[str] = SPECIAL) -> None:
    words = [f"w{i}" for i in range(VOCAB - len(special))]
    vocab = {token: i for i, token in enumerate(special + words)}
    added = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for t in special
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


# The hybrid target's tokenizer adds Qwen3.5's vision tokens (its processor and sglang's look them up).
VISION_SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
HYBRID_SPECIAL = SPECIAL + VISION_SPECIAL
HYBRID_LAYERS = 8
HYBRID_TEXT = {
    "model_type": "qwen3_5_text",
    "vocab_size": VOCAB,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": HYBRID_LAYERS,
    "full_attention_interval": 4,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(HYBRID_LAYERS)],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "attn_output_gate": True,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "mamba_ssm_dtype": "float32",
    "mlp_only_layers": [],
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                        "rope_theta": 10000000, "rope_type": "default"},
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 2,
}
HYBRID_VISION = {
    "model_type": "qwen3_5",
    "depth": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 256,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [],
    "initializer_range": 0.02,
}
HYBRID_DRAFT_LAYER_IDS = [1, 3, 6]
HYBRID_BLOCK = 16


def hybrid_target_config() -> dict:
    token = HYBRID_SPECIAL.index
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": HYBRID_TEXT,
        "vision_config": HYBRID_VISION,
        "image_token_id": token("<|image_pad|>"),
        "video_token_id": token("<|video_pad|>"),
        "vision_start_token_id": token("<|vision_start|>"),
        "vision_end_token_id": token("<|vision_end|>"),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def hybrid_draft_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 2,
        **{**DIMS, "hidden_size": HYBRID_TEXT["hidden_size"], "vocab_size": VOCAB, "max_position_embeddings": 262144,
           "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
        "num_target_layers": HYBRID_LAYERS,
        "block_size": HYBRID_BLOCK,
        "dflash_config": {"block_size": HYBRID_BLOCK, "mask_token": "<|MASK|>", "mask_token_id": SPECIAL.index("<|MASK|>"),
                          "target_layer_ids": HYBRID_DRAFT_LAYER_IDS},
    }


def processor_files(directory: Path) -> None:
    """Qwen3.5's image and video processor settings (transformers' AutoProcessor builds Qwen3VLProcessor from them)."""
    common = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True, "do_normalize": True,
              "do_convert_rgb": True, "processor_class": "Qwen3VLProcessor"}
    (directory / "preprocessor_config.json").write_text(json.dumps({
        **common, "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": 65536, "longest_edge": 16777216}}, indent=1))
    (directory / "video_preprocessor_config.json").write_text(json.dumps({
        **common, "video_processor_type": "Qwen3VLVideoProcessor",
        "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 2, "min_frames": 4, "max_frames": 768}, indent=1))


def hybrid(store: str) -> None:
    target = Path(store) / "tiny-qwen35-hybrid"
    draft = Path(store) / "tiny-qwen35-hybrid-dflash"
    for directory in (target, draft):
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer_files(directory, HYBRID_SPECIAL)
    processor_files(target)
    (target / "config.json").write_text(json.dumps(hybrid_target_config(), indent=1))
    (draft / "config.json").write_text(json.dumps(hybrid_draft_config(), indent=1))
    print(f"tiny models in {store}: {target.name}, {draft.name}")


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
    hybrid(store)


if __name__ == "__main__":
    main(sys.argv[1])
