"""Generate the engine's flag list (`files/engine_flags/<dist>-<version>[+<patch set>].json`) from
its real parser.

    # a venv (any Python the wheel supports) with the engine installed, e.g. the lab's:
    python -m tools.engine_flags generate /path/to/venv/bin/python
    python -m tools.engine_flags generate /path/to/venv/bin/python --patch-set ddtree-sample

`generate` runs operations/environment/on_host/engine_flags.py (it builds the parser exactly as
`prepare_server_args` does and prints its actions) with that Python; with `--patch-set` it
first overlays the set's files on a copy of the installed package. The files are read by
configuration/engine_flags.py, which resolves the data's `args` against them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from configuration.engine_flags import file_for
from configuration.patch_sets import load_patch_set
from operations import remote

USAGE = "usage: python -m tools.engine_flags generate VENV_PYTHON [--patch-set NAME]"


def dump(python: str, pythonpath: str | None = None) -> dict:
    """Run the dump script with `python` (a venv with the engine); return its JSON."""
    script = remote.script_path("engine_flags")
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([python, str(script)], capture_output=True, text=True,
                         env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the dump failed with {python}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def generate(python: str, patch_set: str | None = None) -> Path:
    """Write the flags file of the engine installed for `python` (with `patch_set` overlaid)."""
    pythonpath = None
    digest = None
    with tempfile.TemporaryDirectory() as tmp:
        if patch_set:
            ps = load_patch_set(patch_set)
            digest = ps.digest
            site = subprocess.run(
                [python, "-c",
                 "import sglang, os; print(os.path.dirname(os.path.dirname(sglang.__file__)))"],
                capture_output=True, text=True, check=True).stdout.strip()
            shutil.copytree(Path(site) / "sglang", Path(tmp) / "sglang")
            for f in ps.files:
                (Path(tmp) / f.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ps.local(f), Path(tmp) / f.path)
            pythonpath = tmp
        data = dump(python, pythonpath)
    if patch_set:
        data["patch_set"] = {"name": patch_set, "digest": digest}
    path = file_for(data["version"], patch_set)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    if (len(argv) not in (2, 4) or argv[0] != "generate"
            or (len(argv) == 4 and argv[2] != "--patch-set")):
        print(USAGE, file=sys.stderr)
        return 2
    print(generate(argv[1], argv[3] if len(argv) == 4 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
