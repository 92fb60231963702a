"""Which services a host runs (`run_services`, its shape the schema's: configuration/schema.py, `RunServices`), each
with the host's overrides of its keys, and what the services placed on one host may not share (a port, a GPU).
Whether a placed name is a defined service is checked where the services are built (configuration/host.py); one
service on two hosts, across the inventory (configuration/settings.py).
"""

from __future__ import annotations

from typing import Any

from configuration.errors import DataError
from configuration.typed import Service


def placement(run_services: list[str] | dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> the overrides of its service keys written for this host (none for a name listed, or given null)."""
    if isinstance(run_services, list):
        return {name: {} for name in run_services}
    return {name: overrides.given() if overrides else {} for name, overrides in run_services.items()}


def no_clashes(services: list[Service], src: str, host_name: str) -> None:
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
