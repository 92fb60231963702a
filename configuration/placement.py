"""Which services a host runs (`run_services`, its shape the schema's: configuration/schema.py,
`RunServices`), each replica with the host's overrides of its keys, and what the replicas placed on
one host may not share (a port, served or named in a flag; a GPU). Whether a placed name is a
defined service is checked where the services are built (configuration/host.py); one service on
two hosts, across the inventory (configuration/settings.py).
"""

from __future__ import annotations

from typing import Any

from configuration import kinds
from configuration.errors import DataError
from configuration.typed import Service

# Keys of a service as a whole, not of one replica: every replica takes the same rollout.
ROLLOUT_KEYS = ("max_unavailable", "canary", "canary_soak_s")


def replica_name(service: str, index: int) -> str:
    """The replica's name on its host: the service's name for the first (so one replica per host
    keeps the unit `sglang-<service>.service` it always had), `<service>@<n>` for the n-th (unit
    `sglang-<service>@<n>.service`; a service name has no `@`, so no replica's name is another
    service's)."""
    return service if index == 0 else f"{service}@{index + 1}"


def placement(run_services: list[str] | dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(service, replica name, the overrides of its keys written for this host) per replica placed
    on this host, in the data's order: one for a name listed (or given null, or a map of overrides),
    one per item of a list of overrides."""
    if isinstance(run_services, list):
        return [(name, name, {}) for name in run_services]
    out = []
    for name, overrides in run_services.items():
        replicas = overrides if isinstance(overrides, list) else [overrides]
        out += [(name, replica_name(name, i), given.given() if given else {})
                for i, given in enumerate(replicas)]
    return out


def rollout_keys_not_overridden(src: str, service: str, index: int, overrides: dict[str, Any],
                                replicas: int) -> None:
    for key in ROLLOUT_KEYS:
        if key in overrides:
            at = f"run_services.{service}" + (f"[{index}]" if replicas > 1 else "") + f".{key}"
            raise DataError(src, at, overrides[key],
                            "is a key of the service as a whole (every replica takes the same "
                            f"rollout): set it in services.{service}.{key}, not per host")


def flag_ports(service: Service) -> list[tuple[str, int]]:
    """(flag, port) for each port of its host a service's engine flags name beyond its own `port`:
    a flag named `...-port` with a number (the engine binds it), and every loopback or
    all-interfaces `host:port` or URL in any flag's value (a zmq endpoint, a metrics address)."""
    found = []
    for flag, value in service.args:
        number = kinds.positive_whole_number(value) if flag.endswith("port") else None
        if number is not None:
            found.append((flag, number))
        else:
            found += [(flag, port) for port in kinds.local_ports_in(value)]
    return found


def no_clashes(services: list[Service], src: str, host_name: str,
               args_at: dict[str, tuple[str, str]] | None = None) -> None:
    """`args_at`: replica name -> (file, key path) where its `args` were written."""
    ports: dict[int, str] = {}
    gpus: dict[int, str] = {}
    for service in services:
        other = ports.setdefault(service.port, service.name)
        if other != service.name:
            raise DataError(src, "run_services", [other, service.name],
                            f"both use port {service.port} on host {host_name}; give each service "
                            "or replica on a host its own port (`port` in services.<name>, or in "
                            "its overrides in run_services)")
    opened: dict[int, str] = {}  # port -> the service whose flag names it
    for service in services:
        for flag, port in flag_ports(service):
            other = ports.get(port)
            whose = ("its own serving port" if other == service.name
                     else f"service {other}'s serving port" if other is not None
                     else f"one service {opened[port]}'s flags name too"
                     if opened.get(port, service.name) != service.name else None)
            if whose:
                where, path = (args_at or {}).get(
                    service.name, (src, f"services.{service.definition}.args"))
                raise DataError(where, f"{path}.{flag}", port,
                                f"names port {port} of host {host_name}, {whose}: two uses of one "
                                "port on a host, and whichever starts second fails or takes "
                                "the other's traffic; give it another port")
            opened.setdefault(port, service.name)
    for service in services:
        for gpu in service.gpus:
            other = gpus.setdefault(gpu, service.name)
            if other != service.name:
                raise DataError(src, "run_services", [other, service.name],
                                f"both use GPU {gpu} on host {host_name}; give each service or "
                                "replica on a host its own GPUs (`gpu` in services.<name>, or in "
                                "its overrides in run_services)")
