"""Deploy data: loading the operators' YAML and validating it into typed objects.

Operators edit `group_data/<group>.yml`; the thin `group_data/<group>.py` beside each
calls `load_group_yaml(__file__)`, so pyinfra's own precedence applies unchanged
(`--data` > host data > group data > all). `host_config(host)` returns the host's validated
`HostConfig`; the first call of a run validates the whole inventory (`validate_inventory`)
before `deploy.py` adds a single operation on any host: a bad value anywhere stops the run
with a `DataError` naming the file, the key path, the value and the fix.

The keys, their kinds, defaults and documentation are the models of configuration/schema.py (strict
pydantic models; each kind of value, configuration/kinds.py, checks the whole value wherever it
appears). Here: where each value came from, and the rules only several values together can show
(paths apart from each other, `args` resolved as the engine's parser resolves them
(configuration/engine_flags.py) before the derived-flag, credential, exposure and value rules apply,
services that clash, one machine under two inventory names), and pyinfra's connector keys, each judged by one rule
over every key pyinfra's connectors read (`CONNECTOR_KEYS`).
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import sys
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from configuration import advisories, connection, engine_flags, host_paths, kinds, schema
from configuration import patch_sets as patch_set_files
from configuration.connection import HIDDEN
from configuration.errors import DataError
from configuration.secrets import Secret, config_path, resolve
from configuration.stacks import load_stack, normalize
from configuration.yamlload import load_file

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Key:
    default: Any
    doc: str
    required: bool = False


def _keys(model: type[BaseModel]) -> dict[str, Key]:
    """A model's keys as the rest of the deploy reads them (defaults by name); the schema is the one source."""
    return {name: Key(schema.default_of(model, name), f.description, bool(f.json_schema_extra.get("required")))
            for name, f in model.model_fields.items()}


# Keys any group (or host) may set, keys that belong in the inventory's host data, and a service's keys.
GLOBAL_KEYS: dict[str, Key] = _keys(schema.GroupData)
HOST_KEYS: dict[str, Key] = _keys(schema.HostData)
SERVICE_KEYS: dict[str, Key] = _keys(schema.ServiceSpec)

RESERVED_SERVICE_NAMES = kinds.RESERVED_SERVICE_NAMES

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
    # Every way the data makes the service listen beyond loopback (key path, why): `bind`, engine flags.
    listens_beyond_loopback: tuple[tuple[str, str], ...] = ()

    @property
    def config_file(self) -> str | None:
        """The root-only `--config` file that carries the API keys, if the service has any."""
        return config_path(self.name) if (self.api_key or self.admin_api_key) else None

    @property
    def exposed_without_key(self) -> bool:
        return not self.api_key and (not kinds.is_loopback_host(self.bind) or bool(self.listens_beyond_loopback))

    @property
    def unit_name(self) -> str:
        return f"sglang-{self.name}.service"

    @property
    def unit_path(self) -> str:
        return host_paths.unit_path(self.unit_name)

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
    verify_env: str = "fast"
    # Where SSH reaches the host: (`ssh_hostname`, else the inventory name; `ssh_port`, else 22).
    ssh_address: tuple[str, int] | None = None
    # What this host reads of other hosts, from their validated configurations (`validate_inventory`): the live venv
    # (`venv_path`) of each donor `stack_sources` names without a `path`, the store (`model_store`) of each host
    # `model_sources` names.
    peer_venvs: dict = field(default_factory=dict)
    peer_stores: dict = field(default_factory=dict)

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


# From the schema's refusals to the operator's message ---------------------------------------


def _key_path(prefix: str, loc: tuple) -> str:
    """`services.ddtree` + ('env', 'X') -> `services.ddtree.env.X`; list positions as `[0]`; a map key's own
    refusal (`[key]`) is reported at the key."""
    path = prefix
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _first_error(exc: ValidationError) -> dict:
    """The error an operator should see first: an unknown key, then a missing one, then the first in field order."""
    errors = exc.errors()
    for kind in ("extra_forbidden", "missing"):
        for error in errors:
            if error["type"] == kind:
                return error
    return errors[0]


def _data_error(exc: ValidationError, where, allowed: list[str], missing_doc) -> DataError:
    """`where(key) -> (source, key path prefix)` names the file and the key; the kinds name the fix."""
    error = _first_error(exc)
    loc = tuple(error["loc"])
    source, prefix = where(loc[0] if loc else None)
    ctx = error.get("ctx") or {}
    if "at" in ctx:
        loc = (*loc, ctx["at"])
    path = _key_path(prefix, loc[1:])
    if error["type"] == "extra_forbidden":
        return DataError(source, path, error["input"], f"unknown key; allowed: {', '.join(allowed)}")
    if error["type"] == "missing":
        return DataError(source, path, None, f"required: {missing_doc(loc[0] if loc else None)}")
    shown = ctx["shown"] if "shown" in ctx else error["input"]
    return DataError(source, path, shown, ctx.get("fix") or error["msg"])


def _validated(model: type[BaseModel], data: dict, where) -> BaseModel:
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        raise _data_error(exc, where, list(model.model_fields),
                          lambda key: model.model_fields[key].description) from None


@functools.lru_cache(maxsize=None)
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def _kind(src: str, path: str, kind: Any, value: Any) -> Any:
    """One value of `kind` (configuration/kinds.py), or the `DataError` with its fix."""
    try:
        return _adapter(kind).validate_python(value, strict=True)
    except ValidationError as exc:
        raise _data_error(exc, lambda _: (src, path), [], lambda _: "") from None


# One host --------------------------------------------------------------------------------------


def host_config(host) -> HostConfig:
    """`host`'s validated `HostConfig`, or the `DataError` of the first bad value anywhere in the
    inventory: every host's load of deploy.py raises the same error, so no host is touched."""
    state = getattr(host, "state", None)
    if state is None or getattr(state, "inventory", None) is None:
        return _host_config(host)
    return validate_inventory(state)[host.name]


# Each run's validated inventory (or its first DataError), by the run's State: nothing is kept on pyinfra's objects.
_VALIDATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validate_inventory(state) -> dict[str, HostConfig]:
    """Validate the whole inventory once per run: every host (with --data), every service
    defined (placed or not), every stack and patch-set manifest they use, and what only the
    hosts together can show (one service on two hosts, two hosts at one address).

    pyinfra connects every host, then loads deploy.py once per host in parallel greenlets; the
    first load to get here validates everything (nothing in it waits on I/O, so no other
    greenlet runs meanwhile) and keeps the result on the run's `state`; every later load
    gets the same configs, or re-raises the same error. So a bad value for one host stops the
    run before any host's deploy lock is taken."""
    cached = _VALIDATED.get(state)
    if cached is None:
        try:
            cached = _validate_all(state.inventory)
        except DataError as exc:
            cached = exc
        _VALIDATED[state] = cached
    if isinstance(cached, DataError):
        raise cached
    return cached


def _validate_all(inventory) -> dict[str, HostConfig]:
    _stray_group_files()
    hosts = list(inventory)
    for host in hosts:
        _kind(f"inventory (host {host.name})", "(host name)", kinds.HostName, host.name)
    configs = {host.name: _host_config(host) for host in hosts}
    _one_host_per_service(hosts, configs)
    _one_name_per_address(hosts)
    return {name: _with_peers(config, configs) for name, config in configs.items()}


def _with_peers(config: HostConfig, configs: dict[str, HostConfig]) -> HostConfig:
    """`config` with what it reads of the other hosts, from their validated configurations."""
    venvs = {entry[1]: configs[entry[1]].venv_path for entry in config.stack_sources if entry[0] == "donor" and len(entry) == 2}
    stores = {source: configs[source].model_store for source in config.model_sources.values() if source in configs}
    return replace(config, peer_venvs=venvs, peer_stores=stores)


def _one_host_per_service(hosts: list, configs: dict[str, HostConfig]) -> None:
    placed: dict[str, str] = {}
    for host in hosts:
        for service in configs[host.name].services:
            other = placed.setdefault(service.name, host.name)
            if other != host.name:
                raise DataError(_Reader(host).source("run_services"), "run_services", service.name,
                                f"service {service.name} is placed on {other} too: a service runs on one host (its unit, "
                                "port and API-key file are per service); define a second service under another name to run it twice")


def _one_name_per_address(hosts: list) -> None:
    """Two inventory names for one machine would deploy it twice at once, each one's cleanup removing the
    other's services. Addresses are compared as SSH reaches them (kinds.canonical_address: case, a final dot,
    IPv6 and IPv4 spellings, the port), not as strings."""
    addresses: dict[tuple[str, int], str] = {}
    for host in hosts:
        given = host.data.get("ssh_hostname") or host.name
        address = kinds.canonical_address(given, host.data.get("ssh_port"))
        other = addresses.setdefault(address, host.name)
        if other != host.name:
            raise DataError(f"inventory (host {host.name})", "ssh_hostname", given,
                            f"is also the address of host {other} ({address[0]} port {address[1]}): one machine under two "
                            "names would wait for its own deploy lock and run two sets of services on the same GPUs; list it once")


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
    _no_unknown_keys(host)
    reader = _Reader(host)
    src = reader.source
    raw = {key: reader.get(key, spec) for key, spec in GLOBAL_KEYS.items()}
    stack = load_stack(raw["stack"], source=src("stack"), key_path="stack")
    data: schema.GroupData = _validated(schema.GroupData, raw, lambda key: (src(key), key))
    engine_version = stack.wanted().get(engine_flags.ENGINE)
    if engine_version is not None and engine_flags.load(engine_version) is None:
        raise DataError(src("stack"), "stack", data.stack,
                        f"pins {engine_flags.ENGINE} {engine_version}, whose flag list is not in files/engine_flags/: "
                        "generate it (python -m tools.engine_flags generate VENV_PYTHON; see tools/engine_flags.py)")
    hosts = [h.name for h in host.inventory]
    stack_sources = _stack_sources(src("stack_sources"), data.stack_sources, data.wheelhouse, hosts, host.name, data.venv_path)
    _model_sources(src("model_sources"), data.model_sources, host)
    secrets_file = Path(data.secrets_file)
    _require(not secrets_file.is_dir(), src("secrets_file"), "secrets_file", str(secrets_file),
             "is a directory: name the YAML file (secret name -> value) inside it, e.g. .secrets/secrets.yml")
    _host_paths_apart(src, data)
    host_data: schema.HostData = _validated(
        schema.HostData, {key: reader.get(key, spec) for key, spec in HOST_KEYS.items()}, lambda key: (src(key), key))
    context = _ServiceContext(data, engine_version, secrets_file, src("services"), src("run_services"), stack.wanted())
    placement = _placement(reader)
    services = []
    for name, overrides in placement.items():
        _require(name in data.services, src("run_services"), "run_services", name,
                 f"no such service; defined services: {', '.join(sorted(data.services)) or '(none)'}")
        services.append(_service(context, name, data.services[name], overrides))
    _no_clashes(services, src("run_services"), host.name)
    # Services defined but placed nowhere are validated too: the next edit of run_services
    # must not be the first time their values are read.
    for name, raw_service in data.services.items():
        if name not in placement:
            _service(context, name, raw_service, {})
    return HostConfig(
        host=host.name,
        stack=data.stack,
        venv_path=data.venv_path,
        model_store=data.model_store,
        shm_dir=data.shm_dir,
        wheelhouse=Path(data.wheelhouse),
        host_wheel_cache=data.host_wheel_cache,
        launcher=data.launcher,
        stack_sources=stack_sources,
        installer=data.installer,
        readiness_timeout_s=data.readiness_timeout_s,
        smoke_test=data.smoke_test,
        lock_wait_s=data.lock_wait_s,
        model_sources=dict(data.model_sources),
        services=tuple(services),
        verify_models=data.verify_models,
        failed_gpus=tuple(host_data.failed_gpus),
        service_user=data.service_user,
        verify_env=data.verify_env,
        ssh_address=(str(host.data.get("ssh_hostname") or host.name), int(host.data.get("ssh_port") or 22)),
    )


def _model_sources(src: str, sources: dict[str, Any], host) -> None:
    for model_name, source in sources.items():
        key_path = f"model_sources.{model_name}"
        is_path = isinstance(source, str) and ("/" in source or source.startswith("."))
        if is_path:
            _control_dir(src, key_path, source)
        _require(
            isinstance(source, str) and (is_path or host.inventory.get_host(source, None) is not None),
            src, key_path, source,
            f"must name a host of the inventory ({', '.join(h.name for h in host.inventory)}) "
            "or the model's directory on the control machine (a path that exists here)",
        )
        _require(source != host.name, src, key_path, source, "names this host itself: name the host (or control-machine directory) that holds the model")


def _host_paths_apart(src, data: schema.GroupData) -> None:
    """Every configured host path, and the paths derived from them, each in a place of its own."""
    env_paths = []
    for name, raw in data.services.items():
        patch_sets = raw.get("patch_sets") if isinstance(raw, dict) else None
        if isinstance(patch_sets, list) and patch_sets and all(isinstance(x, str) for x in patch_sets):
            path = environment_for(data.venv_path, tuple(patch_sets)).path
            env_paths.append((src("services"), f"services.{name}.patch_sets (venv {path})", path))
    _no_overlap([
        (src("venv_path"), "venv_path", data.venv_path),
        (src("venv_path"), "venv_path's generations", data.venv_path + ".generations"),
        (src("model_store"), "model_store", data.model_store),
        (src("shm_dir"), "shm_dir", data.shm_dir),
        (src("host_wheel_cache"), "host_wheel_cache", data.host_wheel_cache),
        *{p[2]: p for p in env_paths}.values(),
        *{p[2] + ".generations": (p[0], p[1] + "'s generations", p[2] + ".generations") for p in env_paths}.values(),
    ])


def _stack_sources(src: str, raw: Any, wheelhouse: str, hosts: list[str], this_host: str, venv_path: str) -> tuple[tuple[str, ...], ...]:
    """`stack_sources` as ((kind, location[, path]), ...): `wheelhouse` -> the wheelhouse dir, `{index: URL}` -> the URL, `{donor: HOST[, path: DIR]}`."""
    fix = "must be a non-empty list of `wheelhouse`, `{index: https://...}` and `{donor: <inventory host>}` entries, tried in order"
    _require(isinstance(raw, list) and bool(raw), src, "stack_sources", raw, fix)
    out = []
    for i, entry in enumerate(raw):
        if entry == "wheelhouse":
            out.append(("wheelhouse", wheelhouse))
        elif isinstance(entry, dict) and list(entry) == ["index"]:
            out.append(("index", _kind(src, f"stack_sources[{i}].index", kinds.IndexUrl, entry["index"])))
        elif isinstance(entry, dict) and "donor" in entry and set(entry) <= {"donor", "path"}:
            # A donor is another host's live venv, or, with `path`, any venv on an inventory host,
            # this one included (a venv built by hand beside the one the deploy builds).
            donor, path = entry["donor"], entry.get("path")
            if path is None:
                _require(donor in hosts and donor != this_host, src, f"stack_sources[{i}].donor", donor, f"must name another host of the inventory ({', '.join(h for h in hosts if h != this_host) or 'none'}) whose live venv holds the stack's pins, or add `path:` to copy from a venv at that path")
                out.append(("donor", donor))
            else:
                _require(donor in hosts, src, f"stack_sources[{i}].donor", donor, f"must name a host of the inventory ({', '.join(hosts)}), this one included, that has a venv at `path`")
                # Root copies the donor venv's files into its own: the donor venv is trusted like venv_path.
                path = _kind(src, f"stack_sources[{i}].path", kinds.TrustedHostPath, path)
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


def _no_overlap(paths: list[tuple[str, str, str]]) -> None:
    """(source, key, path): no configured host path may equal or contain another, or a path
    derived from one (the generations directory `<venv_path>.generations`, the patched venvs)."""
    for i, first in enumerate(paths):
        for second in paths[i + 1:]:
            # Name the value set where the operator is most likely editing: --data, then the
            # inventory, then a group's file, then all.yml, then the defaults.
            (src_a, key_a, a), (src_b, key_b, b) = sorted((first, second), key=lambda p: -_precedence(p[0]))
            if kinds.inside(a, b) or kinds.inside(b, a):
                relation = "is the same directory as" if a == b else ("is inside" if kinds.inside(a, b) else "contains")
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
    for denied in kinds.DENIED_PATHS:
        _require(not kinds.inside(denied, str(resolved)), src, path, value,
                 f"resolves to {resolved}, which is or contains {denied}: name the model's own directory")
    _require(resolved.is_dir(), src, path, value, "must be an existing directory on the control machine")
    return resolved


# Services ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ServiceContext:
    """What a service's rules read besides its own keys."""

    data: schema.GroupData
    engine_version: str | None
    secrets_file: Path
    src: str  # where `services` was set
    override_src: str  # where `run_services` was set
    pins: dict[str, str] = field(default_factory=dict)  # the stack's distribution -> version


def _service(ctx: _ServiceContext, name: str, raw: Any, overrides: dict[str, Any]) -> Service:
    base_path = f"services.{name}"
    _require(isinstance(raw, dict), ctx.src, base_path, raw, "must be a map of service keys: " + ", ".join(SERVICE_KEYS))
    for key in raw:
        _require(key in SERVICE_KEYS, ctx.src, f"{base_path}.{key}", raw[key], f"unknown service key; allowed: {', '.join(SERVICE_KEYS)}")
    origin = {key: (ctx.src, f"{base_path}.{key}") for key in SERVICE_KEYS}
    merged = {**raw}
    for key, value in overrides.items():
        merged[key] = value
        origin[key] = (ctx.override_src, f"run_services.{name}.{key}")
    # A required key given as null is missing, as if it were not written.
    merged = {k: v for k, v in merged.items() if not (SERVICE_KEYS[k].required and v is None)}
    spec: schema.ServiceSpec = _validated(schema.ServiceSpec, merged, lambda key: origin.get(key, (ctx.src, f"{base_path}.{key}")))

    def at(key: str) -> tuple[str, str, Any]:
        return origin[key][0], origin[key][1], getattr(spec, key)

    gpus = () if spec.gpu == "auto" else ((spec.gpu,) if isinstance(spec.gpu, int) else tuple(spec.gpu))
    # The unit's sandbox has no capabilities: the engine could not bind a port below 1024, and the
    # readiness check would talk HTTP to whatever already listens there (sshd on 22).
    _require(spec.port >= 1024, *at("port"), "is a privileged port (below 1024): the service runs without capabilities and "
                                             "could not bind it; use a port from 1024 to 65535, e.g. 30000")
    target = _model_use(ctx.data, spec.model, spec.model_in)
    draft = _model_use(ctx.data, spec.draft_model, spec.draft_in) if spec.draft_model is not None else None
    if draft is not None and draft.name == target.name:
        raise DataError(*at("draft_model"), f"the draft model is the target model ({target.name}): name the smaller draft "
                                            "model (e.g. Qwen3.6-27B-DFlash), or null for no speculative decoding")
    secrets = {key: resolve(getattr(spec, key), ctx.secrets_file, *origin[key]) if getattr(spec, key) is not None else None
               for key in ("api_key_secret", "admin_api_key_secret")}
    patch_sets = tuple(spec.patch_sets)
    s, p, _ = at("patch_sets")
    for patch_set in patch_sets:
        _require((patch_set_files.PATCHES_DIR / patch_set / "patchset.yml").exists(), s, p, patch_set, f"no such patch set; available: {', '.join(patch_set_files.available()) or '(none)'}")
        _patch_set_fits_the_stack(ctx, s, p, patch_set_files.load_patch_set(patch_set))  # its manifest, checked like the data
    engine = engine_flags.for_engine(ctx.engine_version, patch_sets)
    # Unknown flags are judged only against a whole flag list: a patch set without its own (a copy, a new set) may add some.
    whole = engine is not None and all(engine_flags.load(ctx.engine_version, p) is not None for p in patch_sets)
    args = _args(*at("args"), engine, ctx.engine_version if whole else None, judge_unknown=whole)
    _check_arg_values(origin["args"][0], args, gpus, patch_sets, engine, ctx.engine_version)
    _served_backends(*origin["args"], args, patch_sets)
    _advisories_refused(*origin["args"], args, engine, ctx.engine_version)
    listening = _listens_beyond_loopback(at("bind"), args)
    _exposure_needs_a_key(listening, secrets["api_key_secret"], spec.allow_unauthenticated)
    return Service(
        name=name,
        environment=environment_for(ctx.data.venv_path, patch_sets),
        gpus=gpus,
        port=spec.port,
        bind=spec.bind,
        target=target,
        draft=draft,
        patch_sets=patch_sets,
        args=tuple((a.flag, a.value) for a in args),
        env=tuple(spec.env.items()),
        api_key=secrets["api_key_secret"],
        admin_api_key=secrets["admin_api_key_secret"],
        allow_unauthenticated=spec.allow_unauthenticated,
        listens_beyond_loopback=tuple((where, why) for (_, where, _value, why) in listening if where != origin["bind"][1]),
    )


def _model_use(data: schema.GroupData, model: str, location: str) -> ModelUse:
    store_path = f"{data.model_store}/{model}"
    load = f"{data.shm_dir}/{model}" if location == "shm" else store_path
    return ModelUse(model, location, store_path, load)


# Exposure ------------------------------------------------------------------------------------------

def _listens_beyond_loopback(bind: tuple[str, str, Any], args: list["_Arg"]) -> list[tuple[str, str, Any, str]]:
    """(source, key path, value, why) for every way the data makes the service listen beyond loopback: `bind`
    (`--host`); any engine flag whose value names an address beyond loopback, whatever the flag is called
    (`kinds.addresses_in`: URLs, `host:port`, zmq's `*`, bare IP addresses, inside JSON values too); and setups that
    are reached from other machines by design (several nodes, prefill/decode disaggregation).

    An address the engine only connects out to counts too: a value does not say whether the engine binds it or
    connects to it (a zmq endpoint is bound by one side and connected by the other, `dist-init-addr` is bound by
    node 0 and reached by the rest), and a wrong guess of "connects" serves the model to the network, while a
    wrong guess of "listens" costs an API key, or `allow_unauthenticated: true` written once."""
    found = []
    if not kinds.is_loopback_host(bind[2]):
        found.append((*bind, "binding beyond loopback"))
    for arg in args:
        beyond = [a for a in kinds.addresses_in(arg.value) if a.beyond_loopback]
        if beyond:
            found.append((arg.source, arg.key_path, arg.value,
                          f"`--{arg.flag}` naming `{beyond[0].written}`, an address beyond loopback that the engine may "
                          "listen at or that other machines reach,"))
        elif arg.dest == "nnodes" and kinds.positive_whole_number(arg.value) not in (None, 1):
            found.append((arg.source, arg.key_path, arg.value, "several nodes, which reach each other beyond loopback,"))
        elif arg.dest == "disaggregation_mode" and arg.value not in (None, False, "null"):
            found.append((arg.source, arg.key_path, arg.value, "prefill/decode disaggregation, which the other side reaches beyond loopback,"))
    return found


def _exposure_needs_a_key(listening: list[tuple[str, str, Any, str]], api_key: Secret | None, allow_open: bool) -> None:
    if listening and not api_key and not allow_open:
        source, key_path, value, why = listening[0]
        raise DataError(
            source, key_path, value,
            f"{why} without an API key lets anyone who reaches the port use the model: "
            "set `api_key_secret` (a secret on the control machine), or `allow_unauthenticated: true` to accept that",
        )


# Engine flags --------------------------------------------------------------------------------------

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
# A flag whose name says it carries a credential (the dest's words, or the flag's own when the engine's list does
# not know it): its value would sit in the world-readable unit and the process's argv.
CREDENTIAL_FLAG_WORDS = re.compile(r"(\A|_)(api_?key|admin_?key|access_?key|secret_?key|private_?key|token|auth_?token|access_?token"
                                   r"|hf_?token|bearer|password|passwd|passphrase|secret|secrets|credential|credentials)(_|\Z)")
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
    source: str = ""


def _argv_word(src: str, path: str, word: Any, shown: Any) -> str:
    """One word of the engine's argv: unit-safe, and never read by the engine's parser as an
    option of its own (`--host=0.0.0.0` as a value would set --host); negative numbers stay values."""
    rule = "must be a non-empty single line without surrounding spaces"
    if isinstance(word, int) and not isinstance(word, bool):
        _kind(src, path, kinds.Int, word)  # a number of thousands of digits cannot even be written out
    elif isinstance(word, float) and not math.isfinite(word):
        raise DataError(src, path, shown, "must be a finite number (inf and nan are no value an engine flag takes)")
    text = str(word)
    found = kinds.control_character(text)
    _require(found is None, src, path, shown, kinds.unit_safe_fix(rule, found) if found else "")
    _require(text != "" and text.strip() == text, src, path, shown, rule)
    _require(not text.startswith("-") or bool(_NUMBER_WORD.fullmatch(text)), src, path, shown,
             "a value may not start with '-' (the engine's parser would read it as another flag); "
             "only negative numbers such as -1 may")
    return text


_NUMBER_WORD = re.compile(r"-[0-9]{1,18}(\.[0-9]*)?([eE][-+]?[0-9]{1,3})?|-\.[0-9]{1,18}")


def _args(src: str, path: str, value: dict, engine: "engine_flags.EngineFlags | None", version: str | None = None,
          judge_unknown: bool = False) -> list[_Arg]:
    """`args` resolved as the engine's parser will read them: `engine` is the flag list of the
    service's stack and patch sets, or None for a launcher without a pinned engine (then every
    known engine version's flags are used, so a derived flag is caught whatever it is spelled).
    With `judge_unknown` (a pinned engine whose whole flag list is known), a flag its parser does not have is refused
    here (`_known_to_the_engine`)."""
    parser = engine if engine is not None else engine_flags.any_engine()
    out: list[_Arg] = []
    seen: dict[str, str] = {}
    for raw_flag, flag_value in value.items():
        key_path = f"{path}.{raw_flag}"
        _require(isinstance(raw_flag, str), src, key_path, raw_flag, "flag names are strings such as `attention-backend`")
        flag = raw_flag.removeprefix("--")
        _require(kinds.FLAG.fullmatch(flag) is not None, src, key_path, raw_flag, kinds.FLAG_FIX)
        resolved = parser.resolve(flag)
        _not_derived(src, key_path, flag, flag_value, resolved)
        dest = resolved.action.dest if resolved.action else None
        _no_credential(src, key_path, flag, dest)
        if judge_unknown:
            _known_to_the_engine(src, key_path, flag, flag_value, resolved, engine, version)
        if resolved.action and f"--{flag}" not in resolved.action.options:
            # A prefix: written out in full, so the unit says what the engine reads.
            flag = max((o for o in resolved.action.options if o.startswith(f"--{flag}")), key=len).lstrip("-")
        ident = dest or flag
        if ident in seen:
            how = "with and without `--`" if seen[ident].removeprefix("--") == raw_flag.removeprefix("--") else f"as `{seen[ident]}` and `{raw_flag}`: {parser.label} reads both as `--{flag}`"
            raise DataError(src, key_path, raw_flag, f"`{raw_flag.removeprefix('--')}` is given twice ({how}); keep one")
        seen[ident] = str(raw_flag)
        _flag_value_shape(src, key_path, flag_value)
        if flag_value is None or flag_value is False:
            continue
        if flag_value is not True:
            for word in flag_value if isinstance(flag_value, list) else [flag_value]:
                _argv_word(src, key_path, word, flag_value)
            _no_credential_in_urls(src, key_path, flag, flag_value)
        _fits_the_action(src, key_path, flag_value, resolved.action, parser)
        out.append(_Arg(flag, flag_value, key_path, dest, src))
    return out


def _known_to_the_engine(src: str, key_path: str, flag: str, flag_value: Any, resolved, engine, version: str | None) -> None:
    """A flag the pinned engine's own flag list does not have (or a prefix of several) is refused before connecting:
    its parser would refuse it on the host (`unrecognized arguments`, `ambiguous option`). Named with the engine, what
    replaced it where an advisory says (files/engine_advisories.yml), else the closest flags it has."""
    if resolved.action is not None:
        return
    if resolved.candidates:
        options = ", ".join(f"`--{a.flag}`" for a in resolved.candidates)
        raise DataError(src, key_path, flag_value, f"`--{flag}` is ambiguous in {engine.label}: it could mean {options}; write one out")
    renamed = advisories.replacement(flag, version)
    if renamed is not None:
        raise DataError(src, key_path, flag_value, f"`--{flag}` is not a flag of {engine.label}: {renamed.text()}")
    names = sorted({o.lstrip("-") for a in engine.actions for o in a.options if o.startswith("--")})
    close = difflib.get_close_matches(flag, names, n=3, cutoff=0.6)
    hint = f"; the closest it has: {', '.join(f'`--{c}`' for c in close)}" if close else ""
    raise DataError(src, key_path, flag_value, f"`--{flag}` is not a flag of {engine.label} (its parser would refuse it on the "
                                               f"host: unrecognized arguments){hint}; remove it, or pin a stack whose engine has it")


def _advisories_refused(src: str, args_path: str, args: list[_Arg], engine, version: str | None) -> None:
    """An engine advisory (files/engine_advisories.yml) with effect `refuse` whose condition the data decides and which
    holds: refused before connecting, naming the flag it is about, the reference and the fix. Those that need the GPU
    (or warn) are the host's GPU check's (operations/gpus.py)."""
    judged = advisories.Service(version, {a.flag: a.value for a in args}, engine)
    for advisory in advisories.applying(judged):
        if advisory.effect != "refuse":
            continue
        given = [a for a in args for flag, _ in advisory.flags if judged.value(flag) is not None and
                 (a.flag == flag or (a.dest is not None and judged.dest(flag) == a.dest))]
        where, value = (given[0].key_path, given[0].value) if given else (args_path, None)
        raise DataError(src, where, value, advisory.text())


def _not_derived(src: str, key_path: str, flag: str, flag_value: Any, resolved) -> None:
    derived = [a for a in ((resolved.action,) if resolved.action else resolved.candidates) if a.dest in DERIVED_DESTS]
    if derived:
        action = derived[0]
        how = "" if f"--{flag}" in action.options else (f" (the engine's parser reads `--{flag}` as `--{action.flag}`)" if resolved.action else f" (`--{flag}` could mean `--{action.flag}`)")
        # A key written where a secret name belongs must not reach the run's output.
        shown = "<hidden>" if DERIVED_DESTS[action.dest].endswith("_secret") else flag_value
        raise DataError(src, key_path, shown, f"`--{action.flag}` is derived from the service key `{DERIVED_DESTS[action.dest]}`{how}; set that instead")


def _no_credential(src: str, key_path: str, flag: str, dest: str | None) -> None:
    name = dest or flag.replace("-", "_")
    if CREDENTIAL_FLAG_WORDS.search(name):
        raise DataError(src, key_path, "<hidden>", f"`--{flag}` carries a credential: " + kinds.SECRETS_FIX)


def _no_credential_in_urls(src: str, key_path: str, flag: str, flag_value: Any) -> None:
    """A URL's `user:password@` in a flag's value (or in a JSON document it holds) is a credential in the world-readable
    unit and argv, whatever the flag is called; never shown, not even in the exposure rule's message."""
    if any(address.userinfo for address in kinds.addresses_in(flag_value)):
        raise DataError(src, key_path, "<hidden>", f"`--{flag}` holds a URL with a user name or password (user:pass@): "
                                                   + kinds.SECRETS_FIX)


def _flag_value_shape(src: str, key_path: str, flag_value: Any) -> None:
    scalar = (str, int, float, bool)
    ok = flag_value is None or isinstance(flag_value, scalar) or (
        isinstance(flag_value, list) and flag_value and all(isinstance(v, scalar) and not isinstance(v, bool) for v in flag_value)
    )
    _require(ok, src, key_path, flag_value, "a flag value is a string, number, true (bare flag), false/null (omitted) or a list")


def _fits_the_action(src: str, key_path: str, flag_value: Any, action, parser) -> None:
    if action is None:
        return
    _require(flag_value is True or action.value, src, key_path, flag_value,
             f"`--{action.flag}` is a switch in {parser.label}: write `true` to set it or `false` to omit it")
    if action.choices and flag_value is not True and (action.dest, flag_value) not in _RESOLVED_BY_US:
        words = flag_value if isinstance(flag_value, list) else [flag_value]
        bad = [w for w in words if str(w) not in action.choices]
        _require(not bad, src, key_path, flag_value, f"not a choice of `--{action.flag}` in {parser.label}: {', '.join(action.choices)}")


def _provides(version: str | None, patch_set: str, algorithm: str) -> bool:
    """Whether `patch_set`, built for the engine `version` the service runs, adds the speculative `algorithm`
    (a patch set written for another version of the engine does not apply to this one)."""
    flags = engine_flags.load(version, patch_set) if version else None
    return flags is not None and algorithm in (flags.algorithms or ())


def _check_arg_values(src: str, args: list[_Arg], gpus: tuple[int, ...], patch_sets: tuple[str, ...],
                      engine: "engine_flags.EngineFlags | None", version: str | None = None) -> None:
    """Values the engine accepts at parse time but fails on at start (or on the GPU)."""
    by_dest = {a.dest: a for a in args if a.dest}
    for dest in _POSITIVE_INT_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            _require(kinds.positive_whole_number(arg.value) is not None, src, arg.key_path, arg.value,
                     "must be a positive whole number (ASCII digits)")
    for dest in _FRACTION_DESTS:
        arg = by_dest.get(dest)
        if arg is not None:
            fraction = kinds.decimal_number(arg.value)
            _require(fraction is not None and 0 < fraction < 1, src, arg.key_path, arg.value,
                     "must be a fraction of the GPU's memory strictly between 0 and 1, e.g. 0.85")
    needed = 1
    for dest in ("tp_size", "pp_size"):
        if dest in by_dest:
            needed *= kinds.positive_whole_number(by_dest[dest].value)
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
            providers = [p for p in available_patch_sets() if p not in patch_sets and _provides(version, p, name)]
            fix = (f"add a patch set that provides it to `patch_sets`: {', '.join(providers)}" if providers
                   else f"use one of {', '.join(sorted(engine.algorithms - {'NONE'}))}")
            raise DataError(src, algorithm.key_path, algorithm.value, f"{engine.label} has no speculative algorithm {name}: {fix}")


def _served_backends(src: str, args_path: str, args: list[_Arg], patch_sets: tuple[str, ...]) -> None:
    """A patch set that names the attention backends it was served on (its manifest's `attention_backends`) holds
    the service to them: DDTree's port parsed, imported and passed every deploy on sglang's default backend (fa3 on
    the H200), then died capturing its CUDA graphs or at its first request (bench/results/
    h200-2026-12-03-b2ac97c-ddtree-auto.txt), while on triton it served. `auto` is resolved and checked on the host."""
    unserved = patch_set_files.first_unserved(patch_sets, {a.flag: a.value for a in args})
    if unserved is not None:
        patch_set, flag, value = unserved
        arg = next((a for a in args if a.flag == flag), None)
        raise DataError(src, arg.key_path if arg else args_path, value, patch_set_files.unserved_reason(*unserved))


def available_patch_sets() -> list[str]:
    return patch_set_files.available()


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


def _no_unknown_keys(host) -> None:
    """Typos in the inventory or in --data would otherwise be silently ignored; pyinfra's privilege arguments, in
    any layer, would make the deploy lock one user and act as another."""
    known = {**GLOBAL_KEYS, **HOST_KEYS}
    pyinfra_keys = connection.pyinfra_keys()
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
                raise DataError(source, key, _shown_under(key, data[key]), f"unknown key; allowed: {', '.join(sorted(known))}, "
                                                        f"or one of pyinfra's own (ssh_hostname, ssh_user, ssh_port, ssh_key, ...){hint}")
    reader = _Reader(host)
    for key, why in connection.refused_connector_arguments().items():
        if connection.set_in_any_layer(host, key):
            raise DataError(reader.source(key), key, _shown_under(key, host.data.get(key)), f"`{key}` {why}")
    connection.judge_connector_keys(host, reader)
    for key, kind in (("ssh_hostname", kinds.HostName), ("ssh_port", kinds.Port)):
        if host.data.get(key) is not None:
            _kind(reader.source(key), key, kind, host.data.get(key))


def _shown_under(key: Any, value: Any) -> Any:
    """A value as a message about `key` shows it: hidden under a name that says it holds a credential (`_sudo_password`)
    and under any `ssh_*` name, where a mistyped key (`ssh_pasword`) may hold one."""
    name = str(key).lstrip("_")
    return HIDDEN if CREDENTIAL_FLAG_WORDS.search(name) or name.startswith("ssh_") else value


def _patch_set_fits_the_stack(ctx: _ServiceContext, src: str, key_path: str, patch_set: patch_set_files.PatchSet) -> None:
    """A patch set is written for one version of its base: over another version it would not apply (the host would
    refuse it only after building a venv generation for it). Known here, so refused before any host is touched."""
    pinned = ctx.pins.get(normalize(patch_set.distribution))
    _require(
        pinned == patch_set.version, src, key_path, patch_set.name,
        f"files/patches/{patch_set.name}/patchset.yml is written for {patch_set.distribution} {patch_set.version}, but the "
        f"stack {ctx.data.stack} " + (f"pins {patch_set.distribution} {pinned}" if pinned else f"has no {patch_set.distribution}")
        + f": use a stack with {patch_set.distribution} {patch_set.version}, or port the patch set to {pinned or 'the stack'}"
        " (python -m tools.patchset_build; docs/stacks-and-patch-sets.md)",
    )

