"""The ABI probe: a generation proven able to serve before it is switched in (`probed`), with the
probe's arguments (`probe_for`), the sandbox it runs in and root's compile of what it imported
(`probe_command`); the probe itself is on_host/abi_probe.py.

Separate from the build (venv.py) because it runs the engine's code, never as root: its sandbox
and what root does with its answer are this module's one concern.
"""

from __future__ import annotations

import json
import shlex

from configuration.stacks import Stack
from operations import remote
from operations.environment import transient
from operations.environment.venv_read import Generation
from operations.run.host_reads import operation


def probe_for(stack: Stack, launcher: str, gpu_args: dict) -> dict:
    """The ABI probe's arguments: the GPUs' (`gpus.GpuDecisions.probe_args`), the stack's kernel
    distributions, and the modules to import (the unit's launcher, and sglang's server entry point
    when the stack has sglang)."""
    modules = [launcher, "sglang.launch_server"] if "sglang" in stack.wanted() else [launcher]
    return {
        **gpu_args,
        "kernels": [p.name for p in stack.packages if p.name in ("sgl-kernel", "sglang-kernel")],
        "modules": list(dict.fromkeys(modules)),
        "torch": "torch" in stack.wanted(),
    }


@operation()
def probed(gen: Generation, probe: dict):
    """
    Run the ABI probe in generation ``gen``: it prints one line and fails the host when the
    environment cannot work (operations/environment/on_host/abi_probe.py).

    + gen: the `Generation` built by `venv.environment`
    + probe: the probe's arguments (kernel distributions, entry point modules, the driver's
      CUDA version and the GPUs' compute capabilities)

    Run it with ``_if`` set to "the generation or its patch sets changed, or it is not live yet".

    It imports the engine, so it runs as the preflight does, never as root: in a transient unit of
    its own, as a dynamic user (the service account may not exist yet: it is made after the
    environments), in the services' sandbox, with the generation bound read-only into an empty
    home and nothing of the caller's environment (`probe_command`).
    """
    yield probe_command(gen, probe)


# The sandbox the ABI probe runs in: the service unit's protections, with a throwaway user.
PROBE_SANDBOX = ("DynamicUser=yes", "ProtectHome=tmpfs", "ProtectSystem=strict", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=", "RestrictSUIDSGID=yes",
                 "UMask=0077")
PROBE_TIMEOUT_S = 600


# Root's half, after the probe: the bytecode of the sources the probe imported, written into the
# generation (which the service user cannot write), so that a service's start reads what was
# compiled here instead of compiling the engine from source at every start. argv: the generation;
# stdin: the probe's list. Only compiling, never importing (`-S`: not even site-packages' .pth
# files run), and only regular `.py` files inside the generation that root owns and no one else may
# write; a path the probe names elsewhere is skipped. As the import system writes bytecode: only
# where none is current for the source's mtime (compileall's own check), so a probe run again does
# not compile a source edited in place with its mtime kept over the bytecode the engine still runs
# (the venv check finds such an edit by its digest, tests/lab/test_convergence.py).
COMPILE_IMPORTED = """
import compileall, os, stat, sys
top = os.path.realpath(sys.argv[1]) + os.sep
compiled = 0
for line in sys.stdin:
    real = os.path.realpath(line.rstrip("\\n"))
    if not real.startswith(top) or not real.endswith(".py") or compiled >= 100000:
        continue
    try:
        st = os.lstat(real)
    except OSError:
        continue
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        continue
    try:
        compiled += compileall.compile_file(real, quiet=2)
    except OSError:
        pass
"""
IMPORTED_MARK = "SGLANG-DEPLOY-IMPORTED "


def probe_command(gen: Generation, probe: dict) -> str:
    """The probe in its transient unit, its output but the list of what it imported passed on; once
    it passed, root compiles that list (COMPILE_IMPORTED)."""
    run = transient.command(
        [*PROBE_SANDBOX, f"BindReadOnlyPaths={gen.path}"],
        {"PATH": transient.SYSTEM_PATH, "HOME": "/tmp"},
        [gen.python, "-I", "-", json.dumps(probe, sort_keys=True)],
        f"ABI probe of generation {gen.id}", PROBE_TIMEOUT_S)
    compile_ = remote.isolated(shlex.quote(gen.python),
                               f"-S -c {shlex.quote(COMPILE_IMPORTED)} {shlex.quote(gen.path)}")
    # time bound: the probe's own (RuntimeMaxSec); compiling is bounded by the list's length.
    return (f"cd / && probe_out=$({run} <<'PYEOF'\n{remote.script('abi_probe')}\nPYEOF\n); "
            f"probe_rc=$?; printf '%s\\n' \"$probe_out\" | grep -v '^{IMPORTED_MARK}'; "
            f"[ $probe_rc -eq 0 ] || exit $probe_rc; "
            f"printf '%s\\n' \"$probe_out\" | sed -n 's/^{IMPORTED_MARK}//p' | {compile_}")
