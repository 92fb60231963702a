"""One host's plan, from its one read: every step's decision, asked of the functions the operations
decide with.

`plan_host` reads each fact with the very arguments the step's operation reads it with (so every
answer comes from the host's one batched read, operations/host_reads.py) and asks the same pure
decision the operation asks: `gpus.decide` (GPU check), `directory.fixes`, `venv.plan`,
`patches.drift`, `venv.INDEX_REWRITTEN` and the live link (Environments), `transfer.StoreListing`,
`models.unused`, `models.stage_reason`, `models.boot_stale` (Models), `service_user.device_access`,
`not_dedicated`, `account_fixes` (Service account), `secrets.key_file_differs`, `unit_file.differs`,
`lifecycle.steps` and `/health` (Service), `placement.leftovers` (Cleanup).

Readers: deploy.py (a host whose plan is empty gets no step operations at all: the read decided it),
the status view (its "deploy would" column is this plan's changes), `--dry` and the JSON plan
(report/plan_view.py). What one step changes feeds the next: a service restarts when its unit, its
venv, its staged models or its key file change, as `lifecycle.running` decides once those operations
ran.
"""

from __future__ import annotations

from typing import Callable

from pyinfra.facts.files import Directory, File, FileContents, Sha1File
from pyinfra.facts.server import Groups

from configuration.host_paths import SECRETS_DIR
from configuration.secrets import config_path
from operations import (
    directory,
    lifecycle,
    models,
    patches,
    placement,
    readiness,
    rollback,
    secrets,
    transfer,
    unit_file,
    units,
    venv,
)
from operations.plan import HostPlan
from operations.service_user import (
    NOLOGIN,
    Account,
    AccountStanding,
    GpuDevices,
    account_fixes,
    device_access,
    group_of,
    not_dedicated,
)
from operations.service_user import STATE_DIR as ACCOUNT_HOME

GPU, ENVS, MODELS, ACCOUNT, SERVICE, CLEANUP = ("GPU check", "Environments", "Models",
                                                "Service account", "Service", "Cleanup")


class Unread(Exception):
    """A fact the host did not answer: nothing that depends on it can be planned."""


def watched_inputs(service, unit_path: str) -> tuple[str, ...]:
    """The host paths the service's process loads besides its code: unit file, venv link, staged
    models' markers, key file. Their content at each (re)start is recorded; a later difference means
    restart."""
    paths = (unit_path, service.environment.path)
    paths += tuple(f"{m.load_path}/{models.MARKER}" for m in service.models if m.location == "shm")
    return paths + ((service.config_file,) if service.config_file else ())


def unit_text(config, service, stack, patch_sets: dict, device_groups: tuple[str, ...]) -> str:
    """The unit the deploy writes for `service` (its GPU decided): the same text for the operation
    and the plan."""
    digests = {name: patch_sets[name].digest for name in service.patch_sets}
    staging = (models.boot_unit_name(config)
               if any(m.location == "shm" for m in service.models) else None)
    return units.render_unit(config, service, stack, units.inputs_digest(stack, digests),
                             after_units=(staging,) if staging else (),
                             supplementary_groups=device_groups)


def plan_host(name: str, decisions, stack, patch_sets: dict, read: Callable,
              verify_env: str | None = None) -> HostPlan:
    """The host's plan. `decisions`: the GPU check's (`gpus.GpuDecisions`, its config with `auto`
    resolved); `read(Fact, **arguments)`: the host's answer (raises on a failed read); `verify_env`:
    how the venv is checked (the data's `verify_env`; the status view's fast check passes
    "fast")."""
    config = decisions.config
    plan = HostPlan(name)

    def ask(fact, **kwargs):
        try:
            return read(fact, **kwargs)
        except Exception as exc:  # a failed read: named in the plan, never a traceback
            plan.unread.append(f"{fact.__name__}: {exc}")
            raise Unread from exc

    for error in decisions.errors:
        service = decisions.service_of(error)
        if service:
            plan.add(GPU, f"service {service}", "refuse", error.split(": ", 1)[-1], service=service)
        else:
            plan.add(GPU, "this host", "refuse", error)
    changed: dict[str, bool] = {}  # what a service loads -> whether this run changes it
    for step in (_environments, _models, _account):
        try:
            step(plan, config, stack, patch_sets, ask, changed, verify_env or config.verify_env)
        except Unread:
            pass
    refused = {c.service for c in plan.refusals if c.step == GPU}
    device_groups = ()
    if config.services:
        try:
            device_groups, _ = device_access(ask(GpuDevices), config.service_user)
        except Unread:
            pass
    for service in config.services:
        if service.name in refused:
            continue  # its unit is written only once the GPU check passes (its GPU is then decided)
        try:
            _service(plan, config, service, stack, patch_sets, device_groups, ask, changed)
        except Unread:
            pass
    try:
        units_found = ask(placement.ManagedUnits)
        for unit in placement.leftovers(units_found or {}, [s.unit_name for s in config.services]):
            plan.add(CLEANUP, unit, "delete",
                     "no longer placed here (stopped once it answers where it is placed)",
                     service=placement.service_of(unit))
    except Unread:
        pass
    return plan


def _speculative_words(spec: dict | None) -> str:
    """What a speculative service's gate asks beyond serving (readiness.speculative_check)."""
    if not spec:
        return ""
    asks = ([f"its greedy tokens against its target's ({spec['tokens']} per probe)"]
            if spec["lossless"] else [])
    asks += [f"an accept length of at least {spec['min_accept']}"] if spec["min_accept"] else []
    return "; " + " and ".join(asks)


def _directory(plan: HostPlan, step: str, path: str, found, mode: str, user: str,
               group: str) -> bool:
    if found is False:
        plan.add(step, path, "refuse",
                 "exists and is not a directory: move it away, then run again")
        return True
    todo = directory.fixes(found, mode, user, group)
    if todo:
        why = ("absent" if "create" in todo
               else f"{found.get('mode')} {found.get('user')}:{found.get('group')}, wanted {mode} "
                    f"{user}:{group}")
        plan.add(step, path, "create" if "create" in todo else "update", why)
    return bool(todo)


def _environments(plan, config, stack, patch_sets, ask, changed, verify) -> None:
    for path in (rollback.STATE_DIR, rollback.RECORD_DIR, rollback.BACKUP_DIR):
        found = ask(Directory, path=path)
        if config.environments or found is not None:
            _directory(plan, ENVS, path, found, "700", "root", "root")
    for env in config.environments:
        gen = venv.generation(env.path, stack,
                              {name: patch_sets[name].digest for name in env.patch_sets})
        facts = ask(venv.VenvState, live=gen.live, wanted=gen.path,
                    host_cache=config.host_wheel_cache, verify=verify)
        before = len(plan.changes)
        if facts is None:
            plan.unread.append(f"venv {env.path}: no answer")
            continue
        if facts.get("untrusted"):
            plan.add(ENVS, env.path, "refuse", facts["untrusted"][0])
            continue
        wanted = facts.get("wanted")
        if wanted is None:
            plan.add(ENVS, f"generation {gen.id}", "create",
                     f"stack {stack.name} with {', '.join(env.patch_sets) or 'no patch sets'}")
        elif not venv.python_matches(stack, wanted):
            plan.add(ENVS, gen.path, "refuse",
                     f"holds Python {wanted['python']}, stack {stack.name} needs {stack.python}")
        else:
            for reason in venv.plan(stack, wanted).reasons:
                plan.add(ENVS, f"generation {gen.id}", "update", reason)
            if wanted.get("index") in venv.INDEX_REWRITTEN and len(plan.changes) == before:
                # A cache of what the RECORDs say: rewriting it changes nothing the services run (no
                # probe, no restart).
                plan.add(ENVS, f"generation {gen.id}'s RECORD index", "update",
                         venv.INDEX_REWRITTEN[wanted["index"]])
                before += 1
            for name in env.patch_sets:
                patch_set = patch_sets[name]
                installed = ask(patches.InstalledFiles, **patches.read_arguments(
                    patch_set, gen.path, f"{gen.path}/{stack.site_packages}"))
                found = patches.drift(patch_set, installed)
                if not found["applied"]:
                    plan.add(ENVS, f"patch set {name} in generation {gen.id}", "update",
                             "; ".join(found["drifted"]) or found["note"])
        live_target = (facts.get("live") or {}).get("target")
        if live_target != gen.path:
            plan.add(ENVS, f"generation {gen.id}", "check", "the ABI probe, before it goes live")
            live = live_target.rsplit("/", 1)[-1] if live_target else "none"
            plan.add(ENVS, env.path, "update", f"switch to generation {gen.id} (live: {live})")
        elif len(plan.changes) > before:
            plan.add(ENVS, f"generation {gen.id}", "check", "the ABI probe, after the change")
        changed[env.path] = len(plan.changes) > before


def _models(plan, config, stack, patch_sets, ask, changed, verify) -> None:
    for model in config.store_models:
        if ask(transfer.StoreListing, path=model.store_path):
            continue
        source = config.model_sources.get(model.name)
        if source is None:
            plan.add(MODELS, model.store_path, "refuse",
                     f"model {model.name} is not in the store and `model_sources` names no host to "
                     "stream it from")
        else:
            plan.add(MODELS, model.store_path, "create", f"stream model {model.name} from {source}")
        changed[f"store:{model.name}"] = True
    owned = ask(models.OwnedInShm, shm_dir=config.shm_dir)
    for entry in models.unused(owned.get("owned") or {},
                               [*(m.name for m in config.staged_models),
                                *owned.get("in_units", [])]):
        plan.add(MODELS, f"{config.shm_dir}/{entry}", "delete",
                 "staged by us, used by no service on this host")
    for model in config.staged_models:
        reason = models.stage_reason(ask(models.StagedModel, **models.staged_read(
            model.store_path, model.load_path, config.verify_models)))
        if reason is not None:
            plan.add(MODELS, model.load_path, "update" if reason != "missing" else "create",
                     f"stage model {model.name}: {reason}")
            changed[f"shm:{model.name}"] = True
    wanted = models.boot_wanted(config)
    state = ask(models.BootStaging, paths=sorted(wanted), unit=models.BOOT_UNIT)
    if config.staged_models:
        for path in models.boot_stale(state, wanted):
            present = path in state["files"]
            plan.add(MODELS, path, "update" if present else "create",
                     "the boot unit's file differs from the data" if present else "absent")
        if not state["enabled"]:
            plan.add(MODELS, models.BOOT_UNIT, "enable", "stages the models again after a reboot")
    elif state["files"] or state["enabled"]:
        plan.add(MODELS, models.BOOT_UNIT, "delete", "no shm model is placed here")


def _account(plan, config, stack, patch_sets, ask, changed, verify) -> None:
    if not config.services:
        return
    user = config.service_user
    _, closed = device_access(ask(GpuDevices), user)
    if closed:
        plan.add(ACCOUNT, user, "refuse", f"cannot open {', '.join(closed)}")
    if user != "root":
        found = not_dedicated(user, ask(AccountStanding, user=user))
        if found:
            plan.add(ACCOUNT, user, "refuse",
                     f"not the services' own account: {'; '.join(f for f, _ in found)}")
        group = group_of(user)
        if group not in ask(Groups):
            plan.add(ACCOUNT, f"group {group}", "create", "a system group of the service user's")
        account = ask(Account, user=user)
        if account is None:
            plan.add(ACCOUNT, f"user {user}", "create", "a system user without a login shell")
        else:
            fixes = account_fixes(account, group, ACCOUNT_HOME, NOLOGIN)
            if fixes:
                plan.add(ACCOUNT, f"user {user}", "update",
                         ", ".join(f"{k} {account.get(k)}, wanted {v}" for k, v in fixes.items()))
    if any(s.config_file for s in config.services):
        group = group_of(user)
        _directory(plan, ACCOUNT, SECRETS_DIR, ask(Directory, path=SECRETS_DIR),
                   secrets.file_modes(group)[0], "root", group)


def _service(plan, config, service, stack, patch_sets, device_groups, ask, changed) -> None:
    name, unit_path = service.name, service.unit_path
    state = ask(secrets.SecretFileState, path=config_path(name))
    key_why = None
    if service.config_file:
        key_why = secrets.key_file_differs(
            state, secrets.key_file_digest(name, service.api_key, service.admin_api_key),
            group_of(config.service_user))
        if key_why:
            plan.add(SERVICE, config_path(name), "create" if state is None else "update",
                     key_why, service=name)
    elif state is not None:
        key_why = "the service has no API key in the data"
        plan.add(SERVICE, config_path(name), "delete", key_why, service=name)
    text = unit_text(config, service, stack, patch_sets, device_groups)
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
        plan.add(SERVICE, unit_path, "create" if found is None else "update", why, service=name,
                 diff=diff)
    inputs_changed = (
        unit_changed
        or key_why is not None  # the key file is one of the service's inputs (deploys/service.py)
        or changed.get(service.environment.path, False)
        or any(changed.get(f"{m.location}:{m.name}", False) for m in service.models)
    )
    if unit_changed or inputs_changed:
        plan.add(SERVICE, f"flags of {service.unit_name}", "check",
                 "the engine's own parser, before the unit is written", service=name)
    watched = watched_inputs(service, unit_path)
    state = ask(readiness.ServiceState, unit=service.unit_name,
                address=readiness.probe_address(service.bind), port=service.port, inputs=watched)
    if not isinstance(state, dict):
        plan.unread.append(f"{service.unit_name}: its state was not read")
        return
    steps = lifecycle.steps(state, unit_path, unit_changed, inputs_changed)
    unit = service.unit_name
    if steps.reload:
        plan.add(SERVICE, "systemd", "reload", f"{unit}'s file changed", service=name)
    if steps.enable:
        plan.add(SERVICE, unit, "enable",
                 f"it is {state.get('enabled') or 'not enabled'}", service=name)
    if steps.start:
        plan.add(SERVICE, unit, "start",
                 f"it is {state.get('active')}/{state.get('sub')}", service=name)
    elif steps.restart:
        newer = ", ".join(state.get("newer") or [])
        plan.add(SERVICE, unit, "restart", f"{newer} changed since it started" if newer
                                           else "what it loads changes in this run", service=name)
    elif steps.record:
        plan.add(SERVICE, f"record of what {unit} started with", "update",
                 "no record covers the running process", service=name)
    if steps.start or steps.restart:
        plan.add(SERVICE, f"readiness of {name}", "check",
                 "/health and a smoke completion after the (re)start"
                 + _speculative_words(readiness.speculative_check(service)), service=name)
    elif state.get("health") != 200 or state.get("active") != "active":
        answer = (state.get("stranger") or state.get("health_error")
                  or f"/health answers {state.get('health')}")
        plan.add(SERVICE, f"readiness of {name}", "check",
                 f"it runs but does not serve: {answer}", service=name)
