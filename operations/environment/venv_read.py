"""What a generation is, and the one read of it: the serving venv's generations as the host holds
them (`VenvState`), and the refusal of a venv or wheel cache that root may not trust.

Separate from the decision (venv_decide.py) and the operations (venv.py) because every one of them,
the plan, the status view and a donor's read ask it, and it asks none of them: a generation's name
comes from its content alone, and the read is the host's, once per run.

Trust: root runs `<venv_path>/bin/python` and installs from `host_wheel_cache`. The venv fact also
says why any of them (the link and where it leads, the generations, the wheel cache, uv, each wheel,
and every directory above them) is not root's alone; the host then stops before anything runs from
them (`refuse_untrusted`). The switch adopts only a venv of root's, and never deletes what is not.

Facts read every installed distribution (name, version with its local tag, installer, and
the files its RECORD names that are damaged: `verify_env: fast` compares sizes, and hashes
files modified after the generation's install stamp; `full` compares every file's sha256
with RECORD) of the wanted and the live generation in one fact, which a converged host's one
read returns with the others (operations/run/host_reads.py). A damaged distribution is reinstalled
from its sha256-checked wheel, re-extracted (its uv cache entry is dropped first).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FactBase, OperationError

from configuration.stacks import Stack
from operations import remote
from operations.environment import installer as installer_mod
from operations.run import host_reads, read_batch
from operations.run.plan import Refusal

VERIFY_MODES = ("fast", "full")

@dataclass(frozen=True)
class Generation:
    """One exact environment: the stack's pins plus the patch sets applied in it."""

    live: str  # venv_path, the symlink units run
    id: str

    @property
    def path(self) -> str:
        return f"{self.live}.generations/{self.id}"

    @property
    def python(self) -> str:
        return f"{self.path}/bin/python"


def generation(live: str, stack: Stack, patch_digests: dict[str, str]) -> Generation:
    """The generation for `stack` with these patch sets (name -> digest, in the order applied)."""
    digest = hashlib.sha256(f"python {stack.python}\n".encode())
    for p in stack.packages:
        digest.update(f"{p.name}=={p.version} {p.sha256 or p.file or ''}\n".encode())
    for name, patch_digest in patch_digests.items():
        digest.update(f"patch {name} {patch_digest}\n".encode())
    return Generation(live, f"{stack.name}-{digest.hexdigest()[:10]}")



# Facts ---------------------------------------------------------------------------------


@read_batch.batched(slow=True)
class VenvState(FactBase):
    """The live link, the wanted and live generations' distributions, the host's wheel cache.

    ``{"live": {"kind": "link"|"dir"|"absent", "target": ...}, "wanted": VENV|None,
    "live_state": VENV|None, "cache": {file: size},
    "uv": bool, "machine": "x86_64"}`` where VENV is ``{"python": "3.11.2", "dists":
    {name: {"version", "installer", "damaged": [...], "damaged_count"}},
    "shared": {top: [dists]}}``.
    """

    def command(self, live: str, wanted: str, host_cache: str, verify: str = "fast") -> str:
        return _venv_script(live, wanted, host_cache, verify)

    def process(self, output):
        return json.loads("\n".join(output))


# What a fast check said of a generation's RECORD index (environment/on_host/venv_state.py) that the
# deploy writes again.
INDEX_REWRITTEN = {
    "missing": "missing (a generation from before the deploy wrote indexes, "
               "or one it did not finish)",
    "stale": "stale (written for other .dist-info files than the generation holds now, "
             "or unreadable)",
}


def _venv_script(live: str, wanted: str, host_cache: str, mode: str) -> str:
    """environment/on_host/venv_state.py with its arguments: a read (`fast`, `full`: the fact), or
    `write-index`."""
    return remote.command(
        "venv_state", shlex.quote(live), shlex.quote(wanted), shlex.quote(host_cache),
        shlex.quote(installer_mod.uv_binary(host_cache)), shlex.quote(mode),
    )


def index_command(gen: Generation, host_cache: str) -> str:
    """Write the generation's RECORD index (environment/on_host/venv_state.py `write-index`)."""
    return _venv_script(gen.live, gen.path, host_cache, "write-index")


def unread(what: str, where: str) -> OperationError:
    """A fact that came back empty: pyinfra has already failed the host (its connection dropped, or
    the command died)."""
    return OperationError(
        f"{host.name}: could not read {what} ({where}): the connection dropped or the command "
        "failed (pyinfra's error above says which); nothing was changed on the host by this step: "
        "run the deploy again once it answers"
    )


def state_of(gen: Generation, host_cache: str, verify: str = "fast") -> dict:
    # the data's `verify_env` is validated before any host is touched
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, not {verify!r}")
    facts = host_reads.get(host, VenvState, live=gen.live, wanted=gen.path,
                           host_cache=host_cache, verify=verify)
    if facts is None:
        raise unread("the serving venv", gen.live)
    refuse_untrusted(facts, gen, host_cache)
    return facts


def refuse_untrusted(facts: dict, gen: Generation, host_cache: str) -> None:
    """Stop the host before anything runs from a venv, or installs from a wheel cache, that another
    user could have written or swapped (environment/on_host/venv_state.py: `untrusted`)."""
    found = facts.get("untrusted") or []
    if found:
        raise Refusal(
            f"root runs {gen.live}/bin/python and installs from {host_cache}, so "
            "they, what they hold and every directory above them must be root's and writable by "
            f"root alone: {'; '.join(found[:3])}"
            f"{f' (and {len(found) - 3} more)' if len(found) > 3 else ''}. "
            "Nothing was run or changed: make them root's (chown root:, chmod go-w), or set "
            "venv_path / host_wheel_cache to a place only root can write"
        )

