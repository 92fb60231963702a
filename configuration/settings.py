"""Deploy data: loading the operators' YAML and validating it into typed objects.

Operators edit `group_data/<group>.yml`; the thin `group_data/<group>.py` beside each
calls `load_group_yaml(__file__)`, so pyinfra's own precedence applies unchanged
(`--data` > host data > group data > all). `host_config(host)` returns the host's validated
`HostConfig`; the first call of a run validates the whole inventory (`validate_inventory`)
before `deploy.py` adds a single operation on any host: a bad value anywhere stops the run
with a `DataError` naming the file, the key path, the value and the fix.

The keys, their kinds, defaults and documentation are the models of configuration/schema.py (strict
pydantic models; each kind of value, configuration/kinds.py, checks the whole value wherever it
appears). The rest of the deploy imports from here; the rules live beside it, one module per
concern:

- group_files.py: the group files, the keys each layer may set, where each value came from
  (`Reader`), and pyinfra's connector keys, each judged by one rule over every key pyinfra's
  connectors read (connection.py);
- refusals.py: the schema's refusals as `DataError`s;
- typed.py: what validation builds (`HostConfig`, `Service`, `Environment`, `ModelUse`);
- host.py: one host's configuration, with sources.py (stack and model sources), placement.py
  (`run_services`, services that clash) and services.py (one service), which reads patch_set_fit.py
  (its patch sets), service_args.py (`args` resolved as the engine's parser resolves them,
  configuration/engine_flags.py, before the derived-flag, credential and value rules apply) and
  exposure.py (exposure and credentials);
- here: the whole inventory, once per run, and what only the hosts together show (a service's
  replicas on several hosts agree, one machine under two inventory names).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from configuration import kinds, run_scope
from configuration.errors import DataError
from configuration.group_files import (  # noqa: F401  (re-exported: the deploy reads them here)
    _KEY_SOURCES,  # tests/unit/test_host_plan.py patches it here (the state is group_files')
    GLOBAL_KEYS,
    HOST_KEYS,
    REPO_ROOT,
    RETIRED_KEYS,
    SERVICE_KEYS,
    Key,
    Reader,
    load_group_yaml,
    stray_group_files,
)
from configuration.host import validate_host
from configuration.kinds import (  # noqa: F401  (re-exported)
    CREDENTIAL_FLAG_WORDS,
    DERIVED_DESTS,
    RESERVED_SERVICE_NAMES,
)
from configuration.patch_set_fit import available_patch_sets  # noqa: F401  (re-exported)
from configuration.refusals import value_of_kind
from configuration.typed import (  # noqa: F401  (re-exported)
    Environment,
    HostConfig,
    ModelUse,
    Service,
    environment_for,
)


def host_config(host) -> HostConfig:
    """`host`'s validated `HostConfig`, or the `DataError` of the first bad value anywhere in the
    inventory: every host's load of deploy.py raises the same error, so no host is touched."""
    state = getattr(host, "state", None)
    if state is None or getattr(state, "inventory", None) is None:
        return validate_host(host)
    return validate_inventory(state)[host.name]


@dataclass
class _Validated:
    """A run's validated inventory, or its first DataError (kept on the run: run_scope)."""

    found: dict[str, HostConfig] | DataError | None = None


def validate_inventory(state) -> dict[str, HostConfig]:
    """Validate the whole inventory once per run: every host (with --data), every service
    defined (placed or not), every stack and patch-set manifest they use, and what only the
    hosts together can show (a service's replicas that disagree, two hosts at one address).

    pyinfra connects every host, then loads deploy.py once per host in parallel greenlets; the
    first load to get here validates everything (nothing in it waits on I/O, so no other
    greenlet runs meanwhile) and keeps the result on the run's `state`; every later load
    gets the same configs, or re-raises the same error. So a bad value for one host stops the
    run before any host's deploy lock is taken."""
    kept = run_scope.of(state, _Validated)
    if kept.found is None:
        try:
            kept.found = _validate_all(state.inventory)
        except DataError as exc:
            kept.found = exc
    cached = kept.found
    if isinstance(cached, DataError):
        raise cached
    return cached


def _validate_all(inventory) -> dict[str, HostConfig]:
    stray_group_files()
    hosts = list(inventory)
    for host in hosts:
        value_of_kind(f"inventory (host {host.name})", "(host name)", kinds.HostName, host.name)
    configs = {host.name: validate_host(host) for host in hosts}
    _replicas_agree(hosts, configs)
    _one_name_per_address(hosts)
    return {name: _with_peers(config, configs) for name, config in configs.items()}


def _with_peers(config: HostConfig, configs: dict[str, HostConfig]) -> HostConfig:
    """`config` with what it reads of the other hosts, from their validated configurations."""
    venvs = {entry[1]: configs[entry[1]].venv_path for entry in config.stack_sources
             if entry[0] == "donor" and len(entry) == 2}
    stores = {source: configs[source].model_store for source in config.model_sources.values()
              if source in configs}
    return replace(config, peer_venvs=venvs, peer_stores=stores)


def _replicas_agree(hosts: list, configs: dict[str, HostConfig]) -> None:
    """A service placed on several hosts is one service with a replica on each: its replicas run one
    stack and one list of patch sets (a rollout moves them all from one version to the next), take
    one rollout, and its canaries name replicas that exist."""
    first: dict[str, tuple[str, HostConfig, Service]] = {}
    replicas: dict[str, list[str]] = {}
    for host in hosts:
        config = configs[host.name]
        for service in config.services:
            replicas.setdefault(service.definition, []).append(f"{host.name}/{service.name}")
            seen = first.setdefault(service.definition, (host.name, config, service))
            other_host, other_config, other = seen
            src = Reader(host).source("run_services")
            what = (f"service {service.definition} (replica {service.name} on {host.name}, and on "
                    f"{other_host})")
            if config.stack != other_config.stack:
                raise DataError(Reader(host).source("stack"), "stack", config.stack,
                                f"differs from {other_config.stack} on {other_host}, where {what} "
                                "runs too: the replicas of a service run one stack (a rollout "
                                "takes them all to the next); give the hosts one stack")
            if service.patch_sets != other.patch_sets:
                raise DataError(src, f"run_services.{service.definition}.patch_sets",
                                list(service.patch_sets),
                                f"differs from {list(other.patch_sets)} on {other_host}, where "
                                f"{what} runs too: the replicas of a service apply the same patch "
                                f"sets; set them once in services.{service.definition}.patch_sets")
            for key in ("max_unavailable", "canary", "canary_soak_s"):
                if getattr(service, key) != getattr(other, key):
                    raise DataError(Reader(host).source("services"),
                                    f"services.{service.definition}.{key}", getattr(service, key),
                                    f"differs from {getattr(other, key)!r} as {other_host} sees "
                                    "it: the service has one rollout; define it the same in every "
                                    "group file that defines the service")
    for name, (host_name, config, service) in first.items():
        if isinstance(service.canary, tuple):
            hosts_of = {}
            for ref in replicas[name]:
                hosts_of.setdefault(ref.split("/")[0], []).append(ref)
            for wanted in service.canary:
                ok = wanted in replicas[name] or len(hosts_of.get(wanted, [])) == 1
                if not ok:
                    why = (f"{wanted} runs {len(hosts_of[wanted])} replicas of it: name one as "
                           "host/replica"
                           if wanted in hosts_of else "is no replica of it")
                    raise DataError(
                        Reader(next(h for h in hosts if h.name == host_name)).source("services"),
                        f"services.{name}.canary", wanted,
                        f"{why}; its replicas: {', '.join(replicas[name])}")


def _one_name_per_address(hosts: list) -> None:
    """Two inventory names for one machine would deploy it twice at once, each one's cleanup
    removing the other's services. Addresses are compared as SSH reaches them
    (kinds.canonical_address: case, a final dot, IPv6 and IPv4 spellings, the port), not as
    strings."""
    addresses: dict[tuple[str, int], str] = {}
    for host in hosts:
        given = host.data.get("ssh_hostname") or host.name
        address = kinds.canonical_address(given, host.data.get("ssh_port"))
        other = addresses.setdefault(address, host.name)
        if other != host.name:
            raise DataError(f"inventory (host {host.name})", "ssh_hostname", given,
                            f"is also the address of host {other} ({address[0]} port "
                            f"{address[1]}): one machine under two names would wait for its own "
                            "deploy lock and run two sets of services on the same GPUs; list it "
                            "once")
