"""Helpers for tests on the local lab: SSH to its hosts, run the deploy, read its results."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "lab" / "state"
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
# The host that destructive tests place their own services on (and clean): the lab's empty one.
SPARE = os.environ.get("LAB_SPARE_HOST", "gpu-b")


def lab_hosts() -> dict:
    return json.loads((STATE / "hosts.json").read_text())


def ssh(host: str, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    address = lab_hosts()[host]["address"]
    argv = [
        "ssh", "-i", str(STATE / "id_ed25519"), "-o", f"UserKnownHostsFile={STATE / 'known_hosts'}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        f"root@{address}", command,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


def http_get(host: str, port: int, path: str) -> tuple[int | None, str]:
    """GET from the host itself (services bind loopback)."""
    script = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=10); print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
        "except OSError as e:\n"
        "    print('None'); print(e)\n"
    )
    out = ssh(host, f"python3 -c {shlex.quote(script)}").stdout
    status, _, body = out.partition("\n")
    return (None if status == "None" else int(status)), body


def chat(host: str, port: int, content: str) -> dict:
    script = (
        "import json, urllib.request\n"
        f"body = json.dumps({{'model': 'default', 'messages': [{{'role': 'user', 'content': {content!r}}}]}}).encode()\n"
        f"req = urllib.request.Request('http://127.0.0.1:{port}/v1/chat/completions', data=body, headers={{'Content-Type': 'application/json'}})\n"
        "print(urllib.request.urlopen(req, timeout=30).read().decode())\n"
    )
    return json.loads(ssh(host, f"python3 -c {shlex.quote(script)}").stdout)


def main_pid(host: str, unit: str) -> int:
    return int(ssh(host, f"systemctl show -p MainPID --value {unit}").stdout.strip() or 0)


def component_name(full: str) -> str:
    """`Service | Unit sglang-x.service` -> `Service` (pyinfra names an operation of a @deploy after it)."""
    return full.split(" | ", 1)[0] if " | " in full else ""


def operation_name(full: str) -> str:
    return full.split(" | ", 1)[1] if " | " in full else full


class DeployResult:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        try:
            self.json = json.loads(proc.stdout) if proc.stdout.strip() else {}
        except ValueError:
            self.json = {}

    @property
    def changed(self) -> list[tuple[str, list[str]]]:
        """(operation name, hosts it changed) for every operation that changed something; the name without its
        component's (pyinfra prints `Service | Unit sglang-x.service`; this says `Unit sglang-x.service`)."""
        ops = self.results.get("operations", [])
        return [(operation_name(op["name"]), op["success"]) for op in ops if op.get("success")]

    @property
    def errors(self) -> list[tuple[str, list[str]]]:
        return [(operation_name(op["name"]), op["error"]) for op in self.results.get("operations", []) if op.get("error")]

    @property
    def components(self) -> list[str]:
        """The deploy's components (deploy.py's @deploy steps), in the order their operations ran."""
        names = [component_name(op["name"]) for op in self.results.get("operations", [])]
        return [name for i, name in enumerate(names) if name not in names[:i]]

    @property
    def results(self) -> dict:
        return self.json.get("results") or {}

    def __repr__(self) -> str:
        # Both streams' tails: without --json, pyinfra writes a failed operation's own lines to stdout.
        return (f"DeployResult(rc={self.returncode}, changed={self.changed}, errors={self.errors})\n"
                f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}")


def deploy(inventory: str | Path = "lab/inventory.py", *extra: str, env: dict | None = None, timeout: int = 900, as_json: bool = True,
           root: Path = ROOT) -> DeployResult:
    """Run the deploy (from `root`: the checkout, or a `repo_copy`); with `as_json`, results are parsed from --json
    (which keeps operations' own log lines quiet)."""
    # -y skips change detection, which is all a --dry run does.
    yes = [] if "--dry" in extra else ["-y"]
    argv = [PYINFRA, str(inventory), "deploy.py", *yes, *(["--json"] if as_json else []), *extra]
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return DeployResult(proc)


def refused_by_its_preflight(host: str, inventory: Path, service: str, reason: str) -> str:
    """Deploy `inventory`, which fails `service`'s preflight on `host` with `reason` (its start): the run fails,
    says so, and writes no unit. The run's output."""
    result = deploy(inventory, as_json=False)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert f"{service}: PREFLIGHT FAILED, unit and running service left as they were: {reason}" in out, out[-3000:]
    unit = f"/etc/systemd/system/sglang-{service}.service"
    assert ssh(host, f"test -e {unit} && echo unit || echo none").stdout.strip() == "none"
    return out


def clean_host(host: str, keep_venv: bool = False) -> None:
    """Remove everything the deploy puts on a host (the lab's own files stay).

    With `keep_venv`, the plain venv (/root/venv_sglang and its generations) and the wheel cache stay: the
    slow part of a first deploy, for tests that only need no service, unit, staged model or config there.
    """
    venvs = "/root/venv_sglang+*" if keep_venv else "/root/venv_sglang /root/venv_sglang.* /root/venv_sglang+* /var/cache/sglang-deploy"
    ssh(host, (
        "for u in $(systemctl list-unit-files 'sglang-*' --no-legend | cut -d' ' -f1); do systemctl disable --now $u >/dev/null 2>&1; done; "
        "rm -f /etc/systemd/system/sglang-*.service; systemctl daemon-reload; systemctl reset-failed 'sglang-*' 2>/dev/null; "
        f"rm -rf {venvs} /etc/sglang-deploy /usr/local/lib/sglang-deploy /run/sglang-deploy-test "
        "/var/cache/sglang/kernels /var/lib/sglang-deploy/kernels "
        "/dev/shm/* /dev/shm/.[!.]*; true"
    ))


def write_inventory(name: str, host_data: dict[str, dict], root: Path = ROOT) -> Path:
    """An inventory of lab hosts with the given host data (beside lab/inventory.py, so the lab's group data applies)."""
    hosts = lab_hosts()
    rows = []
    for host, data in host_data.items():
        row = {
            "ssh_hostname": hosts[host]["address"], "ssh_user": "root", "ssh_key": str(STATE / "id_ed25519"),
            "ssh_known_hosts_file": str(STATE / "known_hosts"), "ssh_strict_host_key_checking": "yes", **data,
        }
        rows.append(f"    ({host!r}, {row!r}),")
    path = root / "lab" / f"{name}.py"
    path.write_text("# Written by a test.\nlab_hosts = [\n" + "\n".join(rows) + "\n]\n")
    return path


def repo_copy(dest: Path) -> Path:
    """A copy of the checkout's tracked files at `dest`, sharing the lab's state and caches (symlinks).

    A test that needs files the deploy reads from the repository (a patch set in files/patches/) writes
    them into such a copy and runs the deploy there: the checkout itself is never written by a test.
    """
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if rel.startswith(("lab/state/", "lab/cache/", "lab/run/")) or not src.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    for shared in ("lab/state", "lab/cache", "lab/run", "lab/inventory.py", ".secrets"):
        if (ROOT / shared).exists() and not (dest / shared).exists():
            (dest / shared).parent.mkdir(parents=True, exist_ok=True)
            (dest / shared).symlink_to((ROOT / shared).resolve())
    return dest


# Faults (tests/lab/test_faults.py) ----------------------------------------------------


def lab(*args: str, timeout: int = 300) -> str:
    """Run `lab/lab.py ARGS` (e.g. `lab("cut", "gpu-e")`); return its output, fail with it."""
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"lab.py {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc.stdout


def health_inside(host: str, port: int) -> int | None:
    """/health of a service seen from inside the host's network namespace (works while its network is cut)."""
    leader = lab_hosts()[host]["leader_pid"]
    script = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    print(urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
        "except OSError:\n"
        "    print('None')\n"
    )
    try:
        out = subprocess.run(["nsenter", "-t", str(leader), "-n", sys.executable, "-c", script], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except subprocess.TimeoutExpired:
        return None
    return int(out) if out.isdigit() else None


def start_deploy(inventory: str | Path, log: Path, *extra: str) -> subprocess.Popen:
    """The deploy in the background, its output (text, not --json) going to `log`."""
    out = open(log, "w")
    argv = [PYINFRA, str(inventory), "deploy.py", "-y", *extra]
    return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)


def wait_until(check, timeout: float, interval: float = 0.2, what: str = "the condition"):
    """Poll `check()` until it returns something true; return it, or fail after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(interval)


# Test hooks that hold a deploy at a known point (tests/lab/test_faults.py) --------------

HOOKS = "/run/sglang-deploy-test"  # operations/model/on_host/stage_model.py's TEST_HOOK_DIR


def hold(host: str, what: str, name: str) -> None:
    """Arm the hook `what` ("staging", "install") on the host for `name`; a stale "reached" marker goes first."""
    ssh(host, f"mkdir -p {HOOKS} && rm -f {HOOKS}/reached-{what} && echo {shlex.quote(name)} > {HOOKS}/hold-{what}")


def release(host: str, what: str) -> None:
    """Let a held step go on (its bounded wait ends at once)."""
    ssh(host, f"rm -f {HOOKS}/hold-{what}", check=False)


def held(host: str, what: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> int:
    """Wait until the deploy `proc` is held at the hook `what`; return the pid of the held process on the host.

    Fails if the deploy ends first (it never reached the point). The pid is checked alive, and the deploy
    still running, after the marker is seen: the fault that follows lands while the step is held.
    """
    def reached():
        if proc.poll() is not None:
            return "ended"
        return ssh(host, f"cat {HOOKS}/reached-{what} 2>/dev/null || true").stdout.strip()

    got = wait_until(reached, timeout, interval=0.2, what=f"the deploy held at {what}")
    assert got != "ended", f"the deploy ended before it reached {what}:\n{log.read_text()[-3000:]}"
    pid = int(got.split()[-1])
    assert ssh(host, f"kill -0 {pid} && echo alive || true").stdout.strip() == "alive", f"held {what} process {pid} is gone"
    assert proc.poll() is None, f"the deploy ended while held at {what}:\n{log.read_text()[-3000:]}"
    return pid


@contextlib.contextmanager
def routed(names: list[str]):
    """The lab's hosts `names` reach one another (through this machine's kernel, forwarding on their links alone); as
    before afterwards. The lab's hosts otherwise have only their link to this machine."""
    hosts = lab_hosts()
    links = [hosts[h]["veth"] for h in names]
    before = {link: open(f"/proc/sys/net/ipv4/conf/{link}/forwarding").read().strip() for link in links}
    for link in links:
        subprocess.run(["sysctl", "-q", "-w", f"net.ipv4.conf.{link}.forwarding=1"], check=True)
    routes = [(h, f"{peer['address'].rsplit('.', 1)[0]}.{int(peer['address'].rsplit('.', 1)[1]) - 2}/30", hosts[h]["control_address"])
              for h in names for peer in (hosts[p] for p in names if p != h)]
    try:
        for host, net, via in routes:
            ssh(host, f"ip route replace {net} via {via}")
        yield
    finally:
        for host, net, via in routes:
            ssh(host, f"ip route del {net} via {via}", check=False)
        for link, value in before.items():
            subprocess.run(["sysctl", "-q", "-w", f"net.ipv4.conf.{link}.forwarding={value}"], check=False)


def impostor_source(port: int) -> str:
    """Another local user's HTTP server on 127.0.0.1:`port` (run as that user by the test): answers 200 `{}` to every
    GET and POST and prints `HEARD METHOD PATH AUTHORIZATION` for each, so its journal holds what it was sent."""
    return f"""
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def answer(self):
        print("HEARD", self.command, self.path, self.headers.get("Authorization"), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{{}}")

    do_GET = do_POST = answer

HTTPServer(("127.0.0.1", {port}), Handler).serve_forever()
"""
