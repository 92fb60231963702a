"""One host's configuration: everything the host sees (its groups, its host data, --data) validated
into a `HostConfig`, or the `DataError` of the first bad value. The schema's models first
(configuration/schema.py), then what only several values show: the engine's flag list for the stack,
where the stack and models come from (configuration/sources.py), the host paths apart from each
other, which services run here (configuration/placement.py) and each service
(configuration/services.py), placed or not.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from configuration import engine_flags, kinds, schema, sources
from configuration.errors import DataError
from configuration.group_files import GLOBAL_KEYS, HOST_KEYS, Reader, no_unknown_keys, precedence
from configuration.placement import no_clashes, placement, rollout_keys_not_overridden
from configuration.refusals import require, validated
from configuration.services import ServiceContext, validated_service
from configuration.stacks import load_stack
from configuration.typed import HostConfig, environment_for


def validate_host(host) -> HostConfig:
    """Validate everything `host` sees into a `HostConfig`, or raise `DataError`."""
    no_unknown_keys(host)
    reader = Reader(host)
    src = reader.source
    raw = {key: reader.get(key, spec) for key, spec in GLOBAL_KEYS.items()}
    stack = load_stack(raw["stack"], source=src("stack"), key_path="stack")
    data: schema.GroupData = validated(schema.GroupData, raw, lambda key: (src(key), key))
    engine_version = stack.wanted().get(engine_flags.ENGINE)
    if engine_version is not None and engine_flags.load(engine_version) is None:
        raise DataError(src("stack"), "stack", data.stack,
                        f"pins {engine_flags.ENGINE} {engine_version}, whose flag list is not in "
                        "files/engine_flags/: generate it (python -m tools.engine_flags generate "
                        "VENV_PYTHON; see tools/engine_flags.py)")
    hosts = [h.name for h in host.inventory]
    stack_sources = sources.stack_sources(src("stack_sources"), data.stack_sources, data.wheelhouse,
                                          hosts, host.name, data.venv_path)
    sources.check_model_sources(src("model_sources"), data.model_sources, host)
    secrets_file = Path(data.secrets_file)
    require(not secrets_file.is_dir(), src("secrets_file"), "secrets_file", str(secrets_file),
            "is a directory: name the YAML file (secret name -> value) inside it, e.g. "
            ".secrets/secrets.yml")
    _host_paths_apart(src, data)
    host_data: schema.HostData = validated(
        schema.HostData, {key: reader.get(key, spec) for key, spec in HOST_KEYS.items()},
        lambda key: (src(key), key))
    context = ServiceContext(data, engine_version, secrets_file, src("services"),
                             src("run_services"), stack.wanted())
    services = _placed_services(context, data, host_data, src, host.name)
    return HostConfig(
        host=host.name,
        data=data,
        wheelhouse=Path(data.wheelhouse),
        stack_sources=stack_sources,
        services=tuple(services),
        failed_gpus=tuple(host_data.failed_gpus),
        ssh_address=(str(host.data.get("ssh_hostname") or host.name),
                     int(host.data.get("ssh_port") or 22)),
    )


def _placed_services(context: ServiceContext, data: schema.GroupData,
                     host_data: schema.HostData, src, host_name: str) -> list:
    """Each replica `run_services` places on this host, validated with its overrides (no two
    clashing); then the services defined but placed nowhere, validated too: the next edit of
    run_services must not be the first time their values are read."""
    placed = placement(host_data.run_services)
    counts = Counter(name for name, _, _ in placed)
    services, args_at = [], {}
    for name, replica, overrides in placed:
        require(name in data.services, src("run_services"), "run_services", name,
                "no such service; defined services: "
                f"{', '.join(sorted(data.services)) or '(none)'}")
        index = sum(1 for s in services if s.definition == name)
        rollout_keys_not_overridden(src("run_services"), name, index, overrides, counts[name])
        override_path = f"run_services.{name}" + (f"[{index}]" if counts[name] > 1 else "")
        services.append(validated_service(
            context, name, data.services[name].given(), overrides, replica=replica,
            override_path=override_path))
        # where its `args` were written (a flag's port is refused there)
        args_at[services[-1].name] = ((src("run_services"), f"{override_path}.args")
                                      if "args" in overrides else
                                      (src("services"), f"services.{name}.args"))
    no_clashes(services, src("run_services"), host_name, args_at)
    for name, definition in data.services.items():
        if name not in counts:
            validated_service(context, name, definition.given(), {})
    return services


def _host_paths_apart(src, data: schema.GroupData) -> None:
    """Every configured host path, and the paths derived from them, each in a place of its own."""
    env_paths = []
    for name, definition in data.services.items():
        if definition.patch_sets:
            path = environment_for(data.venv_path, tuple(definition.patch_sets)).path
            env_paths.append((src("services"), f"services.{name}.patch_sets (venv {path})", path))
    _no_overlap([
        (src("venv_path"), "venv_path", data.venv_path),
        (src("venv_path"), "venv_path's generations", data.venv_path + ".generations"),
        (src("model_store"), "model_store", data.model_store),
        (src("shm_dir"), "shm_dir", data.shm_dir),
        (src("host_wheel_cache"), "host_wheel_cache", data.host_wheel_cache),
        *{p[2]: p for p in env_paths}.values(),
        *{p[2] + ".generations": (p[0], p[1] + "'s generations", p[2] + ".generations")
          for p in env_paths}.values(),
    ])


def _no_overlap(paths: list[tuple[str, str, str]]) -> None:
    """(source, key, path): no configured host path may equal or contain another, or a path
    derived from one (the generations directory `<venv_path>.generations`, the patched venvs)."""
    for i, first in enumerate(paths):
        for second in paths[i + 1:]:
            # Name the value set where the operator is most likely editing: --data, then the
            # inventory, then a group's file, then all.yml, then the defaults.
            (src_a, key_a, a), (src_b, key_b, b) = sorted((first, second),
                                                          key=lambda p: -precedence(p[0]))
            if kinds.inside(a, b) or kinds.inside(b, a):
                relation = ("is the same directory as" if a == b
                            else ("is inside" if kinds.inside(a, b) else "contains"))
                raise DataError(src_a, key_a, a,
                                f"{relation} {key_b} ({b}, from {src_b}): each directory the "
                                "deploy manages needs its own place, or one would move, prune or "
                                "fill the other")
