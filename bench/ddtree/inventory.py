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


SERVICES = {
    "plain": service(30200),
    "dflash": service(30201, {"speculative-algorithm": "DFLASH"}),
    "ddtree15": service(30202, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15}, patch=True),
    "ddtree7": service(30206, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 7}, patch=True),
    "ddtree31": service(30203, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31}, patch=True),
    "ddtree31-bs8": service(30204, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31, "cuda-graph-max-bs": 8}, patch=True),
    "ddtree31-nocg": service(30205, {"speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 31, "disable-cuda-graph": True}, patch=True),
}

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
            "run_services": [s for s in os.environ.get("GPU_SERVICES", "").split(",") if s],
        },
    )
]
