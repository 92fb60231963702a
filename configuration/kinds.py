"""One type per kind of value, each with its rule and its fix: the words of configuration/schema.py.

A kind is a pydantic type (strict: a string is never read as a number, a bool never as an int) that
checks the WHOLE value (`re.fullmatch`: `$` would let a final newline through) and, when it refuses,
says how to fix it. Wherever a kind of value appears in the data it gets the same rule: every string
that reaches a unit file, an argv, a host path or a shell is one of these kinds.

A refusal is a `PydanticCustomError` of type `refused` whose context holds the fix (and, where the
value shown should be another than the one refused, `shown`); `configuration/refusals.py` turns the
first one into a `DataError` naming the file, the key path, the value and the fix.

Numbers and names are here; how a kind refuses and the text and whole numbers every kind is built of
are in configuration/kinds_base.py, environment variables in kinds_env.py, host paths in
kinds_paths.py, addresses in kinds_addresses.py. Every kind is importable from here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Strict

# Every kind is importable from here (the imports below are re-exports).
from configuration.kinds_addresses import (  # noqa: F401  (re-exported)
    HOST_PORT,
    IP_FIX,
    LOCAL_SCHEMES,
    MAX_JSON_DEPTH,
    URL,
    URL_FIX,
    IndexUrl,
    IpAddress,
    NamedAddress,
    addresses_in,
    canonical_address,
    is_loopback_host,
    local_ports_in,
    strings_in,
)
from configuration.kinds_base import (  # noqa: F401  (re-exported)
    REFUSED,
    SECRETS_FIX,
    Int,
    Text,
    control_character,
    matching,
    one_of,
    refuse,
    unit_safe,
    unit_safe_fix,
    with_fix,
)
from configuration.kinds_env import (  # noqa: F401  (re-exported)
    CREDENTIAL_WORDS,
    DERIVED_ENV,
    ENV_NAME,
    ENV_NAME_FIX,
    ENV_VALUE_FIX,
    HARMLESS_MALLOC,
    HARMLESS_PYTHON,
    STEERING_NAMES,
    STEERING_PREFIXES,
    EnvName,
    EnvValue,
    credential_env_name,
    env_name_refusal,
)
from configuration.kinds_flags import (  # noqa: F401  (re-exported)
    ARGS_FIX,
    CREDENTIAL_FLAG_WORDS,
    DERIVED_DESTS,
    FLAG,
    FLAG_FIX,
    FLAG_VALUE_FIX,
    ArgMap,
    FlagValue,
    FlagWord,
)
from configuration.kinds_paths import (  # noqa: F401  (re-exported)
    ABS_FIX,
    ALLOWED_IN_DENIED_TREES,
    DENIED_PATHS,
    DENIED_TREES,
    PATH_CHARS,
    WRITABLE_BY_OTHERS,
    ShmDir,
    TrustedHostPath,
    inside,
    writable_by_others,
)

# Numbers ------------------------------------------------------------------------------------


def _in_range(low: int, high: int, fix: str) -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise refuse(fix)
        return value

    return AfterValidator(check)


PORT_FIX = "must be a TCP port, an integer from 1 to 65535"
Port = Annotated[Int, _in_range(1, 65535, PORT_FIX), with_fix(PORT_FIX)]


MAX_GPUS = 64
GPU_FIX = ("must be a GPU index (0-63) or a non-empty list of them, e.g. `gpu: 1` or "
           "`gpu: [0, 1]`, or `auto`")
GpuIndex = Annotated[Int, _in_range(0, MAX_GPUS - 1, GPU_FIX)]


def _gpu_list(value: list[int]) -> list[int]:
    if not value:
        raise refuse(GPU_FIX)
    if len(set(value)) != len(value):
        raise refuse("lists a GPU twice; list each index once")
    return value


Gpus = Annotated[Union[Literal["auto"], GpuIndex,
                       Annotated[list[GpuIndex], AfterValidator(_gpu_list)]], with_fix(GPU_FIX)]
FailedGpus = Annotated[list[GpuIndex], with_fix("must be a list of GPU indexes (0-63), e.g. `[1]`")]


def seconds(low: int, high: int) -> Any:
    fix = f"must be whole seconds from {low} to {high}"
    return Annotated[Int, _in_range(low, high, fix), with_fix(fix)]


Bool = Annotated[bool, Strict(), with_fix("must be true or false")]


def whole_number(low: int, high: int, what: str) -> Any:
    fix = f"must be a whole number of {what} from {low} to {high}"
    return Annotated[Int, _in_range(low, high, fix), with_fix(fix)]


ACCEPT_LENGTH_FIX = ("must be a number of tokens per verify step from 0 (no floor) to 64, e.g. "
                     "`1.5`")


def _accept_length(value: float) -> float:
    if not 0 <= value <= 64:
        raise refuse(ACCEPT_LENGTH_FIX)
    return float(value)


FRACTION_FIX = "must be a fraction from 0 to 1, e.g. `0.1` (10%)"


def _fraction(value: float) -> float:
    if not 0 <= value <= 1:
        raise refuse(FRACTION_FIX)
    return float(value)


Fraction = Annotated[Union[Int, Annotated[float, Strict()]], AfterValidator(_fraction),
                     with_fix(FRACTION_FIX)]


AcceptLength = Annotated[Union[Int, Annotated[float, Strict()]], AfterValidator(_accept_length),
                         with_fix(ACCEPT_LENGTH_FIX)]

# A service's rollout (configuration/schema.py, `max_unavailable` and `canary`).
MAX_UNAVAILABLE_FIX = ("must be a number of replicas, 1 or more, or a percentage of them from 1% "
                       "to 100%, e.g. 1 or `25%`")
MaxUnavailable = one_of(
    MAX_UNAVAILABLE_FIX,
    (lambda v: isinstance(v, int) and not isinstance(v, bool),
     Annotated[Int, _in_range(1, 100000, MAX_UNAVAILABLE_FIX)]),
    (lambda v: isinstance(v, str),
     Annotated[Text, matching(r"(100|[1-9][0-9]?)%", MAX_UNAVAILABLE_FIX)]),
)
MAX_SURGE_FIX = ("must be 0 (a rollout restarts the replica in place) or 1 (it starts the new "
                 "version beside the old one on a free GPU of its host first, where there is one)")
MaxSurge = Annotated[Int, _in_range(0, 1, MAX_SURGE_FIX), with_fix(MAX_SURGE_FIX)]
CANARY_FIX = ("must be a number of replicas that go first (0: none), or a list of them, each a "
              "host of the inventory (its one replica of the service) or `host/replica`, e.g. "
              "[gpu-a] or [gpu-a/dflash@2]")
Canary = one_of(
    CANARY_FIX,
    (lambda v: isinstance(v, int) and not isinstance(v, bool),
     Annotated[Int, _in_range(0, 100000, CANARY_FIX)]),
    (lambda v: isinstance(v, list), Annotated[
        list[Annotated[Text, matching(r"[^/\s]+(/[a-z0-9][a-z0-9_-]*(@[0-9]+)?)?", CANARY_FIX)]],
        with_fix(CANARY_FIX)]),
)
ASCII_DECIMAL = re.compile(r"[0-9]{1,18}")


def positive_whole_number(value: Any) -> int | None:
    """A positive whole number written as the engine's parser (int()) and a reader both read it:
    ASCII digits only (`str.isdigit` also accepts '²' and Arabic-Indic digits, which int() refuses
    or reads otherwise), at most 18 of them; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 1 <= value < 10**18 else None
    if isinstance(value, str) and ASCII_DECIMAL.fullmatch(value):
        return int(value) if int(value) >= 1 else None
    return None


DECIMAL_FRACTION = re.compile(r"(0|[1-9][0-9]{0,17})?(\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?")


def decimal_number(value: Any) -> float | None:
    """A number as written in ASCII decimal (float() also reads '٠.٥', '1_0' and 'nan'); None
    otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if abs(value) < 10**18 else None
    if isinstance(value, str) and value not in ("", ".") and DECIMAL_FRACTION.fullmatch(value):
        return float(value)
    return None


# Names ----------------------------------------------------------------------------------------

NAME = r"[a-z0-9][a-z0-9_-]{0,62}"
# Service names whose unit `sglang-<name>.service` (or whose files) the deploy uses itself.
RESERVED_SERVICE_NAMES = frozenset({"stage-models", "stage", "deploy"})
SERVICE_NAME_FIX = ("service names are lowercase letters, digits, '-' and '_' (they name the "
                    "systemd unit)")


def _not_reserved(name: str) -> str:
    if name in RESERVED_SERVICE_NAMES:
        raise refuse(f"would name the unit sglang-{name}.service, which is the deploy's own "
                     f"({', '.join(f'sglang-{n}' for n in sorted(RESERVED_SERVICE_NAMES))} are "
                     "reserved): choose another name")
    return name


ServiceName = Annotated[Text, matching(NAME, SERVICE_NAME_FIX), AfterValidator(_not_reserved),
                        with_fix(SERVICE_NAME_FIX)]
SECRET_NAME_FIX = (
    "must be the name of a secret (lowercase letters, digits, '-', '_'), not the key itself")
SecretName = Annotated[Text, matching(NAME, SECRET_NAME_FIX), with_fix(SECRET_NAME_FIX)]
PATCH_SETS_FIX = "must be a list of patch set names (directories in files/patches/)"
PatchSetName = Annotated[Text, matching(NAME, PATCH_SETS_FIX)]
MODEL_FIX = ("must be a model directory name inside `model_store` (letters, digits, '.', '_', "
             "'-'), not a path")
ModelName = Annotated[Text, matching(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}", MODEL_FIX),
                      with_fix(MODEL_FIX)]
STACK_NAME = r"[a-z0-9][a-z0-9._-]{0,127}"
USER_FIX = ("must be a user name (lowercase letters, digits, '_', '-'; up to 32 characters, not "
            "starting with a digit or '-'), e.g. `sglang`, or `root`")
UserName = Annotated[Text, matching(r"[a-z_][a-z0-9_-]{0,31}", USER_FIX), with_fix(USER_FIX)]
# Accounts and groups that hold a privilege on most hosts, or that many daemons share: named as
# `service_user`, the services would run with it, and the deploy would take an account or group
# others use for its own (its key files are readable by the service user's group). `root` is not
# here: it is the documented way to run the engine as root.
PRIVILEGED_ACCOUNTS = {
    **dict.fromkeys(("sudo", "wheel", "admin"), "its members run any command as root through sudo"),
    **dict.fromkeys(("docker", "lxd", "incus-admin", "libvirt", "podman"),
                    "its members start containers or machines as root, which is root on the host"),
    "adm": "its members read the system logs",
    "systemd-journal": "its members read the whole journal, which holds the engine's API keys "
                       "(sglang logs them at start)",
    "disk": "its members read and write the raw disks, so every file",
    "kmem": "its members read kernel memory",
    "shadow": "its members read the password hashes",
    "staff": "its members write /usr/local (Debian), which root runs programs from",
    **dict.fromkeys(("bin", "sys", "daemon", "operator", "tty", "utmp", "man", "mail", "www-data",
                     "sshd", "messagebus"),
                    "a system account or group that owns system files or runs a daemon of its own"),
    **dict.fromkeys(("nobody", "nogroup", "nfsnobody"),
                    "shared by many daemons and by NFS's squashed root: whatever it can read, they "
                    "all can"),
}
# systemd's own accounts (systemd-network, systemd-resolve, ...) are all someone else's.
PRIVILEGED_ACCOUNT_PREFIXES = {"systemd-": "one of systemd's own accounts or groups"}


def privileged_account(name: str) -> str | None:
    """Why `name` is a privileged or shared account or group on most hosts, or None."""
    if name in PRIVILEGED_ACCOUNTS:
        return PRIVILEGED_ACCOUNTS[name]
    return next((why for prefix, why in PRIVILEGED_ACCOUNT_PREFIXES.items()
                 if name.startswith(prefix)), None)


def _not_privileged(name: str) -> str:
    why = privileged_account(name)
    if why:
        raise refuse(f"`{name}` is a privileged or shared account or group on most hosts ({why}): "
                     "the services would run with it, and the deploy would make an account others "
                     "use its own; name an account of the services' own, e.g. `sglang` (the deploy "
                     "creates it, and checks on each host that it is its own), or `root` to run "
                     "them as root knowingly")
    return name


ServiceUserName = Annotated[UserName, AfterValidator(_not_privileged), with_fix(USER_FIX)]
MODULE_FIX = "must be a Python module name such as sglang.launch_server"
ModuleName = Annotated[Text, matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                                      MODULE_FIX), with_fix(MODULE_FIX)]
# pyinfra's inventory names: written into the unit's comment line and the run's output, used as keys
# of files on the control machine. A DNS name, an IP address (IPv6 with ':'), or pyinfra's
# `@local`/`@docker/NAME`.
HOST_NAME_FIX = (
    "must be a host name: letters, digits, '.', '-', '_' and ':' (a DNS name or an IP address), up "
    "to 253 characters; it is written into units and file names")
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
