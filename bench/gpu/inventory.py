"""Inventory for bench/gpu_serve_check.sh: this GPU machine (`@local`), the real stack, tiny models.

GPU_WHEELHOUSE (the stack's wheels this machine's donor venv lacks), GPU_DONOR (a venv here that
holds part of the stack, copied as installed), GPU_STORE (the tiny models), GPU_SERVICES (which
of the services below this run places: one at a time, as they share GPU 0).
"""

import os

COMMON_ARGS = {
    "grammar-backend": "none",
    "load-format": "dummy",
    "mem-fraction-static": 0.3,
    "context-length": 2048,
}
DFLASH = {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 4}


def service(port: int, backend: str, dflash: bool, **extra) -> dict:
    return {
        "gpu": 0,
        "port": port,
        "model": "tiny-qwen3",
        "model_in": "store",
        "draft_model": "tiny-qwen3-dflash" if dflash else None,
        "draft_in": "store",
        "args": {"attention-backend": backend, **COMMON_ARGS, **(DFLASH if dflash else {}), **extra},
    }


SERVICES = {
    "plain-auto": service(30100, "auto", False),
    "plain-triton": service(30101, "triton", False),
    "dflash-auto": service(30102, "auto", True),
    "dflash-triton": service(30103, "triton", True),
    # sglang 0.5.11's default backend on sm 9.0 failed its piecewise CUDA graph capture
    # (CUBLAS_STATUS_EXECUTION_FAILED) on the H200: the same services without that capture.
    "plain-auto-nopw": service(30104, "auto", False, **{"disable-piecewise-cuda-graph": True}),
    "dflash-auto-nopw": service(30105, "auto", True, **{"disable-piecewise-cuda-graph": True}),
}

hosts = [
    (
        "@local",
        {
            "stack": os.environ.get("GPU_STACK", "sglang-0.5.11-cu130"),
            "venv_path": os.environ.get("GPU_VENV", "/root/venv_sglang"),
            "model_store": os.environ.get("GPU_STORE", "/root/gpu-check-models"),
            "wheelhouse": os.environ["GPU_WHEELHOUSE"],
            "stack_sources": [{"donor": "@local", "path": os.environ.get("GPU_DONOR", "/opt/torch/.venv")}, "wheelhouse"],
            "installer": "uv",
            # The lab's rehearsal of this check (no GPU) sets the stand-in server here.
            "launcher": os.environ.get("GPU_LAUNCHER", "sglang.launch_server"),
            "service_user": "root",
            "readiness_timeout_s": 900,
            "services": SERVICES,
            "run_services": [s for s in os.environ.get("GPU_SERVICES", "").split(",") if s],
        },
    )
]
