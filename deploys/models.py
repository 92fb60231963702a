"""Models: each model's durable copy in the store, and the copies the services load from the shm
dir.

A host that lacks a store copy (a host moved to) gets it streamed from the host that
`model_sources` names (operations/model/transfer.py); `shm` models are staged, verified, and staged
again at boot by a unit of their own (operations/model/models.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta

from deploys.planning import Reading
from operations.model import models as staging
from operations.model import transfer
from operations.run.plan import Refusal

STEP = "Models"


@dataclass(frozen=True)
class ModelCopies:
    """Model name -> the operation that made its store copy, and its staged copy (shm models
    only)."""

    store: dict[str, OperationMeta]
    staged: dict[str, OperationMeta]

    def named_of(self, service) -> list[tuple[str, OperationMeta, bool]]:
        """The operations whose change means `service` loads other model files, as `this_run.Inputs`
        names them: (what the operation makes, it, conditional)."""
        ops = [(f"model {m.name} staged", self.staged[m.name], False) for m in service.models
               if m.name in self.staged]
        return ops + [(f"model {m.name} in the store", self.store[m.name], False)
                      for m in service.models if m.location == "store"]


def plan(reading: Reading) -> None:
    """Store copies to stream (`transfer.stream_from`), staged copies no service uses
    (`staging.unused`), copies to stage (`staging.stage_reason`), the boot unit (`boot_stale`):
    each decided as the step's operations decide it, from the same read."""
    config, plan_, ask, changed = reading.config, reading.plan, reading.ask, reading.changed
    for model in config.store_models:
        if ask(transfer.StoreListing, path=model.store_path):
            continue
        source = config.model_sources.get(model.name)
        try:
            transfer.stream_from(model.name, model.store_path, source,
                                 config.peer_stores.get(source), plan_.host)
        except Refusal as refusal:
            plan_.refuse(STEP, refusal, model.store_path)
        else:
            plan_.add(STEP, model.store_path, "create", f"stream model {model.name} from {source}")
        changed[f"store:{model.name}"] = True
    owned = ask(staging.OwnedInShm, shm_dir=config.shm_dir)
    for entry in staging.unused(owned.get("owned") or {},
                                [*(m.name for m in config.staged_models),
                                 *owned.get("in_units", [])]):
        plan_.add(STEP, f"{config.shm_dir}/{entry}", "delete",
                  "staged by us, used by no service on this host")
    for model in config.staged_models:
        reason = staging.stage_reason(ask(staging.StagedModel, **staging.staged_read(
            model.store_path, model.load_path, config.verify_models)))
        if reason is not None:
            plan_.add(STEP, model.load_path, "update" if reason != "missing" else "create",
                      f"stage model {model.name}: {reason}")
            changed[f"shm:{model.name}"] = True
    wanted = staging.boot_wanted(config)
    state = ask(staging.BootStaging, paths=sorted(wanted), unit=staging.BOOT_UNIT)
    if config.staged_models:
        for path in staging.boot_stale(state, wanted):
            present = path in state["files"]
            plan_.add(STEP, path, "update" if present else "create",
                      "the boot unit's file differs from the data" if present else "absent")
        if not state["enabled"]:
            plan_.add(STEP, staging.BOOT_UNIT, "enable", "stages the models again after a reboot")
    elif state["files"] or state["enabled"]:
        plan_.add(STEP, staging.BOOT_UNIT, "delete", "no shm model is placed here")


@deploy(STEP)
def models(config) -> ModelCopies:
    """Add the store copies and the staging; what each service's restart depends on."""
    store = {
        model.name: transfer.in_store(
            name=f"Model {model.name} in the store",
            model=model.name,
            path=model.store_path,
            source=config.model_sources.get(model.name),
            source_store=config.peer_stores.get(config.model_sources.get(model.name)),
        )
        for model in config.store_models
    }
    return ModelCopies(store=store, staged=staging.stage_for_host(config))
