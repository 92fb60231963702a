#!/usr/bin/env python3
"""The local test lab: real systemd hosts (systemd-nspawn containers) reached over real SSH.

    python3 lab/lab.py up [--hosts gpu-a,gpu-b]     start the hosts (idempotent; reuses running ones)
    python3 lab/lab.py status                        one line per host
    python3 lab/lab.py reboot NAME                   reboot a host for real, wait for SSH
    python3 lab/lab.py cut NAME [--kill-connections] cut the host's network (its veth down); the host runs on
    python3 lab/lab.py restore NAME                  plug it back in, wait for SSH
    python3 lab/lab.py gpus NAME [--count N ...]     set the host's stand-in GPUs (/etc/lab/gpus.json)
    python3 lab/lab.py cap --rate 40mibps            cap this machine's link to the hosts (lab/link_cap.py)
    python3 lab/lab.py uncap                         take the cap away
    python3 lab/lab.py down [NAME ...] [--purge]     stop what up started

Each host runs under a small supervisor (`lab.py _supervise NAME`, detached) that restarts systemd-nspawn when
the container reboots (nspawn exits 133 then) and re-applies the control side of the network, so a reboot from
inside a host (pyinfra's server.reboot) behaves as on a real machine. Python 3.11 stdlib only; run as root.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
CACHE_DIR = LAB_DIR / "cache"
BASE_ROOTFS = CACHE_DIR / "rootfs-base"
STATE_DIR = LAB_DIR / "state"
HOSTS_DIR = STATE_DIR / "hosts"
HOSTS_JSON = STATE_DIR / "hosts.json"
LOCK_FILE = STATE_DIR / "lab.lock"
JSON_LOCK_FILE = STATE_DIR / "hosts.json.lock"
SSH_KEY = STATE_DIR / "id_ed25519"
KNOWN_HOSTS = STATE_DIR / "known_hosts"
INVENTORY = LAB_DIR / "inventory.py"
NVIDIA_SMI = LAB_DIR / "nvidia-smi"

DEFAULT_HOSTS = ["gpu-a", "gpu-b"]
# Which services the deploy puts on which lab host; written into lab/inventory.py as host data `run_services`.
PLACEMENT = {"gpu-a": ["ddtree", "dflash"], "gpu-b": []}

SUBNET_PREFIX = "10.213.0."  # one /30 per host: control side .4n+1, host side .4n+2
MAX_SLOTS = 64
DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,iproute2,ca-certificates"
NSPAWN_REBOOT_EXIT = 133  # systemd-nspawn's exit status when the container asked for a reboot

# tool -> apt package that provides it
REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "mount": "mount",
    "ip": "iproute2",
}

DEFAULT_GPU = {
    "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "compute_cap": "12.0",
    "memory_total_mib": 97887,
    "count": 2,
}
DRIVER_VERSION = "580.159.04"
CUDA_VERSION = "13.0"
# Bus ids of an 8-GPU board, in index order.
GPU_BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]

MODELS_DIR = "root/models"
TARGET_MODEL = "Qwen3.6-27B"
DRAFT_MODEL = "Qwen3.6-27B-DFlash"
MIB = 1024 * 1024


class LabError(Exception):
    """A failure with a message that says what to do about it."""


def say(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- small helpers

def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    proc = subprocess.run(cmd, **kw)
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise LabError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {err[-1] if err else 'no output'}")
    return proc


def write_atomic(path: Path, text: str | bytes, mode: int | None = None) -> bool:
    """Write path only if its content differs; return True if written."""
    data = text.encode() if isinstance(text, str) else text
    try:
        if path.read_bytes() == data:
            if mode is not None and (path.stat().st_mode & 0o7777) != mode:
                path.chmod(mode)
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_hosts() -> dict:
    try:
        return json.loads(HOSTS_JSON.read_text())
    except (OSError, ValueError):
        return {}


def update_hosts(fn) -> dict:
    """Read-modify-write hosts.json under a lock (the supervisors write to it too)."""
    with file_lock(JSON_LOCK_FILE):
        hosts = load_hosts()
        fn(hosts)
        write_atomic(HOSTS_JSON, json.dumps(hosts, indent=2, sort_keys=False) + "\n")
        return hosts


def pid_cmdline(pid: int | None) -> list[str]:
    if not pid:
        return []
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


def pid_ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def is_nspawn_of(pid: int | None, name: str) -> bool:
    cmd = pid_cmdline(pid)
    return bool(cmd) and cmd[0].endswith("systemd-nspawn") and "-M" in cmd and cmd[cmd.index("-M") + 1] == name


def is_supervisor_of(pid: int | None, name: str) -> bool:
    cmd = pid_cmdline(pid)
    return "_supervise" in cmd and cmd[-1] == name


def leader_of(nspawn_pid: int) -> int | None:
    """The container's PID 1 (its 'leader'): nspawn's child process."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and pid_ppid(int(entry.name)) == nspawn_pid:
            return int(entry.name)
    return None


def is_mounted(path: Path) -> bool:
    # mountinfo holds the real path: a lab/state reached through a symlink (a git worktree's) must match it, or
    # a second overlay is mounted on the same upper/work dirs, and the first one's copy-ups fail (ENOENT).
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def mounts_under(path: Path) -> list[str]:
    prefix = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True)


def slot_addresses(slot: int) -> tuple[str, str]:
    return f"{SUBNET_PREFIX}{4 * slot + 1}", f"{SUBNET_PREFIX}{4 * slot + 2}"


def ssh_base(address: str, timeout: int = 3) -> list[str]:
    return ["ssh", "-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}",
            "-o", "LogLevel=ERROR", f"root@{address}"]


def ssh_ok(address: str, timeout: int = 3) -> bool:
    try:
        return subprocess.run(ssh_base(address, timeout) + ["true"], capture_output=True,
                              timeout=timeout + 5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def port_open(address: str, port: int = 22, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------- preflight and base image

def preflight() -> None:
    if os.geteuid() != 0:
        raise LabError("lab.py needs root (systemd-nspawn, mount, ip); run it as root")
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        tools = [t for t, p in REQUIRED_TOOLS.items() if p in missing]
        raise LabError(f"missing tools: {', '.join(tools)}; install them with: "
                       f"apt-get update && apt-get install -y {' '.join(missing)}")


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (debootstrap's default one does not answer here)."""
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.exists():
        for line in deb822.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "deb" and "security" not in line:
                return next(p for p in parts[1:] if not p.startswith("["))
    raise LabError("no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")


def remove_tree(path: Path) -> None:
    for point in mounts_under(path):
        run(["umount", "-l", point], check=False)
    if path.exists():
        run(["rm", "-rf", "--one-file-system", str(path)])


def ensure_base() -> None:
    """Build the shared base rootfs once; an interrupted build never looks complete (temp dir, then rename)."""
    tmp = CACHE_DIR / "rootfs-base.partial"
    remove_tree(tmp)  # left by an interrupted build
    if BASE_ROOTFS.is_dir():
        return
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror()
    say(f"base: debootstrap {DEBIAN_SUITE} from {mirror} into {BASE_ROOTFS} (about a minute, once)")
    t0 = time.monotonic()
    log = CACHE_DIR / "debootstrap.log"
    with open(log, "w") as out:
        rc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", DEBIAN_SUITE,
                             str(tmp), mirror], stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        remove_tree(tmp)
        tail = log.read_text().strip().splitlines()[-3:]
        raise LabError(f"debootstrap failed (exit {rc}), see {log}: {' | '.join(tail)}")
    # Per-host identity is created per host: no shared SSH host keys, no shared machine id.
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc/machine-id").write_text("")
    for deb in (tmp / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    os.rename(tmp, BASE_ROOTFS)
    say(f"base: built in {time.monotonic() - t0:.0f} s")


def ensure_lab_key() -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not SSH_KEY.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab@control", "-f", str(SSH_KEY)])
        say(f"key: generated {SSH_KEY}")


# ---------------------------------------------------------------- per-host rootfs

def host_dir(name: str) -> Path:
    return HOSTS_DIR / name


def overlay_works() -> bool:
    probe = STATE_DIR / ".overlay-probe"
    remove_tree(probe)
    for d in ("lower", "upper", "work", "merged"):
        (probe / d).mkdir(parents=True)
    ok = run(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={probe}/lower,upperdir={probe}/upper,workdir={probe}/work", str(probe / "merged")],
             check=False).returncode == 0
    if ok:
        run(["umount", str(probe / "merged")], check=False)
    remove_tree(probe)
    return ok


def mount_rootfs(name: str, rec: dict) -> bool:
    """Make the host's rootfs available; return True if it was mounted now."""
    hdir = host_dir(name)
    rootfs = hdir / "rootfs"
    if rec["rootfs_mode"] == "overlay":
        if is_mounted(rootfs):
            return False
        for d in ("upper", "work", "rootfs"):
            (hdir / d).mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={BASE_ROOTFS},upperdir={hdir / 'upper'},workdir={hdir / 'work'}", str(rootfs)])
        return True
    if not (rootfs / "etc").is_dir():
        tmp = hdir / "rootfs.partial"
        remove_tree(tmp)
        run(["cp", "-a", "--reflink=auto", str(BASE_ROOTFS), str(tmp)])
        remove_tree(rootfs)
        os.rename(tmp, rootfs)
    return False


def choose_rootfs_mode(name: str) -> str:
    hdir = host_dir(name)
    if (hdir / "upper").is_dir():
        return "overlay"
    if (hdir / "rootfs" / "etc").is_dir():
        return "copy"
    return "overlay" if overlay_works() else "copy"


def unmount_rootfs(name: str) -> None:
    rootfs = host_dir(name) / "rootfs"
    if is_mounted(rootfs):
        if run(["umount", str(rootfs)], check=False).returncode != 0:
            run(["umount", "-l", str(rootfs)], check=False)


LAB_NET_UNIT = """\
# Lab infrastructure (lab/lab.py), not part of the deployment: gives host0 its address at every boot.
[Unit]
Description=Lab network: address on host0
DefaultDependencies=no
Before=network.target ssh.service
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile=/etc/lab/net.env
ExecStart=/sbin/ip addr replace ${ADDRESS} dev host0
ExecStart=/sbin/ip link set host0 up
# Five containers booting at once on this machine's cgroup v1: systemd once failed to attach the unit's process
# to its cgroup (status 219/CGROUP) on one of them, and the unit stayed failed. Such a start is tried again.
Restart=on-failure
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


def provision(name: str, rec: dict) -> list[str]:
    """Idempotently give the host its identity, access, network unit, GPU stand-in and models."""
    root = Path(rec["rootfs"])
    done = []
    write_atomic(root / "etc/hostname", f"{name}\n")
    hosts_file = root / "etc/hosts"
    text = hosts_file.read_text() if hosts_file.exists() else ""
    if f" {name}\n" not in text:
        write_atomic(hosts_file, text + f"127.0.1.1 {name}\n")
    mid = root / "etc/machine-id"
    if not mid.exists() or not mid.read_text().strip():
        write_atomic(mid, uuid.uuid4().hex + "\n", 0o444)
        done.append("machine-id")
    if not (root / "etc/ssh/ssh_host_ed25519_key").exists():
        run(["ssh-keygen", "-A", "-f", str(root)])
        done.append("ssh host keys")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    if write_atomic(ssh_dir / "authorized_keys", Path(f"{SSH_KEY}.pub").read_text(), 0o600):
        done.append("authorized_keys")
    write_atomic(root / "etc/lab/net.env", f"ADDRESS={rec['address']}/30\n")
    if write_atomic(root / "etc/systemd/system/lab-net.service", LAB_NET_UNIT):
        done.append("lab-net.service")
    wants = root / "etc/systemd/system/multi-user.target.wants/lab-net.service"
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to("/etc/systemd/system/lab-net.service")
    if sync_nvidia_smi(root):
        done.append("nvidia-smi")
    if not (root / "etc/lab/gpus.json").exists():
        write_gpus(root, default_gpus(name))
        done.append("gpus.json")
    done += ensure_models(root)
    return done


# The stand-in runs as a module behind a small launcher, so that python keeps its compiled form: run as a
# script, its 400 lines were compiled again on every call (about 17 ms of CPU each, three calls per host in
# every deploy's read, all on the CPUs the lab's hosts share with the control machine). A real nvidia-smi
# costs its own host's CPU, not the control machine's.
NVIDIA_SMI_MODULE_DIR = "/usr/lib/lab-nvidia-smi"
NVIDIA_SMI_LAUNCHER = f"""#!/usr/bin/python3 -IS
# The lab's nvidia-smi stand-in: lab/nvidia-smi, installed as {NVIDIA_SMI_MODULE_DIR}/nvidia_smi.py by lab/lab.py.
import sys

sys.path.insert(0, "{NVIDIA_SMI_MODULE_DIR}")
import nvidia_smi

try:
    sys.exit(nvidia_smi.main(sys.argv[1:]))
except BrokenPipeError:
    sys.exit(0)
"""


def sync_nvidia_smi(root: Path) -> bool:
    module = write_atomic(root / NVIDIA_SMI_MODULE_DIR.lstrip("/") / "nvidia_smi.py", NVIDIA_SMI.read_bytes(), 0o644)
    launcher = write_atomic(root / "usr/bin/nvidia-smi", NVIDIA_SMI_LAUNCHER, 0o755)
    return module or launcher


# ---------------------------------------------------------------- stand-in GPUs

def gpu_uuid(host: str, index: int) -> str:
    h = hashlib.sha256(f"lab-gpu:{host}:{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def make_gpu(host: str, index: int, name: str, compute_cap: str, memory_mib: int) -> dict:
    serial = str(int(hashlib.sha256(f"lab-serial:{host}:{index}".encode()).hexdigest(), 16))[:13]
    bus = GPU_BUS_IDS[index] if index < len(GPU_BUS_IDS) else f"{0xE0 + index:02X}"
    return {
        "index": index, "name": name, "uuid": gpu_uuid(host, index), "serial": serial,
        "bus_id": f"00000000:{bus}:00.0", "compute_cap": compute_cap, "memory_total_mib": memory_mib,
        "memory_used_mib": 0, "pstate": "P8", "temperature_c": 32, "utilization_pct": 0,
        "power_draw_w": 30, "power_limit_w": 700 if "H200" in name or "H100" in name else 600, "state": "ok",
    }


def default_gpus(host: str, count: int | None = None, name: str | None = None, compute_cap: str | None = None,
                 memory_mib: int | None = None) -> dict:
    return {
        "driver_version": DRIVER_VERSION,
        "cuda_version": CUDA_VERSION,
        "gpus": [make_gpu(host, i, name or DEFAULT_GPU["name"], compute_cap or DEFAULT_GPU["compute_cap"],
                          memory_mib or DEFAULT_GPU["memory_total_mib"])
                 for i in range(DEFAULT_GPU["count"] if count is None else count)],
        "processes": [],
    }


def write_gpus(root: Path, cfg: dict) -> bool:
    return write_atomic(root / "etc/lab/gpus.json", json.dumps(cfg, indent=2) + "\n", 0o644)


def gpus_summary(cfg: dict) -> str:
    gpus = cfg["gpus"]
    kinds = sorted({(g["name"], g["compute_cap"], g["memory_total_mib"]) for g in gpus})
    parts = [", ".join(f"{sum(1 for g in gpus if (g['name'], g['compute_cap'], g['memory_total_mib']) == k)} x "
                       f"{k[0]} (sm {k[1]}, {k[2]} MiB)" for k in kinds) or "no GPUs"]
    for state in ("failed", "missing"):
        idx = [g["index"] for g in gpus if g.get("state") == state]
        if idx:
            parts.append(f"{state} {idx}")
    if cfg.get("processes"):
        parts.append("processes " + ", ".join(f"{p['gpu_index']}:{p['pid']}:{p['used_memory_mib']}MiB"
                                              for p in cfg["processes"]))
    return "; ".join(parts)


# ---------------------------------------------------------------- stand-in models

def noise(seed: str, size: int) -> bytes:
    """Deterministic pseudo-random bytes: a sha256 counter stream seeded by the file's name."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def safetensors_bytes(seed: str, tensor: str, size: int) -> bytes:
    """A valid safetensors file of exactly `size` bytes: one uint8 tensor of noise."""
    n = size
    for _ in range(5):
        header = json.dumps({"__metadata__": {"format": "pt"},
                             tensor: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}, separators=(",", ":"))
        header = header.encode()
        header += b" " * (-len(header) % 8)
        n_new = size - 8 - len(header)
        if n_new == n:
            break
        n = n_new
    return len(header).to_bytes(8, "little") + header + noise(seed, n)


def model_files() -> dict[str, bytes | str]:
    """Relative path under /root/models -> content."""
    target_cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
        "rope_theta": 10000000, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
        "bos_token_id": 151643, "eos_token_id": 151645, "transformers_version": "4.57.1",
        "lab_stand_in": "tiny weights; not a real model",
    }
    draft_cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 5, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
        "rope_theta": 10000000, "rms_norm_eps": 1e-06, "block_size": 16, "num_target_layers": 64,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 16, 31, 46, 61]},
        "use_sliding_window": True, "sliding_window": 2048, "transformers_version": "4.57.1",
        "lab_stand_in": "tiny weights; not a real model",
    }
    tokenizer_cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144, "bos_token": None,
                     "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}
    files: dict[str, bytes | str] = {}
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for i, shard in enumerate(shards):
        files[f"{TARGET_MODEL}/{shard}"] = safetensors_bytes(f"{TARGET_MODEL}/{shard}", f"lab.shard{i}", 2 * MIB)
    files[f"{TARGET_MODEL}/model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 4 * MIB},
         "weight_map": {f"lab.shard{i}": shard for i, shard in enumerate(shards)}}, indent=2) + "\n"
    files[f"{TARGET_MODEL}/config.json"] = json.dumps(target_cfg, indent=2) + "\n"
    files[f"{TARGET_MODEL}/tokenizer_config.json"] = json.dumps(tokenizer_cfg, indent=2) + "\n"
    files[f"{DRAFT_MODEL}/model.safetensors"] = safetensors_bytes(f"{DRAFT_MODEL}/model.safetensors", "lab.draft",
                                                                  1 * MIB)
    files[f"{DRAFT_MODEL}/config.json"] = json.dumps(draft_cfg, indent=2) + "\n"
    files[f"{DRAFT_MODEL}/tokenizer_config.json"] = json.dumps(tokenizer_cfg, indent=2) + "\n"
    return files


def ensure_models(root: Path) -> list[str]:
    created = []
    base = root / MODELS_DIR
    files = None
    for rel in model_relpaths():
        path = base / rel
        if path.exists():
            continue
        files = files or model_files()
        write_atomic(path, files[rel], 0o644)
        created.append(f"/{MODELS_DIR}/{rel}")
    return [f"models ({len(created)} files)"] if created else []


def model_relpaths() -> list[str]:
    return [f"{TARGET_MODEL}/{f}" for f in ("config.json", "tokenizer_config.json", "model.safetensors.index.json",
                                            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")] \
        + [f"{DRAFT_MODEL}/{f}" for f in ("config.json", "tokenizer_config.json", "model.safetensors")]


# ---------------------------------------------------------------- networking

def veth_of(leader: int) -> str | None:
    """The control-side name of the host's veth (nspawn truncates/hashes long names), via host0's peer ifindex."""
    out = run(["nsenter", "-t", str(leader), "-n", "ip", "-o", "link", "show", "host0"], check=False).stdout
    m = re.search(r"host0@if(\d+)", out)
    if not m:
        return None
    for dev in Path("/sys/class/net").iterdir():
        try:
            if (dev / "ifindex").read_text().strip() == m.group(1):
                return dev.name
        except OSError:
            continue
    return None


def configure_network(rec: dict, leader: int) -> str:
    veth = None
    for _ in range(100):
        veth = veth_of(leader)
        if veth:
            break
        time.sleep(0.1)
    if not veth:
        raise LabError(f"no host0 veth found for leader {leader}")
    run(["ip", "addr", "replace", f"{rec['control_address']}/30", "dev", veth])
    run(["ip", "link", "set", veth, "up"])
    run(["nsenter", "-t", str(leader), "-n", "ip", "addr", "replace", f"{rec['address']}/30", "dev", "host0"])
    run(["nsenter", "-t", str(leader), "-n", "ip", "link", "set", "host0", "up"])
    return veth


# ---------------------------------------------------------------- supervisor (runs detached, one per host)

CLONE_NEWTIME = 0x80


def fresh_time_namespace() -> None:
    """Before exec of nspawn: its children (the container) get clocks that start at 1 s.

    A container shares the kernel's /proc/uptime, so without this the uptime never drops at a reboot and
    pyinfra's server.reboot (which waits for a smaller uptime) would time out. A time namespace per boot fixes that.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWTIME) != 0:
        return  # kernel without time namespaces: uptime stays the host's
    mono = int(time.clock_gettime(time.CLOCK_MONOTONIC)) - 1
    boot = int(time.clock_gettime(time.CLOCK_BOOTTIME)) - 1
    with open("/proc/self/timens_offsets", "w") as f:
        f.write(f"monotonic {-mono} 0\nboottime {-boot} 0\n")


def supervise(name: str) -> int:
    """Run systemd-nspawn for one host; start it again when the container reboots (exit 133)."""
    rec = load_hosts()[name]
    stopping = False
    child: subprocess.Popen | None = None

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True
        if child and child.poll() is None:
            child.send_signal(signal.SIGTERM)  # nspawn turns it into a clean poweroff of the container

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    boots = 0
    rc = 0
    while not stopping:
        boots += 1
        child = subprocess.Popen(["systemd-nspawn", "-q", "-b", "-D", rec["rootfs"], "-M", name, "--register=no",
                                  "--keep-unit", "--network-veth"], stdin=subprocess.DEVNULL,
                                 preexec_fn=fresh_time_namespace)
        leader = None
        for _ in range(300):
            if child.poll() is not None:
                break
            leader = leader_of(child.pid)
            with contextlib.suppress(OSError):
                if leader and os.readlink(f"/proc/{leader}/ns/net") != os.readlink("/proc/self/ns/net"):
                    break
            leader = None
            time.sleep(0.1)
        veth = None
        if leader:
            try:
                veth = configure_network(rec, leader)
                if load_hosts().get(name, {}).get("cut"):  # a cut cable stays cut across a reboot
                    run(["ip", "link", "set", veth, "down"])
            except LabError as e:
                print(f"[lab] {name}: network setup failed: {e}", flush=True)

        def record(hosts, leader=leader, veth=veth, nspawn=child.pid, boots=boots):
            hosts[name].update(supervisor_pid=os.getpid(), nspawn_pid=nspawn, leader_pid=leader, veth=veth,
                               boots=boots, booted_at=time.time())
        update_hosts(record)
        print(f"[lab] {name}: boot {boots}: nspawn {child.pid}, leader {leader}, veth {veth}", flush=True)
        rc = child.wait()
        print(f"[lab] {name}: systemd-nspawn exited {rc}", flush=True)
        if rc != NSPAWN_REBOOT_EXIT:
            break

    def stopped(hosts):
        if hosts.get(name, {}).get("supervisor_pid") == os.getpid():
            hosts[name].update(supervisor_pid=None, nspawn_pid=None, leader_pid=None, veth=None)
    update_hosts(stopped)
    return rc


# ---------------------------------------------------------------- host state

def host_running(name: str, rec: dict) -> bool:
    leader = rec.get("leader_pid")
    return (is_nspawn_of(rec.get("nspawn_pid"), name) and bool(leader)
            and pid_ppid(leader) == rec.get("nspawn_pid"))


def assign_slots(names: list[str], hosts: dict) -> None:
    used = {rec["slot"] for rec in hosts.values()}
    for pos, name in enumerate(names):
        if name in hosts:
            continue
        slot = pos if pos not in used else next(s for s in range(MAX_SLOTS) if s not in used)
        if slot >= MAX_SLOTS:
            raise LabError(f"no free address slot for {name}: at most {MAX_SLOTS} hosts")
        used.add(slot)
        control, address = slot_addresses(slot)
        hosts[name] = {"address": address, "control_address": control, "leader_pid": None,
                       "machine": name, "rootfs": str(host_dir(name) / "rootfs"), "slot": slot,
                       "rootfs_mode": None, "nspawn_pid": None, "supervisor_pid": None, "veth": None}


def write_known_hosts(hosts: dict) -> None:
    lines = []
    for name, rec in hosts.items():
        root = Path(rec["rootfs"])
        if rec.get("rootfs_mode") == "overlay" and not is_mounted(root):
            root = host_dir(name) / "upper"
        for kind in ("ed25519", "ecdsa", "rsa"):
            pub = root / f"etc/ssh/ssh_host_{kind}_key.pub"
            if pub.exists():
                keytype, key = pub.read_text().split()[:2]
                lines.append(f"{rec['address']} {keytype} {key}")
    write_atomic(KNOWN_HOSTS, "".join(line + "\n" for line in lines), 0o644)


def inventory_text(hosts: dict, placement: dict) -> str:
    """The pyinfra inventory for these hosts: group `lab_hosts`, host data from the lab's state and PLACEMENT."""
    key, known = json.dumps(str(SSH_KEY)), json.dumps(str(KNOWN_HOSTS))
    lines = ["# Generated by lab/lab.py up: the local lab's hosts. Do not edit; edit lab/lab.py's PLACEMENT instead.",
             "lab_hosts = ["]
    for name, rec in hosts.items():
        pad = " " * (len(f'    ("{name}", {{'))
        lines.append(f'    ({json.dumps(name)}, {{"ssh_hostname": {json.dumps(rec["address"])}, "ssh_user": "root", '
                     f'"ssh_key": {key},')
        lines.append(f'{pad}"ssh_known_hosts_file": {known}, "ssh_strict_host_key_checking": "yes",')
        lines.append(f'{pad}"run_services": {json.dumps(list(placement.get(name, [])))}}}),')
    lines.append("]")
    return "\n".join(lines) + "\n"


def wait_ssh(address: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if port_open(address) and ssh_ok(address):
            return True
        time.sleep(0.3)
    return False


def console_tail(name: str, n: int = 3) -> str:
    log = host_dir(name) / "console.log"
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return "(no console log)"


# ---------------------------------------------------------------- commands

def start_host(name: str) -> None:
    hdir = host_dir(name)
    hdir.mkdir(parents=True, exist_ok=True)
    with open(hdir / "console.log", "ab") as log:
        subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_supervise", name],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         close_fds=True, cwd="/")


def cmd_up(names: list[str]) -> int:
    t0 = time.monotonic()
    preflight()
    hosts = load_hosts()
    running = {n for n in names if n in hosts and host_running(n, hosts[n])}
    healthy = set()
    if running:
        with ThreadPoolExecutor(len(running)) as pool:
            for n, ok in zip(running, pool.map(lambda n: ssh_ok(hosts[n]["address"]), running)):
                if ok:
                    healthy.add(n)
    to_start = [n for n in names if n not in healthy]
    stuck = [n for n in to_start if n in running]
    if to_start:
        ensure_base()
        ensure_lab_key()
    for n in stuck:  # its container runs but SSH does not answer: maybe booting; give it a moment, then restart
        if wait_ssh(hosts[n]["address"], time.monotonic() + 20):
            healthy.add(n)
            to_start.remove(n)
        else:
            say(f"{n}: running but SSH does not answer; restarting it ({console_tail(n, 1)})")
            stop_host(n, hosts[n])
    hosts = update_hosts(lambda h: assign_slots(names, h))
    for n in to_start:
        rec = hosts[n]
        if rec.get("rootfs_mode") is None:
            mode = choose_rootfs_mode(n)
            update_hosts(lambda h, n=n, mode=mode: h[n].update(rootfs_mode=mode))
            rec["rootfs_mode"] = mode
        mount_rootfs(n, rec)
        changed = provision(n, rec)
        say(f"{n}: rootfs ready ({rec['rootfs_mode']}){': set ' + ', '.join(changed) if changed else ''}")
    for n in sorted(healthy):
        root = Path(hosts[n]["rootfs"])
        changed = (["nvidia-smi"] if sync_nvidia_smi(root) else []) + ensure_models(root)
        say(f"{n}: running at {hosts[n]['address']} (leader {hosts[n]['leader_pid']}), reused"
            + (f"; updated {', '.join(changed)}" if changed else ""))
    write_known_hosts(hosts)
    for n in to_start:
        start_host(n)
    deadline = time.monotonic() + 90
    failed = []
    for n in to_start:
        if wait_ssh(hosts[n]["address"], deadline):
            rec = load_hosts()[n]
            say(f"{n}: up at {rec['address']} (leader {rec['leader_pid']}, veth {rec['veth']}), "
                f"ssh ok in {time.monotonic() - t0:.1f} s")
        else:
            failed.append(n)
            say(f"{n}: FAILED: no SSH at {hosts[n]['address']} after 90 s; console: {console_tail(n)}")
    hosts = load_hosts()
    write_atomic(INVENTORY, inventory_text({n: hosts[n] for n in names}, PLACEMENT))
    say(f"inventory: {INVENTORY.relative_to(LAB_DIR.parent)} ({len(names)} hosts, group lab_hosts); "
        f"{time.monotonic() - t0:.1f} s")
    if failed:
        raise LabError(f"hosts without SSH: {', '.join(failed)}; see lab/state/hosts/<name>/console.log, "
                       "then `lab.py down` and `lab.py up`")
    return 0


def wait_pid_gone(pid: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid and time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or pid_cmdline(pid) == [""]:
            return True
        time.sleep(0.1)
    return not pid or not Path(f"/proc/{pid}").exists()


def stop_host(name: str, rec: dict) -> str:
    rec = load_hosts().get(name, rec)
    sup, nsp = rec.get("supervisor_pid"), rec.get("nspawn_pid")
    sup = sup if is_supervisor_of(sup, name) else None
    nsp = nsp if is_nspawn_of(nsp, name) else None
    how = "stopped"
    if not sup and not nsp:
        how = "was not running"
    else:
        # SIGTERM to the supervisor (or to nspawn): nspawn sends SIGRTMIN+3 to the container, a clean poweroff
        os.kill(sup or nsp, signal.SIGTERM)
        if not wait_pid_gone(sup or nsp, 35):
            how = "killed (no clean poweroff in 35 s)"
            cur = load_hosts().get(name, {})
            for n_pid in {nsp, cur.get("nspawn_pid")}:
                if is_nspawn_of(n_pid, name):
                    leader = leader_of(n_pid)
                    for pid in (leader, n_pid):
                        if pid:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                    wait_pid_gone(n_pid, 5)
            if is_supervisor_of(sup, name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(sup, signal.SIGKILL)
    veth = rec.get("veth")
    if veth and Path(f"/sys/class/net/{veth}").exists():
        run(["ip", "addr", "del", f"{rec['control_address']}/30", "dev", veth], check=False)
    unmount_rootfs(name)
    update_hosts(lambda h: h.get(name, {}).update(supervisor_pid=None, nspawn_pid=None, leader_pid=None,
                                                  veth=None))
    return how


def cmd_down(names: list[str], purge: bool) -> int:
    preflight()
    hosts = load_hosts()
    for n in names or list(hosts):
        if n not in hosts:
            say(f"{n}: unknown host")
            continue
        t0 = time.monotonic()
        how = stop_host(n, hosts[n])
        say(f"{n}: {how} ({time.monotonic() - t0:.1f} s)")
    if purge:
        targets = names or list(load_hosts())
        still = [n for n, r in load_hosts().items() if n in targets and host_running(n, r)]
        if still:
            raise LabError(f"not purging: still running: {', '.join(still)}")
        for n in targets:
            unmount_rootfs(n)
        if names:  # these hosts are forgotten, their address slots freed
            for n in names:
                remove_tree(host_dir(n))
            update_hosts(lambda h: [h.pop(n, None) for n in names])
            say(f"purged {', '.join(names)} (base cache kept)")
        else:  # all hosts: fresh rootfs and keys at the next up; addresses stay as recorded
            remove_tree(HOSTS_DIR)
            say(f"purged {HOSTS_DIR.relative_to(LAB_DIR.parent)} (base cache {BASE_ROOTFS.relative_to(LAB_DIR.parent)} kept)")
    return 0


def cmd_status() -> int:
    hosts = load_hosts()
    if not hosts:
        say("no lab hosts; run: python3 lab/lab.py up")
        return 0
    names = list(hosts)
    running = {n: host_running(n, hosts[n]) for n in names}
    with ThreadPoolExecutor(len(names)) as pool:
        ssh = dict(zip(names, pool.map(lambda n: running[n] and ssh_ok(hosts[n]["address"]), names)))
    for n in names:
        rec = hosts[n]
        extra = f"leader {rec['leader_pid']}, veth {rec['veth']}, boots {rec.get('boots')}" if running[n] else ""
        extra += ", NETWORK CUT (lab.py restore)" if rec.get("cut") else ""
        say(f"{n:<8} {rec['address']:<12} {'running' if running[n] else 'stopped':<8} "
            f"ssh {'ok' if ssh[n] else 'failed':<6} {extra}".rstrip())
    return 0 if all(running.values()) and all(ssh.values()) else 1


def cmd_reboot(name: str, timeout: float = 120) -> int:
    preflight()
    hosts = load_hosts()
    rec = hosts.get(name)
    if not rec or not host_running(name, rec):
        raise LabError(f"{name} is not running; start it with: python3 lab/lab.py up")
    if not is_supervisor_of(rec.get("supervisor_pid"), name):
        raise LabError(f"{name} has no supervisor to restart it; run: python3 lab/lab.py down {name} && "
                       "python3 lab/lab.py up")
    old_leader = rec["leader_pid"]
    t0 = time.monotonic()
    try:
        subprocess.run(ssh_base(rec["address"]) + ["systemctl", "reboot"], capture_output=True, timeout=15)
    except subprocess.TimeoutExpired:
        pass
    if pid_ppid(old_leader) == rec["nspawn_pid"] and not wait_pid_gone(old_leader, 10):
        with contextlib.suppress(ProcessLookupError):
            os.kill(old_leader, signal.SIGINT)  # systemd as PID 1: ctrl-alt-del, i.e. reboot
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        cur = load_hosts()[name]
        if cur.get("leader_pid") and cur["leader_pid"] != old_leader and host_running(name, cur):
            break
        time.sleep(0.2)
    else:
        raise LabError(f"{name} did not come back within {timeout:.0f} s; console: {console_tail(name)}")
    if not wait_ssh(rec["address"], deadline):
        raise LabError(f"{name} rebooted but SSH does not answer; console: {console_tail(name)}")
    cur = load_hosts()[name]
    say(f"{name}: rebooted in {time.monotonic() - t0:.1f} s (leader {old_leader} -> {cur['leader_pid']}, "
        f"boot {cur.get('boots')}), ssh ok")
    return 0


def running_host(name: str) -> dict:
    rec = load_hosts().get(name)
    if not rec or not host_running(name, rec):
        raise LabError(f"{name} is not running; start it with: python3 lab/lab.py up --hosts ...,{name}")
    if not rec.get("veth") or not Path(f"/sys/class/net/{rec['veth']}").exists():
        raise LabError(f"{name} has no veth on this side (hosts.json: {rec.get('veth')!r})")
    return rec


def cmd_cut(name: str, kill_connections: bool) -> int:
    """Cut one host's network: its veth on this side goes down (the host sees NO-CARRIER on host0).

    The host itself runs on (its services, a command an SSH session started); nothing reaches it
    and nothing from it reaches this machine. Open TCP connections survive a short cut, as on a real
    network; `kill_connections` also aborts this machine's connections to the host (`ss -K`), which
    is what a cut longer than TCP's retransmission timeout (about 15 minutes) ends in.
    """
    preflight()
    rec = running_host(name)
    update_hosts(lambda h: h[name].update(cut=True))
    run(["ip", "link", "set", rec["veth"], "down"])
    killed = ""
    if kill_connections:
        out = run(["ss", "-H", "-K", "-t", "dst", rec["address"]], check=False).stdout
        killed = f"; {len(out.strip().splitlines())} TCP connection(s) from here aborted"
    say(f"{name}: network cut (veth {rec['veth']} down, {rec['address']} unreachable){killed}")
    return 0


def cmd_restore(name: str, timeout: float = 60) -> int:
    """Undo `cut`: the veth up again, its address and route back; wait for SSH."""
    preflight()
    rec = running_host(name)
    t0 = time.monotonic()
    run(["ip", "link", "set", rec["veth"], "up"])
    run(["ip", "addr", "replace", f"{rec['control_address']}/30", "dev", rec["veth"]])
    update_hosts(lambda h: h[name].update(cut=False))
    if not wait_ssh(rec["address"], t0 + timeout):
        raise LabError(f"{name}: network restored but SSH does not answer within {timeout:.0f} s; "
                       f"console: {console_tail(name)}")
    say(f"{name}: network restored (veth {rec['veth']} up), ssh ok in {time.monotonic() - t0:.1f} s")
    return 0


def cap_links() -> dict[str, str]:
    """{veth (this side): this machine's address on it} of every running host (what `cap` shapes)."""
    hosts = load_hosts()
    return {rec["veth"]: rec["control_address"] for name, rec in sorted(hosts.items())
            if host_running(name, rec) and rec.get("veth") and Path(f"/sys/class/net/{rec['veth']}").exists()}


def cmd_cap(rate: str | None) -> int:
    """Cap this machine's link to the running hosts at `rate` (lab/link_cap.py); `None`: take it away."""
    import link_cap

    preflight()
    links = cap_links()
    try:
        if rate is None:
            link_cap.uncap(list(links))
            say(f"link to the hosts uncapped ({len(links)} veth(s))")
            return 0
        link_cap.cap(links, rate)
    except link_cap.CapError as e:
        raise LabError(str(e)) from None
    say(f"link between this machine and {len(links)} host(s) capped at {link_cap.tc_rate(rate)} each way "
        "(host to host uncapped); `lab.py uncap` takes it away")
    return 0


def parse_process(spec: str) -> dict:
    try:
        idx, pid, mib = (int(x) for x in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--process wants IDX:PID:MiB, got {spec!r}")
    return {"gpu_index": idx, "pid": pid, "used_memory_mib": mib, "name": "python3"}


def cmd_gpus(args) -> int:
    preflight()
    hosts = load_hosts()
    rec = hosts.get(args.name)
    if not rec or not rec.get("rootfs_mode"):
        raise LabError(f"unknown host {args.name}; run: python3 lab/lab.py up --hosts ...,{args.name}")
    mounted_now = mount_rootfs(args.name, rec)
    try:
        root = Path(rec["rootfs"])
        path = root / "etc/lab/gpus.json"
        cfg = json.loads(path.read_text()) if path.exists() and not args.reset else default_gpus(args.name)
        if any(v is not None for v in (args.count, args.gpu_name, args.compute_cap, args.memory_mib)):
            first = cfg["gpus"][0] if cfg["gpus"] else make_gpu(args.name, 0, DEFAULT_GPU["name"],
                                                                DEFAULT_GPU["compute_cap"],
                                                                DEFAULT_GPU["memory_total_mib"])
            old_states = {g["index"]: g.get("state", "ok") for g in cfg["gpus"]}
            cfg["gpus"] = [make_gpu(args.name, i, args.gpu_name or first["name"],
                                    args.compute_cap or first["compute_cap"],
                                    args.memory_mib or first["memory_total_mib"])
                           for i in range(args.count if args.count is not None else len(cfg["gpus"]))]
            for g in cfg["gpus"]:
                g["state"] = old_states.get(g["index"], "ok")
        if args.cuda:
            cfg["cuda_version"] = args.cuda
        by_index = {g["index"]: g for g in cfg["gpus"]}
        for state, idxs in (("ok", args.ok), ("failed", args.fail), ("missing", args.missing)):
            for i in idxs or []:
                if i not in by_index:
                    raise LabError(f"{args.name} has no GPU {i} (it has {len(by_index)}: 0..{len(by_index) - 1})")
                by_index[i]["state"] = state
        if args.clear_processes:
            cfg["processes"] = []
        for p in args.process or []:
            if p["gpu_index"] not in by_index:
                raise LabError(f"{args.name} has no GPU {p['gpu_index']}")
            cfg["processes"] = [q for q in cfg.get("processes", []) if q["pid"] != p["pid"]] + [p]
        changed = write_gpus(root, cfg)
    finally:
        if mounted_now:
            unmount_rootfs(args.name)
    say(f"{args.name}: gpus {'set' if changed else 'unchanged'}: {gpus_summary(cfg)}")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lab.py", description="Local test lab: systemd-nspawn hosts over SSH.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the hosts (idempotent)")
    up.add_argument("--hosts", default=",".join(DEFAULT_HOSTS), help="comma list (default: %(default)s)")
    down = sub.add_parser("down", help="stop the hosts that up started")
    down.add_argument("names", nargs="*", help="hosts to stop (default: all)")
    down.add_argument("--purge", action="store_true", help="also delete lab/state/hosts (keeps the base cache)")
    sub.add_parser("status", help="one line per host")
    rb = sub.add_parser("reboot", help="reboot a host for real and wait for SSH")
    rb.add_argument("name")
    cut = sub.add_parser("cut", help="cut a host's network (its veth down); `restore` undoes it")
    cut.add_argument("name")
    cut.add_argument("--kill-connections", action="store_true",
                     help="also abort this machine's TCP connections to the host (a cut that outlasts TCP's timeout)")
    rs = sub.add_parser("restore", help="restore a cut host's network and wait for SSH")
    rs.add_argument("name")
    g = sub.add_parser("gpus", help="set a host's stand-in GPUs (/etc/lab/gpus.json)")
    g.add_argument("name")
    g.add_argument("--count", type=int)
    g.add_argument("--name", dest="gpu_name", help='product name, e.g. "NVIDIA H200"')
    g.add_argument("--compute-cap", help="e.g. 9.0")
    g.add_argument("--memory-mib", type=int)
    g.add_argument("--cuda", help="the CUDA version the driver supports, as nvidia-smi's header says it (e.g. 12.8)")
    g.add_argument("--fail", type=int, action="append", metavar="IDX", help="GPU IDX requires reset (ERR!)")
    g.add_argument("--missing", type=int, action="append", metavar="IDX", help="GPU IDX fell off the bus")
    g.add_argument("--ok", type=int, action="append", metavar="IDX", help="GPU IDX healthy again")
    g.add_argument("--process", type=parse_process, action="append", metavar="IDX:PID:MiB",
                   help="add a compute app entry")
    g.add_argument("--clear-processes", action="store_true")
    g.add_argument("--reset", action="store_true", help="back to the defaults")
    cp = sub.add_parser("cap", help="cap this machine's link to the hosts (host to host stays fast); `uncap` undoes it")
    cp.add_argument("--rate", required=True, help="tc's units (40mibps = 40 MiB/s, 320mbit) or 40MiB/s")
    sub.add_parser("uncap", help="take the cap of `cap` away")
    sup = sub.add_parser("_supervise")
    sup.add_argument("name")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "_supervise":
            return supervise(args.name)
        if args.cmd == "status":
            return cmd_status()
        # Not under the lab lock: a cut or restore must not wait for another `up` (it touches one veth).
        if args.cmd == "cut":
            return cmd_cut(args.name, args.kill_connections)
        if args.cmd == "restore":
            return cmd_restore(args.name)
        if args.cmd in ("cap", "uncap"):
            return cmd_cap(args.rate if args.cmd == "cap" else None)
        with file_lock(LOCK_FILE):
            if args.cmd == "up":
                names = [n.strip() for n in args.hosts.split(",") if n.strip()]
                bad = [n for n in names if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", n)]
                if bad:
                    raise LabError(f"bad host name(s) {bad}: use lowercase letters, digits and '-'")
                return cmd_up(names)
            if args.cmd == "down":
                return cmd_down(args.names, args.purge)
            if args.cmd == "reboot":
                return cmd_reboot(args.name)
            if args.cmd == "gpus":
                return cmd_gpus(args)
    except LabError as e:
        print(f"lab.py {args.cmd}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
