"""GPUs: what `nvidia-smi` says about a host's GPUs, and the decisions taken from it.

- `GpuState` (fact): one remote call per host runs `nvidia-smi --query-gpu` (index, UUID, name,
  compute capability, memory, driver, health fields), `--query-compute-apps` and the plain table
  (its header carries the CUDA version the driver supports; a GPU in trouble shows `ERR!`), and
  reads our units' GPUs and processes and the models' sizes and kinds (hybrid or dense, from their
  config.json: the engine advisories' `target`). The command always exits 0: a
  missing GPU makes nvidia-smi print "Unable to determine the device handle ..." and exit
  non-zero, which would otherwise fail the host before anything could be said about it.
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
import json
import re
import shlex
from dataclasses import dataclass, field

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand

from configuration import advisories, engine_flags, patch_sets, stacks
from configuration.errors import fail_dry_run
from configuration.host_paths import UNIT_DIR
from configuration.settings import HostConfig, Service
from operations import remote
from operations.gpu import prerequisites
from operations.run import host_reads, read_batch
from operations.run.host_reads import operation
from report import summary
from report.sizes import human_bytes

MIB = 1024 * 1024
# Values nvidia-smi prints for a field it cannot read from a GPU in trouble.
_BROKEN_VALUES = ("[GPU requires reset]", "ERR!", "[Unknown Error]", "[GPU is lost]")
_MISSING_RE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)")
_HEADER_RE = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_TABLE_ROW_RE = re.compile(
    r"^\|\s+(\d+)\s+.*\|\s*([0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s")
_ACTIVE = ("active", "activating", "reloading", "deactivating")


# Facts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    compute_cap: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    bus_id: str
    problems: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class App:
    pid: int
    gpu_uuid: str
    used_mib: int | None


@dataclass(frozen=True)
class Unit:
    """One of the host's `sglang-*.service` units as found."""

    managed: bool
    gpus: tuple[int, ...] | None
    active: str
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuFacts:
    nvidia_smi: str | None
    error: str | None  # nvidia-smi absent or not answering: no GPU can be used
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[Gpu, ...]
    missing: tuple[str, ...]  # bus ids nvidia-smi could not reach
    apps: tuple[App, ...]
    units: dict[str, Unit] = field(default_factory=dict)
    model_bytes: dict[str, int | None] = field(default_factory=dict)
    # a model dir -> `hybrid`, `dense`, or None (no readable config.json); absent: no such dir
    model_kinds: dict[str, str | None] = field(default_factory=dict)

    def by_index(self) -> dict[int, Gpu]:
        return {g.index: g for g in self.gpus}


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_header(table: str) -> tuple[str | None, str | None]:
    """Driver version and the CUDA version it supports, from the plain table's (or `-q`'s)
    header."""
    match = _HEADER_RE.search(table)
    if match:
        return match.group(1), match.group(2)
    driver = re.search(r"^Driver Version\s*:\s*(\S+)", table, re.M)
    cuda = re.search(r"^CUDA Version\s*:\s*(\S+)", table, re.M)
    return (driver.group(1) if driver else None), (cuda.group(1) if cuda else None)


def parse_table_errors(table: str) -> set[str]:
    """Bus ids of the GPUs whose block in the plain table shows `ERR!`."""
    out: set[str] = set()
    current = None
    for line in table.splitlines():
        row = _TABLE_ROW_RE.match(line)
        if row:
            current = row.group(2).upper()
        elif line.startswith("+") or line.startswith("|="):
            if line.startswith("+-"):
                current = None
        if current and "ERR!" in line:
            out.add(current)
        if "Processes:" in line:
            break
    return out


def parse_missing(stderr: str) -> list[str]:
    """Bus ids from "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error", each
    once."""
    seen: dict[str, None] = {}
    for match in _MISSING_RE.finditer(stderr):
        seen[match.group(1).rstrip(":").upper()] = None
    return list(seen)


def _same_bus(a: str, b: str) -> bool:
    # nvidia-smi prints 00000000:2A:00.0 in tables and 0000:2A:00.0 in the device-handle error.
    return a.upper()[-12:] == b.upper()[-12:]


def parse_query_gpu(text: str, fields: str) -> list[Gpu]:
    """Rows of `--query-gpu=FIELDS --format=csv,noheader,nounits`; broken values become problems."""
    names = [f.strip() for f in fields.split(",")]
    gpus = []
    for line in text.splitlines():
        if not line.strip() or line.count(",") < len(names) - 1:
            continue
        values = dict(zip(names, (v.strip() for v in line.split(", ", len(names) - 1))))
        if _int(values.get("index", "")) is None:
            continue
        problems = []
        broken = sorted({v for v in values.values() if v in _BROKEN_VALUES})
        if broken:
            problems.append(f"nvidia-smi reads {', '.join(broken)}")
        ecc = _int(values.get("ecc.errors.uncorrected.volatile.total", ""))
        if ecc:
            problems.append(f"{ecc} uncorrectable ECC errors since the driver loaded")
        if values.get("retired_pages.pending") == "Yes":
            problems.append("retired pages pending (reset the GPU)")
        if values.get("remapped_rows.pending") == "Yes":
            problems.append("row remapping pending (reset the GPU)")
        if values.get("remapped_rows.failure") == "Yes":
            problems.append("row remapping failed")
        gpus.append(Gpu(
            index=int(values["index"]),
            uuid=values.get("uuid", ""),
            name=values.get("name", ""),
            compute_cap=values.get("compute_cap", ""),
            memory_total_mib=_int(values.get("memory.total", "")),
            memory_used_mib=_int(values.get("memory.used", "")),
            bus_id=values.get("pci.bus_id", ""),
            problems=tuple(problems),
        ))
    return gpus


def parse_compute_apps(text: str) -> list[App]:
    """Rows of `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and _int(parts[0]) is not None:
            apps.append(App(int(parts[0]), parts[1], _int(parts[2])))
    return apps


def _unit_gpus(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        return None


def facts_from(raw: dict) -> GpuFacts:
    """The fact script's JSON, parsed."""
    units = {
        name: Unit(managed=u["managed"], gpus=_unit_gpus(u["gpus"]), active=u["active"] or "",
                   pids=tuple(u["pids"]))
        for name, u in raw.get("units", {}).items()
    }
    models = raw.get("models", {})
    if not raw.get("nvidia_smi"):
        return GpuFacts(None, "nvidia-smi not found (no NVIDIA driver on the host?)", None, None,
                        (), (), (), units, models)
    query, apps, table = raw["query"], raw["apps"], raw["table"]
    gpus = parse_query_gpu(query["stdout"], query.get("fields", ""))
    missing = parse_missing(query["stderr"] + table["stderr"] + apps["stderr"])
    driver, cuda = parse_header(table["stdout"])
    if not driver:
        driver = next((line.split(", ")[6] for line in query["stdout"].splitlines()
                       if line.count(", ") >= 6), None)
    error = None
    if not gpus and not missing:
        said = (query["stdout"] + query["stderr"]).strip().splitlines()
        error = f"nvidia-smi failed (exit {query['rc']}): {said[0] if said else 'no output'}"
    err_buses = parse_table_errors(table["stdout"])
    gpus = [
        dataclasses.replace(g, problems=g.problems + ("the table shows ERR!",))
        if any(_same_bus(g.bus_id, b) for b in err_buses) and not g.problems else g
        for g in gpus
    ]
    return GpuFacts(
        nvidia_smi=raw["nvidia_smi"],
        error=error,
        driver_version=driver,
        cuda_version=cuda,
        gpus=tuple(gpus),
        missing=tuple(missing),
        apps=tuple(parse_compute_apps(apps["stdout"])),
        units=units,
        model_bytes=models,
        model_kinds=raw.get("kinds", {}),
    )


@read_batch.batched(slow=True)
class GpuState(FactBase):
    """The host's GPUs (``GpuFacts``): nvidia-smi's view, our units' GPUs and processes, the models'
    sizes."""

    def command(self, models: tuple[str, ...] | list[str] = (), unit_dir: str = UNIT_DIR) -> str:
        return remote.command("gpu_state", shlex.quote(unit_dir), *(shlex.quote(m) for m in models))

    def process(self, output) -> GpuFacts:
        return facts_from(json.loads("\n".join(output)))


# Decisions -------------------------------------------------------------------------------


class Refusal(str):
    """An error of the GPU check, as text (`dflash: GPU 1 is in use ...`), and the service it is
    about as data (`service`; None: the host's own, which stops every service on it). Decided where
    the error is made, never read back from the text (a service may be named like the first word of
    a host's error)."""

    service: str | None

    def __new__(cls, service: Service, why: str) -> Refusal:
        made = super().__new__(cls, f"{service.name}: {why}")
        made.service = service.name
        return made


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


def _arg(service: Service, flag: str):
    return dict(service.args).get(flag)


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
        if (name == service.unit_name or not unit.managed or unit.active not in _ACTIVE
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


def _engine(service: Service, engine: str | None) -> advisories.EngineUse:
    """`service` as the advisories judge it: its engine version, its flags as that engine's parser
    reads them, its patch sets."""
    return advisories.EngineUse(engine, dict(service.args),
                                engine_flags.for_engine(engine, service.patch_sets),
                                service.patch_sets)


def _caps(service: Service, facts: GpuFacts) -> list[str]:
    return [facts.by_index()[i].compute_cap for i in service.gpus if i in facts.by_index()]


def _backend(service: Service, facts: GpuFacts, engine: str | None,
             decisions: list[str]) -> Service:
    """`attention-backend: auto` resolved on this GPU: the backend an advisory that holds for
    sglang's default here prefers (files/engine_advisories.yml: FlashInfer's JIT on sm 12.x prefers
    triton), else sglang's default."""
    if _arg(service, "attention-backend") != "auto":
        return service
    caps = _caps(service, facts)
    held = [a for cap in caps
            for a in advisories.applying(_engine(service, engine), cap, advisories.DEFAULT_BACKEND)
            if a.prefer]
    if held:
        args = [(f, held[0].prefer if f == "attention-backend" else v) for f, v in service.args]
        decisions.append(f"{service.name}: attention-backend auto -> {held[0].prefer} (sm "
                         f"{caps[0]}: {held[0].summary} [{held[0].id}])")
    else:
        args = [(flag, value) for flag, value in service.args if flag != "attention-backend"]
        shown = f"sm {caps[0]}" if caps else "GPU not known"
        decisions.append(f"{service.name}: attention-backend auto -> sglang's default ({shown})")
    return dataclasses.replace(service, args=tuple(args))


def _memory(service: Service, facts: GpuFacts, decisions: list[str], warnings: list[str],
            errors: list[str]) -> None:
    gpus = [facts.by_index()[i] for i in service.gpus if i in facts.by_index()]
    totals = [g.memory_total_mib for g in gpus if g.memory_total_mib]
    if not totals:
        return
    sizes = {m.name: facts.model_bytes.get(m.store_path) for m in service.models}
    unknown = [name for name, size in sizes.items() if size is None]
    if unknown:
        decisions.append(f"{service.name}: size of {', '.join(unknown)} unknown (not in the model "
                         "store yet): GPU memory not checked")
        return
    tp = _int(str(_arg(service, "tp-size") or _arg(service, "tp") or 1)) or 1
    need = sum(sizes.values()) / tp
    total = min(totals) * MIB
    gpu_text = (f"GPU {service.gpus[0]}" if len(service.gpus) == 1
                else f"GPUs {','.join(map(str, service.gpus))}")
    models = " + ".join(f"{name} {human_bytes(size)}" for name, size in sizes.items())
    per = f"{human_bytes(need)} per GPU ({models}{f', tp {tp}' if tp > 1 else ''})"
    fraction = _arg(service, "mem-fraction-static")
    if need > total:
        errors.append(Refusal(service, f"models need {per}, {gpu_text} has {human_bytes(total)}: "
                                       f"short by {human_bytes(need - total)}; use more GPUs "
                                       "(tp-size) or a smaller model"))
        return
    if fraction is None:
        if need > 0.9 * total:
            warnings.append(f"{service.name}: models take {need / total:.0%} of {gpu_text}'s "
                            f"{human_bytes(total)} ({per}): little or no room for the KV cache "
                            "once sglang sizes mem-fraction-static itself")
        else:
            decisions.append(f"{service.name}: models {per} fit {gpu_text} ({human_bytes(total)}; "
                             "mem-fraction-static: sglang's choice)")
        return
    try:
        fraction = float(fraction)
    except ValueError:
        errors.append(Refusal(service, f"mem-fraction-static {fraction!r} is not a number"))
        return
    pool = fraction * total
    if need > pool:
        wanted = need / total
        errors.append(Refusal(service, f"models need {per}, mem-fraction-static {fraction} of "
                                       f"{gpu_text}'s {human_bytes(total)} gives "
                                       f"{human_bytes(pool)}: short by {human_bytes(need - pool)}; "
                                       f"raise mem-fraction-static to more than {wanted:.2f} (and "
                                       "leave room for the KV cache)"))
    elif pool - need < 0.1 * pool:
        warnings.append(f"{service.name}: models {per} leave {human_bytes(pool - need)} "
                        f"({(pool - need) / pool:.0%}) of the static pool (mem-fraction-static "
                        f"{fraction} of {human_bytes(total)}) for the KV cache")
    else:
        decisions.append(f"{service.name}: models {per} fit mem-fraction-static {fraction} of "
                         f"{gpu_text} ({human_bytes(pool)}), {human_bytes(pool - need)} left for "
                         "the KV cache")


def _served_backends(service: Service, facts: GpuFacts, errors: list[str]) -> None:
    """The backend `attention-backend: auto` resolved to on this host's GPU, held to the service's
    patch sets' served backends (configuration.patch_sets.unserved_backend). The control machine
    checked every backend the data names; only `auto` waits for the GPU."""
    unserved = patch_sets.first_unserved(service.patch_sets, dict(service.args))
    if unserved is None:
        return
    caps = [facts.by_index()[i].compute_cap for i in service.gpus if i in facts.by_index()]
    shown = (_arg(service, "attention-backend")
             or f"sglang's default on {'sm ' + caps[0] if caps else 'this GPU'}")
    what = f"`attention-backend: auto` gives {shown} here"
    errors.append(Refusal(service, patch_sets.unserved_reason(*unserved, what=what)))


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
        _memory(dataclasses.replace(service, gpus=tuple(free[:need])), facts, [], [], short)
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
                    self.errors.append(Refusal(service, f"GPU {index} {why}; {_free_text(free)}"))
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
            self.errors.append(Refusal(service, "gpu auto: no healthy free GPU on this host "
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
        judged = _engine(service, engine)
        kind = self.facts.model_kinds.get(service.target.store_path)
        seen: set[str] = set()
        pending: dict[str, tuple[advisories.Advisory, ...]] = {}
        for cap in _caps(service, self.facts) or [None]:
            for advisory in advisories.applying(judged, cap, target=kind):
                if advisory.id not in seen:
                    seen.add(advisory.id)
                    if advisory.effect == "refuse":
                        self.errors.append(Refusal(service, advisory.text()))
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
            auto_backend = _arg(self.resolved[placed.name], "attention-backend") == "auto"
            service = _backend(self.resolved[placed.name], self.facts, engine, self.decisions)
            if auto_backend:
                _served_backends(service, self.facts, self.errors)
            if service.gpus:
                _memory(service, self.facts, self.decisions, self.warnings, self.errors)
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
