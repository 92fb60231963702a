"""The status view (status.py): its rows as a table, a detail view, a JSON document, an exit code
and a Prometheus textfile. Data in, text out; the one pyinfra piece is `StatusPrinter`, the callback
that prints once the last host is done and ends the process with the exit code.

A row is a plain dict (views/status.py builds them), one per placed service and one per reached
host without services (or unreached host): JSON-ready as it is. Its words are mostly the hosts'
(unit states, GPU names, a model's or a patch's state, errors): the table and the detail view show
each on its line with every control in it visible (`terminal_text.one_line`), the Prometheus labels
too; the JSON holds them whole, escaped as JSON escapes them.

Exit codes follow `terraform plan -detailed-exitcode` and monitoring checks:
0 every host reached, every service healthy, nothing a deploy would change; 2 drift (a deploy would
change something) and nothing unhealthy; 1 a host not reached, a service not healthy, or an
unhealthy GPU.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pyinfra.api.state import BaseStateCallback

from configuration import run_scope
from report.atomic_file import write_atomically  # noqa: F401 - the views write through it
from report.sizes import human_bytes
from report.terminal_text import one_line

EXIT_OK, EXIT_UNHEALTHY, EXIT_DRIFT = 0, 1, 2
SCHEMA = "sglang-deploy-status/1"
# a table cell longer than this is cut (the detail view and the JSON hold the whole text)
CELL_MAX = 48


# -- one row's words ------------------------------------------------------------------------


def verdict(row: dict) -> str:
    if not row.get("reachable", True):
        return "UNREACHABLE"
    if not row.get("healthy", True):
        return "UNHEALTHY"
    if row.get("changes"):
        return "DRIFT"
    return "ok"


def exit_code(rows: list[dict]) -> int:
    """0 converged and healthy, 2 drift, 1 unhealthy or unreachable (which wins over drift)."""
    words = {verdict(row) for row in rows}
    if words & {"UNREACHABLE", "UNHEALTHY"}:
        return EXIT_UNHEALTHY
    if "DRIFT" in words:
        return EXIT_DRIFT
    return EXIT_OK


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def gpu_text(gpu: dict) -> str:
    used, total = gpu.get("memory_used_mib"), gpu.get("memory_total_mib")
    memory = f"{used if used is not None else '?'}/{total if total is not None else '?'} MiB"
    health = "ok" if gpu.get("healthy") else "UNHEALTHY: " + "; ".join(gpu.get("problems") or ["?"])
    if gpu.get("missing"):
        health = "MISSING"
    foreign = gpu.get("foreign") or []
    others = f"; other processes: {', '.join(foreign)}" if foreign else ""
    return f"{gpu['index']} {gpu.get('name') or '?'} {memory} {health}{others}"


def _health(row: dict) -> str:
    health = row.get("health")
    if not health:
        return "-"
    status = health.get("status")
    latency = health.get("latency_ms")
    word = str(status) if status is not None else (health.get("error") or "no answer")
    return f"{word} {latency:.0f}ms" if latency is not None and status is not None else word


def _unit(row: dict) -> str:
    unit = row.get("unit")
    if not unit:
        return "-"
    if unit.get("load") == "not-found":
        return "not installed"
    words = f"{unit.get('active') or '?'}/{unit.get('sub') or '?'}"
    if unit.get("enabled") not in (None, "enabled"):
        words += f" ({unit.get('enabled')})"
    return words


def _pid(row: dict) -> str:
    if not row.get("pid"):
        return "-"
    restarts = f" r{row['restarts']}" if row.get("restarts") else ""
    return f"{row['pid']} {duration(row.get('uptime_s'))}{restarts}"


def _accept(row: dict) -> str:
    """The acceptance its gate read when this process started (a speculative service), and whether
    its tokens were checked against its target's."""
    gate = row.get("gate") or {}
    if gate.get("accept_length") is None:
        return "-"
    return f"{gate['accept_length']:.2f}" + ("" if gate.get("lossless") else " unchecked")


def _generation(row: dict) -> str:
    gen = row.get("generation")
    if not gen:
        return "-"
    if gen.get("live") == gen.get("wanted"):
        return f"{gen.get('stack')} (live = wanted)"
    return f"{gen.get('stack')}: live {gen.get('live') or 'none'} != wanted {gen.get('wanted')}"


def _kernels(row: dict) -> str:
    """Whether the service's kernel cache (its unit's key) holds compiled kernels: a restart on
    a warm one skips the engine's compile and JIT."""
    kernels = row.get("kernels")
    if not kernels or kernels.get("warm") is None:
        return "-"
    if not kernels["warm"]:
        return f"cold ({kernels.get('key')})"
    return (f"warm {human_bytes(kernels.get('bytes') or 0)}, {kernels.get('files')} files "
            f"({kernels.get('key')})")


def _patches(row: dict) -> str:
    sets = row.get("patch_sets") or []
    if not sets:
        return "-"
    return ", ".join(
        f"{p['name']} " + ("applied" if p.get("applied")
                           else "DRIFTED: " + "; ".join(p.get("drifted") or [p.get("note") or "?"]))
        for p in sets
    )


def _models(row: dict) -> str:
    models = row.get("models") or []
    if not models:
        return "-"
    return ", ".join(f"{m['name']} " + ("verified" if m.get("verified")
                                        else (m.get("why") or "not verified")) for m in models)


def _gpus(row: dict) -> str:
    gpus = row.get("gpus") or []
    if row.get("gpu_error"):
        return row["gpu_error"]
    return "; ".join(gpu_text(g) for g in gpus) or "-"


def _gpus_short(row: dict) -> str:
    """GPUs in a few characters each: index, memory used/total in GiB, ok or BAD, processes not
    ours."""
    if row.get("gpu_error"):
        return row["gpu_error"]
    parts = []
    for g in row.get("gpus") or []:
        used, total = g.get("memory_used_mib"), g.get("memory_total_mib")
        memory = (f"{used / 1024:.0f}/{total / 1024:.0f}G"
                  if used is not None and total is not None else "?")
        word = "MISSING" if g.get("missing") else "ok" if g.get("healthy") else "BAD"
        foreign = f" +{len(g['foreign'])} foreign" if g.get("foreign") else ""
        parts.append(f"{g['index']} {memory} {word}{foreign}")
    return ", ".join(parts) or "-"


def _changes_short(row: dict) -> str:
    changes = row.get("changes") or []
    if not changes:
        return "nothing"
    return changes[0] if len(changes) == 1 else f"{len(changes)}: {changes[0]}; ..."


def _host(row: dict) -> str:
    return row["host"]


def _changes(row: dict) -> str:
    changes = row.get("changes") or []
    return "; ".join(changes) if changes else "nothing"


def _lock(row: dict) -> str:
    lock = row.get("lock")
    if not lock:
        return "-"
    return (f"{lock.get('who', 'unknown')} (pid {lock.get('pid', '?')}) since "
            f"{lock.get('since', '?')}")


def _lock_short(row: dict) -> str:
    lock = row.get("lock")
    return f"{lock.get('who', 'unknown')} pid {lock.get('pid', '?')}" if lock else "-"


# (header, cell, priority): columns of lower priority fold into the detail view first on a narrow
# terminal.
COLUMNS: list[tuple[str, object, int]] = [
    ("HOST", _host, 0),
    ("SERVICE", lambda r: r.get("service") or "-", 0),
    ("STATUS", verdict, 0),
    ("PORT", lambda r: str(r["port"]) if r.get("port") else "-", 1),
    ("UNIT", _unit, 1),
    ("HEALTH", _health, 1),
    ("DEPLOY WOULD", _changes_short, 1),
    ("LOCK", _lock_short, 1),
    ("PID/UPTIME", _pid, 2),
    ("ACCEPT", _accept, 2),
    ("GPU", _gpus_short, 2),
    ("GENERATION", _generation, 3),
    ("KERNELS", _kernels, 4),
    ("PATCH SETS", _patches, 4),
    ("MODELS", _models, 4),
]


def as_shown(value):
    """`value` (a row, or anything in one) with each string as the view shows it: `one_line`, so a
    cell's width is what the terminal shows and a host's newline cannot start a row of its own."""
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {key: as_shown(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_shown(item) for item in value]
    return value


def _cut(text: str, limit: int = CELL_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def table(rows: list[dict], width: int) -> str:
    """The rows as one table that fits `width` columns: columns of lower priority are left out (and
    named below it) until it fits; the LOCK column only when some host's lock is held."""
    rows = as_shown(rows)
    columns = [c for c in COLUMNS if c[0] != "LOCK" or any(r.get("lock") for r in rows)]
    cells = {name: [_cut(cell(r)) for r in rows] for name, cell, _ in columns}
    widths = {name: max([len(name)] + [len(c) for c in cells[name]]) for name, _, _ in columns}
    shown = list(columns)
    while len(shown) > 3 and sum(widths[n] for n, _, _ in shown) + 2 * (len(shown) - 1) > width:
        lowest = max(p for _, _, p in shown)
        drop = [c for c in shown if c[2] == lowest][-1]
        shown.remove(drop)
    lines = ["  ".join(f"{name:<{widths[name]}}" for name, _, _ in shown).rstrip()]
    for i in range(len(rows)):
        lines.append(
            "  ".join(f"{cells[name][i]:<{widths[name]}}" for name, _, _ in shown).rstrip())
    for row in rows:  # why a row is not ok, whole, whatever the width
        name = f"{row['host']}/{row['service']}" if row.get("service") else row["host"]
        lines += [f"! {name}: {problem}" for problem in row.get("problems") or []]
        lines += [f"~ {name}: WARNING: {warning}" for warning in row.get("warnings") or []]
    left_out = [name for name, _, _ in columns if all(name != s[0] for s in shown)]
    if left_out:
        lines.append(f"({len(left_out)} column(s) left out to fit {width} columns: "
                     f"{', '.join(left_out)}; STATUS_DETAIL=1 shows every column)")
    return "\n".join(lines)


def detail(rows: list[dict]) -> str:
    """Every column of every row, one `NAME: value` line each, whole (nothing cut)."""
    rows = as_shown(rows)
    blocks = []
    for row in rows:
        title = (f"{row['host']}/{row['service']}" if row.get("service")
                 else f"{row['host']} (no service placed)")
        lines = [f"{title}: {verdict(row)}"]
        for name, cell, _ in COLUMNS:
            if name in ("HOST", "SERVICE", "STATUS"):
                continue
            if name == "GPU":
                gpus = row.get("gpus") or []
                if row.get("gpu_error") or not gpus:
                    lines.append(f"  GPU: {_gpus(row)}")
                for gpu in gpus:
                    lines.append(f"  GPU: {gpu_text(gpu)}")
                continue
            if name == "LOCK":
                lines.append(f"  LOCK: {_lock(row)}")
                continue
            if name == "DEPLOY WOULD":
                changes = row.get("changes") or []
                lines.append(f"  DEPLOY WOULD: {_changes(row) if not changes else ''}".rstrip())
                plan = row.get("plan") or [{}] * len(changes)  # parallel to `changes`
                for change, record in zip(changes, plan):
                    lines.append(f"    - {change}")
                    lines += [f"        {line}" for line in record.get("diff") or ()]
                lines += [f"  WARNING: {w}" for w in row.get("warnings") or []]
                continue
            lines.append(f"  {name}: {cell(row)}")
        for problem in row.get("problems") or []:
            lines.append(f"  PROBLEM: {problem}")
        if not row.get("reachable", True):
            lines.append(f"  REACHABLE: no ({row.get('unreachable') or '?'})")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def footer(rows: list[dict], covers: str) -> str:
    code = exit_code(rows)
    counts = {w: sum(1 for r in rows if verdict(r) == w)
              for w in ("ok", "DRIFT", "UNHEALTHY", "UNREACHABLE")}
    summary = ", ".join(f"{n} {w}" for w, n in counts.items() if n) or "no rows"
    return (f"{summary}; exit code {code} (0 converged and healthy, 2 drift, 1 unhealthy or "
            f"unreachable)\n{covers}")


def rollouts_in_progress(rows: list[dict]) -> dict[str, dict[str, list[str]]]:
    """definition -> {"current": [host/replica...], "old": [...]} for each service whose replicas
    run two versions: some run what the data says (their plan restarts nothing), others would be
    (re)started onto it (a rollout that halted, or a run that stopped part way)."""
    by_service: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        if not row.get("reachable") or not row.get("service"):
            continue
        old = any(c.get("action") in ("restart", "start") for c in row.get("plan") or [])
        entry = by_service.setdefault(row.get("definition") or row["service"],
                                      {"current": [], "old": []})
        entry["old" if old else "current"].append(f"{row['host']}/{row['service']}")
    return {name: v for name, v in sorted(by_service.items()) if v["current"] and v["old"]}


def rollout_lines(rows: list[dict]) -> str:
    return "".join(f"ROLLOUT IN PROGRESS: {name}: current on {', '.join(v['current'])}; old on "
                   f"{', '.join(v['old'])} (the deploy would restart those)\n"
                   for name, v in rollouts_in_progress(rows).items())


def document(rows: list[dict], covers: str) -> dict:
    """The JSON document: the same rows, with the verdict of each and the run's exit code."""
    return {
        "schema": SCHEMA,
        "exit_code": exit_code(rows),
        "deploy_would_covers": covers,
        "rows": [{**row, "status": verdict(row)} for row in rows],
        "rollouts_in_progress": rollouts_in_progress(rows),
    }


# -- Prometheus ------------------------------------------------------------------------------

METRICS = {
    "sglang_deploy_host_up": "1 when the host answered (SSH), else 0",
    "sglang_deploy_host_lock_held": "1 while a deploy lock is held on the host",
    "sglang_deploy_gpu_healthy": "1 when nvidia-smi reports the GPU healthy, else 0",
    "sglang_deploy_service_up": "1 when the service's unit runs and /health answers 200, else 0",
    "sglang_deploy_service_health_latency_seconds": "time to /health's answer, from the host "
                                                    "itself",
    "sglang_deploy_service_restarts": "systemd's NRestarts of the service's unit",
    "sglang_deploy_service_accept_length": ("accepted tokens per verify step that the readiness "
                                            "gate read when the running process started"),
    "sglang_deploy_service_kernel_cache_warm": ("1 when the kernel cache the service's unit names "
                                                "holds compiled kernels, else 0"),
    "sglang_deploy_service_drift": "1 when a deploy would change something for the service, else 0",
    "sglang_deploy_status_exit_code": "the status command's exit code (0 ok, 2 drift, 1 unhealthy "
                                      "or unreachable)",
}


def _label(value) -> str:
    """A label value as the table shows it, on one line with every control visible (a raw newline
    would end the sample and start a metric line of the host's), then `\\` and `"` escaped as the
    text format reads them."""
    return one_line(value).replace("\\", "\\\\").replace('"', '\\"')


def _labels(**labels) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def prometheus(rows: list[dict]) -> str:
    """node_exporter's textfile-collector format: gauges per host, GPU and service."""
    samples: dict[str, list[str]] = {name: [] for name in METRICS}
    hosts_seen = set()
    for row in rows:
        host = row["host"]
        if host not in hosts_seen:
            hosts_seen.add(host)
            samples["sglang_deploy_host_up"].append(f"{_labels(host=host)} "
                                                    f"{1 if row.get('reachable', True) else 0}")
            samples["sglang_deploy_host_lock_held"].append(f"{_labels(host=host)} "
                                                           f"{1 if row.get('lock') else 0}")
            for gpu in row.get("host_gpus") or []:
                ok = 1 if gpu.get("healthy") and not gpu.get("missing") else 0
                samples["sglang_deploy_gpu_healthy"].append(
                    f"{_labels(host=host, gpu=gpu['index'], name=gpu.get('name') or '')} {ok}")
        if not row.get("service"):
            continue
        labels = _labels(host=host, service=row["service"], port=row.get("port") or "")
        health = row.get("health") or {}
        up = 1 if row.get("reachable", True) and row.get("healthy") else 0
        samples["sglang_deploy_service_up"].append(f"{labels} {up}")
        if health.get("status") is not None and health.get("latency_ms") is not None:
            samples["sglang_deploy_service_health_latency_seconds"].append(
                f"{labels} {health['latency_ms'] / 1000:.6f}")
        if row.get("restarts") is not None:
            samples["sglang_deploy_service_restarts"].append(f"{labels} {int(row['restarts'])}")
        accept = (row.get("gate") or {}).get("accept_length")
        if accept is not None:
            samples["sglang_deploy_service_accept_length"].append(f"{labels} {float(accept):.4f}")
        warm = (row.get("kernels") or {}).get("warm")
        if warm is not None:
            samples["sglang_deploy_service_kernel_cache_warm"].append(
                f"{labels} {1 if warm else 0}")
        if row.get("reachable", True):
            samples["sglang_deploy_service_drift"].append(f"{labels} "
                                                          f"{1 if row.get('changes') else 0}")
    samples["sglang_deploy_status_exit_code"].append(f" {exit_code(rows)}")
    lines = []
    for name, text in METRICS.items():
        if not samples[name]:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        lines += [f"{name}{sample}" for sample in samples[name]]
    return "\n".join(lines) + "\n"


# -- options (environment variables: pyinfra's own -v and --data mean other things) --------------


def options_from(environ) -> dict:
    """STATUS_DETAIL=1, STATUS_JSON=FILE|-, STATUS_PROM=FILE, STATUS_WIDTH=N."""
    width = environ.get("STATUS_WIDTH")
    if width is not None and not width.isdigit():
        raise ValueError(f"STATUS_WIDTH={width!r}: a number of columns")
    return {
        "detail": environ.get("STATUS_DETAIL", "") not in ("", "0"),
        "json": environ.get("STATUS_JSON") or None,
        "prom": environ.get("STATUS_PROM") or None,
        "width": int(width) if width else None,
    }


def render(rows: list[dict], options: dict, covers: str, width: int) -> dict[str, str]:
    """What to print and write: {"stdout": text, "json": text or None, "prom": text or None}."""
    rows = sorted(rows, key=lambda r: (r["host"], r.get("service") or ""))
    view = detail(rows) if options.get("detail") else table(rows, options.get("width") or width)
    doc = (json.dumps(document(rows, covers), indent=2, sort_keys=True) + "\n"
           if options.get("json") else None)
    return {
        "view": view + "\n\n" + rollout_lines(rows) + footer(rows, covers),
        "json": doc,
        "prom": prometheus(rows) if options.get("prom") else None,
    }


def emit(rows: list[dict], options: dict, covers: str, width: int, out=None) -> int:
    """Print the view (to stderr when the JSON goes to stdout), write the files asked for; the exit
    code."""
    out = out or sys.stdout
    texts = render(rows, options, covers, width)
    to_stdout_json = options.get("json") == "-"
    print(texts["view"], file=sys.stderr if to_stdout_json else out)
    if texts["json"] is not None:
        if to_stdout_json:
            out.write(texts["json"])
        else:
            write_atomically(Path(options["json"]), texts["json"])
    if texts["prom"] is not None:
        write_atomically(Path(options["prom"]), texts["prom"])
    out.flush()
    return exit_code(rows)


# -- the run's store and its printer (the one pyinfra piece) -------------------------------------

@dataclass
class _Rows:
    """Host name -> its rows, written as each host's load reads it (kept on the run:
    configuration/run_scope.py)."""

    by_host: dict[str, list[dict]] = field(default_factory=dict)


def record(state, host_name: str, rows: list[dict]) -> None:
    run_scope.of(state, _Rows).by_host[host_name] = rows


def unreachable_row(host_name: str, why: str) -> dict:
    return {"host": host_name, "reachable": False, "unreachable": why, "service": None,
            "healthy": False, "changes": [], "problems": [f"not reached: {why}"], "gpus": [],
            "host_gpus": [], "lock": None}


class StatusPrinter(BaseStateCallback):
    """Once the last host is done: the view, the files asked for, and the process's exit code.

    pyinfra ends its run with `sys.exit(0 or 1)` and then disconnects every host; the last host's
    `host_disconnect` raises SystemExit with the status's own code, which replaces pyinfra's."""

    def __init__(self, options: dict, covers: str, width: int, reason_for):
        self.options, self.covers, self.width, self.reason_for = options, covers, width, reason_for
        self.disconnected: set[str] = set()
        self.done = False
        super().__init__()

    def rows(self, state) -> list[dict]:
        by_host = run_scope.of(state, _Rows).by_host
        rows = [row for name in sorted(by_host) for row in by_host[name]]
        active = {h.name for h in state.activated_hosts}
        for host in state.inventory:
            if host.name in by_host or not state.is_host_in_limit(host):
                continue
            why = ("its read failed (pyinfra's error above says why)" if host.name in active
                   else self.reason_for(host))
            rows.append(unreachable_row(host.name, why))
        return rows

    def host_disconnect(self, state, host):
        self.disconnected.add(host.name)
        if self.done or not {h.name for h in state.activated_hosts} <= self.disconnected:
            return
        self.done = True
        code = emit(self.rows(state), self.options, self.covers, self.width)
        raise SystemExit(code)
