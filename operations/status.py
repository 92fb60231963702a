"""The status view's reads and decisions (status.py): one host's rows from its one read, changing nothing.

A host is read the deploy's way: `host_reads.prepare`/`install` (one batched call answering the facts the
deploy itself read there last time), then the deploy's own facts asked with the deploy's own arguments, so
each answer comes from that batch. Nothing the deploy decides from is read any other way. In the same batch
(`install(..., also=...)`), the deploy lock's holder read by the lock's own script (`StatusProbe`:
`lock_host.py peek`), and on a host where nothing is placed, its GPUs: one call per host. `/health` and the
time it takes come with the deploy's own `ServiceState` read.

What it never does: take or wait for the deploy lock (its holder is shown), run a command that writes on a
host (every fact used here only reads: see each in the module that defines it), or keep the read set a deploy
keeps on the control machine (`HostReads.asked` is emptied before the run ends, so nothing is saved).

"Deploy would" is decided by the deploy's own pure decision functions from those answers: `gpus.decide` (the
GPU check), `venv.plan` and the wanted generation against the live one (Environments), the applied patch
files against the set's manifest (what `patches.applied` compares), `models.drift` (staging),
`units.render_unit` against the unit file's sha1 (what `unit_file.written` compares), `lifecycle.steps`
(reload, enable, start, restart), `placement.leftovers` and `models.unused` (Cleanup). Not covered, because
they are decided only while a deploy runs or from facts it reads only then: the API key files, the service
account, the boot staging unit, the models' store copies, the preflight, and whether a restart's readiness
gate passes (COVERS says so wherever the column is shown).
"""

from __future__ import annotations

import hashlib
import json
import socket

from pyinfra.api import FactBase
from pyinfra.facts.files import File, Sha1File

from operations import gpus, host_reads, lifecycle, lock, models, patches, placement, readiness, remote, units, venv
from operations.pyinfra_adapter import real_host
from operations.service_user import gpu_device_groups

COVERS = (
    "DEPLOY WOULD covers the GPU check, venv generations (fast check), patch sets, staged models (fast check), "
    "unit files, start/restart/enable/reload and removals of unplaced units and models; not API key files, the "
    "service account, the boot staging unit, store copies or the preflight."
)
class StatusProbe(FactBase):
    """``{"lock": {"who", "pid", "since", "control"} | None}``: the deploy lock's holder, read by the lock's own
    script (`lock_host.py peek`, which only reads); the token that lets its owner give it back is not kept."""

    def command(self) -> str:
        return remote.command("lock_host", "peek")

    def process(self, output):
        holder = json.loads(output[-1]).get("held_by")
        if holder is None:
            return {"lock": None}
        return {"lock": {k: holder.get(k) for k in ("who", "pid", "since", "control")} if isinstance(holder, dict) else {"who": "unknown"}}


# -- pure pieces ------------------------------------------------------------------------------


def health_answer(state: dict | None) -> dict:
    """A service's /health as the row shows it, from the deploy's ServiceState read (service_state.py times it)."""
    if state is None:
        return {"status": None, "latency_ms": None, "error": "unit state not read"}
    status = state.get("health")
    error = state.get("health_error") or (None if status is not None else "nothing answers")
    return {"status": status, "latency_ms": state.get("health_ms"), "error": error}


def patch_state(patch_set: patches.PatchSet, installed: dict | None) -> dict:
    """What `patches.applied` would find: applied (every file and the record as the set says) or what drifted."""
    if not installed:
        return {"name": patch_set.name, "applied": False, "drifted": [], "note": "not read (the generation is not built)"}
    if installed.get("version") != patch_set.version:
        found = installed.get("version") or "(not installed)"
        return {"name": patch_set.name, "applied": False, "drifted": [],
                "note": f"{patch_set.distribution} {found} in the venv, the set is for {patch_set.version}"}
    drifted = []
    for f in patch_set.files:
        found = (installed.get("files") or {}).get(f.path)
        if found == f.sha256:
            continue
        if found is None:
            drifted.append(f"{f.path} missing")
        elif found == f.original:
            drifted.append(f"{f.path} is the original (not applied)")
        else:
            drifted.append(f"{f.path} changed on the host (sha256 {found[:12]})")
    if installed.get("record") != patches.applied_record(patch_set):
        drifted.append("applied-state record differs")
    return {"name": patch_set.name, "applied": not drifted, "drifted": drifted, "note": None}


def gpu_rows(facts: gpus.GpuFacts | None, indexes: tuple[int, ...] | None = None) -> list[dict]:
    """The GPUs (all, or those of `indexes`) as rows: memory, health, and processes no unit of ours runs."""
    if facts is None or facts.error:
        return []
    ours = {pid for unit in facts.units.values() for pid in unit.pids}
    by_index = facts.by_index()
    out = []
    for index in (indexes if indexes is not None else sorted(by_index)):
        gpu = by_index.get(index)
        if gpu is None:
            out.append({"index": index, "name": None, "missing": True, "healthy": False,
                        "problems": [f"not listed by nvidia-smi{' (cannot reach ' + ', '.join(facts.missing) + ')' if facts.missing else ''}"],
                        "memory_used_mib": None, "memory_total_mib": None, "foreign": []})
            continue
        foreign = [f"pid {a.pid}" + (f" {a.used_mib} MiB" if a.used_mib is not None else "")
                   for a in facts.apps if a.gpu_uuid == gpu.uuid and a.pid not in ours]
        out.append({"index": gpu.index, "name": gpu.name, "missing": False, "healthy": gpu.healthy,
                    "problems": list(gpu.problems), "memory_used_mib": gpu.memory_used_mib,
                    "memory_total_mib": gpu.memory_total_mib, "foreign": foreign})
    return out


def service_changes(state: dict, unit_path: str, unit_changed: bool, inputs_changed: bool) -> list[str]:
    """The unit's lifecycle steps (`lifecycle.steps`) in words."""
    steps = lifecycle.steps(state, unit_path, unit_changed, inputs_changed)
    words = []
    if steps.reload:
        words.append("daemon-reload")
    if steps.enable:
        words.append("enable the unit")
    if steps.start:
        words.append("start the service")
    if steps.restart:
        newer = ", ".join(state.get("newer") or [])
        words.append("restart the service" + (f" ({newer} changed since it started)" if newer else ""))
    elif steps.record and not steps.start:
        words.append("record what the running process was started with")
    return words


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


def read_host(state, host, config, stack, patch_sets: dict, watched: dict[str, tuple[str, ...]]) -> list[dict]:
    """`host`'s rows: one per placed service, or one for the host when none is placed.

    `watched`: service name -> the paths its process loads (deploys/service.py `watched_inputs`), the
    arguments the deploy reads `ServiceState` with (so the answer comes from the same read).
    """
    host = real_host(host)  # the Host itself: pyinfra's `host` names it only in the greenlet loading this file
    lock.send_without_delay(host)  # each command otherwise waits for a delayed ACK (operations/lock.py)
    lock.watch_connection(host)  # a host that stops answering is dropped within seconds, not waited for
    digest = repr(config)
    # The status keeps nothing on the control machine: what it asks is not saved as the next read set.
    host_reads.prepare(state, host, config_digest=digest, keep_read_set=False)
    # Our own small reads go into the host's one read, beside the deploy's facts: the lock's holder, and where
    # nothing is placed (the deploy reads no GPUs there), the GPUs. /health and its latency come with the deploy's
    # own ServiceState read.
    also = [(StatusProbe, {})] + ([(gpus.GpuState, {"models": ()})] if not config.services else [])
    host_reads.install(state, host, config_digest=digest, also=tuple(also))
    probe = _fact(host, StatusProbe)
    bare_gpus = _fact(host, gpus.GpuState, models=()) if not config.services else None
    return _rows(host, config, stack, patch_sets, watched, probe, bare_gpus)


def _rows(host, config, stack, patch_sets, watched, probe, bare_gpus) -> list[dict]:
    problems_host: list[str] = []
    # GPUs: the GPU check's own decision (gpu: auto resolved, refusals) from the same fact the deploy reads.
    if config.services:
        paths = sorted({m.store_path for s in config.services for m in s.models})
        gpu_facts = _fact(host, gpus.GpuState, models=paths)
    else:
        gpu_facts = bare_gpus
    facts = gpu_facts if _ok(gpu_facts) else None
    if isinstance(gpu_facts, _Unread):
        problems_host.append(gpu_facts.why)
    decisions = gpus.decide(config, facts, stack.wanted().get("sglang")) if config.services else gpus.GpuDecisions(config)
    resolved = decisions.config
    host_gpus = gpu_rows(facts)
    gpu_error = (facts.error if facts is not None and facts.error else None) or (
        None if facts is not None else "GPUs not read")

    probe_answer = probe
    lock_holder = probe_answer.get("lock") if isinstance(probe_answer, dict) else None
    if not isinstance(probe_answer, dict):
        problems_host.append("the deploy lock's holder was not read")

    host_changes: list[str] = []
    units_found = _fact(host, placement.ManagedUnits)
    if _ok(units_found):
        for unit in placement.leftovers(units_found, [s.unit_name for s in config.services]):
            host_changes.append(f"remove {unit} (no longer placed here, once it answers elsewhere)")
    owned = _fact(host, models.OwnedInShm, shm_dir=config.shm_dir)
    if _ok(owned):
        for entry in models.unused(owned.get("owned") or {}, [m.name for m in config.staged_models]):
            host_changes.append(f"release {config.shm_dir}/{entry}")

    # Environments: the wanted generation against the live one, and what a fast check finds in it.
    env_state: dict[str, dict] = {}
    for env in config.environments:
        gen = venv.generation(env.path, stack, {name: patch_sets[name].digest for name in env.patch_sets})
        found = _fact(host, venv.VenvState, live=gen.live, wanted=gen.path, host_cache=config.host_wheel_cache, verify="fast")
        changes, live = [], None
        if not _ok(found):
            changes.append(f"venv {env.path} not read ({getattr(found, 'why', 'no answer')})")
        else:
            live_target = (found.get("live") or {}).get("target")
            live = live_target.rsplit("/", 1)[-1] if live_target else None
            wanted = found.get("wanted")
            if found.get("untrusted"):
                changes.append(f"refuse the host: {found['untrusted'][0]}")
            if wanted is None:
                changes.append(f"build generation {gen.id}")
            else:
                changes += venv.plan(stack, wanted).reasons
                if wanted.get("index") in venv.INDEX_REWRITTEN:
                    changes.append(f"write generation {gen.id}'s RECORD index ({wanted['index']})")
            if live_target != gen.path:
                changes.append(f"switch {env.path} to generation {gen.id} (live: {live or 'none'})")
        patch_rows = []
        for name in env.patch_sets:
            patch_set = patch_sets[name]
            installed = None
            if _ok(found) and found.get("wanted") is not None:
                installed = _fact(
                    host, patches.InstalledFiles, site_packages=f"{gen.path}/{stack.site_packages}",
                    distribution=patch_set.distribution, backup_dir=patches._backup_dir(gen.path, name),
                    record=patches._record_path(gen.path, name), paths=tuple(f.path for f in patch_set.files),
                )
            row = patch_state(patch_set, installed if _ok(installed) else None)
            patch_rows.append(row)
            if not row["applied"] and (found and _ok(found) and found.get("wanted") is not None):
                changes.append(f"apply patch set {name} ({'; '.join(row['drifted']) or row['note']})")
        env_state[env.path] = {"gen": gen, "live": live, "changes": changes, "patches": patch_rows}

    # Staged models: the staging's own drift decision, on the fast check.
    model_state: dict[str, dict] = {}
    for model in config.staged_models:
        found = _fact(host, models.StagedModel, src=model.store_path, dest=model.load_path, verify=config.verify_models)
        why = models.drift(found) if _ok(found) else f"not read ({getattr(found, 'why', 'no answer')})"
        model_state[model.name] = {"name": model.name, "location": "shm", "verified": why is None, "why": why}

    device_groups = gpu_device_groups(config.service_user) if config.services else ()
    rows = []
    for service in resolved.services:
        rows.append(_service_row(host, resolved, service, stack, patch_sets, watched.get(service.name, ()), env_state,
                                 model_state, decisions, facts, host_gpus, device_groups, host_changes))
    if not rows:
        bad_gpus = [g for g in host_gpus if not g["healthy"]]
        rows.append({
            "host": host.name, "reachable": True, "service": None, "lock": lock_holder,
            "gpus": host_gpus, "host_gpus": host_gpus, "gpu_error": gpu_error if gpu_error != "GPUs not read" else None,
            "changes": host_changes, "healthy": not bad_gpus and not problems_host,
            "problems": problems_host + [f"GPU {g['index']}: {'; '.join(g['problems'])}" for g in bad_gpus],
        })
    else:
        for row in rows:
            row["lock"] = lock_holder
            row["problems"] = problems_host + row["problems"]
            row["healthy"] = row["healthy"] and not problems_host
        rows[0]["changes"] = rows[0]["changes"] + [c for c in host_changes if c not in rows[0]["changes"]]
    return rows


def _service_row(host, config, service, stack, patch_sets, watched, env_state, model_state, decisions, facts,
                 host_gpus, device_groups, host_changes) -> dict:
    problems, changes = [], []
    mine = [e for e in decisions.errors if e.startswith(f"{service.name}:")]
    changes += [f"refuse the host (GPU check): {e}" for e in mine]
    # The GPU check's warnings (engine advisories that hold here, little KV room): shown, not a verdict.
    warned = [w.split(": ", 1)[1] for w in decisions.warnings if w.startswith(f"{service.name}: ")]
    env = env_state[service.environment.path]
    changes += env["changes"]
    staged = [model_state[m.name] for m in service.models if m.location == "shm"]
    store = [{"name": m.name, "location": "store", "verified": None, "why": "loaded from the store (not staged)"}
             for m in service.models if m.location == "store"]
    for m in staged:
        if not m["verified"]:
            changes.append(f"stage model {m['name']} ({m['why']})")

    unit_path = service.unit_path
    unit_changed = False
    if not mine:  # a unit is written only once the GPU check passes (its GPU is then decided)
        digests = {name: patch_sets[name].digest for name in service.patch_sets}
        boot = models.boot_unit_name(config) if any(m.location == "shm" for m in service.models) else None
        text = units.render_unit(config, service, stack, units.inputs_digest(stack, digests),
                                 after_units=(boot,) if boot else (), supplementary_groups=device_groups)
        found = _fact(host, File, path=unit_path)
        same = _ok(found) and _fact(host, Sha1File, path=unit_path) == hashlib.sha1(text.encode()).hexdigest()
        if not same:
            unit_changed = True
            changes.append(f"write {unit_path}" + (" (differs from the data)" if _ok(found) else " (absent)"))
    state = _fact(host, readiness.ServiceState, unit=service.unit_name, address=readiness.probe_address(service.bind),
                  port=service.port, inputs=watched)
    unit = pid = uptime = restarts = None
    running = False
    if _ok(state):
        unit = {k: state.get(k) for k in ("load", "active", "sub", "enabled")}
        pid, uptime, restarts = state.get("pid") or None, state.get("uptime_s"), state.get("restarts")
        running = state.get("active") == "active" and state.get("sub") in lifecycle.RUNNING
        inputs_changed = unit_changed or bool(env["changes"]) or any(not m["verified"] for m in staged)
        changes += service_changes(state, unit_path, unit_changed, inputs_changed)
    else:
        problems.append(f"unit state not read ({getattr(state, 'why', 'no answer')})")
    answer = health_answer(state if _ok(state) else None)
    if not running:
        problems.append(f"unit {service.unit_name} is {(unit or {}).get('active') or '?'}/{(unit or {}).get('sub') or '?'}")
    if answer["status"] != 200:
        problems.append(f"/health answers {answer['status'] or answer['error'] or 'nothing'}")
    gpu_list = gpu_rows(facts, service.gpus) if facts is not None else []
    for g in gpu_list:
        if not g["healthy"]:
            problems.append(f"GPU {g['index']}: {'; '.join(g['problems'])}")
    if facts is None or facts.error:
        problems.append(f"GPUs: {facts.error if facts is not None else 'not read'}")
    return {
        "host": host.name, "reachable": True, "service": service.name, "port": service.port,
        "unit_name": service.unit_name, "unit": unit, "pid": pid, "uptime_s": uptime, "restarts": restarts,
        "health": answer, "gpus": gpu_list, "host_gpus": host_gpus, "gpu_error": None,
        "generation": {"stack": stack.name, "wanted": env["gen"].id, "live": env["live"], "venv": service.environment.path},
        "patch_sets": [p for p in env["patches"] if p["name"] in service.patch_sets],
        "models": staged + store, "changes": list(dict.fromkeys(changes)),
        "healthy": not problems, "problems": problems, "warnings": warned,
    }


def unreachable_reason(address: str, port: int, timeout_s: float = 1.5) -> str:
    """Why pyinfra could not connect to a host SSH reaches at `address`:`port` (its validated `ssh_address`), as far as
    one TCP connect to that port says (bounded)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return f"SSH to {address}:{port} failed (the port answers: see pyinfra's error above: keys, host key, user)"
    except socket.timeout:
        return f"no answer from {address}:{port} within {timeout_s:g} s"
    except OSError as exc:
        return f"{address}:{port}: {exc.strerror or exc}"
