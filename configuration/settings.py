"""Deploy data: loading the operators' YAML and validating it into typed objects.

Operators edit `group_data/<group>.yml`; the thin `group_data/<group>.py` beside each
calls `load_group_yaml(__file__)`, so pyinfra's own precedence applies unchanged
(`--data` > host data > group data > all). `host_config(host)` returns the host's validated
`HostConfig`; the first call of a run validates the whole inventory (`validate_inventory`)
before `deploy.py` adds a single operation on any host: a bad value anywhere stops the run
with a `DataError` naming the file, the key path, the value and the fix. Each kind of value
has one rule wherever it appears (`_unit_safe`, `_argv_word`, `_abs_path` + `_no_overlap`,
`_control_dir`, service names), and `args` are resolved as the engine's parser resolves them
(configuration/engine_flags.py) before the derived-flag, exposure and value rules apply.

Every key, its default and its meaning lives in `GLOBAL_KEYS`, `HOST_KEYS` and
`SERVICE_KEYS` below; the README's variables table repeats them (a test checks it).
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from configuration import engine_flags
from configuration.errors import DataError
from configuration.yamlload import load_file
from operations.secrets import Secret, config_path, resolve

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Key:
    default: Any
    doc: str
    required: bool = False


# Keys any group (or host) may set. Defaults mirror the hand-run deployment this replaces.
GLOBAL_KEYS: dict[str, Key] = {
    "stack": Key("sglang-0.5.23-cu130", "Named, pinned package set for the serving venv (a file in `files/stacks/`)."),
    "venv_path": Key("/root/venv_sglang", "Serving virtualenv on the host."),
    "model_store": Key("/root/models", "Directory on the host holding the models (the durable copy)."),
    "shm_dir": Key("/dev/shm", "RAM disk the services load `shm` models from; emptied on reboot."),
    "verify_env": Key("fast", "How venvs are checked against each distribution's RECORD: `fast` (sizes; files modified after the deploy's last install are hashed) or `full` (the sha256 of every file); what differs is reinstalled from its wheel."),
    "verify_models": Key("fast", "How staged models are checked: `fast` (names and sizes against the manifests) or `full` (re-hash every staged file, repair what differs)."),
    "wheelhouse": Key("wheelhouse", "Directory on the control machine with the stack's wheel files (relative to the deploy dir)."),
    "host_wheel_cache": Key("/var/cache/sglang-deploy/wheels", "Where pushed wheels land on the host."),
    "stack_sources": Key(["wheelhouse"], "Where the stack's files come from, tried in order per file: `wheelhouse` (the `wheelhouse` directory, pushed), `{index: URL}` (the host downloads from a package index, hashes required), `{donor: HOST}` (installed distributions copied from that host's live venv; `{donor: HOST, path: DIR}`: from the venv at DIR there, this host included)."),
    "installer": Key("auto", "What installs the stack on the host: `auto` (uv when the wheelhouse ships it, else pip), `uv` or `pip`."),
    "launcher": Key("sglang.launch_server", "Python module the unit runs (`python -m <launcher> <flags>`)."),
    "readiness_timeout_s": Key(1800, "Seconds a (re)started service may take to answer `/health` with 200."),
    "smoke_test": Key(True, "After a (re)start, send one chat completion and require an answer."),
    "lock_wait_s": Key(300, "Seconds, from the run's start, that a deploy waits for another deploy's lock on a host; then that host alone fails and the others go on."),
    "model_sources": Key({}, "Map model name -> where to stream it from when a host's store lacks it: an inventory host (e.g. the one a service moves away from) or a directory on the control machine."),
    "service_user": Key("sglang", "Unix user the services run as: a system user the deploy creates (no login shell), or `root` on hosts where it must (the systemd hardening applies either way)."),
    "secrets_file": Key(".secrets/secrets.yml", "Git-ignored YAML map secret name -> value on the control machine ($SGLANG_DEPLOY_SECRET_<NAME> wins)."),
    "services": Key({}, "Map of service name -> service definition (keys below)."),
}

# Keys that belong in the inventory's host data.
HOST_KEYS: dict[str, Key] = {
    "run_services": Key(
        [],
        "Which services run on this host: a list of names, or a map name -> overrides of service keys (e.g. `gpu`, `port`).",
    ),
    "failed_gpus": Key([], "GPU indexes on this host that no service may use, whatever `nvidia-smi` says (an operator's mark after a failure)."),
}

SERVICE_KEYS: dict[str, Key] = {
    "gpu": Key(None, "GPU index, or a list of indexes, the service uses (`CUDA_VISIBLE_DEVICES`); `auto`: a healthy free GPU, kept across runs.", required=True),
    "port": Key(None, "TCP port the server listens on, 1024 to 65535.", required=True),
    "bind": Key("127.0.0.1", "Address the server binds (`--host`)."),
    "model": Key(None, "Target model: a directory name in `model_store`.", required=True),
    "model_in": Key("shm", "Where the target is loaded from: `shm` (staged into `shm_dir`) or `store`."),
    "draft_model": Key(None, "Draft model directory name in `model_store` (speculative decoding), or null."),
    "draft_in": Key("store", "Where the draft is loaded from: `shm` or `store`."),
    "patch_sets": Key([], "Patch sets from `files/patches/` copied into the installed engine."),
    "args": Key({}, "Map of sglang flag -> value, one `--flag value` line each; `true` = bare flag, `false`/null = omitted."),
    "env": Key({}, "Map of environment variables for the unit."),
    "api_key_secret": Key(None, "Name of the secret holding the service's API key (`--api-key`, passed in a root-only `--config` file)."),
    "admin_api_key_secret": Key(None, "Name of the secret holding the service's admin API key (`--admin-api-key`)."),
    "allow_unauthenticated": Key(False, "Allow binding beyond loopback without an API key (anyone who reaches the port can use it)."),
}

DERIVED_ENV = {"CUDA_VISIBLE_DEVICES": "gpu"}

LOCATIONS = ("shm", "store")
# Service names whose unit `sglang-<name>.service` (or whose files) the deploy uses itself.
RESERVED_SERVICE_NAMES = frozenset({"stage-models", "stage", "deploy"})
_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_-]{0,62}\Z")
_FLAG_RE = re.compile(r"\A[a-z0-9][a-z0-9-]*\Z")
_ENV_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_MODEL_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_USER_RE = re.compile(r"\A[a-z_][a-z0-9_-]{0,31}\Z")
_MODULE_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# (group, key) -> YAML file that set it last (for error messages). pyinfra merges the
# group_data folders of the deploy dir and of the inventory's dir key by key, last wins.
_KEY_SOURCES: dict[tuple[str, str], str] = {}
# group_data directories whose loaders ran: a `.yml` there without its `.py` is reported.
_GROUP_DIRS: set[Path] = set()


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def load_group_yaml(group_py_file: str) -> dict[str, Any]:
    """Load `<group>.yml` beside a `group_data/<group>.py` file and return its keys.

    The file's syntax (configuration/yamlload.py: no duplicate keys, no YAML 1.1 surprises, UTF-8)
    and top-level key names are checked here; values are validated for the whole inventory
    by `validate_inventory`, once all layers are merged.
    """
    py_path = Path(group_py_file)
    yml_path = py_path.with_suffix(".yml")
    shown = _display_path(yml_path)
    group = py_path.stem
    _GROUP_DIRS.add(py_path.resolve().parent)
    if not yml_path.exists():
        raise DataError(shown, "(file)", None, f"missing: create it, or delete {py_path.name} if group '{group}' has no data")
    data = load_file(yml_path, shown)
    if data is None:
        # An empty file would silently fall back to every default (another stack, other paths).
        raise DataError(shown, "(file)", None, f"empty: write the group's keys, or delete it and {py_path.name} if group '{group}' has no data")
    if not isinstance(data, dict):
        raise DataError(shown, "(top level)", data, "must be a mapping of key: value")
    known = {**GLOBAL_KEYS, **HOST_KEYS}
    for key in data:
        if key not in known:
            raise DataError(shown, str(key), data[key], _unknown_key_message(key, known))
    for key in data:
        _KEY_SOURCES[(group, key)] = shown
    return data


# Keys that once meant something: the error says what replaced them rather than only "unknown key".
RETIRED_KEYS = {
    "force_patch_sets": "no longer used: a file edited by hand inside an installed package differs from its RECORD, "
                        "so the venv check reinstalls that package in a new generation before any patch set is applied; remove the key",
}


def _unknown_key_message(key: Any, known, extra: str = "") -> str:
    if key in RETIRED_KEYS:
        return RETIRED_KEYS[key]
    return f"unknown key; allowed: {', '.join(sorted(known))}{extra}{_did_you_mean(key, known)}"


def _did_you_mean(key: Any, known) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


# Typed configuration -------------------------------------------------------------------


@dataclass(frozen=True)
class ModelUse:
    """One model a service loads, and the directory it is loaded from."""

    name: str
    location: str  # "shm" or "store"
    store_path: str
    load_path: str


@dataclass(frozen=True)
class Environment:
    """A venv: the host's stack plus, in order, the patch sets applied to it.

    Patch sets change the installed package, so services that want different patch sets
    cannot share a venv; services that agree on both share one. The plain stack lives at
    `venv_path`, each patched combination beside it (`/root/venv_sglang+ddtree-sample`),
    so a path never depends on which other services a host runs.
    """

    path: str
    patch_sets: tuple[str, ...]


def environment_for(venv_path: str, patch_sets: tuple[str, ...]) -> Environment:
    return Environment("+".join((venv_path, *patch_sets)), tuple(patch_sets))


@dataclass(frozen=True)
class Service:
    name: str
    environment: Environment
    gpus: tuple[int, ...]
    port: int
    bind: str
    target: ModelUse
    draft: ModelUse | None
    patch_sets: tuple[str, ...]
    args: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    api_key: Secret | None = None
    admin_api_key: Secret | None = None
    allow_unauthenticated: bool = False

    @property
    def config_file(self) -> str | None:
        """The root-only `--config` file that carries the API keys, if the service has any."""
        return config_path(self.name) if (self.api_key or self.admin_api_key) else None

    @property
    def exposed_without_key(self) -> bool:
        return not self.api_key and not _is_loopback(self.bind)

    @property
    def unit_name(self) -> str:
        return f"sglang-{self.name}.service"

    @property
    def models(self) -> tuple[ModelUse, ...]:
        return (self.target,) + ((self.draft,) if self.draft else ())

    def argv(self) -> list[str]:
        """The server's flags, derived ones first, then `args` in the data's order."""
        out = ["--model-path", self.target.load_path]
        if self.draft:
            out += ["--speculative-draft-model-path", self.draft.load_path]
        out += ["--host", self.bind, "--port", str(self.port)]
        if self.config_file:
            out += ["--config", self.config_file]
        for flag, value in self.args:
            if value is True:
                out.append(f"--{flag}")
            elif isinstance(value, list):
                out += [f"--{flag}", *(str(v) for v in value)]
            else:
                out += [f"--{flag}", str(value)]
        return out

    def environment_variables(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus), **dict(self.env)}

    @property
    def endpoint(self) -> str:
        return f"http://{self.bind}:{self.port}"


@dataclass(frozen=True)
class HostConfig:
    host: str
    stack: str
    venv_path: str
    model_store: str
    shm_dir: str
    wheelhouse: Path
    host_wheel_cache: str
    launcher: str
    readiness_timeout_s: int
    smoke_test: bool
    lock_wait_s: int = 300
    model_sources: dict = field(default_factory=dict)
    services: tuple[Service, ...] = field(default_factory=tuple)
    verify_models: str = "fast"
    failed_gpus: tuple[int, ...] = ()
    stack_sources: tuple = (("wheelhouse", "wheelhouse"),)
    installer: str = "auto"
    service_user: str = "sglang"

    @property
    def staged_models(self) -> tuple[ModelUse, ...]:
        """Models this host must hold in `shm_dir`, each once."""
        seen: dict[str, ModelUse] = {}
        for service in self.services:
            for model in service.models:
                if model.location == "shm":
                    seen.setdefault(model.name, model)
        return tuple(seen.values())

    @property
    def patch_sets(self) -> tuple[str, ...]:
        names: list[str] = []
        for service in self.services:
            names += [p for p in service.patch_sets if p not in names]
        return tuple(names)

    @property
    def store_models(self) -> tuple[ModelUse, ...]:
        """Every model this host's services need in its store (the durable copy), each once."""
        return tuple({m.name: m for s in self.services for m in s.models}.values())

    @property
    def environments(self) -> tuple[Environment, ...]:
        """The venvs this host's services need, each once, in placement order."""
        return tuple(dict.fromkeys(service.environment for service in self.services))


# Validation ---------------------------------------------------------------------------


class _Reader:
    """Reads one host's merged data, remembering where each top-level key came from."""

    def __init__(self, host):
        self.host = host
        self.name = host.name

    def source(self, key: str) -> str:
        inventory = self.host.inventory
        if key in inventory.get_override_data():
            return "--data"
        if key in inventory.get_host_data(self.name):
            return f"inventory (host {self.name})"
        for group in reversed(self.host.groups):
            if key in inventory.get_group_data(group):
                return _KEY_SOURCES.get((group, key), f"group_data/{group}.py")
        if key in inventory.get_data():
            return _KEY_SOURCES.get(("all", key), "group_data/all.py")
        return "defaults (configuration/settings.py)"

    def get(self, key: str, spec: Key) -> Any:
        return self.host.data.get(key, spec.default)


def _require(cond: bool, src: str, path: str, value: Any, fix: str) -> None:
    if not cond:
        raise DataError(src, path, value, fix)


def _is_ip(value: Any) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return isinstance(value, str)


def _is_loopback(address: str) -> bool:
    return address == "localhost" or ipaddress.ip_address(address).is_loopback


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# One rule per kind of value: every string that reaches a unit file, an argv or a path on a
# host goes through exactly one of these, wherever in the data it appears.


def _unit_safe(src: str, path: str, value: Any, shown: Any = None, rule: str = "must be one line of printable characters") -> str:
    """A string written into a unit (`Environment=`, `ExecStart=`) or an argv: no control or
    format characters at all. systemd ends a directive at `\n` and also treats `\r` as a line
    end; `\0`, `\t`, `\x1b`, U+2028 and the like change how a line is read or shown."""
    text = str(value)
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category[0] == "C" or category in ("Zl", "Zp"):
            raise DataError(src, path, value if shown is None else shown,
                            f"{rule}: it contains the control character {ch!r} at position {i}, and values written into "
                            "a unit or a command line may hold printable characters only (no \\n, \\r, \\t, \\0)")
    return text


_NUMBER_WORD = re.compile(r"\A(-[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|-\.[0-9]+)\Z")


def _argv_word(src: str, path: str, word: Any, shown: Any) -> str:
    """One word of the engine's argv: unit-safe, and never read by the engine's parser as an
    option of its own (`--host=0.0.0.0` as a value would set --host); negative numbers stay values."""
    text = _unit_safe(src, path, word, shown, "must be a non-empty single line without surrounding spaces")
    _require(text != "" and text.strip() == text, src, path, shown, "must be a non-empty single line without surrounding spaces")
    _require(not text.startswith("-") or bool(_NUMBER_WORD.match(text)), src, path, shown,
             "a value may not start with '-' (the engine's parser would read it as another flag); "
             "only negative numbers such as -1 may")
    return text


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
# Our own fixed paths on every host (operations/secrets.py, models.py, lock.py, units).
OWN_PATHS = ("/etc/sglang-deploy", "/usr/local/lib/sglang-deploy", "/run/sglang-deploy.lock", "/etc/systemd/system")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _abs_path(src: str, path: str, value: Any) -> str:
    """An absolute, normalized host path, outside the deny list, written as it will be used."""
    _require(isinstance(value, str) and value.startswith("/"), src, path, value, "must be an absolute path on the host, without '..'")
    _unit_safe(src, path, value)
    _require(
        bool(re.fullmatch(r"[A-Za-z0-9_./+@:-]+", value)), src, path, value,
        "may hold only letters, digits and _ . / + @ : - (no spaces, quotes, % or $: it is written into unit files)",
    )
    _require(".." not in value.split("/"), src, path, value, "must be an absolute path on the host, without '..'")
    shown, value = value, str(PurePosixPath(re.sub("/+", "/", value)))  # `/root//venv/` is `/root/venv`
    for denied in DENIED_PATHS:
        _require(not _inside(denied, value), src, path, shown,
                 f"is {'' if value == denied else 'a parent of '}{denied}, a system directory the deploy would move, prune or fill: "
                 "use a directory of its own, e.g. /root/venv_sglang or /srv/models")
    for tree in DENIED_TREES:
        if _inside(value, tree) and not any(_inside(value, ok) for ok in ALLOWED_IN_DENIED_TREES):
            raise DataError(src, path, shown, f"is inside {tree} (system files): use a directory of its own, e.g. under /root or /srv")
    for own in OWN_PATHS:
        _require(not _inside(value, own) and not _inside(own, value), src, path, shown, f"overlaps {own}, which the deploy manages itself: use another directory")
    return value


def _no_overlap(paths: list[tuple[str, str, str]]) -> None:
    """(source, key, path): no configured host path may equal or contain another, or a path
    derived from one (the generations directory `<venv_path>.generations`, the patched venvs)."""
    for i, first in enumerate(paths):
        for second in paths[i + 1:]:
            # Name the value set where the operator is most likely editing: --data, then the
            # inventory, then a group's file, then all.yml, then the defaults.
            (src_a, key_a, a), (src_b, key_b, b) = sorted((first, second), key=lambda p: -_precedence(p[0]))
            if _inside(a, b) or _inside(b, a):
                relation = "is the same directory as" if a == b else ("is inside" if _inside(a, b) else "contains")
                raise DataError(src_a, key_a, a, f"{relation} {key_b} ({b}, from {src_b}): each directory the deploy manages "
                                                 "needs its own place, or one would move, prune or fill the other")


def _precedence(source: str) -> int:
    if source == "--data":
        return 4
    if source.startswith("inventory"):
        return 3
    if source.startswith("defaults"):
        return 0
    return 1 if Path(source).stem == "all" else 2


def _control_dir(src: str, path: str, value: Any) -> Path:
    """A directory on the control machine the deploy reads from (streams a model out of)."""
    _require(isinstance(value, str) and value != "", src, path, value, "must be a directory on the control machine")
    resolved = Path(value).resolve()
    for denied in DENIED_PATHS:
        _require(not _inside(denied, str(resolved)), src, path, value,
                 f"resolves to {resolved}, which is or contains {denied}: name the model's own directory")
    _require(resolved.is_dir(), src, path, value, "must be an existing directory on the control machine")
    return resolved


def _gpus(src: str, path: str, value: Any) -> tuple[int, ...]:
    """The GPU indexes; `()` for `auto` (chosen per host from nvidia-smi, see operations/gpus.py)."""
    if value == "auto":
        return ()
    items = value if isinstance(value, list) else [value]
    ok = bool(items) and all(_is_int(i) and 0 <= i < 64 for i in items)
    _require(ok, src, path, value, "must be a GPU index (0-63) or a non-empty list of them, e.g. `gpu: 1` or `gpu: [0, 1]`, or `auto`")
    _require(len(set(items)) == len(items), src, path, value, "lists a GPU twice; list each index once")
    return tuple(items)


# Engine dests the tool derives from service keys (the parser's `dest`, so that every alias and
# prefix of `--model-path`, `--host`, `--api-key`, ... is one and the same rule).
DERIVED_DESTS = {
    "model_path": "model",
    "speculative_draft_model_path": "draft_model",
    "port": "port",
    "host": "bind",
    "config": "api_key_secret",
    "api_key": "api_key_secret",
    "admin_api_key": "admin_api_key_secret",
}
# Values the engine would refuse only once it runs on the GPU (or misuse silently): refused here.
_POSITIVE_INT_DESTS = (
    "tp_size", "pp_size", "dp_size", "ep_size", "speculative_dflash_block_size", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_ddtree_budget",
)
_FRACTION_DESTS = ("mem_fraction_static",)
# `args` values the tool resolves itself before the unit is written (operations/gpus.py).
_RESOLVED_BY_US = {("attention_backend", "auto")}


@dataclass(frozen=True)
class _Arg:
    flag: str  # as it goes into argv (a prefix is written out in full)
    value: Any
    key_path: str
    dest: str | None  # the engine's dest, when the flag resolves


def _args(src: str, path: str, value: Any, engine: "engine_flags.EngineFlags | None") -> list[_Arg]:
    """`args` resolved as the engine's parser will read them: `engine` is the flag list of the
    service's stack and patch sets, or None for a launcher without a pinned engine (then every
    known engine version's flags are used, so a derived flag is caught whatever it is spelled)."""
    _require(isinstance(value, dict), src, path, value, "must be a map of sglang flag -> value, e.g. `attention-backend: triton`")
    parser = engine if engine is not None else engine_flags.any_engine()
    out: list[_Arg] = []
    seen: dict[str, str] = {}
    for raw_flag, flag_value in value.items():
        key_path = f"{path}.{raw_flag}"
        _require(isinstance(raw_flag, str), src, key_path, raw_flag, "flag names are strings such as `attention-backend`")
        flag = raw_flag.removeprefix("--")
        _require(
            bool(_FLAG_RE.match(flag)), src, key_path, raw_flag,
            "flag names are lowercase words joined by '-', as on sglang's command line (e.g. `attention-backend`)",
        )
        resolved = parser.resolve(flag)
        derived = [a for a in ((resolved.action,) if resolved.action else resolved.candidates) if a.dest in DERIVED_DESTS]
        if derived:
            action = derived[0]
            how = "" if f"--{flag}" in action.options else (f" (the engine's parser reads `--{flag}` as `--{action.flag}`)" if resolved.action else f" (`--{flag}` could mean `--{action.flag}`)")
            # A key written where a secret name belongs must not reach the run's output.
            shown = "<hidden>" if DERIVED_DESTS[action.dest].endswith("_secret") else flag_value
            raise DataError(src, key_path, shown, f"`--{action.flag}` is derived from the service key `{DERIVED_DESTS[action.dest]}`{how}; set that instead")
        dest = resolved.action.dest if resolved.action else None
        if resolved.action and f"--{flag}" not in resolved.action.options:
            # A prefix: written out in full, so the unit says what the engine reads.
            flag = max((o for o in resolved.action.options if o.startswith(f"--{flag}")), key=len).lstrip("-")
        ident = dest or flag
        if ident in seen:
            how = "with and without `--`" if seen[ident].removeprefix("--") == raw_flag.removeprefix("--") else f"as `{seen[ident]}` and `{raw_flag}`: {parser.label} reads both as `--{flag}`"
            raise DataError(src, key_path, raw_flag, f"`{raw_flag.removeprefix('--')}` is given twice ({how}); keep one")
        seen[ident] = str(raw_flag)
        scalar = (str, int, float, bool)
        ok = flag_value is None or isinstance(flag_value, scalar) or (
            isinstance(flag_value, list) and flag_value and all(isinstance(v, scalar) and not isinstance(v, bool) for v in flag_value)
        )
        _require(ok, src, key_path, flag_value, "a flag value is a string, number, true (bare flag), false/null (omitted) or a list")
        if flag_value is None or flag_value is False:
            continue
        if flag_value is not True:
            for word in flag_value if isinstance(flag_value, list) else [flag_value]:
                _argv_word(src, key_path, word, flag_value)
        action = resolved.action
        if action is not None:
            _require(flag_value is True or action.value, src, key_path, flag_value,
                     f"`--{action.flag}` is a switch in {parser.label}: write `true` to set it or `false` to omit it")
            if action.choices and flag_value is not True and (dest, flag_value) not in _RESOLVED_BY_US:
                words = flag_value if isinstance(flag_value, list) else [flag_value]
                bad = [w for w in words if str(w) not in action.choices]
                _require(not bad, src, key_path, flag_value, f"not a choice of `--{action.flag}` in {parser.label}: {', '.join(action.choices)}")
        out.append(_Arg(flag, flag_value, key_path, dest))
    return out


def _check_arg_values(src: str, args: list[_Arg], gpus: tuple[int, ...], patch_sets: tuple[str, ...],
                      engine: "engine_flags.EngineFlags | None") -> None:
    """Values the engine accepts at parse time but fails on at start (or on the GPU)."""
    by_dest = {a.dest: a for a in args if a.dest}
    for dest in _POSITIVE_INT_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            v = arg.value
            ok = (_is_int(v) or (isinstance(v, str) and v.isdigit())) and int(v) >= 1
            _require(ok, src, arg.key_path, v, "must be a positive whole number")
    for dest in _FRACTION_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            try:
                fraction = float(arg.value) if not isinstance(arg.value, (bool, list)) else None
            except ValueError:
                fraction = None
            _require(fraction is not None and 0 < fraction < 1, src, arg.key_path, arg.value,
                     "must be a fraction of the GPU's memory strictly between 0 and 1, e.g. 0.85")
    needed = 1
    for dest in ("tp_size", "pp_size"):
        if dest in by_dest:
            needed *= int(by_dest[dest].value)
    listed = len(gpus) or 1  # `gpu: auto` takes one GPU
    if needed > listed:
        arg = by_dest.get("tp_size") or by_dest["pp_size"]
        raise DataError(src, arg.key_path, arg.value,
                        f"needs {needed} GPUs (tp-size x pp-size) but the service lists {listed} "
                        f"({'auto: one GPU' if not gpus else ', '.join(map(str, gpus))}): list {needed} GPUs in `gpu`, or lower it")
    algorithm = by_dest.get("speculative_algorithm")
    if algorithm is not None and engine is not None and engine.algorithms is not None:
        name = str(algorithm.value).upper()
        if name not in engine.algorithms:
            providers = [p for p in available_patch_sets() if p not in patch_sets
                         and any(name in (engine_flags.load(v, p).algorithms or ()) for v in engine_flags.known_versions() if engine_flags.load(v, p))]
            fix = (f"add a patch set that provides it to `patch_sets`: {', '.join(providers)}" if providers
                   else f"use one of {', '.join(sorted(engine.algorithms - {'NONE'}))}")
            raise DataError(src, algorithm.key_path, algorithm.value, f"{engine.label} has no speculative algorithm {name}: {fix}")


def _env(src: str, path: str, value: Any) -> tuple[tuple[str, str], ...]:
    _require(isinstance(value, dict), src, path, value, "must be a map of NAME -> value, e.g. `SGLANG_DDTREE_MAX_TOPK: 8`")
    out = []
    for name, env_value in value.items():
        key_path = f"{path}.{name}"
        _require(isinstance(name, str) and bool(_ENV_RE.match(name)), src, key_path, name, "must be a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in DERIVED_ENV:
            raise DataError(src, key_path, env_value, f"`{name}` is derived from the service key `{DERIVED_ENV[name]}`; set that instead")
        _require(
            isinstance(env_value, (str, int, float)) and not isinstance(env_value, bool),
            src, key_path, env_value, "must be a single-line string or number (quote booleans: \"true\")",
        )
        out.append((name, _unit_safe(src, key_path, env_value, rule="must be a single-line string or number")))
    return tuple(out)


def _model_name(src: str, path: str, value: Any) -> str:
    _require(
        isinstance(value, str) and bool(_MODEL_RE.match(value)) and value not in (".", ".."),
        src, path, value, "must be a model directory name inside `model_store` (letters, digits, '.', '_', '-'), not a path",
    )
    return value


def _service(src: str, name: str, raw: Any, overrides: dict[str, Any], override_src: str, hc: dict[str, Any]) -> Service:
    base_path = f"services.{name}"
    _require(isinstance(raw, dict), src, base_path, raw, "must be a map of service keys: " + ", ".join(SERVICE_KEYS))
    for key in raw:
        _require(key in SERVICE_KEYS, src, f"{base_path}.{key}", raw[key], f"unknown service key; allowed: {', '.join(SERVICE_KEYS)}")
    merged = {k: spec.default for k, spec in SERVICE_KEYS.items()}
    origin = {k: (src, f"{base_path}.{k}") for k in SERVICE_KEYS}
    merged.update(raw)
    for key, value in overrides.items():
        merged[key] = value
        origin[key] = (override_src, f"run_services.{name}.{key}")
    for key, spec in SERVICE_KEYS.items():
        if spec.required and merged[key] is None:
            raise DataError(src, f"{base_path}.{key}", None, f"required: {spec.doc}")

    def at(key: str) -> tuple[str, str, Any]:
        return origin[key][0], origin[key][1], merged[key]

    gpus = _gpus(*at("gpu"))
    s, p, port = at("port")
    _require(_is_int(port) and 1 <= port <= 65535, s, p, port, "must be a TCP port, an integer from 1 to 65535")
    # The unit's sandbox has no capabilities: the engine could not bind a port below 1024, and the
    # readiness check would talk HTTP to whatever already listens there (sshd on 22).
    _require(port >= 1024, s, p, port, "is a privileged port (below 1024): the service runs without capabilities and "
                                       "could not bind it; use a port from 1024 to 65535, e.g. 30000")
    s, p, bind = at("bind")
    _require(_is_ip(bind), s, p, bind, "must be an IP address such as 127.0.0.1 or 0.0.0.0")
    locations = {}
    for key in ("model_in", "draft_in"):
        s, p, loc = at(key)
        _require(loc in LOCATIONS, s, p, loc, "must be `shm` (staged into shm_dir) or `store` (loaded from model_store)")
        locations[key] = loc

    def use(model: str, location: str) -> ModelUse:
        store_path = f"{hc['model_store']}/{model}"
        load = f"{hc['shm_dir']}/{model}" if location == "shm" else store_path
        return ModelUse(model, location, store_path, load)

    target = use(_model_name(*at("model")), locations["model_in"])
    draft = None
    s, p, draft_name = at("draft_model")
    if draft_name is not None:
        draft = use(_model_name(s, p, draft_name), locations["draft_in"])
    if draft is not None and draft.name == target.name:
        raise DataError(s, p, draft_name, f"the draft model is the target model ({target.name}): name the smaller draft "
                                          "model (e.g. Qwen3.6-27B-DFlash), or null for no speculative decoding")
    secrets: dict[str, Secret | None] = {}
    for key in ("api_key_secret", "admin_api_key_secret"):
        s, p, secret_name = at(key)
        if secret_name is None:
            secrets[key] = None
            continue
        _require(isinstance(secret_name, str) and bool(_NAME_RE.match(secret_name)), s, p, secret_name, "must be the name of a secret (lowercase letters, digits, '-', '_'), not the key itself")
        secrets[key] = resolve(secret_name, hc["secrets_file"], s, p)
    s, p, allow_open = at("allow_unauthenticated")
    _require(isinstance(allow_open, bool), s, p, allow_open, "must be true or false")
    if not secrets["api_key_secret"] and not _is_loopback(bind) and not allow_open:
        s, p, _ = at("bind")
        raise DataError(
            s, p, bind,
            "binding beyond loopback without an API key lets anyone who reaches the port use the model: "
            "set `api_key_secret` (a secret on the control machine), or `allow_unauthenticated: true` to accept that",
        )
    s, p, patch_sets = at("patch_sets")
    _require(
        isinstance(patch_sets, list) and all(isinstance(x, str) and _NAME_RE.match(x) for x in patch_sets),
        s, p, patch_sets, "must be a list of patch set names (directories in files/patches/)",
    )
    _require(len(set(patch_sets)) == len(patch_sets), s, p, patch_sets, "names a patch set twice; list each once")
    for patch_set in patch_sets:
        _require((REPO_ROOT / "files" / "patches" / patch_set / "patchset.yml").exists(), s, p, patch_set, f"no such patch set; available: {', '.join(available_patch_sets()) or '(none)'}")
        _load_patch_set(patch_set)  # its manifest, checked like the data
    engine = engine_flags.for_engine(hc["engine_version"], tuple(patch_sets))
    args = _args(*at("args"), engine)
    _check_arg_values(origin["args"][0], args, gpus, tuple(patch_sets), engine)
    return Service(
        name=name,
        environment=environment_for(hc["venv_path"], tuple(patch_sets)),
        gpus=gpus,
        port=port,
        bind=bind,
        target=target,
        draft=draft,
        patch_sets=tuple(patch_sets),
        args=tuple((a.flag, a.value) for a in args),
        env=_env(*at("env")),
        api_key=secrets["api_key_secret"],
        admin_api_key=secrets["admin_api_key_secret"],
        allow_unauthenticated=allow_open,
    )


def available_patch_sets() -> list[str]:
    root = REPO_ROOT / "files" / "patches"
    return sorted(p.parent.name for p in root.glob("*/patchset.yml"))


def _placement(reader: _Reader) -> dict[str, dict[str, Any]]:
    src = reader.source("run_services")
    value = reader.get("run_services", HOST_KEYS["run_services"])
    if isinstance(value, list):
        _require(all(isinstance(v, str) for v in value), src, "run_services", value, "must list service names, e.g. `[ddtree, dflash]`")
        _require(len(set(value)) == len(value), src, "run_services", value, "names a service twice; list each once")
        return {name: {} for name in value}
    _require(isinstance(value, dict), src, "run_services", value, "must be a list of service names or a map name -> overrides (e.g. {dflash: {gpu: 1, port: 30001}})")
    out = {}
    for name, overrides in value.items():
        overrides = overrides or {}
        _require(isinstance(overrides, dict), src, f"run_services.{name}", overrides, "overrides must be a map of service keys, e.g. {gpu: 1, port: 30001}")
        for key in overrides:
            _require(key in SERVICE_KEYS, src, f"run_services.{name}.{key}", overrides[key], f"unknown service key; allowed: {', '.join(SERVICE_KEYS)}")
        out[name] = overrides
    return out


@functools.lru_cache(maxsize=None)
def _pyinfra_keys() -> frozenset[str]:
    """Data keys pyinfra itself reads: its connectors' keys (ssh_hostname, ssh_user, ...) and its
    global arguments (_sudo, ...). Only these pass; `ssh_usr` is a typo like any other.
    Found once per process: pyinfra lists its connectors from the installed packages' entry points."""
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors

    keys = {name for name, _ in all_global_arguments() if name.startswith("_")}
    for connector in get_all_connectors().values():
        keys |= set(getattr(connector, "data_meta", None) or {})
    return frozenset(keys)


def _no_unknown_keys(host) -> None:
    """Typos in the inventory or in --data would otherwise be silently ignored."""
    known = {**GLOBAL_KEYS, **HOST_KEYS}
    pyinfra_keys = _pyinfra_keys()
    layers = (
        ("--data", host.inventory.get_override_data()),
        (f"inventory (host {host.name})", host.inventory.get_host_data(host.name)),
    )
    for source, data in layers:
        for key in data:
            if key not in known and key not in pyinfra_keys:
                if key in RETIRED_KEYS:
                    raise DataError(source, key, data[key], RETIRED_KEYS[key])
                hint = _did_you_mean(key, [*known, *pyinfra_keys])
                raise DataError(source, key, data[key], f"unknown key; allowed: {', '.join(sorted(known))}, "
                                                        f"or one of pyinfra's own (ssh_hostname, ssh_user, ssh_port, ssh_key, _sudo, ...){hint}")


def _load_patch_set(name: str):
    from operations.patches import load_patch_set  # patches imports pyinfra's host context

    return load_patch_set(name)


def host_config(host) -> HostConfig:
    """`host`'s validated `HostConfig`, or the `DataError` of the first bad value anywhere in the
    inventory: every host's load of deploy.py raises the same error, so no host is touched."""
    state = getattr(host, "state", None)
    if state is None or getattr(state, "inventory", None) is None:
        return _host_config(host)
    return validate_inventory(state)[host.name]


def validate_inventory(state) -> dict[str, HostConfig]:
    """Validate the whole inventory once per run: every host (with --data), every service
    defined (placed or not), every stack and patch-set manifest they use, and what only the
    hosts together can show (one service on two hosts, two hosts at one address).

    pyinfra connects every host, then loads deploy.py once per host in parallel greenlets; the
    first load to get here validates everything (nothing in it waits on I/O, so no other
    greenlet runs meanwhile) and keeps the result on the run's `state`; every later load
    gets the same configs, or re-raises the same error. So a bad value for one host stops the
    run before any host's deploy lock is taken."""
    cached = getattr(state, "_sglang_deploy_validated", None)
    if cached is None:
        try:
            cached = _validate_all(state.inventory)
        except DataError as exc:
            cached = exc
        state._sglang_deploy_validated = cached
    if isinstance(cached, DataError):
        raise cached
    return cached


def _validate_all(inventory) -> dict[str, HostConfig]:
    _stray_group_files()
    hosts = list(inventory)
    configs = {host.name: _host_config(host) for host in hosts}
    placed: dict[str, str] = {}
    for host in hosts:
        for service in configs[host.name].services:
            other = placed.setdefault(service.name, host.name)
            if other != host.name:
                raise DataError(_Reader(host).source("run_services"), "run_services", service.name,
                                f"service {service.name} is placed on {other} too: a service runs on one host (its unit, "
                                "port and API-key file are per service); define a second service under another name to run it twice")
    addresses: dict[tuple[str, str], str] = {}
    for host in hosts:
        address = (str(host.data.get("ssh_hostname") or host.name), str(host.data.get("ssh_port") or 22))
        other = addresses.setdefault(address, host.name)
        if other != host.name:
            raise DataError(f"inventory (host {host.name})", "ssh_hostname", address[0],
                            f"is also the address of host {other}: one machine under two names would wait for its own "
                            "deploy lock and run two sets of services on the same GPUs; list it once")
    return configs


def _stray_group_files() -> None:
    """A `group_data/<group>.yml` without its `<group>.py` loader is never read by pyinfra."""
    dirs = set(_GROUP_DIRS) | {REPO_ROOT / "group_data", Path.cwd() / "group_data"}
    if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
        dirs.add(Path(sys.argv[1]).resolve().parent / "group_data")
    for folder in sorted(dirs):
        for yml in sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")]):
            if not yml.with_suffix(".py").exists():
                raise DataError(_display_path(yml), "(file)", yml.name,
                                f"has no loader {yml.stem}.py beside it, so pyinfra never reads it: copy group_data/all.py "
                                f"to {yml.stem}.py (it loads {yml.stem}.yml), or delete the file")


def _host_config(host) -> HostConfig:
    """Validate everything `host` sees into a `HostConfig`, or raise `DataError`."""
    from configuration.stacks import load_stack  # stacks import settings' helpers

    _no_unknown_keys(host)
    reader = _Reader(host)
    values: dict[str, Any] = {}
    for key, spec in GLOBAL_KEYS.items():
        values[key] = reader.get(key, spec)
    src = reader.source
    stack = load_stack(values["stack"], source=src("stack"), key_path="stack")
    values["engine_version"] = stack.wanted().get(engine_flags.ENGINE)
    if values["engine_version"] is not None and engine_flags.load(values["engine_version"]) is None:
        raise DataError(src("stack"), "stack", values["stack"],
                        f"pins {engine_flags.ENGINE} {values['engine_version']}, whose flag list is not in files/engine_flags/: "
                        "generate it (python -m configuration.engine_flags generate VENV_PYTHON; see configuration/engine_flags.py)")
    for key in ("venv_path", "model_store", "shm_dir", "host_wheel_cache"):
        values[key] = _abs_path(src(key), key, values[key])
    _require(isinstance(values["wheelhouse"], str) and values["wheelhouse"] != "", src("wheelhouse"), "wheelhouse", values["wheelhouse"], "must be a directory path on the control machine")
    stack_sources = _stack_sources(src("stack_sources"), values["stack_sources"], values["wheelhouse"], [h.name for h in host.inventory], host.name, values["venv_path"])
    _require(values["installer"] in ("auto", "uv", "pip"), src("installer"), "installer", values["installer"], "must be `auto` (uv when the wheelhouse ships it, else pip), `uv` or `pip`")
    _require(isinstance(values["launcher"], str) and bool(_MODULE_RE.match(values["launcher"])), src("launcher"), "launcher", values["launcher"], "must be a Python module name such as sglang.launch_server")
    timeout = values["readiness_timeout_s"]
    _require(_is_int(timeout) and 1 <= timeout <= 86400, src("readiness_timeout_s"), "readiness_timeout_s", timeout, "must be whole seconds from 1 to 86400")
    _require(isinstance(values["smoke_test"], bool), src("smoke_test"), "smoke_test", values["smoke_test"], "must be true or false")
    sources = values["model_sources"]
    _require(isinstance(sources, dict), src("model_sources"), "model_sources", sources, "must be a map of model name -> inventory host name")
    for model_name, source in sources.items():
        key_path = f"model_sources.{model_name}"
        _model_name(src("model_sources"), key_path, model_name)
        is_path = isinstance(source, str) and ("/" in source or source.startswith("."))
        if is_path:
            _control_dir(src("model_sources"), key_path, source)
        _require(
            isinstance(source, str) and (is_path or host.inventory.get_host(source, None) is not None),
            src("model_sources"), key_path, source,
            f"must name a host of the inventory ({', '.join(h.name for h in host.inventory)}) "
            "or the model's directory on the control machine (a path that exists here)",
        )
        _require(source != host.name, src("model_sources"), key_path, source, "names this host itself: name the host (or control-machine directory) that holds the model")
    wait = values["lock_wait_s"]
    _require(_is_int(wait) and 0 <= wait <= 86400, src("lock_wait_s"), "lock_wait_s", wait, "must be whole seconds from 0 to 86400")
    _require(isinstance(values["secrets_file"], str) and values["secrets_file"] != "", src("secrets_file"), "secrets_file", values["secrets_file"], "must be a file path on the control machine")
    values["secrets_file"] = Path(values["secrets_file"])
    _require(not values["secrets_file"].is_dir(), src("secrets_file"), "secrets_file", str(values["secrets_file"]),
             "is a directory: name the YAML file (secret name -> value) inside it, e.g. .secrets/secrets.yml")
    _require(
        isinstance(values["service_user"], str) and bool(_USER_RE.match(values["service_user"])),
        src("service_user"), "service_user", values["service_user"],
        "must be a user name (lowercase letters, digits, '_', '-'; up to 32 characters, not starting with a digit or '-'), e.g. `sglang`, or `root`",
    )
    _require(values["verify_models"] in ("fast", "full"), src("verify_models"), "verify_models", values["verify_models"], "must be `fast` (names and sizes) or `full` (re-hash the staged files)")

    services_raw = values["services"]
    _require(isinstance(services_raw, dict), src("services"), "services", services_raw, "must be a map of service name -> service definition")
    for name in services_raw:
        _require(isinstance(name, str) and bool(_NAME_RE.match(name)), src("services"), f"services.{name}", name, "service names are lowercase letters, digits, '-' and '_' (they name the systemd unit)")
        _require(name not in RESERVED_SERVICE_NAMES, src("services"), f"services.{name}", name,
                 f"would name the unit sglang-{name}.service, which is the deploy's own ({', '.join(f'sglang-{n}' for n in sorted(RESERVED_SERVICE_NAMES))} are reserved): choose another name")
    # Every configured host path, and the paths derived from them, each in a place of its own.
    env_paths = [(src("services"), f"services.{n}.patch_sets (venv {environment_for(values['venv_path'], tuple(r.get('patch_sets') or ())).path})",
                  environment_for(values["venv_path"], tuple(r.get("patch_sets") or ())).path)
                 for n, r in services_raw.items() if isinstance(r, dict) and r.get("patch_sets") and isinstance(r.get("patch_sets"), list)
                 and all(isinstance(x, str) for x in r["patch_sets"])]
    _no_overlap([
        (src("venv_path"), "venv_path", values["venv_path"]),
        (src("venv_path"), "venv_path's generations", values["venv_path"] + ".generations"),
        (src("model_store"), "model_store", values["model_store"]),
        (src("shm_dir"), "shm_dir", values["shm_dir"]),
        (src("host_wheel_cache"), "host_wheel_cache", values["host_wheel_cache"]),
        *{p[2]: p for p in env_paths}.values(),
        *{p[2] + ".generations": (p[0], p[1] + "'s generations", p[2] + ".generations") for p in env_paths}.values(),
    ])

    failed_gpus = reader.get("failed_gpus", HOST_KEYS["failed_gpus"])
    _require(
        isinstance(failed_gpus, list) and all(_is_int(i) and 0 <= i < 64 for i in failed_gpus),
        reader.source("failed_gpus"), "failed_gpus", failed_gpus, "must be a list of GPU indexes (0-63), e.g. `[1]`",
    )
    placement = _placement(reader)
    services = []
    for name, overrides in placement.items():
        _require(name in services_raw, src("run_services"), "run_services", name, f"no such service; defined services: {', '.join(sorted(services_raw)) or '(none)'}")
        services.append(_service(src("services"), name, services_raw[name], overrides, src("run_services"), values))

    _no_clashes(services, src("run_services"), host.name)
    # Services defined but placed nowhere are validated too: the next edit of run_services
    # must not be the first time their values are read.
    for name, raw in services_raw.items():
        if name not in placement:
            _service(src("services"), name, raw, {}, src("run_services"), values)
    return HostConfig(
        host=host.name,
        stack=values["stack"],
        venv_path=values["venv_path"],
        model_store=values["model_store"],
        shm_dir=values["shm_dir"],
        wheelhouse=Path(values["wheelhouse"]),
        host_wheel_cache=values["host_wheel_cache"],
        launcher=values["launcher"],
        stack_sources=stack_sources,
        installer=values["installer"],
        readiness_timeout_s=timeout,
        smoke_test=values["smoke_test"],
        lock_wait_s=wait,
        model_sources=dict(sources),
        services=tuple(services),
        verify_models=values["verify_models"],
        failed_gpus=tuple(failed_gpus),
        service_user=values["service_user"],
    )


_URL_RE = re.compile(r"\Ahttps?://[^\s/]+(/\S*)?\Z")


def _stack_sources(src: str, raw: Any, wheelhouse: str, hosts: list[str], this_host: str, venv_path: str) -> tuple[tuple[str, ...], ...]:
    """`stack_sources` as ((kind, location[, path]), ...): `wheelhouse` -> the wheelhouse dir, `{index: URL}` -> the URL, `{donor: HOST[, path: DIR]}`."""
    fix = "must be a non-empty list of `wheelhouse`, `{index: https://...}` and `{donor: <inventory host>}` entries, tried in order"
    _require(isinstance(raw, list) and bool(raw), src, "stack_sources", raw, fix)
    out = []
    for i, entry in enumerate(raw):
        if entry == "wheelhouse":
            out.append(("wheelhouse", wheelhouse))
        elif isinstance(entry, dict) and list(entry) == ["index"]:
            _require(isinstance(entry["index"], str) and bool(_URL_RE.match(entry["index"])), src, f"stack_sources[{i}].index", entry["index"], "must be a package index URL such as https://pypi.org/simple")
            out.append(("index", entry["index"]))
        elif isinstance(entry, dict) and "donor" in entry and set(entry) <= {"donor", "path"}:
            # A donor is another host's live venv, or, with `path`, any venv on an inventory host,
            # this one included (a venv built by hand beside the one the deploy builds).
            donor, path = entry["donor"], entry.get("path")
            if path is None:
                _require(donor in hosts and donor != this_host, src, f"stack_sources[{i}].donor", donor, f"must name another host of the inventory ({', '.join(h for h in hosts if h != this_host) or 'none'}) whose live venv holds the stack's pins, or add `path:` to copy from a venv at that path")
                out.append(("donor", donor))
            else:
                _require(donor in hosts, src, f"stack_sources[{i}].donor", donor, f"must name a host of the inventory ({', '.join(hosts)}), this one included, that has a venv at `path`")
                path = _abs_path(src, f"stack_sources[{i}].path", path)
                _require(donor != this_host or path.rstrip("/") != venv_path.rstrip("/"), src, f"stack_sources[{i}].path", path, "is this host's own venv_path: name the other venv to copy from")
                out.append(("donor", donor, path))
        else:
            _require(False, src, f"stack_sources[{i}]", entry, fix)
    return tuple(out)


def _no_clashes(services: list[Service], src: str, host_name: str) -> None:
    ports: dict[int, str] = {}
    gpus: dict[int, str] = {}
    for service in services:
        other = ports.setdefault(service.port, service.name)
        if other != service.name:
            raise DataError(src, "run_services", [other, service.name], f"both use port {service.port} on host {host_name}; give each service on a host its own port (`port` in services.<name>, or an override in run_services)")
        for gpu in service.gpus:
            other = gpus.setdefault(gpu, service.name)
            if other != service.name:
                raise DataError(src, "run_services", [other, service.name], f"both use GPU {gpu} on host {host_name}; give each service on a host its own GPUs (`gpu` in services.<name>, or an override in run_services)")
