"""Inventory for bench/ddtree/gpu_run.sh: this GPU machine (`@local`), sglang-0.5.13-cu130, tiny models.

Like bench/gpu/inventory.py (GPU_WHEELHOUSE, GPU_DONOR, GPU_STORE, GPU_SERVICES: one service
placed at a time, they share GPU 0), with the four services the DDTree comparison needs. The draft
is tiny-qwen3-dflash16 (bench/gpu/tiny_models.py's draft with a 16-token block, made by gpu_run.sh):
with it, DDTREE budget 15 is the spine (block - 1: PR #27509's ad7ab160 runs it as DFLASH) and 31 a
tree. `attention-backend` is GPU_BACKEND (default triton, what SM 12.x gets; `auto` for sglang's own).
On the H200 (2026-12-03, bench/results/h200-2026-12-03-d0a14af-ddtree-*) ddtree31 died at start capturing the
target's CUDA graph; ddtree31-bs8 (`cuda-graph-max-bs: 8`) captured it and died at its first replay (the graph
holds 16 tokens a request, the tree verifies 32); ddtree31-nocg (`disable-cuda-graph: true`) served.
The port's fix (bench/ddtree/fixes/ddtree-verify-width.patch) sizes the target's graphs and triton verify
buffers as budget + 1; ddtree7 is the spine below block - 1 (8 tokens a request, not the block's 16).
With the fixes all of them serve on triton (h200-2026-12-03-b2ac97c-ddtree-triton.txt); with GPU_BACKEND=auto
on an H200 (sglang's default, fa3) every DDTREE service died (-ddtree-auto.txt), and since the set's manifest
names triton alone (attention_backends), the deploy's GPU check now refuses them there before any change.

The hybrid-* services are the operator's own (issue #36 item 3): a Qwen3.5/3.6-style target (tiny-qwen35-hybrid:
Qwen3_5ForConditionalGeneration, Gated DeltaNet layers beside gated full attention) with its DFlash draft
(tiny-qwen35-hybrid-dflash, block 16), and the seed's settings as sglang 0.5.13 takes them: mem-fraction-static
0.75, context-length 32768, max-running-requests 4, mamba-full-memory-ratio 0.5, mamba-scheduler-strategy
extra_buffer (0.5.13 still has the flag: files/engine_flags/sglang-0.5.13.json; 0.5.20 renamed it
mamba-radix-cache-strategy), speculative-dflash-block-size 16. All four run in the patched generation, so that
DFLASH, the DDTREE spine (budget 15 = block - 1) and a DDTREE tree (31) differ in the algorithm alone; hybrid-plain
(no speculation) is the reference output: each service's greedy completion of the same prompt is compared with it.
hybrid-w-* are the same with initialised target weights (dummy weights repeat one token whatever the state).
On an H100 (2026-12-05, bench/results/h100-2026-12-05-*-hybrid-*) every one passed its gate; DDTREE, spine and
tree, left plain decoding's greedy tokens at the third (the patch set never commits the linear-attention state) and
the tree died at its first accepted side branch, so the hybrid DDTREE services are refused at validation since
(files/engine_advisories.yml: ddtree-hybrid-linear-state).
"""

import os

BACKEND = os.environ.get("GPU_BACKEND", "triton")
COMMON_ARGS = {
    "attention-backend": BACKEND,
    "grammar-backend": "none",
    "load-format": "dummy",
    "mem-fraction-static": 0.3,
    "context-length": 2048,
}


def service(port: int, spec: dict | None = None, patch: bool = False) -> dict:
    return {
        "gpu": 0,
        "port": port,
        "model": "tiny-qwen3",
        "model_in": "store",
        "draft_model": "tiny-qwen3-dflash16" if spec else None,
        "draft_in": "store",
        "patch_sets": ["ddtree-0_5_13"] if patch else [],
        "args": {**COMMON_ARGS, **(spec or {})},
    }


# The operator's seed, as sglang 0.5.13 takes it (group_data/all.yml's services plus the flags).
HYBRID_ARGS = {
    "attention-backend": BACKEND,
    "grammar-backend": "none",
    "load-format": "dummy",
    "mem-fraction-static": 0.75,
    "context-length": 32768,
    "max-running-requests": 4,
    "mamba-full-memory-ratio": 0.5,
    "mamba-scheduler-strategy": "extra_buffer",
}


def hybrid(port: int, spec: dict | None = None, weights: bool = False) -> dict:
    """A hybrid service; `weights`: the target with initialised weights (tiny-qwen35-hybrid-w, made on the GPU
    machine by bench/gpu/tiny_weights.py), loaded as they are, the draft still dummy."""
    loads = {"load-format": "auto", **({"speculative-draft-load-format": "dummy"} if spec else {})} if weights else {}
    return {
        "gpu": 0,
        "port": port,
        "model": "tiny-qwen35-hybrid-w" if weights else "tiny-qwen35-hybrid",
        "model_in": "store",
        "draft_model": "tiny-qwen35-hybrid-dflash" if spec else None,
        "draft_in": "store",
        "patch_sets": ["ddtree-0_5_13"],
        "args": {**HYBRID_ARGS, **loads, **(spec or {})},
    }


ALL_SERVICES = {
    "plain": service(30200),
    "dflash": service(30201, {"speculative-algorithm": "DFLASH"}),
    "ddtree15": service(30202, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15}, patch=True),
    "ddtree7": service(30206, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 7}, patch=True),
    "ddtree31": service(30203, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31}, patch=True),
    "ddtree31-bs8": service(30204, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31, "cuda-graph-max-bs": 8}, patch=True),
    "ddtree31-nocg": service(30205, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31, "disable-cuda-graph": True}, patch=True),
    "hybrid-plain": hybrid(30300),
    "hybrid-dflash": hybrid(30301, {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16}),
    "hybrid-ddtree15": hybrid(30302, {"speculative-algorithm": "DDTREE", "speculative-dflash-block-size": 16,
                                      "speculative-ddtree-budget": 15}),
    "hybrid-ddtree31": hybrid(30303, {"speculative-algorithm": "DDTREE", "speculative-dflash-block-size": 16,
                                      "speculative-ddtree-budget": 31}),
    # The same with initialised target weights: dummy weights answer one token over and over, so only these show
    # whether a speculative service's greedy output is plain decoding's.
    "hybrid-w-plain": hybrid(30310, weights=True),
    "hybrid-w-dflash": hybrid(30311, {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16}, weights=True),
    "hybrid-w-ddtree15": hybrid(30312, {"speculative-algorithm": "DDTREE", "speculative-dflash-block-size": 16,
                                        "speculative-ddtree-budget": 15}, weights=True),
    "hybrid-w-ddtree31": hybrid(30313, {"speculative-algorithm": "DDTREE", "speculative-dflash-block-size": 16,
                                        "speculative-ddtree-budget": 31}, weights=True),
}

# Validation reads every service of the inventory, and since the run above the hybrid DDTREE services are refused
# (files/engine_advisories.yml: ddtree-hybrid-linear-state): only the services this run places are in it, so the
# others still deploy, and asking for a hybrid DDTREE service shows the refusal.
# A leading underscore: pyinfra takes every other module-level list of strings for a group of hosts.
_RUN_SERVICES = [s for s in os.environ.get("GPU_SERVICES", "").split(",") if s]
SERVICES = {name: s for name, s in ALL_SERVICES.items() if not _RUN_SERVICES or name in _RUN_SERVICES}

hosts = [
    (
        "@local",
        {
            "stack": os.environ.get("GPU_STACK", "sglang-0.5.13-cu130"),
            "venv_path": os.environ.get("GPU_VENV", "/root/venv_sglang"),
            "model_store": os.environ.get("GPU_STORE", "/root/gpu-check-models"),
            "wheelhouse": os.environ["GPU_WHEELHOUSE"],
            "stack_sources": [{"donor": "@local", "path": os.environ.get("GPU_DONOR", "/opt/torch/.venv")}, "wheelhouse"],
            "installer": "uv",
            "launcher": os.environ.get("GPU_LAUNCHER", "sglang.launch_server"),
            "service_user": "root",
            "readiness_timeout_s": 900,
            "services": SERVICES,
            "run_services": _RUN_SERVICES,
        },
    )
]
