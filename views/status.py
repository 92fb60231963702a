"""The status view's reads and decisions (status.py): one host's rows from its one read, changing
nothing.

A host is read the deploy's way: `host_reads.prepare`/`install` (one batched call answering the
facts the deploy itself read there last time), then the deploy's own facts asked with the deploy's
own arguments, so each answer comes from that batch. Nothing the deploy decides from is read any
other way. In the same batch (`install(..., also=...)`), the deploy lock's holder read by the lock's
own script (`StatusProbe`: `lock_host.py peek`), and on a host where nothing is placed, its GPUs:
one call per host. `/health` and the time it takes come with the deploy's own `ServiceState` read.

What it never does: take or wait for the deploy lock (its holder is shown), run a command that
writes on a host (every fact used here only reads: see each in the module that defines it), or keep
the read set a deploy keeps on the control machine (`HostReads.asked` is emptied before the run
ends, so nothing is saved).

"Deploy would" is the host's plan (deploys/plan.py), made by the very functions the deploy
makes it with, from the same answers: every step (GPU check, Environments, Models, Service account,
Service, Cleanup), as `Change` records (`plan` in each row; `changes` their text). Not covered:
whether a restart's readiness gate will pass (COVERS says so wherever the column is shown). The venv
and the staged models are judged by their fast check here (the data's `verify_env: full` is the
deploy's own).
"""

from __future__ import annotations

import json
import socket

from pyinfra.api import FactBase

from deploys import environments
from deploys import models as models_step
from deploys.plan import plan_host
from operations import remote
from operations.environment import patches, venv_read
from operations.gpu import gpu_read, gpus
from operations.model import models
from operations.run import host_reads
from operations.service import kernel_cache, lifecycle, readiness

COVERS = (
    "DEPLOY WOULD is the deploy's own plan from this read (deploys/plan.py): every step, "
    "the venv and staged models by their fast check; not whether a restart's readiness gate will "
    "pass."
)
class StatusProbe(FactBase):
    """``{"lock": {"who", "pid", "since", "control"} | None}``: the deploy lock's holder, read by
    the lock's own script (`lock_host.py peek`, which only reads); the token that lets its owner
    give it back is not kept."""

    def command(self) -> str:
        return remote.command("lock_host", "peek")

    def process(self, output):
        holder = json.loads(output[-1]).get("held_by")
        if holder is None:
            return {"lock": None}
        return {"lock": {k: holder.get(k) for k in ("who", "pid", "since", "control")}
                if isinstance(holder, dict) else {"who": "unknown"}}


# -- pure pieces ------------------------------------------------------------------------------


def health_answer(state: dict | None) -> dict:
    """A service's /health as the row shows it, from the deploy's ServiceState read
    (service_state.py times it)."""
    if state is None:
        return {"status": None, "latency_ms": None, "error": "unit state not read"}
    status = state.get("health")
    error = state.get("health_error") or (None if status is not None else "nothing answers")
    return {"status": status, "latency_ms": state.get("health_ms"), "error": error}


def gpu_rows(facts: gpu_read.GpuFacts | None, indexes: tuple[int, ...] | None = None) -> list[dict]:
    """The GPUs (all, or those of `indexes`) as rows: memory, health, and processes no unit of ours
    runs."""
    if facts is None or facts.error:
        return []
    ours = {pid for unit in facts.units.values() for pid in unit.pids}
    by_index = facts.by_index()
    out = []
    for index in (indexes if indexes is not None else sorted(by_index)):
        gpu = by_index.get(index)
        if gpu is None:
            out.append({"index": index, "name": None, "missing": True, "healthy": False,
                        # The f-string's one field is longer than the line: E501 left to it.
                        "problems": [
                            "not listed by "
                            f"nvidia-smi{' (cannot reach ' + ', '.join(facts.missing) + ')' if facts.missing else ''}"],  # noqa: E501
                        "memory_used_mib": None, "memory_total_mib": None, "foreign": []})
            continue
        foreign = [f"pid {a.pid}" + (f" {a.used_mib} MiB" if a.used_mib is not None else "")
                   for a in facts.apps if a.gpu_uuid == gpu.uuid and a.pid not in ours]
        out.append({"index": gpu.index, "name": gpu.name, "missing": False, "healthy": gpu.healthy,
                    "problems": list(gpu.problems), "memory_used_mib": gpu.memory_used_mib,
                    "memory_total_mib": gpu.memory_total_mib, "foreign": foreign})
    return out


# -- one host -----------------------------------------------------------------------------------


def _fact(host, cls, **kwargs):
    try:
        return host_reads.get(host, cls, **kwargs)
    except Exception as exc:  # a fact that failed on the host: shown in the row, never a traceback
        return _Unread(f"{cls.__name__}: {exc}")


class _Unread:
    def __init__(self, why: str):
        self.why = why


def _ok(value) -> bool:
    return value is not None and not isinstance(value, _Unread)


def also_read(config) -> tuple[tuple[type, dict], ...]:
    """The status view's own small reads, in the host's one read beside the deploy's facts
    (`deploys.run.HostRun.observing`): the lock's holder, and where nothing is placed (the deploy
    reads no GPUs there), the GPUs. /health and its latency come with the deploy's own
    ServiceState read."""
    return ((StatusProbe, {}),) + (((gpu_read.GpuState, {"models": ()}),) if not config.services
                                   else ())


def read_host(host, config, stack, patch_sets: dict,
              watched: dict[str, tuple[str, ...]]) -> list[dict]:
    """`host`'s rows (its one read installed with `also_read`): one per placed service, or one for
    the host when none is placed.

    `watched`: service name -> the paths its process loads (deploys/service.py `watched_inputs`),
    the arguments the deploy reads `ServiceState` with (so the answer comes from the same read).
    """
    probe = _fact(host, StatusProbe)
    bare_gpus = _fact(host, gpu_read.GpuState, models=()) if not config.services else None
    return _rows(host, config, stack, patch_sets, watched, probe, bare_gpus)


def _rows(host, config, stack, patch_sets, watched, probe, bare_gpus) -> list[dict]:
    problems_host: list[str] = []
    # GPUs: the GPU check's own decision (gpu: auto resolved, refusals) from the same fact the
    # deploy reads.
    if config.services:
        paths = sorted({m.store_path for s in config.services for m in s.models})
        gpu_facts = _fact(host, gpu_read.GpuState, models=paths)
    else:
        gpu_facts = bare_gpus
    facts = gpu_facts if _ok(gpu_facts) else None
    if isinstance(gpu_facts, _Unread):
        problems_host.append(gpu_facts.why)
    decisions = (gpus.decide(config, facts, stack.wanted().get("sglang")) if config.services
                 else gpus.GpuDecisions(config))
    resolved = decisions.config
    host_gpus = gpu_rows(facts)
    gpu_error = (facts.error if facts is not None and facts.error else None) or (
        None if facts is not None else "GPUs not read")

    probe_answer = probe
    lock_holder = probe_answer.get("lock") if isinstance(probe_answer, dict) else None
    if not isinstance(probe_answer, dict):
        problems_host.append("the deploy lock's holder was not read")

    # What a deploy would change: the host's plan, the deploy's own decisions from the same read
    # (deploys/plan.py).
    plan = plan_host(host.name, decisions, stack, patch_sets,
                     read=host_reads.reader(host), verify_env="fast")
    problems_host += [f"not read: {what}" for what in plan.unread]
    envs = {env.path: _environment(host, env, stack, patch_sets, config)
            for env in config.environments}
    staged = {}
    for model in config.staged_models:
        found = _fact(host, models.StagedModel,
                      **models.staged_read(model.store_path, model.load_path, config.verify_models))
        why = (models.stage_reason(found) if _ok(found)
               else f"not read ({getattr(found, 'why', 'no answer')})")
        staged[model.name] = {"name": model.name, "location": "shm",
                              "verified": why is None, "why": why}

    rows = [_service_row(host, service, stack, watched.get(service.name, ()), envs, staged,
                         decisions, facts, host_gpus, plan)
            for service in resolved.services]
    shown = {id(c) for row in rows for c in row.pop("_changes")}
    host_changes = [c for c in plan.changes if id(c) not in shown]
    if not rows:
        bad_gpus = [g for g in host_gpus if not g["healthy"]]
        rows.append({
            "host": host.name, "reachable": True, "service": None, "lock": lock_holder,
            "gpus": host_gpus, "host_gpus": host_gpus,
            "gpu_error": gpu_error if gpu_error != "GPUs not read" else None,
            "changes": [c.text for c in host_changes], "plan": [c.record() for c in host_changes],
            "healthy": not bad_gpus and not problems_host,
            "problems": problems_host + [f"GPU {g['index']}: {'; '.join(g['problems'])}"
                                         for g in bad_gpus],
        })
    else:
        for row in rows:
            row["lock"] = lock_holder
            row["problems"] = problems_host + row["problems"]
            row["healthy"] = row["healthy"] and not problems_host
        rows[0]["changes"] += [c.text for c in host_changes]
        rows[0]["plan"] += [c.record() for c in host_changes]
    return rows


def _environment(host, env, stack, patch_sets, config) -> dict:
    """A venv as its rows show it: the wanted generation, the live one, and each patch set's
    drift."""
    gen = venv_read.generation(env.path, stack,
                               {name: patch_sets[name].digest for name in env.patch_sets})
    found = _fact(host, venv_read.VenvState, live=gen.live, wanted=gen.path,
                  host_cache=config.host_wheel_cache, verify="fast")
    live_target = (found.get("live") or {}).get("target") if _ok(found) else None
    built = _ok(found) and found.get("wanted") is not None
    rows = []
    for name in env.patch_sets:
        installed = None
        if built:
            installed = _fact(host, patches.InstalledFiles,
                              **patches.read_arguments(patch_sets[name], gen.path,
                                                       f"{gen.path}/{stack.site_packages}"))
        rows.append(patches.drift(patch_sets[name], installed if _ok(installed) else None))
    return {"gen": gen, "live": live_target.rsplit("/", 1)[-1] if live_target else None,
            "patches": rows}


def _concerns(change, service, env: dict) -> bool:
    """Whether a change of the plan is shown in `service`'s row: its own, its venv's, its
    models'."""
    if change.service is not None:
        return change.service == service.name
    if change.step == environments.STEP:
        return service.environment.path in change.what or env["gen"].id in change.what
    if change.step == models_step.STEP:
        return any(change.what in (m.load_path, m.store_path) for m in service.models)
    return False


def _service_row(host, service, stack, watched, envs, staged_models, decisions, facts,
                 host_gpus, plan) -> dict:
    problems = []
    # The GPU check's warnings (engine advisories that hold here, little KV room): shown, not a
    # verdict.
    warned = [w.split(": ", 1)[1] for w in decisions.warnings if w.startswith(f"{service.name}: ")]
    env = envs[service.environment.path]
    mine = [c for c in plan.changes if _concerns(c, service, env)]
    staged = [staged_models[m.name] for m in service.models if m.location == "shm"]
    store = [{"name": m.name, "location": "store", "verified": None,
              "why": "loaded from the store (not staged)"}
             for m in service.models if m.location == "store"]
    state = _fact(host, readiness.ServiceState, unit=service.unit_name,
                  address=readiness.probe_address(service.bind), port=service.port, inputs=watched)
    unit = pid = uptime = restarts = None
    running = False
    if _ok(state):
        unit = {k: state.get(k) for k in ("load", "active", "sub", "enabled")}
        pid, uptime, restarts = (state.get("pid") or None, state.get("uptime_s"),
                                 state.get("restarts"))
        running = state.get("active") == "active" and state.get("sub") in lifecycle.RUNNING
    else:
        problems.append(f"unit state not read ({getattr(state, 'why', 'no answer')})")
    answer = health_answer(state if _ok(state) else None)
    if not running:
        problems.append(f"unit {service.unit_name} is "
                        f"{(unit or {}).get('active') or '?'}/{(unit or {}).get('sub') or '?'}")
    if answer["status"] != 200:
        problems.append(f"/health answers {answer['status'] or answer['error'] or 'nothing'}")
    gpu_list = gpu_rows(facts, service.gpus) if facts is not None else []
    for g in gpu_list:
        if not g["healthy"]:
            problems.append(f"GPU {g['index']}: {'; '.join(g['problems'])}")
    if facts is None or facts.error:
        problems.append(f"GPUs: {facts.error if facts is not None else 'not read'}")
    return {
        "host": host.name, "reachable": True, "service": service.name,
        "definition": service.definition, "port": service.port, "unit_name": service.unit_name,
        "unit": unit, "pid": pid, "uptime_s": uptime, "restarts": restarts, "health": answer,
        # what its readiness gate proved of this process (a speculative service): acceptance, ...
        "gate": state.get("gate") if _ok(state) else None,
        "gpus": gpu_list, "host_gpus": host_gpus, "gpu_error": None,
        "generation": {"stack": stack.name, "wanted": env["gen"].id, "live": env["live"],
                       "venv": service.environment.path},
        "kernels": kernels_of(host, service, env["gen"].path),
        "patch_sets": [p for p in env["patches"] if p["name"] in service.patch_sets],
        "models": staged + store, "changes": [c.text for c in mine],
        "plan": [c.record() for c in mine], "_changes": mine, "healthy": not problems,
        "problems": problems, "warnings": warned,
    }


def kernels_of(host, service, generation: str) -> dict:
    """The service's kernel cache as its unit names it (operations/service/kernel_cache.py): its
    key, whether it holds compiled kernels (`warm`: None where it was not read), files and bytes."""
    cache_key = kernel_cache.key(service, generation)
    found = _fact(host, kernel_cache.KernelCaches, unit_dirs=kernel_cache.UNIT_DIRS)
    found = found if _ok(found) else None
    entry = ((found or {}).get("caches") or {}).get(cache_key) or {}
    return {"key": cache_key, "warm": kernel_cache.warm(found, cache_key),
            "files": entry.get("files", 0), "bytes": entry.get("bytes", 0)}


def unreachable_reason(address: str, port: int, timeout_s: float = 1.5) -> str:
    """Why pyinfra could not connect to a host SSH reaches at `address`:`port` (its validated
    `ssh_address`), as far as one TCP connect to that port says (bounded)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return (f"SSH to {address}:{port} failed (the port answers: see pyinfra's error above: "
                    "keys, host key, user)")
    except socket.timeout:
        return f"no answer from {address}:{port} within {timeout_s:g} s"
    except OSError as exc:
        return f"{address}:{port}: {exc.strerror or exc}"
