"""One type per kind of value, each with its rule and its fix: the words of configuration/schema.py.

A kind is a pydantic type (strict: a string is never read as a number, a bool never as an int) that
checks the WHOLE value (`re.fullmatch`: `$` would let a final newline through) and, when it refuses,
says how to fix it. Wherever a kind of value appears in the data it gets the same rule: every string
that reaches a unit file, an argv, a host path or a shell is one of these kinds.

A refusal is a `PydanticCustomError` of type `refused` whose context holds the fix (and, where the
value shown should be another than the one refused, `shown`); `configuration/settings.py` turns the
first one into a `DataError` naming the file, the key path, the value and the fix.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import unicodedata
from collections import deque
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import AfterValidator, BeforeValidator, Strict, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from configuration.host_paths import OWN_PATHS, SERVICE_CACHE_DIR, SERVICE_STATE_DIR

REFUSED = "refused"


def refuse(fix: str, shown: Any = None, at: str | None = None) -> PydanticCustomError:
    """The error a kind raises: `fix` is the message's last part (no `{}` formatting is applied to it); `shown`:
    the value the message shows, where it is another than the one refused; `at`: a key below the one refused
    (a map's rule that names one of its entries)."""
    context = {"fix": fix}
    if shown is not None:
        context["shown"] = shown
    if at is not None:
        context["at"] = at
    return PydanticCustomError(REFUSED, "{fix}", context)


def with_fix(fix: str) -> WrapValidator:
    """Any refusal inside the kind (a wrong type, a value out of range) reads as the kind's own `fix`,
    except a refusal with a fix of its own (a more precise rule inside the kind), which is kept."""

    def wrap(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            own = [e for e in exc.errors() if e["type"] == REFUSED]
            if own:
                raise refuse(own[0]["ctx"]["fix"], own[0]["ctx"].get("shown"), own[0]["ctx"].get("at")) from None
            raise refuse(fix) from None

    return WrapValidator(wrap)


def matching(pattern: str, fix: str) -> AfterValidator:
    """The whole string matches `pattern` (fullmatch: no final newline slips through `$`)."""
    compiled = re.compile(pattern)

    def check(text: str) -> str:
        if compiled.fullmatch(text) is None:
            raise refuse(fix)
        return text

    return AfterValidator(check)


def _not_too_long_a_number(value: Any) -> Any:
    """Python refuses int() of more than 4300 digits and repr() of such an int: a number that long is
    refused before anything converts or shows it (no value here needs more than 18 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        raise refuse("is far too large a number: no value here needs more than 18 digits", shown=f"<a number of {value.bit_length()} bits>")
    return value


# Numbers ------------------------------------------------------------------------------------

Int = Annotated[int, Strict(), BeforeValidator(_not_too_long_a_number)]


def _in_range(low: int, high: int, fix: str) -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise refuse(fix)
        return value

    return AfterValidator(check)


PORT_FIX = "must be a TCP port, an integer from 1 to 65535"
Port = Annotated[Int, _in_range(1, 65535, PORT_FIX), with_fix(PORT_FIX)]


MAX_GPUS = 64
GPU_FIX = "must be a GPU index (0-63) or a non-empty list of them, e.g. `gpu: 1` or `gpu: [0, 1]`, or `auto`"
GpuIndex = Annotated[Int, _in_range(0, MAX_GPUS - 1, GPU_FIX)]


def _gpu_list(value: list[int]) -> list[int]:
    if not value:
        raise refuse(GPU_FIX)
    if len(set(value)) != len(value):
        raise refuse("lists a GPU twice; list each index once")
    return value


Gpus = Annotated[Union[Literal["auto"], GpuIndex, Annotated[list[GpuIndex], AfterValidator(_gpu_list)]], with_fix(GPU_FIX)]
FailedGpus = Annotated[list[GpuIndex], with_fix("must be a list of GPU indexes (0-63), e.g. `[1]`")]


def seconds(low: int, high: int) -> Any:
    fix = f"must be whole seconds from {low} to {high}"
    return Annotated[Int, _in_range(low, high, fix), with_fix(fix)]


Bool = Annotated[bool, Strict(), with_fix("must be true or false")]
ASCII_DECIMAL = re.compile(r"[0-9]{1,18}")


def positive_whole_number(value: Any) -> int | None:
    """A positive whole number written as the engine's parser (int()) and a reader both read it: ASCII
    digits only (`str.isdigit` also accepts '²' and Arabic-Indic digits, which int() refuses or reads
    otherwise), at most 18 of them; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 1 <= value < 10**18 else None
    if isinstance(value, str) and ASCII_DECIMAL.fullmatch(value):
        return int(value) if int(value) >= 1 else None
    return None


DECIMAL_FRACTION = re.compile(r"(0|[1-9][0-9]{0,17})?(\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?")


def decimal_number(value: Any) -> float | None:
    """A number as written in ASCII decimal (float() also reads '٠.٥', '1_0' and 'nan'); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if abs(value) < 10**18 else None
    if isinstance(value, str) and value not in ("", ".") and DECIMAL_FRACTION.fullmatch(value):
        return float(value)
    return None


# Strings that reach a unit, an argv or a shell ----------------------------------------------

Text = Annotated[str, Strict()]


def control_character(text: str) -> tuple[int, str] | None:
    """The first character that changes how a unit line or a command line is read or shown: systemd ends
    a directive at `\\n` and `\\r`; `\\0`, `\\t`, `\\x1b`, U+2028 and the like are control or format characters."""
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category[0] == "C" or category in ("Zl", "Zp"):
            return i, ch
    return None


def unit_safe_fix(rule: str, found: tuple[int, str]) -> str:
    i, ch = found
    return (f"{rule}: it contains the control character {ch!r} at position {i}, and values written into "
            "a unit or a command line may hold printable characters only (no \\n, \\r, \\t, \\0)")


def unit_safe(rule: str) -> AfterValidator:
    def check(text: str) -> str:
        found = control_character(text)
        if found:
            raise refuse(unit_safe_fix(rule, found))
        return text

    return AfterValidator(check)


# Names ----------------------------------------------------------------------------------------

NAME = r"[a-z0-9][a-z0-9_-]{0,62}"
# Service names whose unit `sglang-<name>.service` (or whose files) the deploy uses itself.
RESERVED_SERVICE_NAMES = frozenset({"stage-models", "stage", "deploy"})
SERVICE_NAME_FIX = "service names are lowercase letters, digits, '-' and '_' (they name the systemd unit)"


def _not_reserved(name: str) -> str:
    if name in RESERVED_SERVICE_NAMES:
        raise refuse(f"would name the unit sglang-{name}.service, which is the deploy's own "
                     f"({', '.join(f'sglang-{n}' for n in sorted(RESERVED_SERVICE_NAMES))} are reserved): choose another name")
    return name


ServiceName = Annotated[Text, matching(NAME, SERVICE_NAME_FIX), AfterValidator(_not_reserved), with_fix(SERVICE_NAME_FIX)]
SECRET_NAME_FIX = "must be the name of a secret (lowercase letters, digits, '-', '_'), not the key itself"
SecretName = Annotated[Text, matching(NAME, SECRET_NAME_FIX), with_fix(SECRET_NAME_FIX)]
PATCH_SETS_FIX = "must be a list of patch set names (directories in files/patches/)"
PatchSetName = Annotated[Text, matching(NAME, PATCH_SETS_FIX)]
MODEL_FIX = "must be a model directory name inside `model_store` (letters, digits, '.', '_', '-'), not a path"
ModelName = Annotated[Text, matching(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", MODEL_FIX), with_fix(MODEL_FIX)]
STACK_NAME = r"[a-z0-9][a-z0-9._-]{0,127}"
USER_FIX = ("must be a user name (lowercase letters, digits, '_', '-'; up to 32 characters, not starting with a digit or '-'), "
            "e.g. `sglang`, or `root`")
UserName = Annotated[Text, matching(r"[a-z_][a-z0-9_-]{0,31}", USER_FIX), with_fix(USER_FIX)]
# Accounts and groups that hold a privilege on most hosts, or that many daemons share: named as `service_user`, the
# services would run with it, and the deploy would take an account or group others use for its own (its key files are
# readable by the service user's group). `root` is not here: it is the documented way to run the engine as root.
PRIVILEGED_ACCOUNTS = {
    **dict.fromkeys(("sudo", "wheel", "admin"), "its members run any command as root through sudo"),
    **dict.fromkeys(("docker", "lxd", "incus-admin", "libvirt", "podman"),
                    "its members start containers or machines as root, which is root on the host"),
    "adm": "its members read the system logs",
    "systemd-journal": "its members read the whole journal, which holds the engine's API keys (sglang logs them at start)",
    "disk": "its members read and write the raw disks, so every file",
    "kmem": "its members read kernel memory",
    "shadow": "its members read the password hashes",
    "staff": "its members write /usr/local (Debian), which root runs programs from",
    **dict.fromkeys(("bin", "sys", "daemon", "operator", "tty", "utmp", "man", "mail", "www-data", "sshd", "messagebus"),
                    "a system account or group that owns system files or runs a daemon of its own"),
    **dict.fromkeys(("nobody", "nogroup", "nfsnobody"),
                    "shared by many daemons and by NFS's squashed root: whatever it can read, they all can"),
}
# systemd's own accounts (systemd-network, systemd-resolve, ...) are all someone else's.
PRIVILEGED_ACCOUNT_PREFIXES = {"systemd-": "one of systemd's own accounts or groups"}


def privileged_account(name: str) -> str | None:
    """Why `name` is a privileged or shared account or group on most hosts, or None."""
    if name in PRIVILEGED_ACCOUNTS:
        return PRIVILEGED_ACCOUNTS[name]
    return next((why for prefix, why in PRIVILEGED_ACCOUNT_PREFIXES.items() if name.startswith(prefix)), None)


def _not_privileged(name: str) -> str:
    why = privileged_account(name)
    if why:
        raise refuse(f"`{name}` is a privileged or shared account or group on most hosts ({why}): the services would run "
                     "with it, and the deploy would make an account others use its own; name an account of the services' "
                     "own, e.g. `sglang` (the deploy creates it, and checks on each host that it is its own), or `root` "
                     "to run them as root knowingly")
    return name


ServiceUserName = Annotated[UserName, AfterValidator(_not_privileged), with_fix(USER_FIX)]
MODULE_FIX = "must be a Python module name such as sglang.launch_server"
ModuleName = Annotated[Text, matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", MODULE_FIX), with_fix(MODULE_FIX)]
FLAG_FIX = "flag names are lowercase words joined by '-', as on sglang's command line (e.g. `attention-backend`)"
FLAG = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
# pyinfra's inventory names: written into the unit's comment line and the run's output, used as keys of files
# on the control machine. A DNS name, an IP address (IPv6 with ':'), or pyinfra's `@local`/`@docker/NAME`.
HOST_NAME_FIX = ("must be a host name: letters, digits, '.', '-', '_' and ':' (a DNS name or an IP address), "
                 "up to 253 characters; it is written into units and file names")
ADDRESS = r"(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9:][A-Za-z0-9._:-]{0,252})"
HOST_NAME = rf"(@[a-z]+(/{ADDRESS})?|{ADDRESS})"
HostName = Annotated[Text, matching(HOST_NAME, HOST_NAME_FIX), with_fix(HOST_NAME_FIX)]


def choice(*words: str, fix: str) -> Any:
    """One of `words`, exactly."""

    def check(word: str) -> str:
        if word not in words:
            raise refuse(fix)
        return word

    return Annotated[Text, AfterValidator(check), with_fix(fix)]


# Environment variables -------------------------------------------------------------------------

ENV_NAME_FIX = "must be a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Names that make a process load or run other code than its own: the dynamic loader, the Python
# interpreter, shells, glibc's module and locale loaders and tunables, malloc's debug hooks, and the
# CUDA, NVTX, NCCL, libfabric, UCX and triton plugins and tools that are loaded or run from a path.
# The service's env reaches the unit and root's preflight of the same flags; none of these may.
STEERING_PREFIXES = ("LD_", "DYLD_", "PYTHON", "BASH_FUNC_", "MALLOC_", "GLIBC_", "PERL", "RUBY", "NODE_")
# PYTHON* names that change neither what Python loads nor where it looks for it.
HARMLESS_PYTHON = frozenset({"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "PYTHONHASHSEED",
                             "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONOPTIMIZE"})
HARMLESS_MALLOC = frozenset({"MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"})
STEERING_NAMES = frozenset({
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PROMPT_COMMAND", "CDPATH", "GLOBIGNORE", "ZDOTDIR",
    "GCONV_PATH", "GETCONF_DIR", "LOCPATH", "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN", "TZDIR",
    "CUDA_INJECTION32_PATH", "CUDA_INJECTION64_PATH", "NVTX_INJECTION32_PATH", "NVTX_INJECTION64_PATH",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN",
    "FI_PROVIDER_PATH", "UCX_MODULE_DIR", "OMPI_MCA_mca_base_component_path",
    "TRITON_CACHE_MANAGER", "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH",
    "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CC", "CXX", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
})
# Names the unit derives from the data, or whose value changes what a derived one means: the GPUs
# (`CUDA_VISIBLE_DEVICES` numbers GPUs as nvidia-smi does only with CUDA_DEVICE_ORDER=PCI_BUS_ID, which the unit
# sets; container runtimes, MPS and ROCm have their own). PATH and HOME, which the unit also sets, may be set: they
# reach only the sandboxed service (root's preflight takes neither, operations/preflight.py).
DERIVED_ENV = {
    "CUDA_VISIBLE_DEVICES": "is derived from the service key `gpu`; set that instead",
    "CUDA_DEVICE_ORDER": "is set by the unit to PCI_BUS_ID, so that `gpu` (CUDA_VISIBLE_DEVICES) numbers GPUs as nvidia-smi does; "
                         "another order would put the service on other GPUs than the ones checked: remove it",
    "NVIDIA_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived from it): set `gpu` instead",
    "CUDA_MPS_PIPE_DIRECTORY": "would attach the service to another MPS daemon than its GPUs' own: remove it",
    "HIP_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived from it): set `gpu` instead",
    "ROCR_VISIBLE_DEVICES": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived from it): set `gpu` instead",
    "GPU_DEVICE_ORDINAL": "would choose other GPUs than `gpu` says (CUDA_VISIBLE_DEVICES, derived from it): set `gpu` instead",
}


def env_name_refusal(name: str) -> str | None:
    """Why `name` may not be set in a service's `env`, or None."""
    if name in DERIVED_ENV:
        return f"`{name}` {DERIVED_ENV[name]}"
    steering = name in STEERING_NAMES or (
        name.startswith(STEERING_PREFIXES) and name not in HARMLESS_PYTHON and name not in HARMLESS_MALLOC)
    if steering:
        return (f"`{name}` steers what a loader or interpreter loads or runs (the dynamic loader, Python, a shell, glibc, "
                "malloc, a CUDA/NCCL/triton plugin or tool): the unit and root's preflight must run the venv's own code "
                "only; remove it (put code the engine needs into the stack or a patch set)")
    return None


# A name says it carries a credential: its words (split at '_' or '-') hold one of these.
CREDENTIAL_WORDS = frozenset({"KEY", "APIKEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE",
                              "CREDENTIAL", "CREDENTIALS"})


def credential_env_name(name: str) -> bool:
    return bool(CREDENTIAL_WORDS & set(name.upper().split("_")))


SECRETS_FIX = ("a credential in the data sits in a world-readable unit file, the process's argv or environment and the "
               "run's output: keep it out of the data; the deploy passes secrets only as the API keys named by "
               "`api_key_secret`/`admin_api_key_secret` (docs/threat-model.md, \"Secrets, exposure and host keys\"), from the control machine's secrets file")


# The name's shape; which names a service may set is the env map's rule (configuration/schema.py), which shows
# the value set under a refused name.
EnvName = Annotated[Text, matching(ENV_NAME.pattern, ENV_NAME_FIX), with_fix(ENV_NAME_FIX)]

ENV_VALUE_FIX = "must be a single-line string or number"


def _env_value(value: Any) -> str:
    text = str(value)
    found = control_character(text)
    if found:
        raise refuse(unit_safe_fix(ENV_VALUE_FIX, found))
    return text


EnvValue = Annotated[Union[Text, Int, Annotated[float, Strict()]], AfterValidator(_env_value),
                     with_fix(ENV_VALUE_FIX + ' (quote booleans: "true")')]


# Host paths --------------------------------------------------------------------------------------

ABS_FIX = "must be an absolute path on the host, without '..'"
PATH_CHARS = re.compile(r"[A-Za-z0-9_./+@:-]{1,4096}")
# Host paths no configured directory may be or contain: the deploy moves `venv_path` into its
# generations directory, prunes generations, empties staging directories and chowns caches, so
# pointing one of them at a system directory (or at `/`) would destroy it.
DENIED_PATHS = (
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
    "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/var",
    "/root/.ssh", "/run/user", "/usr/local", "/var/cache", "/var/lib", "/var/log", "/var/tmp", "/var/spool",
)
# Trees nothing of ours may be inside (system files, kernel interfaces), except the RAM disks.
DENIED_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr", "/run/user")
ALLOWED_IN_DENIED_TREES = ("/dev/shm",)
# Places the service user or any local user can write. Root later runs the venv's python, reads and installs
# the wheels and serves the models: none of those may lie where someone else could put or swap a file.
WRITABLE_BY_OTHERS = {
    SERVICE_STATE_DIR: "the unit's StateDirectory and the service user's home, which systemd hands to the service user",
    SERVICE_CACHE_DIR: "the unit's CacheDirectory, which systemd hands to the service user",
    "/tmp": "world-writable", "/var/tmp": "world-writable", "/dev/shm": "world-writable",
    "/run/lock": "world-writable", "/var/lock": "world-writable", "/var/crash": "world-writable",
    "/home": "users' homes, which their users write", "/run/user": "users' runtime directories, which their users write",
}


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _host_path(value: str) -> str:
    """An absolute, normalized host path, outside the deny list, written as it will be used."""
    if not value.startswith("/"):
        raise refuse(ABS_FIX)
    found = control_character(value)
    if found:
        raise refuse(unit_safe_fix("must be one line of printable characters", found))
    if PATH_CHARS.fullmatch(value) is None:
        raise refuse("may hold only letters, digits and _ . / + @ : - (no spaces, quotes, % or $: it is written into unit files)")
    if ".." in value.split("/"):
        raise refuse(ABS_FIX)
    normal = str(PurePosixPath(re.sub("/+", "/", value)))  # `/root//venv/` is `/root/venv`
    for denied in DENIED_PATHS:
        if inside(denied, normal):
            raise refuse(f"is {'' if normal == denied else 'a parent of '}{denied}, a system directory the deploy would move, "
                         "prune or fill: use a directory of its own, e.g. /root/venv_sglang or /srv/models")
    for tree in DENIED_TREES:
        if inside(normal, tree) and not any(inside(normal, ok) for ok in ALLOWED_IN_DENIED_TREES):
            raise refuse(f"is inside {tree} (system files): use a directory of its own, e.g. under /root or /srv")
    for own in OWN_PATHS:
        if inside(normal, own) or inside(own, normal):
            raise refuse(f"overlaps {own}, which the deploy manages itself: use another directory")
    return normal


def writable_by_others(path: str, allowed: tuple[str, ...] = ()) -> str | None:
    """Why root may not trust what lies at `path` (a place others can write), or None."""
    for place, why in WRITABLE_BY_OTHERS.items():
        if inside(path, place) and place not in allowed:
            return (f"is inside {place} ({why}): root runs, reads or deletes what is there, and another user could "
                    "put or swap a file in it first; use a root-owned directory, e.g. under /root or /srv")
    return None


def _trusted(allowed: tuple[str, ...]) -> AfterValidator:
    def check(path: str) -> str:
        reason = writable_by_others(path, allowed)
        if reason:
            raise refuse(reason)
        return path

    return AfterValidator(check)


# What root later runs (a venv), reads to install (wheels, a donor venv) or serves (the store): not where others write.
TrustedHostPath = Annotated[Text, AfterValidator(_host_path), _trusted(()), with_fix(ABS_FIX)]
# The RAM disk models are staged into: /dev/shm is world-writable, and the staging code moves a squatted
# directory aside; every other place others can write is refused.
ShmDir = Annotated[Text, AfterValidator(_host_path), _trusted(("/dev/shm",)), with_fix(ABS_FIX)]


# Addresses ------------------------------------------------------------------------------------------

def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


IP_FIX = "must be an IP address such as 127.0.0.1 or 0.0.0.0"


def _ip_address(text: str) -> str:
    if _ip(text) is None:
        raise refuse(IP_FIX)
    return text


IpAddress = Annotated[Text, AfterValidator(_ip_address), with_fix(IP_FIX)]


def is_loopback_host(host: str) -> bool:
    """Whether an address (an IP, `localhost`, `[::1]`) is on loopback; a DNS name may point anywhere."""
    host = host.strip("[]").lower().rstrip(".")
    if host in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    address = _ip(host)
    return address is not None and (address.is_loopback or (
        isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None and address.ipv4_mapped.is_loopback))


def canonical_address(host: str, port: Any = None) -> tuple[str, int]:
    """One spelling per machine address, as SSH reaches it: DNS names without case or a final dot, IP addresses
    in one form (IPv6 compressed, IPv4-mapped IPv6 and inet_aton's short forms as IPv4), loopback as one, and the
    SSH port (22 unless given)."""
    text = str(host).strip().strip("[]").lower().rstrip(".")
    address = _ip(text.split("%")[0])
    if address is None and re.fullmatch(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}", text):
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address is not None:
        text = "loopback" if address.is_loopback else address.compressed
    elif text in ("localhost", "localhost.localdomain", "ip6-localhost"):
        text = "loopback"
    # pyinfra itself refuses an ssh_port that is not an int.
    return text, port if isinstance(port, int) and not isinstance(port, bool) else 22


URL_FIX = "must be a package index URL such as https://pypi.org/simple"
URL = re.compile(r"https?://(?P<authority>[^/?#\s]+)(?P<path>/[A-Za-z0-9._~%+=:,/-]*)?")
HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def _index_url(url: str) -> str:
    match = URL.fullmatch(url)
    if match is None:
        raise refuse(URL_FIX)
    if "@" in match["authority"] or "%40" in match["authority"].lower():
        raise refuse("holds a user name or password (user:pass@): " + SECRETS_FIX + "; give the host's root an index it "
                     "reaches without credentials in the URL (e.g. root's own ~/.netrc on the host, put there by hand)")
    if HOST_PORT.fullmatch(match["authority"]) is None:
        raise refuse(URL_FIX)
    return url


IndexUrl = Annotated[Text, AfterValidator(_index_url), with_fix(URL_FIX)]


# Addresses named anywhere in a value -------------------------------------------------------------------------------
#
# The engine takes addresses in many flags, under many names, and inside JSON values (`--kv-events-config
# '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'`): an address is found by its shape, wherever it is written,
# rather than by a list of the flags known to take one.

# URL schemes that name no network address: a local socket, a path, the process itself.
LOCAL_SCHEMES = frozenset({"ipc", "inproc", "file", "unix"})
_URL_IN_TEXT = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#\s,;'\"<>(){}|\\]*)")
_WORD_SEPARATORS = re.compile(r"[\s,;'\"<>(){}|=/@\\]+")
_HOST_AND_PORT = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*):(?P<port>[0-9]{1,5})")
# inet_aton's forms with at least one dot (`10.1`, `0x7f.1`); a bare `0.85` is a number, not an address, unless a
# port follows it.
_DOTTED_NUMBER = re.compile(r"(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){1,3}")
# A DNS name holds a letter: `12:30` is no host and port.
_DNS_NAME = re.compile(r"(?=[A-Za-z0-9.-]*[A-Za-z])[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})*\.?")
# JSON held in a string, held in JSON, ...: deeper than this is read as text only.
MAX_JSON_DEPTH = 8


@dataclass(frozen=True)
class NamedAddress:
    """One address a value names: as written (`tcp://*:5557`), and its host (`*`, `10.0.0.1`, `node0`)."""

    written: str
    host: str
    userinfo: bool = False  # a URL with `user[:password]@` before its host

    @property
    def beyond_loopback(self) -> bool:
        # canonical_address reads every spelling of loopback (`127.1`, `::ffff:127.0.0.1`, `localhost`) as one;
        # `*`, an empty host before a port and a DNS name other than localhost are beyond it.
        return canonical_address(self.host)[0] != "loopback"


def strings_in(value: Any) -> list[str]:
    """Every string of a value, in the order written: itself, the keys and items of a map or list; a string that
    holds a JSON document, its strings instead (to MAX_JSON_DEPTH), read as the engine's JSON parser reads them
    (`tcp:\\/\\/\\u002a:5557` is `tcp://*:5557`)."""
    found: list[str] = []
    pending: deque[tuple[Any, int]] = deque([(value, 0)])
    while pending:
        item, depth = pending.popleft()
        if isinstance(item, str):
            document = _json_in(item) if depth < MAX_JSON_DEPTH else None
            if document is None:
                found.append(item)
            else:
                pending.append((document[0], depth + 1))
        elif isinstance(item, dict):
            pending += [(part, depth) for pair in item.items() for part in pair]
        elif isinstance(item, list):
            pending += [(part, depth) for part in item]
    return found


def _json_in(text: str) -> tuple[Any] | None:
    """(the document) a string holds as JSON (a map, a list or a quoted string), or None: then it is read as text."""
    if text.lstrip()[:1] not in ("{", "[", '"'):
        return None
    try:
        return (json.loads(text),)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python parses
        return None


def addresses_in(value: Any) -> list[NamedAddress]:
    """Every network address a value names, in any of its strings: URLs (`tcp://H:P`, `http://user@H/`, but not
    `ipc://`, `file://`), `H:P` and `[v6]:P`, zmq's `*` and `*:P`, and bare IP addresses (`0.0.0.0`, `::`)."""
    return [address for text in strings_in(value) for address in _addresses_in_text(text)]


def _addresses_in_text(text: str) -> list[NamedAddress]:
    found = []
    for url in _URL_IN_TEXT.finditer(text):
        if url["scheme"].lower() in LOCAL_SCHEMES:
            continue
        userinfo = "@" in url["authority"]
        host = _url_host(url["authority"].rpartition("@")[2])
        if host is not None or userinfo:
            found.append(NamedAddress(url[0], host or "", userinfo))
    for word in _WORD_SEPARATORS.split(_URL_IN_TEXT.sub(" ", text)):
        host = _word_host(word)
        if host is not None:
            found.append(NamedAddress(word, host))
    return found


def _url_host(host_port: str) -> str | None:
    """The host of a URL's `host[:port]`: a name, an address, `*`; an empty host before a port binds every
    interface (`tcp://:5557`, as Python's `bind(("", port))`); None where the URL names no host (`http:///x`)."""
    if host_port == "":
        return None
    split = _HOST_AND_PORT.fullmatch(host_port)
    host = split["host"] if split else host_port
    host = host.strip("[]")
    return host if host else ("*" if split else None)


def _word_host(word: str) -> str | None:
    """The host a word outside a URL names: `*`, `*:P`, `H:P`, `[v6]:P`, a bare IP address; None for any other
    word (a bare name or number could be anything: `triton`, `0.85`)."""
    if word == "*":
        return "*"
    split = _HOST_AND_PORT.fullmatch(word)
    if split:
        host = split["host"]
        if host == "*" or (host.startswith("[") and _ip(host.strip("[]").split("%")[0]) is not None):
            return host.strip("[]")
        if _ip(host.split("%")[0]) is not None or _DOTTED_NUMBER.fullmatch(host.lower()) or _DNS_NAME.fullmatch(host):
            return host
        return None
    bare = word[1:-1] if word.startswith("[") and word.endswith("]") else word
    return bare if _ip(bare.split("%")[0]) is not None else None
