"""Start a rendered unit's exact command line on a machine without systemd, and gate it like the deploy.

    python3 bench/gpu/serve.py /etc/systemd/system/sglang-NAME.service TIMEOUT_S

Reads the unit that operations/service/units.py rendered (deploy_gpu.py wrote it): its `Environment=`
lines, `WorkingDirectory=`, and `ExecStart=` (systemd's quoting undone: `"..."` words, `\\`
continuations, `$$` and `%%`), creates its `StateDirectory=`/`CacheDirectory=` as systemd would
(`/var/lib/<name>`, `/var/cache/<name>`), and starts the process with that environment only
(systemd passes no other). Then runs the deploy's own readiness script
(operations/service/on_host/wait_ready.py as the deploy sends it: /health 200, then one chat completion), with bench/gpu's
`systemctl`/`journalctl` stand-ins answering for the process, and asks /server_info which
attention backend, speculative algorithm and grammar backend the server really runs.
Prints one JSON line; the process is stopped at the end. Not applied: `User=` and the sandbox
(they need systemd); the process runs as the user who runs this.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RUN = Path(os.environ.get("GPU_RUN", "/run/gpu-check"))


def unescape(word: str, variables: bool) -> str:
    """systemd's escapes: `%%` everywhere, `$$` where it expands variables (ExecStart=, not Environment=)."""
    word = word.replace("%%", "%")
    return word.replace("$$", "$") if variables else word


def parse_unit(text: str) -> dict:
    """ExecStart's argv, the Environment= variables and the directories of a rendered unit."""
    lines, joined = [], ""
    for raw in text.splitlines():
        if raw.startswith("#") and not joined:
            continue
        if raw.endswith("\\"):
            joined += raw[:-1] + " "
            continue
        lines.append(joined + raw)
        joined = ""
    unit = {"env": {}, "argv": None, "cwd": "/", "dirs": []}
    for line in lines:
        key, _, value = line.partition("=")
        if key == "Environment":
            for word in shlex.split(value):
                name, _, val = unescape(word, False).partition("=")
                unit["env"][name] = val
        elif key == "ExecStart":
            unit["argv"] = [unescape(w, True) for w in shlex.split(value)]
        elif key == "WorkingDirectory":
            unit["cwd"] = value
        elif key == "StateDirectory":
            unit["dirs"] += [f"/var/lib/{d}" for d in value.split()]
        elif key == "CacheDirectory":
            unit["dirs"] += [f"/var/cache/{d}" for d in value.split()]
    return unit


def main(unit_path: str, timeout: int) -> int:
    name = Path(unit_path).name
    unit = parse_unit(Path(unit_path).read_text())
    for d in unit["dirs"]:
        Path(d).mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **unit["env"]}
    log = open(RUN / f"{name}.log", "wb")
    started = time.monotonic()
    proc = subprocess.Popen(unit["argv"], env=env, cwd=unit["cwd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (RUN / f"{name}.pid").write_text(str(proc.pid))
    port = unit["argv"][unit["argv"].index("--port") + 1]
    address = unit["argv"][unit["argv"].index("--host") + 1]
    gate_env = {**os.environ, "PATH": f"{HERE}:{os.environ['PATH']}", "GPU_RUN": str(RUN)}
    # The gate as the deploy sends it to a host: the script with what the host scripts share inlined.
    sys.path.insert(0, str(ROOT))
    from operations import remote

    gate_script = RUN / "wait_ready.py"
    gate_script.write_text(remote.script("wait_ready"))
    gate = subprocess.run(
        [sys.executable, str(gate_script), name, address, port, str(timeout), "1", "-"],
        capture_output=True, text=True, env=gate_env,
    )
    result = {"unit": name, "argv": unit["argv"], "env": unit["env"], "wall_s": round(time.monotonic() - started, 1)}
    try:
        result["gate"] = json.loads(gate.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result["gate"] = {"ok": False, "reason": f"wait_ready printed nothing: {gate.stderr.strip()[-800:]}"}
    if result["gate"].get("ok"):
        with urllib.request.urlopen(f"http://{address}:{port}/server_info", timeout=30) as response:
            info = json.load(response)
        result["server_info"] = {k: info.get(k) for k in ("version", "attention_backend", "speculative_algorithm", "speculative_num_draft_tokens", "grammar_backend", "load_format", "model_path", "speculative_draft_model_path")}
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
    print(json.dumps(result))
    return 0 if result["gate"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
