"""GPUs: the decisions taken from what `nvidia-smi` says about a host's GPUs.

- `GpuState` (fact, operations/gpu/gpu_facts.py): the host's GPUs, our units' GPUs and processes
  and the models' sizes and kinds (hybrid or dense, from their config.json: the engine advisories'
  `target`), in one remote call per host.
- `decide(config, facts)` (pure) resolves `gpu: auto` and `attention-backend: auto`, checks each
  service's GPUs (present, healthy, free) and its models' size against GPU memory and
  `mem-fraction-static`, and returns a `GpuDecisions`: the resolved config, one line per decision,
  warnings and errors.
- `plan_for_host(config, stack)` reads the fact at load time (the units are rendered from the plan;
  facts read then see the host before the deploy, which is what a GPU check wants);
  `gpus.checked(plan=...)` shows the decisions (also under `--dry`) and fails the host, before
  any change, when the plan has errors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import FunctionCommand

from configuration import advisories, stacks
from configuration.errors import fail_dry_run
from configuration.settings import HostConfig, Service
from operations.gpu import fit, prerequisites
from operations.gpu.gpu_read import (
    ACTIVE_STATES,
    GpuFacts,
    GpuState,
)
from operations.run import host_reads
from operations.run.host_reads import operation
from report import summary

# Decisions -------------------------------------------------------------------------------




@dataclass(frozen=True)
class GpuDecisions:
    """What the GPUs decide for a host: its config with `auto` resolved, and what to say."""

    config: HostConfig
    decisions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    facts: GpuFacts | None = None  # what nvidia-smi said (None: not read, nothing placed here)
    # A service whose target model the host did not hold when read (a first deploy, a move): per
    # target kind, the advisories that hold for that kind (`advisories.by_target`), for its
    # preflight to decide once the model is staged.
    after_staging: dict[str, dict[str, tuple[advisories.Advisory, ...]]] = field(
        default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    @staticmethod
    def service_of(error: str) -> str | None:
        """The service an error is about (a `Refusal`'s, as it was made); None for the host's own
        (its Python, its driver: every service on it)."""
        return getattr(error, "service", None)

    def arch_of(self, service) -> str | None:
        """The GPU architecture `service` runs on, as kernels are built for it (`sm90`, `sm90_sm120`
        for a mix); None where its GPUs were not read."""
        if self.facts is None or self.facts.error:
            return None
        caps = sorted({g.compute_cap for g in self.facts.gpus
                       if g.index in service.gpus and g.compute_cap})
        return "_".join("sm" + c.replace(".", "") for c in caps) or None

    def probe_args(self) -> dict:
        """What the ABI probe compares torch against: the driver's CUDA version, the GPUs' compute
        capabilities."""
        if self.facts is None or self.facts.error:
            return {"driver_cuda": None, "compute_caps": []}
        used = {i for s in self.config.services for i in s.gpus}
        caps = sorted({g.compute_cap for g in self.facts.gpus if g.index in used and g.compute_cap})
        return {"driver_cuda": self.facts.cuda_version, "compute_caps": caps}


def _summary(facts: GpuFacts) -> str:
    kinds: dict[tuple, int] = {}
    for g in facts.gpus:
        key = (g.name, g.compute_cap, g.memory_total_mib)
        kinds[key] = kinds.get(key, 0) + 1
    parts = ([f"{n} x {name} (sm {cc}, {mem} MiB)" for (name, cc, mem), n in kinds.items()]
             or ["no GPUs listed"])
    return (f"{', '.join(parts)}; driver {facts.driver_version or '?'}, CUDA "
            f"{facts.cuda_version or '?'}")




def _users(facts: GpuFacts, config: HostConfig, service: Service) -> dict[int, list[str]]:
    """GPU index -> what uses it besides `service` itself: processes, and our other units' GPUs."""
    own = facts.units.get(service.unit_name)
    own_pids = set(own.pids) if own else set()
    pid_unit = {pid: name for name, unit in facts.units.items() if name != service.unit_name
                for pid in unit.pids}
    by_uuid = {g.uuid: g.index for g in facts.gpus}
    users: dict[int, list[str]] = {}
    for app in facts.apps:
        if app.pid in own_pids or app.gpu_uuid not in by_uuid:
            continue
        mem = f", {app.used_mib} MiB" if app.used_mib is not None else ""
        who = (f"{pid_unit[app.pid]} (pid {app.pid}{mem})" if app.pid in pid_unit
               else f"pid {app.pid}{mem}")
        users.setdefault(by_uuid[app.gpu_uuid], []).append(who)
    placed = {s.unit_name for s in config.services}
    for name, unit in sorted(facts.units.items()):
        if (name == service.unit_name or not unit.managed or unit.active not in ACTIVE_STATES
                or not unit.gpus):
            continue
        why = ("" if name in placed
               else ", no longer placed here: removed after this run's readiness gates")
        for index in unit.gpus:
            entry = f"{name} (running{why})"
            if not any(u.startswith(name) for u in users.get(index, [])):
                users.setdefault(index, []).append(entry)
    return users


def _why_not(index: int, facts: GpuFacts, failed: tuple[int, ...], users: dict[int, list[str]],
             taken: dict[int, str]) -> str | None:
    gpu = facts.by_index().get(index)
    if index in failed:
        return "is marked failed (`failed_gpus` in the host's data)"
    if gpu is None:
        listed = ", ".join(str(i) for i in sorted(facts.by_index())) or "none"
        lost = f"; it cannot reach {', '.join(facts.missing)}" if facts.missing else ""
        return f"is missing (nvidia-smi lists GPUs {listed}{lost})"
    if not gpu.healthy:
        return f"is unhealthy: {'; '.join(gpu.problems)}"
    if index in taken:
        return f"is given to service {taken[index]} in this run"
    if users.get(index):
        return f"is in use by {', '.join(users[index])}"
    return None


def _free(facts: GpuFacts, failed, users, taken) -> list[int]:
    return [g.index for g in facts.gpus if _why_not(g.index, facts, failed, users, taken) is None]


def _free_text(free: list[int]) -> str:
    return (f"healthy free GPUs: {', '.join(str(i) for i in free)}" if free
            else "no healthy free GPU on this host")


def surge_gpus(decisions: GpuDecisions, service: Service,
               taken: dict[int, str]) -> tuple[tuple[int, ...], str]:
    """The GPUs a surge of `service` (operations/service/surge.py) may start on, by the GPU check's
    own rule (`_why_not`: present, healthy, not marked failed, used by no process and no active unit
    of ours), and given to no service placed here nor to another surge of this run (`taken`: GPU ->
    whose), and large enough for its models (`_memory`); as many as the service uses, lowest
    first. ((), why not) where too few are free."""
    facts = decisions.facts
    if facts is None or facts.error:
        return (), "the host's GPUs were not read"
    users = _users(facts, decisions.config, service)
    given = {i: s.name for s in decisions.config.services for i in s.gpus}
    given.update(taken)
    failed = decisions.config.failed_gpus
    others = [g.index for g in facts.gpus if g.index not in service.gpus]
    free = [i for i in others if _why_not(i, facts, failed, users, given) is None]
    need = max(1, len(service.gpus))
    if len(free) >= need:
        short: list[str] = []  # the GPU check's memory rule, on the surge's GPUs
        fit.memory(dataclasses.replace(service, gpus=tuple(free[:need])), facts, [], [], short)
        if short:
            return (), f"GPU {','.join(map(str, free[:need]))} is free but too small: " + "; ".join(
                s.split(": ", 1)[-1] for s in short)
        return tuple(free[:need]), ""
    reasons = "; ".join(f"GPU {i} {_why_not(i, facts, failed, users, given)}"
                        for i in others if i not in free)
    return (), (f"{len(free)} free GPU(s) beside its own, it needs {need}"
                + (f" ({reasons})" if reasons else ""))


def decide(config: HostConfig, facts: GpuFacts | None, engine: str | None = None) -> GpuDecisions:
    """Resolve `gpu: auto` and `attention-backend: auto`, and check every service's GPUs and memory.

    `engine`: the stack's sglang version, for combinations known to fail on a real GPU.
    `gpu: auto` keeps the GPU of the service's current unit while that GPU is healthy and free,
    else takes the lowest-numbered healthy free GPU; services with fixed GPUs are served first,
    so adding an `auto` service never moves another one.
    """
    if not config.services:
        return GpuDecisions(config)
    if facts is None or facts.error:
        names = ", ".join(s.name for s in config.services)
        error = (facts.error if facts else "no GPU facts")
        return GpuDecisions(config, errors=(f"{error}: services {names} need a GPU",))
    placing = _Placing(config, facts)
    placing.fixed()
    placing.auto()
    return placing.checked(engine)


@dataclass
class _Placing:
    """`decide` under way: what is said so far, the GPUs taken (index -> service) and each
    service as resolved."""

    config: HostConfig
    facts: GpuFacts
    decisions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    taken: dict[int, str] = field(default_factory=dict)
    resolved: dict[str, Service] = field(default_factory=dict)
    # per service whose target the host did not hold: GpuDecisions.after_staging
    after_staging: dict[str, dict[str, tuple[advisories.Advisory, ...]]] = field(
        default_factory=dict)

    def __post_init__(self) -> None:
        facts = self.facts
        self.decisions.append(f"GPUs: {_summary(facts)}")
        for gpu in facts.gpus:
            if not gpu.healthy:
                self.decisions.append(f"GPU {gpu.index} ({gpu.bus_id}) unhealthy: "
                                      f"{'; '.join(gpu.problems)}")
        if facts.missing:
            self.decisions.append(f"nvidia-smi cannot reach {', '.join(facts.missing)} (fell off "
                                  "the bus?)")

    def _why_not(self, index: int, users, taken) -> str | None:
        return _why_not(index, self.facts, self.config.failed_gpus, users, taken)

    def fixed(self) -> None:
        """Fixed GPUs first: they are the operator's word; `auto` fits around them."""
        for service in self.config.services:
            if not service.gpus:
                continue
            users = _users(self.facts, self.config, service)
            others = dict(self.taken)
            for index in service.gpus:
                why = self._why_not(index, users, others)
                if why:
                    free = [i for i in _free(self.facts, self.config.failed_gpus, users, others)
                            if i not in service.gpus or i == index]
                    self.errors.append(
                        fit.Refusal(service, f"GPU {index} {why}; {_free_text(free)}"))
            for index in service.gpus:
                self.taken.setdefault(index, service.name)
            self.resolved[service.name] = service

    def auto(self) -> None:
        """Then `auto` services that can keep their current GPU, then the others, lowest GPU
        first."""
        autos = [s for s in self.config.services if not s.gpus]
        for service in autos:
            self._keep(service)
        for service in autos:
            if service.name not in self.resolved:
                self._lowest_free(service)

    def _current(self, service: Service) -> tuple[int, ...] | None:
        unit = self.facts.units.get(service.unit_name)
        return unit.gpus if unit and unit.managed and unit.gpus and len(unit.gpus) == 1 else None

    def _keep(self, service: Service) -> None:
        current = self._current(service)
        users = _users(self.facts, self.config, service)
        if current and self._why_not(current[0], users, self.taken) is None:
            self.decisions.append(f"{service.name}: gpu auto -> GPU {current[0]} (kept: its "
                                  "current unit's GPU)")
            self.taken[current[0]] = service.name
            self.resolved[service.name] = dataclasses.replace(service, gpus=current)

    def _lowest_free(self, service: Service) -> None:
        current = self._current(service)
        users = _users(self.facts, self.config, service)
        free = _free(self.facts, self.config.failed_gpus, users, self.taken)
        if not free:
            reasons = "; ".join(f"GPU {g.index} {self._why_not(g.index, users, self.taken)}"
                                for g in self.facts.gpus)
            self.errors.append(fit.Refusal(service, "gpu auto: no healthy free GPU on this host "
                                                f"({reasons or 'no GPUs listed'})"))
            self.resolved[service.name] = service
            return
        moved = (f" (its current GPU {current[0]} "
                 f"{self._why_not(current[0], users, self.taken)})" if current else "")
        self.decisions.append(
            f"{service.name}: gpu auto -> GPU {free[0]} (lowest healthy free GPU{moved})")
        self.taken[free[0]] = service.name
        self.resolved[service.name] = dataclasses.replace(service, gpus=(free[0],))

    def _advised(self, service: Service, engine: str | None) -> None:
        """The engine advisories that hold for `service` on this host's GPU, with the backend it
        runs here (`auto` resolved) and its target model's kind: a refusal is an error (before any
        change), a warning is shown (also under --dry). Where the host does not hold the target
        yet, those that depend on its kind go to `after_staging`, for the preflight."""
        judged = fit.engine_use(service, engine)
        kind = self.facts.model_kinds.get(service.target.store_path)
        seen: set[str] = set()
        pending: dict[str, tuple[advisories.Advisory, ...]] = {}
        for cap in fit.caps_of(service, self.facts) or [None]:
            for advisory in advisories.applying(judged, cap, target=kind):
                if advisory.id not in seen:
                    seen.add(advisory.id)
                    if advisory.effect == "refuse":
                        self.errors.append(fit.Refusal(service, advisory.text()))
                    else:
                        self.warnings.append(f"{service.name}: {advisory.text()}")
            for target, held in (advisories.by_target(judged, cap) if kind is None
                                 else {}).items():
                pending[target] = tuple(dict.fromkeys(pending.get(target, ()) + held))
        if pending:
            self.after_staging[service.name] = pending
            ids = sorted({a.id for held in pending.values() for a in held})
            where = (f"{service.target.store_path} has no readable config.json"
                     if service.target.store_path in self.facts.model_kinds
                     else f"{service.target.name} is not in {service.target.store_path} yet")
            self.decisions.append(f"{service.name}: {where}: advisories on the target's kind "
                                  f"({', '.join(ids)}) are decided by its preflight, once staged")

    def checked(self, engine: str | None) -> GpuDecisions:
        """Each service with its GPUs placed: `attention-backend: auto` resolved, the backends its
        patch sets served on, its memory, the engine advisories."""
        services = []
        for placed in self.config.services:
            auto_backend = fit.arg(self.resolved[placed.name], "attention-backend") == "auto"
            service = fit.backend(self.resolved[placed.name], self.facts, engine, self.decisions)
            if auto_backend:
                fit.served_backends(service, self.facts, self.errors)
            if service.gpus:
                fit.memory(service, self.facts, self.decisions, self.warnings, self.errors)
                self._advised(service, engine)
            services.append(service)
        return GpuDecisions(dataclasses.replace(self.config, services=tuple(services)),
                            tuple(self.decisions), tuple(self.warnings), tuple(self.errors),
                            after_staging=self.after_staging)


def plan_for_host(config: HostConfig, stack: stacks.Stack) -> GpuDecisions:
    """Read the host's GPUs (one remote call, only if it runs services) and decide for `stack`'s
    engine."""
    if not config.services:
        return GpuDecisions(config)
    paths = sorted({m.store_path for s in config.services for m in s.models})
    facts = host_reads.get(host, GpuState, models=paths)
    engine = stack.wanted().get("sglang")
    decided = decide(config, facts, engine)
    # What the host must have for the stack and models (its Python, glibc, driver, room in RAM):
    # refused here, with the GPUs, before anything is built.
    basics = host_reads.get(host, prerequisites.HostBasics,
                            **prerequisites.read_arguments(config, stack))
    missing = tuple(prerequisites.refusals(config, stack, basics, facts))
    return dataclasses.replace(decided, facts=facts, errors=missing + decided.errors)


# The operation ---------------------------------------------------------------------------


def _refuse(state, host, plan: GpuDecisions) -> bool:
    for error in plan.errors:
        host.log_styled(f"GPU CHECK FAILED, nothing changed on this host: {error}", fg="red",
                        log_func=logger.error)
    for error in plan.errors:
        service = plan.service_of(error)
        for name in [service] if service else [s.name for s in plan.config.services]:
            summary.record(host, name, "-", "FAILED",
                           f"GPU check: {error.split(': ', 1)[-1] if service else error}")
    return False


def show(host, plan: GpuDecisions) -> None:
    """Print the GPU decisions (`gpu: auto` and `attention-backend: auto` resolved) and warnings for
    the host's services: by the check's operation, and on a converged host, which gets none
    (operations/service/converged.py)."""
    for line in plan.decisions:
        host.log(line)
    for line in plan.warnings:
        host.log_styled(f"WARNING: {line}", fg="yellow", log_func=logger.warning)


@operation()
def checked(plan: GpuDecisions):
    """
    Show the GPU decisions for the host's services, and fail the host if they cannot run.

    + plan: ``plan_for_host(config, stack)``: the decisions, warnings and errors

    Decisions:
        Printed when the deploy is planned (so ``--dry`` shows them), or once while executing
        with ``-y``. An error (a GPU missing, unhealthy, busy or too small) fails the host when
        this operation runs, first of the host's operations, so nothing on it changes.

    **Example:**

    .. code:: python

        gpus.checked(name="GPUs fit the services on this host",
                     plan=gpus.plan_for_host(config, stack))
    """
    state = host.state
    if not state.is_executing or not state.should_check_for_changes():
        show(host, plan)
        if not state.is_executing:
            for line in plan.errors:
                host.log_styled(f"GPU check will fail: {line}", fg="red", log_func=logger.error)
            if plan.errors:
                fail_dry_run(host)  # --dry exits 1: the real run would refuse this host
    if plan.ok:
        services = ", ".join(f"{s.name} on GPU {','.join(map(str, s.gpus))}"
                             for s in plan.config.services)
        host.noop(f"GPUs fit: {services}" if services else "no services placed: no GPU needed")
        return
    yield FunctionCommand(_refuse, (plan,), {})
