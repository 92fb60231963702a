"""What a target model is (hybrid or dense), read from its own config.json where its bytes are: by the GPU check's read
where the host's store holds it, by the preflight once it is staged (operations/remote/_common.py: model_kind), and
what the preflight then says of the engine advisories on the target's kind (operations/service/preflight.py: advised).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.gpu import tiny_models
from configuration import advisories
from operations import remote
from operations.service import preflight
from tests.unit.test_gpus import run_fact_script, standin_config


def model_kind(directory) -> str | None:
    """The remote scripts' own rule, run as they run it (the shared text, stdlib only)."""
    namespace: dict = {}
    exec(compile(remote.shared_text(), "_common.py", "exec"), namespace)
    return namespace["model_kind"](str(directory))


QWEN3_DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
               "layer_types": ["full_attention", "full_attention"]}
CASES = [
    ("qwen3.5 (a multimodal wrapper: text_config)", tiny_models.hybrid_target_config(), "hybrid"),
    ("qwen3-next (linear_attention layers)", {"architectures": ["Qwen3NextForCausalLM"],
                                              "layer_types": ["linear_attention", "full_attention"]}, "hybrid"),
    ("lfm2 (short convolutions)", {"architectures": ["Lfm2ForCausalLM"], "layer_types": ["conv", "full_attention"]},
     "hybrid"),
    ("nemotron-h (M is a Mamba layer)", {"architectures": ["NemotronHForCausalLM"],
                                         "hybrid_override_pattern": "M-M-M*-"}, "hybrid"),
    ("falcon-h1 (mamba dims)", {"architectures": ["FalconH1ForCausalLM"], "mamba_d_ssm": 1024}, "hybrid"),
    ("qwen3 dense", QWEN3_DENSE, "dense"),
    ("gemma3 (sliding and full attention)", {"architectures": ["Gemma3ForCausalLM"],
                                             "layer_types": ["sliding_attention", "full_attention"]}, "dense"),
    ("llama (no layer_types)", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}, "dense"),
    ("the DFlash draft", tiny_models.hybrid_draft_config(), "dense"),
]


@pytest.mark.parametrize(("name", "config", "kind"), CASES, ids=[c[0] for c in CASES])
def test_the_kind_is_what_the_models_config_says(tmp_path, name, config, kind):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_kind(tmp_path) == kind


@pytest.mark.parametrize("content", [None, b"{not json", b"[1, 2]"], ids=["no config.json", "broken", "not a map"])
def test_no_readable_config_is_not_a_kind(tmp_path, content):
    if content is not None:
        (tmp_path / "config.json").write_bytes(content)
    assert model_kind(tmp_path) is None


def test_a_config_json_that_is_no_file_is_not_read(tmp_path):
    """The GPU check reads it as root: a fifo would block the host's read, a device would be read."""
    import os

    os.mkfifo(tmp_path / "config.json")
    assert model_kind(tmp_path) is None
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").symlink_to("/dev/zero")
    assert model_kind(tmp_path) is None


def test_the_gpu_checks_read_says_each_models_kind(tmp_path):
    facts = run_fact_script(tmp_path, standin_config(tmp_path), models={
        "hy": {"config.json": json.dumps(tiny_models.hybrid_target_config()).encode(), "model.safetensors": 64},
        "de": {"config.json": json.dumps(QWEN3_DENSE).encode(), "model.safetensors": 64},
        "gguf": {"model.gguf": 64},
    })
    kinds = {path.rsplit("/", 1)[-1]: kind for path, kind in facts.model_kinds.items()}
    assert kinds == {"hy": "hybrid", "de": "dense", "gguf": None}


def test_the_preflight_reads_the_staged_targets_kind(tmp_path):
    """The preflight's own script, run by a Python with no sglang: the parser says so, the target is still read."""
    (tmp_path / "config.json").write_text(json.dumps(tiny_models.hybrid_target_config()))
    argv = ["--model-path", str(tmp_path), "--port", "30000"]
    proc = subprocess.run([sys.executable, "-I", "-", json.dumps(argv), "sglang.launch_server"],
                          input=remote.script("preflight"), capture_output=True, text=True, cwd="/")
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["target"] == "hybrid", result


def _by_target() -> dict[str, tuple[advisories.Advisory, ...]]:
    held = advisories.Advisory("refuse-it", "it dies", "refuse", "ref", "serve it otherwise", target=("hybrid",))
    warned = advisories.Advisory("warn-it", "it slows", "warn", "ref2", "tune it", target=("hybrid", "dense"))
    return {"hybrid": (held, warned), "dense": (warned,)}


def test_the_preflight_refuses_for_the_kind_it_read_and_only_that():
    refusal, warnings = preflight.advised({"target": "hybrid"}, _by_target())
    assert refusal == "it dies [refuse-it; ref]: serve it otherwise (the target is hybrid)"
    assert warnings == ["it slows [warn-it; ref2]: tune it (the target is hybrid)"]
    assert preflight.advised({"target": "dense"}, _by_target()) == (
        None, ["it slows [warn-it; ref2]: tune it (the target is dense)"])


def test_a_kind_the_preflight_could_not_read_is_said_not_guessed():
    refusal, warnings = preflight.advised({"target": None}, _by_target())
    assert refusal is None
    assert warnings == ["the target's kind could not be read (no readable config.json at its --model-path): "
                        "advisories refuse-it, warn-it not checked"]
    assert preflight.advised({"target": None}, {}) == (None, []), "nothing left to the preflight: nothing said"
