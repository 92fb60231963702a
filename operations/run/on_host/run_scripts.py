"""Run several of our read-only remote scripts from one python start (stdlib only).

The host reads batch (operations/run/host_reads.py) sends this file with `run_all(PAYLOAD, IMPORTS,
EARLY)` appended: a zlib-compressed, base64 JSON list of [id, script body, argv]. Each script runs
as it would alone (`python3 - ARGS`: a fresh globals dict named __main__, its own sys.argv, its
stdout captured) in a child forked from this process, so the scripts share one interpreter start-up
and their imports (made here, before the forks), and run side by side on the host's CPUs (reading
two venvs' files takes two CPUs as long as one). Outputs are printed in job order, each after a
marker line that names its id and exit status.
"""

import base64
import contextlib
import importlib
import io
import json
import os
import sys
import zlib

MARK = "@@sglang-deploy-read"
# operations/remote/__init__.py: SHARED_MARK (tests/unit/test_host_reads.py keeps them equal)
SHARED_MARK = "#@@sglang-deploy-shared@@"


def _child(code, argv, out_fd):
    """In the forked child: run one script, write its stdout to out_fd, exit with its status."""
    captured = io.StringIO()
    status = 0
    sys.argv = ["-", *argv]
    try:
        with contextlib.redirect_stdout(captured):
            exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        if isinstance(stop.code, int):
            status = stop.code
        elif stop.code is not None:
            sys.stderr.write(f"{stop.code}\n")
            status = 1
    except BaseException:
        # This read is answered by its own call later, which reports the error as pyinfra does.
        # only here: its imports (linecache, tokenize, textwrap) are paid by a failing read alone
        import traceback

        traceback.print_exc(file=sys.stderr)
        status = 1
    try:
        view = memoryview(captured.getvalue().encode("utf-8", "backslashreplace"))
        while view:
            view = view[os.write(out_fd, view):]
    finally:
        sys.stderr.flush()
        os._exit(status)


def _output_file(index):
    """A file for job `index`'s output, as a descriptor that the forked child writes and this
    process reads back.

    An anonymous memory file where the kernel has them (Linux 3.17): nothing is made on the host's
    disks and nothing is left behind. Else an unnamed temporary file (tempfile, and the shutil, bz2,
    lzma and random it imports, are loaded only then: a fifth of the imports that every host's read
    paid before any script ran)."""
    try:
        return os.memfd_create(f"sglang-deploy-read-{index}", getattr(os, "MFD_CLOEXEC", 0))
    except (AttributeError, OSError):
        import tempfile

        handle = tempfile.TemporaryFile(prefix="sglang-deploy-read-")
        fd = os.dup(handle.fileno())
        handle.close()
        return fd


def _read_back(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _import(modules):
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:
            pass  # a failing import is the script's to report


def run_all(payload, imports=(), early=()):
    """Run the jobs of `payload`, after importing `imports` (the modules the scripts import at their
    top level).

    `early` is what the first jobs (the longest reads: a venv's file check) import: only those are
    made before the first forks, and the rest while those first jobs run, so the longest start as
    soon as they can.
    """
    jobs = json.loads(zlib.decompress(base64.b64decode(payload)).decode("utf-8"))
    # {"shared": _common.py's text, "jobs": [...]}: each body holds a mark where it was
    if isinstance(jobs, dict):
        shared = jobs["shared"]
        jobs = [[job_id, body.replace(SHARED_MARK, shared, 1), argv]
                for job_id, body, argv in jobs["jobs"]]
    # Imported here, before the forks: every child finds them loaded, instead of each paying for its
    # own.
    _import(early or imports)
    rest_imported = not early
    compiled = {}
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    running, status, outputs = {}, {}, {}
    queue = list(enumerate(jobs))
    try:
        while queue or running:
            while queue and len(running) < workers:
                index, (_, body, argv) = queue.pop(0)
                if body not in compiled:
                    compiled[body] = compile(body, "<remote script>", "exec")
                outputs[index] = _output_file(index)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(compiled[body], argv, outputs[index])
                running[pid] = index
            if not rest_imported:
                rest_imported = True
                if queue:
                    _import(imports)
                    continue
            pid, wait_status = os.wait()
            index = running.pop(pid, None)
            if index is not None:
                status[index] = os.waitstatus_to_exitcode(wait_status)
        out = sys.stdout
        for index, (job_id, _, _) in enumerate(jobs):
            code = status.get(index, 1)
            try:
                text = _read_back(outputs.pop(index))
            except OSError:
                text, code = "", code or 1
            out.write(f"{MARK} {job_id} {code if code >= 0 else 1}\n")
            out.write(text if text.endswith("\n") or not text else text + "\n")
        out.flush()
    finally:
        for fd in outputs.values():
            os.close(fd)
