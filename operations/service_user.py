"""The unprivileged account the services run as, and what the sandboxed unit needs to reach.

`service_user` (data, default `sglang`) names the account. The deploy creates it as a system
user and group (no login shell, home `/var/lib/sglang`, which systemd makes as the unit's
`StateDirectory=`); `service_user: root` keeps the old behaviour for hosts where the engine
must run as root, with the same sandbox otherwise (see templates/sglang.service.j2).

What the account must reach, and how:

- GPUs: `/dev/nvidia*` are 0666 on most hosts; where a device is not world-accessible, its
  group (e.g. `video`) goes into the unit's `SupplementaryGroups=` (`GpuDevices` reads them, `gpu_device_groups`).
  A device only root can open stops the host with the fix (`service_user: root`, or the
  driver's `NVreg_DeviceFileMode`/`NVreg_DeviceFileGID`).
- venv and models under a home directory (`/root/venv_sglang` and `/root/models` by default;
  `/root` is 0700): the unit's `ProtectHome=tmpfs` hides every home, and `BindReadOnlyPaths=`
  shows back, read-only, exactly what the service loads (`hidden_paths`): its venv path, the
  venv's generations beside it (`<venv>.generations`, whatever is inside), and the models it
  loads from the store. No permission on the host changes.
- caches (triton, flashinfer JIT, torch, CUDA) and HOME: `CacheDirectory=`/`StateDirectory=`,
  which systemd creates and hands to the user (`runtime_environment`).
- the `--config` file with API keys: root-owned, group the service user's, 0640 in a 0710
  directory (operations/secrets.py); 0600 root-only when the user is root.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.server import Groups

from configuration.host_paths import SERVICE_CACHE_DIR as CACHE_DIR
from configuration.host_paths import SERVICE_STATE_DIR as STATE_DIR
from operations import host_reads
from operations.host_reads import operation

# ProtectHome=tmpfs mounts an empty, read-only tmpfs on each of these.
HOME_DIRS = ("/root", "/home", "/run/user")
NOLOGIN = "/usr/sbin/nologin"


def group_of(user: str) -> str:
    """The service user's primary group (created with it, same name); `root` for root."""
    return user


def runtime_environment() -> dict[str, str]:
    """Where the engine's JIT caches and HOME point: directories systemd owns for the unit.

    flashinfer keeps its JIT cache in `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`
    (flashinfer/jit/env.py), triton in `$TRITON_CACHE_DIR`, torch's inductor in
    `$TORCHINDUCTOR_CACHE_DIR` (else a /tmp dir, private and lost at each restart), the CUDA
    driver's PTX cache in `$CUDA_CACHE_PATH`; the rest (huggingface, outlines, torch
    extensions, deep_gemm) under `$XDG_CACHE_HOME` or `$HOME`.
    """
    return {
        "HOME": STATE_DIR,
        "XDG_CACHE_HOME": CACHE_DIR,
        "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{CACHE_DIR}/flashinfer",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",
        "CUDA_CACHE_PATH": f"{CACHE_DIR}/nv",
    }


def is_hidden(path: str) -> bool:
    """Whether `ProtectHome=tmpfs` hides `path` from the unit."""
    return any(path == d or path.startswith(d + "/") for d in HOME_DIRS)


def hidden_paths(venv_path: str, store_paths: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(path, required) the unit binds read-only back into its namespace, because a home dir hides them.

    The venv's `.generations` sibling is optional (`-` in the unit): it exists only with the
    generation layout, where `venv_path` is a symlink into it.
    """
    wanted = [(venv_path, True), (f"{venv_path}.generations", False)] + [(p, False) for p in store_paths]
    seen: dict[str, bool] = {}
    for path, required in wanted:
        if is_hidden(path) and path not in seen:
            seen[path] = required
    return list(seen.items())


@host_reads.batched()
class GpuDevices(FactBase):
    """Mode (octal), group and path of each NVIDIA character device (empty on a host without them)."""

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return "for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && stat -c '%a %G %n' \"$f\"; done; true"

    def process(self, output):
        rows = []
        for line in output:
            parts = line.split(None, 2)
            if len(parts) == 3:
                rows.append((parts[0], parts[1], parts[2]))
        return rows


def device_access(devices: list[tuple[str, str, str]], user: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(groups the user needs for the GPU devices, devices it cannot open at all).

    A device that others may read and write (0666, the driver's default) needs nothing; one
    that only its group may use needs that group; one that only root may use cannot be
    reached by an unprivileged user.
    """
    if user == "root":
        return (), ()
    groups: list[str] = []
    closed: list[str] = []
    for mode, group, path in devices:
        bits = int(mode, 8)
        if bits & 0o006 == 0o006:
            continue
        if group != "root" and bits & 0o060 == 0o060:
            if group not in groups:
                groups.append(group)
        else:
            closed.append(path)
    return tuple(groups), tuple(closed)


def gpu_device_groups(user: str) -> tuple[str, ...]:
    """The GPU device groups of the current host (a fact, read before the deploy changes anything)."""
    groups, _ = device_access(host_reads.get(host, GpuDevices), user)
    return groups


@operation()
def devices_reachable(user: str):
    """
    Fail the host, before any unit changes, if a GPU device is one the service user cannot open.

    + user: the service user
    """
    _, closed = device_access(host_reads.get(host, GpuDevices), user)
    if closed:
        raise OperationError(
            f"service_user {user} cannot open {', '.join(closed)} (mode without access for others, group root): "
            "set `service_user: root` for this host, or make the driver create its devices 0666 or for a group "
            "(nvidia module options NVreg_DeviceFileMode/NVreg_DeviceFileGID)"
        )
    host.noop(f"GPU devices are reachable by {user}")
    yield from ()


@host_reads.batched()
class Account(FactBase):
    """One account's passwd entry and its primary group's name, or None when it does not exist.

    pyinfra's `server.user` reads `Users`, every account of the host with its groups (a command
    per account): the most expensive read of a converged host, for the one account we own.
    """

    def command(self, user: str) -> str:
        quoted = shlex.quote(user)
        return f"getent passwd {quoted} || true; echo @@; id -gn {quoted} 2>/dev/null || true"

    def process(self, output):
        lines = list(output)
        split = lines.index("@@") if "@@" in lines else len(lines)
        entry = next((line for line in lines[:split] if line.count(":") >= 6), None)
        if entry is None:
            return None
        name, _pw, uid, _gid, _gecos, home, shell = entry.split(":", 6)
        group = lines[split + 1].strip() if len(lines) > split + 1 else ""
        return {"user": name, "uid": int(uid), "home": home, "shell": shell, "group": group}


@operation()
def group_present(group: str):
    """
    A system group ``group`` (pyinfra's `server.group` does the same, reading the host's groups again on every run;
    this decides from the host's one read).

    + group: its name
    """
    if group in host_reads.get(host, Groups):
        host.noop(f"group {group} exists")
        return
    yield StringCommand("groupadd", "--system", QuoteString(group))


@operation()
def account(user: str, group: str, home: str, shell: str):
    """
    A system account ``user`` with primary group ``group``, home ``home`` (not created) and login shell ``shell``.

    + user: the account
    + group: its primary group (which must exist)
    + home: its home directory, set in passwd only (systemd's `StateDirectory=` makes it for the unit)
    + shell: its login shell (`/usr/sbin/nologin`)
    """
    found = host_reads.get(host, Account, user=user)
    if found is None:
        yield StringCommand("useradd", "-d", QuoteString(home), "-s", QuoteString(shell), "-g", QuoteString(group), "-r", "-M", QuoteString(user))
        return
    changes: list = []
    if found["home"] != home:
        changes += ["-d", QuoteString(home)]
    if found["shell"] != shell:
        changes += ["-s", QuoteString(shell)]
    if found["group"] != group:
        changes += ["-g", QuoteString(group)]
    if changes:
        yield StringCommand("usermod", *changes, QuoteString(user))
    else:
        host.noop(f"account {user} is a system account of group {group}, home {home}, shell {shell}")


def ensure_account(user: str) -> None:
    """Add the operations that create the service account (nothing for root)."""
    devices_reachable(name=f"GPU devices reachable by {user}", user=user)
    if user == "root":
        return
    group_present(name=f"System group {user}", group=group_of(user))
    account(name=f"System user {user} (no login shell) runs the services", user=user, group=group_of(user), home=STATE_DIR, shell=NOLOGIN)
