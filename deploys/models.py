"""Models: each model's durable copy in the store, and the copies the services load from the shm
dir.

A host that lacks a store copy (a host moved to) gets it streamed from the host that
`model_sources` names (operations/transfer.py); `shm` models are staged, verified, and staged
again at boot by a unit of their own (operations/models.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta

from operations import models as staging
from operations import transfer


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


@deploy("Models")
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
