# The ABI probe, run by a generation's own python before it may become live.
# argv: JSON {"kernels": [dist, ...], "modules": [module, ...], "driver_cuda": "13.0"|null,
#             "compute_caps": ["9.0", ...],
#             "torch": true|false (does the stack have torch; default true)}
# Imports torch, the kernel distributions' packages, flashinfer (when installed) and the server
# entry point; compares torch's CUDA version with the kernel's CUDA tag, with the CUDA version
# the driver supports, and torch's compiled GPU architectures with the GPUs' compute capability.
# Success: the imported sources' paths (one SGLANG-DEPLOY-IMPORTED line each), then one JSON
# line on stdout. Failure: exit 1 with ONE line on stderr naming the
# mismatched distributions and versions (an `undefined symbol` included).
import importlib
import importlib.metadata as md
import json
import os
import re
import sys

args = json.loads(sys.argv[1])
found = {"python": "%d.%d.%d" % sys.version_info[:3]}


# What a kernel distribution is imported as, where its wheel does not say (no top_level.txt).
KERNEL_IMPORTS = {"sgl-kernel": ["sgl_kernel"], "sglang-kernel": ["sgl_kernel"]}


def fail(message):
    sys.stderr.write("ABI probe failed: " + message + "\n")
    sys.exit(1)


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def owner_of(path):
    """(distribution, version) whose RECORD lists the file at `path`."""
    path = os.path.realpath(path)
    for dist in md.distributions():
        for f in dist.files or ():
            try:
                if os.path.realpath(str(dist.locate_file(f))) == path:
                    return dist.metadata["Name"], dist.version
            except OSError:
                continue
    return None, None


def cuda_of(tag):
    """`cu130` -> `13.0`; `cu128` -> `12.8`."""
    m = re.fullmatch(r"cu(\d+)(\d)", tag or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def load(module):
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        text = " ".join(str(exc).split())
        m = re.search(r"(/\S+?\.so[^:\s]*): undefined symbol: (\S+)", text)
        loaded = sys.modules.get("torch")
        torch_version = getattr(loaded, "__version__", None) or version("torch")
        if m:
            dist, dist_version = owner_of(m.group(1))
            lib = os.path.basename(m.group(1))
            who = f"{dist} {dist_version}" if dist else m.group(1)
            fail(
                f"{who} ({lib}) was built against another torch than torch {torch_version}: "
                f"undefined symbol {m.group(2)}; install the {dist or 'kernel'} build made for "
                f"torch {torch_version} (one stack, one ABI set)"
            )
        fail(f"import {module}: {type(exc).__name__}: {text[:300]}")


if args.get("torch", True):
    torch = load("torch")
    found["torch"] = torch.__version__
    torch_cuda = getattr(torch.version, "cuda", None)
else:
    # A stack without torch (the lab's stand-in server alone) has no CUDA-bound set to prove: only
    # its entry point is imported. A kernel in it would have no torch to match.
    torch, torch_cuda = None, None
    found["torch"] = None
    for dist in args.get("kernels", []):
        if version(dist):
            fail(f"{dist} {version(dist)} is installed, and the stack names no torch for it: add "
                 "torch to the stack")
found["torch_cuda"] = torch_cuda

for dist in args.get("kernels", []) if torch is not None else ():
    dist_version = version(dist)
    if dist_version is None:
        continue
    top = None
    try:
        top = (md.distribution(dist).read_text("top_level.txt") or "").split()
    except Exception:  # noqa: BLE001
        top = None
    # Real kernel wheels ship no top_level.txt (sglang-kernel 0.4.2 holds sgl_kernel, deep_gemm and
    # triton_kernels): import the package the distribution is named for.
    for module in top or KERNEL_IMPORTS.get(dist, [dist.replace("-", "_")]):
        load(module)
    local = dist_version.partition("+")[2]
    kernel_cuda = cuda_of(local)
    found[dist] = dist_version
    if kernel_cuda and torch_cuda and kernel_cuda.split(".")[0] != torch_cuda.split(".")[0]:
        fail(
            f"{dist} {dist_version} is built for CUDA {kernel_cuda}, torch {torch.__version__} for "
            f"CUDA {torch_cuda}: pick the kernel and torch of one CUDA version"
        )
    if kernel_cuda and not torch_cuda:
        fail(f"{dist} {dist_version} is built for CUDA {kernel_cuda}, torch {torch.__version__} is "
             "a CPU build")

if version("flashinfer-python"):
    load("flashinfer")
    found["flashinfer-python"] = version("flashinfer-python")

driver = args.get("driver_cuda")
if torch_cuda and driver:
    def as_tuple(v):
        return tuple(int(x) for x in v.split(".")[:2])

    if as_tuple(torch_cuda) > as_tuple(driver):
        fail(
            f"torch {torch.__version__} needs CUDA {torch_cuda}, the driver supports CUDA up to "
            f"{driver}: upgrade the NVIDIA driver, or use a stack built for CUDA <= " + driver
        )
caps = args.get("compute_caps") or []
if torch_cuda and caps:
    arches = torch.cuda.get_arch_list() if torch.cuda.is_available() else []
    found["arch_list"] = arches
    if arches:
        for cap in caps:
            major, minor = (int(x) for x in cap.split(".")[:2])
            sm = major * 10 + minor
            numbers = [(a.split("_")[0], int(re.sub(r"\D", "", a) or 0)) for a in arches]
            # A cubin runs on its own major version (same or newer minor); PTX (compute_) is
            # JIT-compiled upward.
            ok = any((kind == "sm" and n // 10 == major and n <= sm)
                     or (kind == "compute" and n <= sm) for kind, n in numbers)
            if not ok:
                fail(
                    f"torch {torch.__version__} has kernels for {' '.join(arches)}, not for this "
                    f"GPU's compute capability {cap} (sm_{sm}): use a torch build that includes "
                    f"sm_{sm}"
                )

for module in args.get("modules", []):
    load(module)
# What root compiles into the generation once the probe passed (venv_probe.COMPILE_IMPORTED): the
# sources imported here, which the service user may not write bytecode beside.
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if isinstance(path, str) and path.endswith(".py") and "\n" not in path:
        print("SGLANG-DEPLOY-IMPORTED " + path)
print(json.dumps(found, sort_keys=True))
