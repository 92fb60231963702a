"""Models in RAM: `models.staged(src, dest)` keeps a verified copy of a model in the shm dir.

`/dev/shm` is a tmpfs: it is emptied on every reboot, and a half-finished copy there
looks like a model. A staged copy is therefore built in a temporary sibling, verified
file by file against the source, marked with a manifest (our ownership marker) and only
then renamed into place. The converged check compares file names and sizes with the
source and the manifest, without re-hashing.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FactBase, operation

from pyinfra.operations import files

from operations import remote
from operations.settings import HostConfig

MARKER = ".sglang-deploy-staged.json"


class StagedModel(FactBase):
    """Source listing, staged listing (``{relpath: size}`` or None), manifest and free bytes at the destination."""

    def command(self, src: str, dest: str) -> str:
        return remote.command("model_state", shlex.quote(src), shlex.quote(dest), MARKER)

    def process(self, output):
        return json.loads("\n".join(output))


def drift(state: dict) -> str | None:
    """Why the staged copy is not a verified copy of the source, or None if it is."""
    src, dest, marker = state["src"], state["dest"], state["marker"]
    if dest is None:
        return "not staged"
    if not marker or "files" not in marker:
        return "no staging manifest (not staged by us, or interrupted)"
    manifest_sizes = {rel: size for rel, (size, _sha) in marker["files"].items()}
    if manifest_sizes != src:
        return "source changed since staging"
    missing = sorted(set(src) - set(dest))
    if missing:
        return f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "")
    wrong = sorted(rel for rel in src if dest.get(rel) != src[rel])
    if wrong:
        return f"size differs: {', '.join(wrong[:3])}"
    extra = sorted(set(dest) - set(src))
    if extra:
        return f"unexpected files: {', '.join(extra[:3])}"
    return None


@operation()
def staged(src: str, dest: str):
    """
    Keep a verified copy of the model directory ``src`` at ``dest``.

    + src: the model's durable directory on the host (in the model store)
    + dest: where the service loads it from (in the shm dir)

    Staging:
        The copy is written to ``.<name>.partial`` beside ``dest``, each file's sha256 is
        checked against the source, a manifest is written and the directory is renamed
        into place; the source is only ever read. Free space is checked first.

    **Example:**

    .. code:: python

        models.staged(
            name="Stage Qwen3.6-27B into /dev/shm",
            src="/root/models/Qwen3.6-27B",
            dest="/dev/shm/Qwen3.6-27B",
        )
    """
    state = host.get_fact(StagedModel, src=src, dest=dest)
    if state["src"] is None:
        # Nothing to copy from: the stage script fails with the message that says so.
        reason = "source missing"
    else:
        reason = drift(state)
    if reason is None:
        host.noop(f"model {dest} is staged and matches {src}")
        return
    host.log(f"model {dest}: {reason}: staging from {src}")
    yield remote.command("stage_model", shlex.quote(src), shlex.quote(dest), MARKER)


def stage_for_host(config: HostConfig) -> dict:
    """Add the operations that stage every `shm` model of the host's services; name -> operation."""
    if not config.staged_models:
        return {}
    files.directory(name=f"Shm dir {config.shm_dir} exists", path=config.shm_dir, present=True)
    return {
        model.name: staged(
            name=f"Model {model.name} staged in {config.shm_dir}",
            src=model.store_path,
            dest=model.load_path,
        )
        for model in config.staged_models
    }
