# Fact script: what nvidia-smi says about the host's GPUs, our units' GPUs and processes, and the
# models' sizes and kinds (_common.model_kind), as JSON. Always exits 0: a missing or failing
# nvidia-smi is data, not an error.
# argv: UNIT_DIR [MODEL_DIR ...]
import glob
import json
import os
import re
import subprocess
import sys

from _common import model_kind  # noqa: E402 - remote.script puts _common.py here

unit_dir = sys.argv[1]
model_dirs = sys.argv[2:]

FIELDS = (
    "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id,"
    "ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,"
    "remapped_rows.failure"
)
BASIC_FIELDS = "index,uuid,name,compute_cap,memory.total,memory.used,driver_version,pci.bus_id"
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MANAGED = "# Managed by sglang-deploy"


def start(argv):
    """A command started now: its output is collected by `finish` (several run side by side)."""
    try:
        # time bound: finish() waits 60 s for it, then kills it
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True), argv
    except OSError as exc:
        return exc, argv


def finish(started):
    proc, argv = started
    if isinstance(proc, OSError):
        return {"rc": 127, "stdout": "", "stderr": str(proc)}
    try:
        stdout, stderr = proc.communicate(timeout=60)
        return {"rc": proc.returncode, "stdout": stdout, "stderr": stderr}
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"rc": 124, "stdout": "", "stderr": f"{argv[0]} timed out after 60 s"}


def run(argv):
    return finish(start(argv))


def which(name, path):
    """shutil.which(name, path=path), without importing shutil (and the bz2, lzma and fnmatch it
    imports) into every host's read."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, name)
        if (os.path.exists(candidate) and os.access(candidate, os.X_OK)
                and not os.path.isdir(candidate)):
            return candidate
    return None


smi = which("nvidia-smi",
            os.environ.get("PATH", "") + ":/usr/bin:/usr/local/bin:/usr/local/nvidia/bin")
out = {"nvidia_smi": smi, "query": None, "apps": None, "table": None, "units": {}, "models": {},
       "kinds": {}}
# Our units: their GPUs (CUDA_VISIBLE_DEVICES) and every process in their cgroup.
paths = sorted(glob.glob(os.path.join(unit_dir, "sglang-*.service")))
names = [os.path.basename(p) for p in paths]
# nvidia-smi takes from tens of milliseconds to seconds per call on a loaded 8-GPU host: its three
# calls and systemd's answer run side by side, so this read costs the slowest of them, not their
# sum.
started = {}
if smi:
    started["query"] = start([smi, f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"])
    started["apps"] = start(
        [smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"])
    started["table"] = start([smi])
if names:
    started["show"] = start(
        ["systemctl", "show", "-p", "Id,ActiveState,MainPID,ControlGroup", *names])
done = {key: finish(value) for key, value in started.items()}
if smi:
    query = done["query"]
    if "is not a valid field" in query["stdout"] + query["stderr"]:
        # Older drivers lack some health fields: ask for the basic ones.
        query = run([smi, f"--query-gpu={BASIC_FIELDS}", "--format=csv,noheader,nounits"])
        query["fields"] = BASIC_FIELDS
    else:
        query["fields"] = FIELDS
    out["query"] = query
    out["apps"] = done["apps"]
    out["table"] = done["table"]

props = {}
if names:
    show = done["show"]
    block = {}
    for line in show["stdout"].splitlines() + [""]:
        if not line.strip():
            if block.get("Id"):
                props[block["Id"]] = block
            block = {}
            continue
        key, _, value = line.partition("=")
        block[key] = value


def cgroup_pids(cgroup):
    if not cgroup:
        return []
    for root in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"):
        try:
            with open(f"{root}{cgroup}/cgroup.procs") as handle:
                return sorted(int(x) for x in handle.read().split())
        except (OSError, ValueError):
            continue
    return []


for path, name in zip(paths, names):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        continue
    match = re.search(r'^Environment="?CUDA_VISIBLE_DEVICES=([^"\n]*)"?\s*$', text, re.M)
    info = props.get(name, {})
    pid = int(info.get("MainPID") or 0)
    pids = cgroup_pids(info.get("ControlGroup"))
    if pid and pid not in pids:
        pids.append(pid)
    out["units"][name] = {
        "managed": text.startswith(MANAGED),
        "gpus": match.group(1) if match else None,
        "active": info.get("ActiveState"),
        "pids": sorted(pids),
    }

# Models: bytes of weight files (all files if none look like weights); None when absent.
for model_dir in model_dirs:
    if not os.path.isdir(model_dir):
        out["models"][model_dir] = None
        continue
    out["kinds"][model_dir] = model_kind(model_dir)
    weights = total = 0
    for root, _dirs, files in os.walk(model_dir):
        for name in files:
            if name.startswith(".sglang-"):
                continue
            try:
                size = os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
            total += size
            if name.endswith(WEIGHTS):
                weights += size
    out["models"][model_dir] = weights or total

print(json.dumps(out))
