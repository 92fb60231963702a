"""The validated configuration, as the deploy reads it: a host's `HostConfig`, its `Service`s, each
service's `Environment` (venv) and `ModelUse`s; and, while a service is judged, each of its engine
flags as the engine's parser reads it (`Arg`). Built from validated data only
(configuration/host.py, configuration/services.py); configuration/settings.py is where the rest of
the deploy imports them from.

A `HostConfig` and a `Service` hold the schema's own validated model (`schema.GroupData`,
`schema.ServiceSpec`) and read its fields through: a value and its default are the schema's, in
one place; these classes add only what is resolved (a service's GPUs, models, venv, flags as the
engine reads them, secrets; a host's placed services, its sources, its SSH address).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from configuration import host_paths, kinds
from configuration.schema import GroupData, ServiceSpec
from configuration.secrets import Secret, config_path


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
    """One replica of a service on its host. `name` is the replica's (its unit, key file, summary
    row and the status view's row), unique on the host: the service's own name, or `<service>@<n>`
    for a host's n-th replica of it; `definition` is the service's (`services.<definition>`), which
    its replicas on every host share.

    `spec` is the schema's own model of the service as this host runs it (its definition with this
    host's overrides, `schema.ServiceSpec`): its fields - `port`, `bind`, `max_unavailable`, ... -
    read through as this object's, with the schema's defaults, never copied. The rest is resolved:
    GPUs, models, venv, flags as the engine reads them, secrets."""

    name: str
    definition: str  # the service's name in `services`
    spec: ServiceSpec
    environment: Environment
    gpus: tuple[int, ...]
    target: ModelUse
    draft: ModelUse | None
    patch_sets: tuple[str, ...]
    args: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...]
    api_key: Secret | None = None
    admin_api_key: Secret | None = None
    # Every way the data makes the service listen beyond loopback (key path, why): `bind`, engine
    # flags.
    listens_beyond_loopback: tuple[tuple[str, str], ...] = ()
    # The service's canary (operations/service/rollout.py): a count, or the hosts named.
    canary: int | tuple[str, ...] = 0

    def __getattr__(self, name: str) -> Any:
        # Only for names the dataclass lacks: the schema's fields, read from its model.
        if name in ServiceSpec.model_fields:
            return getattr(self.spec, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def config_file(self) -> str | None:
        """The root-only `--config` file that carries the API keys, if the service has any."""
        return config_path(self.name) if (self.api_key or self.admin_api_key) else None

    @property
    def exposed_without_key(self) -> bool:
        return (not self.api_key
                and (not kinds.is_loopback_host(self.bind) or bool(self.listens_beyond_loopback)))

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

    @property
    def speculative_algorithm(self) -> str | None:
        """The speculative algorithm the engine runs (`DFLASH`, `DDTREE`, ...), or None."""
        return speculative_algorithm(dict(self.args))


def speculative_algorithm(args: dict) -> str | None:
    """The speculative algorithm a service's flags (as they go into argv) name, or None."""
    value = args.get("speculative-algorithm")
    name = str(value).upper() if value not in (None, False) else ""
    return name if name not in ("", "NONE") else None


# One engine flag of a service, as configuration/service_args.py resolved it (the rules of
# exposure.py and patch_set_fit.py read it too).
@dataclass(frozen=True)
class Arg:
    flag: str  # as it goes into argv (a prefix is written out in full)
    value: Any
    key_path: str
    dest: str | None  # the engine's dest, when the flag resolves
    source: str = ""


@dataclass(frozen=True)
class HostConfig:
    """One host's validated configuration: the schema's own model of the group data (`data`, a
    `schema.GroupData`: its fields - `venv_path`, `shm_dir`, `service_user`, ... - read through as
    this object's, with the schema's defaults, never copied), and what is resolved per host."""

    host: str
    data: GroupData
    # `data.wheelhouse` as a path, and `data.stack_sources` resolved (configuration/sources.py)
    wheelhouse: Path
    stack_sources: tuple
    services: tuple[Service, ...]  # the replicas placed on this host (`data.services` defines them)
    failed_gpus: tuple[int, ...]
    # Where SSH reaches the host: (`ssh_hostname`, else the inventory name; `ssh_port`, else 22).
    ssh_address: tuple[str, int] | None = None
    # What this host reads of other hosts, from their validated configurations
    # (`validate_inventory`): the live venv (`venv_path`) of each donor `stack_sources` names
    # without a `path`, the store (`model_store`) of each host `model_sources` names.
    peer_venvs: dict = field(default_factory=dict)
    peer_stores: dict = field(default_factory=dict)

    def with_data(self, **changes: Any) -> HostConfig:
        """This configuration with some of the schema's fields changed (not validated again)."""
        return replace(self, data=self.data.model_copy(update=changes))

    def __getattr__(self, name: str) -> Any:
        # Only for names the dataclass lacks: the schema's fields, read from its model.
        if name in GroupData.model_fields and name != "services":
            return getattr(self.data, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

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
