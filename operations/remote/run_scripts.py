"""Run several of our read-only remote scripts in this one python process (stdlib only).

The host reads batch (operations/host_reads.py) sends this file with PAYLOAD appended: a
zlib-compressed, base64 JSON list of [id, script body, argv]. Each script runs as it would
alone (`python3 - ARGS`: a fresh globals dict named __main__, sys.argv set, its stdout
captured); its output follows a marker line that names the id and the exit status. One
python start and one set of imports then serve every fact of a host instead of one each.
"""

import base64
import contextlib
import io
import json
import sys
import traceback
import zlib

MARK = "@@sglang-deploy-read"


def run_all(payload):
    jobs = json.loads(zlib.decompress(base64.b64decode(payload)).decode("utf-8"))
    compiled = {}
    out = sys.stdout
    for job_id, body, argv in jobs:
        code = compiled.get(body)
        if code is None:
            code = compiled[body] = compile(body, "<remote script>", "exec")
        captured = io.StringIO()
        status = 0
        saved_argv = sys.argv
        sys.argv = ["-", *argv]
        try:
            with contextlib.redirect_stdout(captured):
                exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            # The batch goes on; this read is answered by its own call, which reports the error.
            traceback.print_exc(file=sys.stderr)
            status = 1
        finally:
            sys.argv = saved_argv
        out.write(f"{MARK} {job_id} {status}\n")
        text = captured.getvalue()
        out.write(text if text.endswith("\n") or not text else text + "\n")
    out.flush()
