"""The unprivileged account the services run as, and what the sandboxed unit needs to reach.

`service_user` (data, default `sglang`) names the account. The deploy creates it as a system
user and group (no login shell, home `/var/lib/sglang`, which systemd makes as the unit's
`StateDirectory=`); `service_user: root` keeps the old behaviour for hosts where the engine
must run as root, with the same sandbox otherwise (see templates/sglang.service.j2).

What the account must reach, and how:

- GPUs: `/dev/nvidia*` are 0666 on most hosts; where a device is not world-accessible, its
  group (e.g. `video`) goes into the unit's `SupplementaryGroups=` (`GpuDevices` reads them,
  `gpu_device_groups`). A device only root can open stops the host with the fix (`service_user:
  root`, or the driver's `NVreg_DeviceFileMode`/`NVreg_DeviceFileGID`).
- venv and models under a home directory (`/root/venv_sglang` and `/root/models` by default;
  `/root` is 0700): the unit's `ProtectHome=tmpfs` hides every home, and `BindReadOnlyPaths=`
  shows back, read-only, exactly what the service loads (`hidden_paths`): its venv path, the
  venv's generations beside it (`<venv>.generations`, whatever is inside), and the models it
  loads from the store. No permission on the host changes.
- caches (triton, flashinfer JIT, torch, CUDA) and HOME: `CacheDirectory=`/`StateDirectory=`,
  which systemd creates and hands to the user (`runtime_environment`).
- the `--config` file with API keys: root-owned, group the service user's, 0640 in a 0710
  directory (operations/service/secrets.py); 0600 root-only when the user is root.

The account must be the deploy's own (`dedicated_account`, before any account or group changes): an
account of that name that exists is not uid or gid 0, its primary group is its own group with no
other member, it is in no other group, it has no login shell and its home is the deploy's; a group
of that name that exists before the account has no member. Otherwise the deploy would run the engine
with another account's privileges, or make an account others use its own (its key files are readable
by the account's group): the host stops, naming what it found and the fix. The control machine
refuses well-known privileged names before any host is touched (configuration/kinds.py,
`PRIVILEGED_ACCOUNTS`).
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.facts.server import Groups

from configuration.host_paths import SERVICE_CACHE_DIR as CACHE_DIR
from configuration.host_paths import SERVICE_STATE_DIR as STATE_DIR
from operations.run import host_reads, read_batch
from operations.run.host_reads import operation
from operations.run.plan import Refusal
from operations.service import kernel_cache

# ProtectHome=tmpfs mounts an empty, read-only tmpfs on each of these.
HOME_DIRS = ("/root", "/home", "/run/user")
NOLOGIN = "/usr/sbin/nologin"


def group_of(user: str) -> str:
    """The service user's primary group (created with it, same name); `root` for root."""
    return user


def runtime_environment(cache_dir: str | None = None) -> dict[str, str]:
    """Where the engine's JIT caches and HOME point: into `cache_dir`, the service's kernel cache
    inside the unit's CacheDirectory (operations/service/kernel_cache.py); without one (a run in
    the service's sandbox, not the service), the CacheDirectory itself and HOME the unit's
    StateDirectory."""
    if cache_dir is not None:
        return kernel_cache.environment(cache_dir)
    return {**kernel_cache.environment(CACHE_DIR), "HOME": STATE_DIR}


def is_hidden(path: str) -> bool:
    """Whether `ProtectHome=tmpfs` hides `path` from the unit."""
    return any(path == d or path.startswith(d + "/") for d in HOME_DIRS)


def hidden_paths(venv_path: str, store_paths: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(path, required) the unit binds read-only back into its namespace, because a home dir hides
    them.

    The venv's `.generations` sibling is optional (`-` in the unit): it exists only with the
    generation layout, where `venv_path` is a symlink into it.
    """
    wanted = ([(venv_path, True), (f"{venv_path}.generations", False)]
              + [(p, False) for p in store_paths])
    seen: dict[str, bool] = {}
    for path, required in wanted:
        if is_hidden(path) and path not in seen:
            seen[path] = required
    return list(seen.items())


@read_batch.batched()
class GpuDevices(FactBase):
    """Mode (octal), group and path of each NVIDIA character device (empty on a host without
    them)."""

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return ("for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && stat -c '%a %G %n' "
                "\"$f\"; done; true")

    def process(self, output):
        rows = []
        for line in output:
            parts = line.split(None, 2)
            if len(parts) == 3:
                rows.append((parts[0], parts[1], parts[2]))
        return rows


def device_access(devices: list[tuple[str, str, str]],
                  user: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
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
    """The GPU device groups of the current host (a fact, read before the deploy changes
    anything)."""
    groups, _ = device_access(host_reads.get(host, GpuDevices), user)
    return groups


def refuse_closed_devices(devices: list[tuple[str, str, str]], user: str) -> None:
    """The Service account step's decider on the GPU devices (`GpuDevices`): `plan.Refusal` where
    the service user cannot open one."""
    _, closed = device_access(devices, user)
    if closed:
        raise Refusal(
            f"service_user {user} cannot open {', '.join(closed)} (mode without access for others, "
            "group root): set `service_user: root` for this host, or make the driver create its "
            "devices 0666 or for a group (nvidia module options "
            "NVreg_DeviceFileMode/NVreg_DeviceFileGID)", what=user)


@operation()
def devices_reachable(user: str):
    """
    Fail the host, before any unit changes, if a GPU device is one the service user cannot open.

    + user: the service user
    """
    refuse_closed_devices(host_reads.get(host, GpuDevices), user)
    host.noop(f"GPU devices are reachable by {user}")
    yield from ()


@read_batch.batched()
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


# Shells that log nobody in (useradd's nologin, and false, which older system accounts have).
NO_LOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/usr/bin/nologin", "/bin/false",
                   "/usr/bin/false")


@read_batch.batched()
class AccountStanding(FactBase):
    """What could make an account someone else's: its passwd entry, its primary group's entry
    (before the account exists: the group of its name, which useradd would use), the other accounts
    whose primary group that is, and the groups that list the account as a member (also before it
    exists: it would be in them at once). From NSS (`getent`), as logins and systemd see them."""

    def command(self, user: str) -> str:
        quoted = shlex.quote(user)
        return (
            f"u={quoted}; p=$(getent passwd \"$u\"); echo \"$p\"; echo @@; "
            "if [ -n \"$p\" ]; then g=$(printf '%s\\n' \"$p\" | cut -d: -f4); else g=\"$u\"; fi; "
            "e=$(getent group \"$g\"); echo \"$e\"; echo @@; gid=$(printf '%s\\n' \"$e\" | cut -d: "
            "-f3); [ -z \"$gid\" ] || getent passwd | awk -F: -v g=\"$gid\" -v u=\"$u\" '$4 == g "
            "&& $1 != u {print $1}'; echo @@; getent group | awk -F: -v u=\"$u\" '{n = split($4, "
            "m, \",\"); for (i = 1; i <= n; i++) if (m[i] == u) print $1}'; true"
        )

    def process(self, output):
        sections: list[list[str]] = [[]]
        for line in output:
            if line.strip() == "@@":
                sections.append([])
            elif line.strip():
                sections[-1].append(line.strip())
        passwd, group, sharing, listed_in = (sections + [[], [], [], []])[:4]
        account = None
        fields = passwd[0].split(":", 6) if passwd else []
        if len(fields) == 7 and fields[2].isdigit() and fields[3].isdigit():
            account = {"user": fields[0], "uid": int(fields[2]), "gid": int(fields[3]),
                       "home": fields[5], "shell": fields[6]}
        primary = None
        fields = group[0].split(":", 3) if group else []
        if len(fields) == 4 and fields[2].isdigit():
            primary = {"name": fields[0], "gid": int(fields[2]),
                       "members": [m for m in fields[3].split(",") if m]}
        return {"account": account, "group": primary, "sharing": sharing, "listed_in": listed_in}


def not_dedicated(user: str, standing: dict) -> list[tuple[str, str]]:
    """(what was found, how to undo it) for each thing that makes `user` someone else's account
    rather than the services' own, as `AccountStanding` read it; [] when it is theirs (or does not
    exist, and nothing waits for it)."""
    account, group = standing["account"], standing["group"]
    group_name = group["name"] if group else None
    found: list[tuple[str, str]] = []
    if account is not None:
        if account["uid"] == 0:
            found.append(("uid 0 (root's)", "name another account: one with uid 0 is root"))
        if account["gid"] == 0:
            found.append(("primary group gid 0 (root's)", f"usermod -g {user} {user}"))
        elif group_name != user:
            found.append((f"primary group {group_name or account['gid']}, not its own group {user}",
                          f"usermod -g {user} {user} (after groupadd --system {user} where that "
                          "group does not exist)"))
        if account["shell"] not in NO_LOGIN_SHELLS:
            found.append((f"login shell {account['shell'] or '(empty: /bin/sh)'}",
                          f"usermod -s {NOLOGIN} {user}"))
        if account["home"] != STATE_DIR:
            found.append((f"home {account['home']}, not {STATE_DIR} (the deploy's accounts have "
                          "that home; another's is another daemon's or a person's)",
                          f"usermod -d {STATE_DIR} {user}"))
    elif group is not None and group["gid"] == 0:
        found.append((f"group {group_name} has gid 0 (root's)", "name another account"))
    if group is not None and group_name == user:
        members = [m for m in group["members"] if m != user]
        if members:
            found.append((f"its group {user} has other members: {', '.join(members)}",
                          "; ".join(f"gpasswd -d {m} {user}" for m in members)))
        if standing["sharing"]:
            found.append(
                (f"its group {user} is the primary group of {', '.join(standing['sharing'])} too",
                 "; ".join(f"usermod -g OTHER_GROUP {m}" for m in standing["sharing"])))
    # Listed in its own group is no other group.
    others = [g for g in standing["listed_in"] if g != group_name]
    if others:
        found.append(
            (f"member of {', '.join(others)}", "; ".join(f"gpasswd -d {user} {g}" for g in others)))
    return found


def refuse_not_dedicated(user: str, standing: dict) -> None:
    """The Service account step's decider on whose the account is (`AccountStanding`):
    `plan.Refusal` where it is someone else's (`not_dedicated`)."""
    found = not_dedicated(user, standing)
    if found:
        raise Refusal(
            f"service_user {user} is not the services' own account on this host: "
            f"{'; '.join(f for f, _ in found)}. Set `service_user` to a name no account or group "
            f"of this host has (the deploy creates it, e.g. sglang), or, if {user} is the "
            f"services' own account, undo this by hand: {'; '.join(fix for _, fix in found)}",
            what=user)


@operation()
def dedicated_account(user: str):
    """
    Fail the host, before any account or group changes, if ``user`` (or, before it exists, the group
    of its name) is someone else's: the deploy makes the account its own (usermod) and runs the
    engine with its privileges.

    + user: the service user (not root)
    """
    refuse_not_dedicated(user, host_reads.get(host, AccountStanding, user=user))
    host.noop(f"account {user} is the services' own, or does not exist yet")
    yield from ()


@operation()
def group_present(group: str):
    """
    A system group ``group`` (pyinfra's `server.group` does the same, reading the host's groups
    again on every run; this decides from the host's one read).

    + group: its name
    """
    if group in host_reads.get(host, Groups):
        host.noop(f"group {group} exists")
        return
    yield StringCommand("groupadd", "--system", QuoteString(group))


def account_fixes(found: dict, group: str, home: str, shell: str) -> dict[str, str]:
    """What differs on an existing account (`Account` fact) from the wanted one:
    {"home"|"shell"|"group": wanted}."""
    wanted = {"home": home, "shell": shell, "group": group}
    return {key: value for key, value in wanted.items() if found.get(key) != value}


@operation()
def account(user: str, group: str, home: str, shell: str):
    """
    A system account ``user`` with primary group ``group``, home ``home`` (not created) and login
    shell ``shell``.

    + user: the account
    + group: its primary group (which must exist)
    + home: its home directory, set in passwd only (systemd's `StateDirectory=` makes it for the
      unit)
    + shell: its login shell (`/usr/sbin/nologin`)
    """
    found = host_reads.get(host, Account, user=user)
    if found is None:
        yield StringCommand("useradd", "-d", QuoteString(home), "-s", QuoteString(shell), "-g",
                            QuoteString(group), "-r", "-M", QuoteString(user))
        return
    changes = account_fixes(found, group, home, shell)
    if changes:
        flags = {"home": "-d", "shell": "-s", "group": "-g"}
        yield StringCommand("usermod",
                            *(w for k, v in changes.items() for w in (flags[k], QuoteString(v))),
                            QuoteString(user))
    else:
        host.noop(
            f"account {user} is a system account of group {group}, home {home}, shell {shell}")


def ensure_account(user: str) -> None:
    """Add the operations that create the service account (nothing for root)."""
    devices_reachable(name=f"GPU devices reachable by {user}", user=user)
    if user == "root":
        return
    dedicated_account(name=f"{user} is the services' own account", user=user)
    group_present(name=f"System group {user}", group=group_of(user))
    account(name=f"System user {user} (no login shell) runs the services", user=user,
            group=group_of(user), home=STATE_DIR, shell=NOLOGIN)
