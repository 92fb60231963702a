"""Kinds of environment variables a service's `env` sets (configuration/kinds.py re-exports them):
the name's shape, the names a service may not set (what the unit derives, what steers a loader or
interpreter), names that say they carry a credential, and the value."""

from __future__ import annotations

import re
from typing import Annotated, Any, Union

from pydantic import AfterValidator, Strict

from configuration.kinds_base import (
    VALUE_MAX,
    Int,
    Text,
    control_character,
    matching,
    refuse,
    unit_safe_fix,
    with_fix,
)

ENV_NAME_FIX = "must be a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Names that make a process load or run other code than its own: the dynamic loader, the Python
# interpreter, shells, glibc's module and locale loaders and tunables, malloc's debug hooks, and the
# CUDA, NVTX, NCCL, libfabric, UCX and triton plugins and tools that are loaded or run from a path.
# The service's env reaches the unit and root's preflight of the same flags; none of these may.
STEERING_PREFIXES = ("LD_", "DYLD_", "PYTHON", "BASH_FUNC_", "MALLOC_", "GLIBC_", "PERL",
                     "RUBY", "NODE_")
# PYTHON* names that change neither what Python loads nor where it looks for it.
HARMLESS_PYTHON = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONHASHSEED",
     "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONOPTIMIZE"})
HARMLESS_MALLOC = frozenset(
    {"MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"})
STEERING_NAMES = frozenset({
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PROMPT_COMMAND", "CDPATH",
    "GLOBIGNORE", "ZDOTDIR", "GCONV_PATH", "GETCONF_DIR", "LOCPATH", "NLSPATH", "HOSTALIASES",
    "RES_OPTIONS", "LOCALDOMAIN", "TZDIR", "CUDA_INJECTION32_PATH", "CUDA_INJECTION64_PATH",
    "NVTX_INJECTION32_PATH", "NVTX_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN", "FI_PROVIDER_PATH",
    "UCX_MODULE_DIR", "OMPI_MCA_mca_base_component_path", "TRITON_CACHE_MANAGER",
    "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH",
    "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CC", "CXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
})
# Names the unit derives from the data, or whose value changes what a derived one means: the GPUs
# (`CUDA_VISIBLE_DEVICES` numbers GPUs as nvidia-smi does only with CUDA_DEVICE_ORDER=PCI_BUS_ID,
# which the unit sets; container runtimes, MPS and ROCm have their own). PATH and HOME, which the
# unit also sets, may be set: they reach only the sandboxed service (root's preflight takes neither,
# operations/service/preflight.py).
DERIVED_ENV = {
    "CUDA_VISIBLE_DEVICES": "is derived from the service key `gpu`; set that instead",
    "CUDA_DEVICE_ORDER": "is set by the unit to PCI_BUS_ID, so that `gpu` (CUDA_VISIBLE_DEVICES) "
                         "numbers GPUs as nvidia-smi does; another order would put the service on "
                         "other GPUs than the ones checked: remove it",
    "NVIDIA_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, "
                              "derived from it): set `gpu` instead",
    "CUDA_MPS_PIPE_DIRECTORY": "would attach the service to another MPS daemon than its GPUs' own: "
                               "remove it",
    "HIP_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived "
                           "from it): set `gpu` instead",
    "ROCR_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, "
                            "derived from it): set `gpu` instead",
    "GPU_DEVICE_ORDINAL": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived "
                          "from it): set `gpu` instead",
}


def env_name_refusal(name: str) -> str | None:
    """Why `name` may not be set in a service's `env`, or None."""
    if name in DERIVED_ENV:
        return f"`{name}` {DERIVED_ENV[name]}"
    steering = name in STEERING_NAMES or (
        name.startswith(STEERING_PREFIXES) and name not in HARMLESS_PYTHON
        and name not in HARMLESS_MALLOC)
    if steering:
        return (f"`{name}` steers what a loader or interpreter loads or runs (the dynamic loader, "
                "Python, a shell, glibc, malloc, a CUDA/NCCL/triton plugin or tool): the unit and "
                "root's preflight must run the venv's own code only; remove it (put code the "
                "engine needs into the stack or a patch set)")
    return None


# A name says it carries a credential: its words (split at '_' or '-') hold one of these.
CREDENTIAL_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE",
     "CREDENTIAL", "CREDENTIALS"})


def credential_env_name(name: str) -> bool:
    return bool(CREDENTIAL_WORDS & set(name.upper().split("_")))


# The name's shape; which names a service may set is the env map's rule (configuration/schema.py),
# which shows the value set under a refused name.
EnvName = Annotated[Text, matching(ENV_NAME.pattern, ENV_NAME_FIX), with_fix(ENV_NAME_FIX)]

ENV_VALUE_FIX = "must be a single-line string or number"


def _env_value(value: Any) -> str:
    text = str(value)
    if len(text) > VALUE_MAX:
        raise refuse(f"is {len(text)} characters long: at most {VALUE_MAX} go into a unit's "
                     "environment; put a longer value in a file and name the file")
    found = control_character(text)
    if found:
        raise refuse(unit_safe_fix(ENV_VALUE_FIX, found))
    return text


EnvValue = Annotated[Union[Text, Int, Annotated[float, Strict()]], AfterValidator(_env_value),
                     with_fix(ENV_VALUE_FIX + ' (quote booleans: "true")')]
