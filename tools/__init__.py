"""Control-machine command-line tools, not run by pyinfra: `python -m tools.wheelhouse` fills a
wheelhouse with a stack's pinned, sha256-checked files (the deploy's venv operations read a
wheelhouse through configuration/wheels.py, as this tool does), and `python -m tools.patchset_build`
writes a patch set's manifest from patched files and the pristine package."""
