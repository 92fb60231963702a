"""Services: the account they run as, and per service its key file, flags, unit, lifecycle and
readiness.

A service is (re)started only when something it loads changed: its unit, its venv generation,
its patch sets, its staged models, its key file, in this run or since it started (a run that
stopped between a change and its restart). Its exact flags pass the engine's own parser before
its unit is written; the readiness gate waits for /health and a smoke completion, and rolls a
failed change back to the previous unit and venv generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File, FileContents, Sha1File

from configuration.secrets import config_path
from configuration.typed import Service
from deploys.environments import BuiltEnvironment
from deploys.gpu_check import STEP as GPU_STEP
from deploys.models import ModelCopies
from deploys.planning import Reading, Unread
from operations.gpu import gpus
from operations.run import progress, this_run
from operations.service import (
    kernel_cache,
    kernel_ship,
    lifecycle,
    preflight,
    readiness,
    rollback,
    rollout,
    secrets,
    surge,
    unit_file,
    units,
)
from operations.service.service_inputs import cache_key, watched_inputs
from operations.service.service_inputs import unit_text as unit_text_of
from operations.service.service_user import GpuDevices, device_access, group_of

STEP = "Service"


def plan(reading: Reading) -> None:
    """Per service placed here whose GPU check passed: its key file (`secrets.key_file_differs`),
    its unit (`unit_file.differs`, over `service_inputs.unit_text`), the engine's parser, its
    lifecycle (`lifecycle.steps`, with what this run changes that it loads: `reading.changed`) and
    its readiness: as its operations decide them, from the same read."""
    config = reading.config
    refused = {c.service for c in reading.plan.refusals if c.step == GPU_STEP}
    device_groups: tuple[str, ...] = ()
    if config.services:
        try:
            device_groups, _ = device_access(reading.ask(GpuDevices), config.service_user)
        except Unread:
            pass
    surges = Surges()
    for service in config.services:
        if service.name in refused:
            continue  # its unit is written only once the GPU check passes (its GPU is then decided)
        try:
            _replica(reading, service, device_groups, surges)
        except Unread:
            pass


@dataclass
class Surges:
    """The host's surges planned so far (each GPU and port to one surge)."""

    gpus: dict[int, str] = field(default_factory=dict)
    ports: set[int] = field(default_factory=set)


def surge_of(reading: Reading, service, restarts_running: bool, surges: Surges) -> surge.Decision:
    """A replica's rollout, surge or in place (`surge.decide`), from the GPU check's read and, for
    the port it would take, that port's state on the host; a surge is kept in the plan's values
    (`("surge", replica)`), which the operations apply."""
    found, no_gpu, port, busy = (), "", None, None
    if service.max_surge and restarts_running and ("surge left", service.name) not in \
            reading.plan.values:
        found, no_gpu = gpus.surge_gpus(reading.decisions, service, surges.gpus)
        port = surge.port_for(reading.config, service, surges.ports) if found else None
        if port is not None:
            busy = surge.port_busy(reading.ask(
                readiness.ServiceState, unit=surge.unit_name(service.name),
                address=readiness.probe_address(service.bind), port=port, inputs=()))
    left = reading.plan.values.get(("surge left", service.name))
    decision = surge.decide(service, restarts_running, found, no_gpu, port, busy,
                            leftover=left.unit if left else None)
    if decision.surge:
        surges.gpus.update({i: f"{service.name} (its surge)" for i in decision.surge.gpus})
        surges.ports.add(decision.surge.port)
        reading.plan.values[("surge", service.name)] = decision.surge
    return decision


def _speculative_words(spec: dict | None) -> str:
    """What a speculative service's gate asks beyond serving (readiness.speculative_check)."""
    if not spec:
        return ""
    asks = ([f"its greedy tokens against its target's ({spec['tokens']} per probe)"]
            if spec["lossless"] else [])
    asks += [f"an accept length of at least {spec['min_accept']}"] if spec["min_accept"] else []
    return "; " + " and ".join(asks)


def surge_left(reading: Reading, service) -> surge.Surge | None:
    """A surge of a `max_surge` service that an earlier run left running (it stopped between the
    surge's start and its removal): read on every run (its state joins the host's one read), kept
    in the plan's values (`("surge left", replica)`) for its removal once the replica serves."""
    port = surge.port_for(reading.config, service, set())
    if port is None:
        return None
    state = reading.ask(readiness.ServiceState, unit=surge.unit_name(service.name),
                        address=readiness.probe_address(service.bind), port=port, inputs=())
    if not surge.left(state):
        return None
    left = surge.Surge(service.name, (), port)
    reading.plan.values[("surge left", service.name)] = left
    reading.plan.add(STEP, left.unit, "delete",
                     f"an earlier run left it {state.get('active')}: stopped (drained) and removed "
                     f"once {service.name} serves", service=service.name)
    return left


def _replica(reading: Reading, service, device_groups: tuple[str, ...],
             surges: Surges | None = None) -> None:
    config, plan, ask, changed = reading.config, reading.plan, reading.ask, reading.changed
    name, unit_path = service.name, service.unit_path
    state = ask(secrets.SecretFileState, path=config_path(name))
    key_why = None
    if service.config_file:
        key_why = secrets.key_file_differs(
            state, secrets.key_file_digest(name, service.api_key, service.admin_api_key),
            group_of(config.service_user))
        if key_why:
            plan.add(STEP, config_path(name), "create" if state is None else "update",
                     key_why, service=name)
    elif state is not None:
        key_why = "the service has no API key in the data"
        plan.add(STEP, config_path(name), "delete", key_why, service=name)
    text = unit_text_of(config, service, reading.stack, reading.patch_sets, device_groups)
    found = ask(File, path=unit_path)
    sha1 = ask(Sha1File, path=unit_path) if found else None
    why = unit_file.differs(found, sha1, text)
    # A mode or owner put back changes nothing systemd runs (unit_file.written): no preflight,
    # reload or restart.
    unit_changed = why is not None and not unit_file.same_content(found, sha1, text)
    if why:
        # The lines that differ, read only when the content does (a converged host reads no unit).
        diff = (unit_file.line_changes(ask(FileContents, path=unit_path), text)
                if unit_changed and found is not None else ())
        plan.add(STEP, unit_path, "create" if found is None else "update", why, service=name,
                 diff=diff)
    inputs_changed = (
        unit_changed
        or key_why is not None  # the key file is one of the service's inputs (deploys/service.py)
        or changed.get(service.environment.path, False)
        or any(changed.get(f"{m.location}:{m.name}", False) for m in service.models)
    )
    if unit_changed or inputs_changed:
        plan.add(STEP, f"flags of {service.unit_name}", "check",
                 "the engine's own parser, before the unit is written", service=name)
    watched = watched_inputs(service, unit_path)
    state = ask(readiness.ServiceState, unit=service.unit_name,
                address=readiness.probe_address(service.bind), port=service.port, inputs=watched)
    if not isinstance(state, dict):
        plan.unread.append(f"{service.unit_name}: its state was not read")
        return
    steps = lifecycle.steps(state, unit_path, unit_changed, inputs_changed)
    unit = service.unit_name
    if service.max_surge:
        surge_left(reading, service)
    if steps.reload:
        plan.add(STEP, "systemd", "reload", f"{unit}'s file changed", service=name)
    if steps.enable:
        plan.add(STEP, unit, "enable",
                 f"it is {state.get('enabled') or 'not enabled'}", service=name)
    if steps.start:
        plan.add(STEP, unit, "start",
                 f"it is {state.get('active')}/{state.get('sub')}", service=name)
    elif steps.restart:
        newer = ", ".join(state.get("newer") or [])
        rolled = (f"; {surge_of(reading, service, True, surges or Surges()).text}"
                  if service.max_surge else "")
        plan.add(STEP, unit, "restart", (f"{newer} changed since it started" if newer
                                         else "what it loads changes in this run") + rolled,
                 service=name)
    elif steps.record:
        plan.add(STEP, f"record of what {unit} started with", "update",
                 "no record covers the running process", service=name)
    _kernels(reading, service, steps.start or steps.restart)
    if steps.start or steps.restart:
        plan.add(STEP, f"readiness of {name}", "check",
                 "/ready (/health on an engine without it) and a smoke completion after the "
                 "(re)start"
                 + _speculative_words(readiness.speculative_check(service)), service=name)
    elif state.get("health") != 200 or state.get("active") != "active":
        answer = (state.get("stranger") or state.get("health_error")
                  or f"/health answers {state.get('health')}")
        plan.add(STEP, f"readiness of {name}", "check",
                 f"it runs but does not serve: {answer}", service=name)


@dataclass(frozen=True)
class Kernels:
    """What a replica's kernel cache operations are given (operations/service/kernel_ship.py): its
    unit's key, its GPUs' architecture, whether the plan (re)starts it, the host `model_sources`
    names for its target, and its unit's sandbox."""

    key: str
    arch: str | None
    starts: bool
    source: str | None
    sandbox: tuple[str, ...] = ()

    @classmethod
    def of(cls, config, service, stack, patch_sets: dict, arch: str | None, starts: bool,
           sandbox: tuple[str, ...] = ()) -> Kernels:
        return cls(cache_key(service, stack, patch_sets), arch, starts,
                   config.model_sources.get(service.target.name), sandbox)


def _kernels(reading: Reading, service, starts: bool) -> None:
    """The replica's kernel cache: seeded before its (re)start where it is empty
    (`kernel_ship.warm_up`), sealed by root after its gate (`kernel_ship.seal_needed`)."""
    kernels = Kernels.of(reading.config, service, reading.stack, reading.patch_sets,
                         reading.decisions.arch_of(service), starts)
    found = reading.ask(kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    warmup = kernel_ship.warm_up(found, kernels.key, kernels.arch, starts, kernels.source,
                                 reading.plan.host)
    if warmup:
        reading.plan.add(STEP, f"{kernel_cache.KERNELS_DIR}/{kernels.key}", "create", warmup.text,
                         service=service.name)
    if kernel_ship.seal_needed(found, kernels.key, kernels.arch, starts):
        name = kernel_cache.sealed_name(kernels.key, kernels.arch)
        reading.plan.add(STEP, f"{kernel_cache.SEALED_DIR}/{name}", "create",
                         "root's copy of its kernel cache, once it passes its gate",
                         service=service.name)


@dataclass
class Prepared:
    """A replica whose key file and flags are ready (`service`), for its wave's restart
    (`restarted`) and gate (`gated`)."""

    service: Service
    unit_text: str
    inputs: this_run.Inputs
    environment: BuiltEnvironment
    # the host paths its process loads (service_inputs.watched_inputs), read with its state
    watched: tuple[str, ...]
    kernels: Kernels | None = None
    rewritten: unit_file.Rewritten = field(default_factory=unit_file.Rewritten)
    started: lifecycle.Restarted = field(default_factory=lifecycle.Restarted)
    surged: surge.Outcome = field(default_factory=surge.Outcome)


@deploy(STEP)
def service(config, service, stack, patch_sets: dict, environment: BuiltEnvironment,
            model_copies: ModelCopies, device_groups: tuple[str, ...],
            by_target: dict, arch: str | None = None, starts: bool = False) -> Prepared:
    """Add the operations that prepare one replica before any wave restarts: its key file, and its
    exact flags through the engine's own parser in its venv (what its unit will say), with the
    engine advisories on its target's kind that the GPU check left to it (`by_target`:
    `gpus.GpuDecisions.after_staging`); then its empty kernel cache seeded where a sealed copy
    exists (`arch`: its GPUs' architecture; `starts`: the plan (re)starts it)."""
    unit_path = service.unit_path
    unit_text = unit_text_of(config, service, stack, patch_sets, device_groups)
    key_file = secrets.config_file(
        name=f"API keys of {service.name} in a file only root and its service read",
        service=service.name,
        api_key=service.api_key,
        admin_api_key=service.admin_api_key,
        present=bool(service.config_file),
        group=group_of(config.service_user),
    )
    # What this service's process loads besides its unit: its venv, patch sets, staged models, key
    # file.
    inputs = this_run.Inputs((*environment.named_ops(), *model_copies.named_of(service),
                              (f"API keys of {service.name}", key_file, False)))
    parsed = preflight.passed(
        name=f"{service.unit_name} flags pass the engine's own parser",
        service=service.name,
        venv_path=environment.gen.path,
        launcher=config.launcher,
        argv=service.argv(),
        environment={**units.GPU_ORDER, **service.environment_variables()},  # what the unit sets
        endpoint=service.endpoint,
        unit_path=unit_path,
        unit_text=unit_text,
        inputs_changed=inputs,
        by_target=by_target,
        open_ok=bool(service.api_key) or service.allow_unauthenticated,
    )
    progress.watch(parsed, f"{service.unit_name}'s flags through the engine's own parser")
    kernels = Kernels.of(config, service, stack, patch_sets, arch, starts,
                         tuple(units.service_sandbox(config, service)))
    kernel_ship.warmed(name=f"{service.unit_name}'s kernel cache warm before it starts",
                       replica=service.name, cache_key=kernels.key, arch=kernels.arch,
                       starts=kernels.starts, source=kernels.source, sandbox=list(kernels.sandbox))
    return Prepared(service, unit_text, inputs, environment,
                    watched_inputs(service, unit_path), kernels=kernels)


@deploy(STEP)
def restarted(prepared: Prepared, held: Callable[..., str | None], restarts: bool = False) -> None:
    """In the replica's wave: its unit written and the unit (re)started if anything it loads
    changed, unless it is held (`held`, operations/service/rollout.py `Hold`: its service's rollout
    halted earlier in this run, or restarting it would leave too few replicas serving): then its
    unit file and process stay as they are. `restarts`: the host's plan restarts the running replica
    (a rewritten unit would restart it), so the unit write asks as a restart does."""
    service = prepared.service
    unit_path = service.unit_path
    unit_file.written(name=f"Unit {service.unit_name}", path=unit_path, text=prepared.unit_text,
                      rewritten=prepared.rewritten,
                      _if=lambda: held(restarting=restarts) is None)

    # Read before this run changes anything (one answer from the host's read): inputs whose content
    # differs from what the running process was started with. A touched file, or a file dropped
    # beside a staged model, is no change.
    watched = prepared.watched
    stale = readiness.changed_since_start(service.unit_name, service.bind, service.port, watched)
    if stale:
        host.log(f"{service.name}: {', '.join(stale)} changed since the service started (an "
                 "earlier deploy stopped before restarting it): restarting")
    lifecycle.running(
        name=f"{service.unit_name} enabled and running its current inputs",
        unit=service.unit_name,
        unit_path=unit_path,
        bind=service.bind,
        port=service.port,
        inputs=watched,
        unit_changed=prepared.rewritten,
        inputs_changed=this_run.any_of(prepared.rewritten, prepared.inputs),
        outcome=prepared.started,
        held=held,
        service=service.name,
    )


@deploy(STEP)
def gated(config, prepared: Prepared, held: Callable[..., str | None], planned: bool,
          soak_s: int = 0, old_replica: tuple | None = None) -> None:
    """In the replica's wave, after every restart of the wave: the readiness gate (and a canary's
    soak). `planned`: the host's plan (re)starts it; when its rollout halted (`held`), it was kept
    on its old version, and says so."""
    service = prepared.service
    gate = readiness.ready(
        name=f"{service.unit_name} is ready",
        service=service.name,
        unit=service.unit_name,
        bind=service.bind,
        port=service.port,
        timeout=config.readiness_timeout_s,
        smoke=config.smoke_test,
        spec=readiness.speculative_check(service),
        baseline=readiness.Baseline.of(*old_replica) if old_replica else None,
        config_file=service.config_file,
        open_to_all=service.exposed_without_key,
        restarted=prepared.started,
        inputs=prepared.watched,
        rollback_plan=rollback.Restorable(
            service.unit_path, service.unit_name, prepared.rewritten,
            [(service.environment.path, prepared.environment.switched.did_change)],
            stop_timeout_s=service.stop_timeout_s),
        rollout=service.definition,
        held=lambda: prepared.started.held or (held() if planned else None),
        soak_s=soak_s,
    )
    progress.watch(gate, f"{service.unit_name} starting", progress.journal(service.unit_name))
    kernels = prepared.kernels
    if kernels is not None:
        kernel_ship.sealed(name=f"{service.unit_name}'s kernel cache sealed by root",
                           replica=service.name, cache_key=kernels.key, arch=kernels.arch,
                           starts=kernels.starts, sandbox=list(kernels.sandbox),
                           started=prepared.started)


@deploy(STEP)
def surge_started(config, prepared: Prepared, held: Callable[..., str | None],
                  planned: surge.Surge, stack, patch_sets: dict,
                  device_groups: tuple[str, ...]) -> Callable[..., str | None]:
    """In the replica's wave, before its restart: the plan's surge (`planned`) started beside it
    and gated (operations/service/surge.py). Returns the hold its restart and gate ask instead of
    `held`: held where the surge failed; a restart the surge covers takes no serving replica
    away."""
    service = prepared.service
    text = unit_text_of(config, surge.surge_service(service, planned), stack, patch_sets,
                        device_groups)
    surge.started(
        name=f"Surge of {service.unit_name} on GPU {','.join(map(str, planned.gpus))}, "
             f"port {planned.port}",
        surge=planned, unit_text=text, bind=service.bind, timeout=config.readiness_timeout_s,
        smoke=config.smoke_test, config_file=service.config_file,
        spec=readiness.speculative_check(service), rollout=service.definition,
        outcome=prepared.surged, held=held, stop_timeout_s=service.stop_timeout_s)
    return prepared.surged.held(held)


@deploy(STEP)
def surge_removed(prepared: Prepared, planned: surge.Surge, leftover: bool = False) -> None:
    """After the wave's gates: the surge stopped (drained) and removed, once the replica serves on
    its own GPU and port; `leftover`: one an earlier run left (`surge_left`)."""
    service = prepared.service
    surge.removed(name=f"Surge {planned.unit} stopped and removed", surge=planned,
                  unit=service.unit_name, bind=service.bind, port=service.port,
                  config_file=service.config_file, outcome=prepared.surged,
                  stop_timeout_s=service.stop_timeout_s, leftover=leftover)


@deploy(STEP)
def wave_opened(number: int, of: int) -> None:
    """A rollout's wave begins, on every host alike (operations/service/rollout.py `wave`: it orders
    the waves across hosts)."""
    rollout.wave(name=f"Rollout wave {number} of {of}", number=number, of=of)


@deploy(STEP)
def gates_checked() -> None:
    """After the last wave: the host fails where one of its replicas failed its gate
    (operations/service/rollout.py)."""
    rollout.gates_passed(name="Readiness gates passed")
