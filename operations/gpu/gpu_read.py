"""What `nvidia-smi` says about a host's GPUs, as facts: `GpuState` reads it in one remote call per
host (on_host/gpu_state.py: `nvidia-smi --query-gpu` for index, UUID, name, compute capability,
memory, driver and health fields, `--query-compute-apps`, and the plain table, whose header carries
the CUDA version the driver supports and where a GPU in trouble shows `ERR!`; with our units' GPUs
and processes and the models' sizes and kinds), and `facts_from` turns its answer into `GpuFacts`.
The command always exits 0: a missing GPU makes nvidia-smi print "Unable to determine the device
handle ..." and exit non-zero, which would otherwise fail the host before anything could be said
about it. The decisions taken from these facts are operations/gpu/gpus.py's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from configuration.host_paths import UNIT_DIR
from operations import remote
from operations.run import read_batch

MIB = 1024 * 1024
# Values nvidia-smi prints for a field it cannot read from a GPU in trouble.
_BROKEN_VALUES = ("[GPU requires reset]", "ERR!", "[Unknown Error]", "[GPU is lost]")
_MISSING_RE = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)")
_HEADER_RE = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_TABLE_ROW_RE = re.compile(
    r"^\|\s+(\d+)\s+.*\|\s*([0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s")
ACTIVE_STATES = ("active", "activating", "reloading", "deactivating")


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


def int_or_none(text: str) -> int | None:
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
        if int_or_none(values.get("index", "")) is None:
            continue
        problems = []
        broken = sorted({v for v in values.values() if v in _BROKEN_VALUES})
        if broken:
            problems.append(f"nvidia-smi reads {', '.join(broken)}")
        ecc = int_or_none(values.get("ecc.errors.uncorrected.volatile.total", ""))
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
            memory_total_mib=int_or_none(values.get("memory.total", "")),
            memory_used_mib=int_or_none(values.get("memory.used", "")),
            bus_id=values.get("pci.bus_id", ""),
            problems=tuple(problems),
        ))
    return gpus


def parse_compute_apps(text: str) -> list[App]:
    """Rows of `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and int_or_none(parts[0]) is not None:
            apps.append(App(int(parts[0]), parts[1], int_or_none(parts[2])))
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
