"""The serving virtualenv: `venv.environment(path, stack, ...)` makes a venv hold exactly a stack.

Facts read the venv's Python version and every installed distribution (name, version
with its local tag, installer) in one remote call; only distributions that differ from
the stack are pushed and (re)installed, and distributions the stack does not name are
removed. A converged venv costs that one call.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, OperationError, operation
from pyinfra.operations import files

from operations import wheelhouse as wheelhouse_mod
from operations.stacks import Stack, normalize

# Installed with every venv by `python -m venv`; kept unless the stack pins them.
BOOTSTRAP = {"pip", "setuptools", "wheel"}

_LIST_DISTRIBUTIONS = r"""
import importlib.metadata as m, json, sys
out = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if not name:
        continue
    installer = (d.read_text("INSTALLER") or "").strip()
    out[name] = {"version": d.version, "installer": installer}
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "dists": out}))
"""


class VenvState(FactBase):
    """Python version and installed distributions of a venv, or None if there is no venv.

    Returns ``{"python": "3.11.2", "dists": {"torch": {"version": "2.11.0+cu130", "installer": "pip"}}}``
    with names PEP 503-normalised.
    """

    def command(self, path: str) -> str:
        python = shlex.quote(f"{path}/bin/python")
        return f"if [ -x {python} ]; then {python} -c {shlex.quote(_LIST_DISTRIBUTIONS)} || true; fi"

    def process(self, output):
        text = "\n".join(output).strip()
        if not text:
            return None
        data = json.loads(text)
        data["dists"] = {normalize(name): info for name, info in data["dists"].items()}
        return data


def plan(stack: Stack, state: dict | None) -> tuple[list[str], list[str]]:
    """Distributions to (re)install and to remove so that the venv holds exactly `stack`."""
    installed = {name: info["version"] for name, info in (state or {}).get("dists", {}).items()}
    install = [p.name for p in stack.packages if installed.get(p.name) != p.version]
    remove = sorted(set(installed) - set(stack.wanted()) - BOOTSTRAP)
    return install, remove


def python_matches(stack: Stack, state: dict | None) -> bool:
    return state is not None and state["python"].rsplit(".", 1)[0] == stack.python


@operation()
def environment(path: str, stack: Stack, wheelhouse: Path, host_cache: str, present: bool = True):
    """
    Make the venv at ``path`` hold exactly the distributions of ``stack``.

    + path: venv directory on the host
    + stack: the `Stack` to install (from `operations.stacks.load_stack`)
    + wheelhouse: control-machine directory holding the stack's wheels
    + host_cache: directory on the host where pushed wheels are kept
    + present: ``False`` removes the venv

    Exactness:
        Every distribution is installed ``--no-deps`` from a pinned file; versions are
        compared with their local tag (``2.11.0+cu130``), which pip's freeze-based
        checks drop. A venv built for another Python version is rebuilt.

    **Example:**

    .. code:: python

        venv.environment(
            name="Serving venv holds stack sglang-0.5.23-cu130",
            path="/root/venv_sglang",
            stack=load_stack("sglang-0.5.23-cu130"),
            wheelhouse=Path("wheelhouse"),
            host_cache="/var/cache/sglang-deploy/wheels",
        )
    """
    state = host.get_fact(VenvState, path=path)
    if not present:
        if state is None:
            host.noop(f"venv {path} is absent")
        else:
            yield f"rm -rf {shlex.quote(path)}"
        return

    python = f"python{stack.python}"
    if not python_matches(stack, state):
        found = "no venv" if state is None else f"Python {state['python']}"
        host.log(f"venv {path}: {found}, stack {stack.name} needs Python {stack.python}: building it")
        yield (
            f"command -v {python} >/dev/null || {{ echo '{python} not found on the host: stack {stack.name} needs it' >&2; exit 1; }}; "
            f"rm -rf {shlex.quote(path)} && {python} -m venv {shlex.quote(path)}"
        )
        state = None

    install, remove = plan(stack, state)
    if not install and not remove:
        host.noop(f"venv {path} holds stack {stack.name} ({len(stack.packages)} distributions)")
        return

    if install:
        packages = [p for p in stack.packages if p.name in install]
        try:
            local_files = wheelhouse_mod.locate(stack, wheelhouse, packages)
        except wheelhouse_mod.WheelhouseError as exc:
            raise OperationError(str(exc)) from None
        installed = (state or {}).get("dists", {})
        for name in install:
            was = installed.get(name, {}).get("version")
            want = stack.wanted()[name]
            host.log(f"venv {path}: {name} {was} -> {want}" if was else f"venv {path}: add {name} {want}")
        yield f"mkdir -p {shlex.quote(host_cache)}"
        remote = []
        for name, local in sorted(local_files.items()):
            dest = f"{host_cache}/{local.name}"
            yield from files.put._inner(src=str(local), dest=dest)
            remote.append(dest)
        pip = shlex.quote(f"{path}/bin/pip")
        yield (
            f"{pip} install --quiet --no-index --no-deps --force-reinstall --disable-pip-version-check "
            + " ".join(shlex.quote(r) for r in remote)
        )
    if remove:
        host.log(f"venv {path}: remove {', '.join(remove)} (not in stack {stack.name})")
        yield f"{shlex.quote(path + '/bin/pip')} uninstall --quiet --yes " + " ".join(remove)
