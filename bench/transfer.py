"""Bulk bytes at GB scale on the lab, the deploy's way against OpenSSH's own tools doing the same work.

transfer.push_vs_scp        a stack's wheels, at least 1 GiB in all (the lab wheelhouse's wheels, topped up with
                            wheel-sized random files to 1.1 GiB), pushed to a directory of a lab host that lacks
                            them by the deploy's push (`streaming.Pushes`, as `venv._changes` yields it: every file
                            landing whole as `NAME.part` through root's unpacker, `transfer_streams` streams at once
                            over OpenSSH), over one `scp` of the same files into an empty directory of the same host
                            with the deploy's own ssh options (its cipher `aes128-gcm@openssh.com`, no compression).
                            Target at most 1.1. The deploy then checks every pushed file's sha256 on the host before
                            it takes its name; that check, which scp does not do, is printed apart
                            (`transfer.push_check_s`), not in the figure.
transfer.stream_vs_ssh_pipe a 2 GiB model (16 files of 128 MiB) from one lab host's store into another's by the
                            deploy (`transfer._stream`, as `transfer.in_store` runs it: listings, the `.NAME.partial`
                            prepared, the streams relayed here between OpenSSH processes, root's unpacker, the
                            listing check, the rename) over `ssh A tar -c | ssh B tar -x` through this machine with
                            the same cipher, into the same store. Target at most 1.0.
transfer.fanout_4_vs_1      a 1 GiB model (8 files of 128 MiB) staged from the control machine (`model_sources` naming a
                            directory here) into the stores of four lab hosts that lack it (LAB_FANOUT_HOSTS, routed to
                            one another for the run), over the time of the same to one host, with this machine's link
                            to the hosts capped at FANOUT_CAP (40 MiB/s, lab/link_cap.py; host to host left fast): the
                            case fan-out is for. Each host as a deploy stages it (`transfer._fanned_out`: the origin's
                            digests, then the model from the origin or from a host that has it, operations/transport/fanout.py).
                            Receivers forward while they receive (operations/model/forwarding.py). Target at most 2.2.
                            Beside it, in the same rounds: the four with fan-out but no forwarding (a host serves
                            others once it holds the model whole: `transfer.store_and_forward_4_vs_1`), and with
                            fan-out off (`transfer.fanout_4_off_s`, all from here at once through the capped link;
                            `transfer.through_here_4_vs_1`).
transfer.wheels_fanout_4_vs_1
                            one stack's wheels (the same 1.1 GiB) to the four hosts against the same to one host, the
                            link not capped: the push and then the check against the pins after which a host serves the
                            next ones. Beside it `transfer.wheels_through_here_4_vs_1`: fan-out off.
Both sides of each figure include their SSH connection set-up (ours: its route probes too, which a deploy pays once
per host and run); ours runs in a process of its own under gevent, as pyinfra's CLI runs the deploy. Runs
alternate (5 rounds), and the median of each is used; the raw times are printed too. Hosts: LAB_TRANSFER_FROM (gpu-a)
and LAB_TRANSFER_TO (gpu-b), the two hosts `make bench` starts; everything made is removed at the end.

Run it alone: `.venv/bin/python bench/run.py transfer` (make bench FIGURES=transfer); the fan-out figures alone:
`.venv/bin/python bench/transfer.py fanout` (the model, capped) or `... fanout-wheels`; BENCH_FANOUT_ROUNDS rounds
(default 3).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["--ours"]:
    # the deploy's side runs as pyinfra's CLI runs it, patched before anything else loads
    from gevent import monkey

    monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = os.environ.get("LAB_TRANSFER_FROM", "gpu-a")
TARGET = os.environ.get("LAB_TRANSFER_TO", "gpu-b")
MODEL = "bench-transfer-model"
STORE = "/root/models"
WHEELS_DIR = "/var/cache/sglang-bench-wheels"
SCP_DIR = "/var/cache/sglang-bench-scp"
MODEL_FILES, MODEL_FILE_MIB = 16, 128
WHEELS_GIB = 1.1
ROUNDS = 5
FANOUT_HOSTS = os.environ.get("LAB_FANOUT_HOSTS", "gpu-b,gpu-c,gpu-d,gpu-e").split(",")
FANOUT_ROUNDS = int(os.environ.get("BENCH_FANOUT_ROUNDS", "3"))
FANOUT_CAP = os.environ.get("BENCH_FANOUT_CAP", "40mibps")  # this machine's link to the hosts (lab/link_cap.py)
FANOUT_MODEL = "bench-fanout-model"
FANOUT_MODEL_FILES, FANOUT_MODEL_FILE_MIB = 8, 128  # 1 GiB
CIPHER = "aes128-gcm@openssh.com"


def _lab():
    from tests.lab.labutil import STATE, lab_hosts

    return STATE, lab_hosts()


def ssh_base(host: str) -> list[str]:
    state, hosts = _lab()
    return ["ssh", "-i", str(state / "id_ed25519"), "-o", f"UserKnownHostsFile={state / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "Compression=no", "-c", CIPHER,
            f"root@{hosts[host]['address']}"]


def ssh(host: str, command: str, timeout: int = 900) -> str:
    proc = subprocess.run([*ssh_base(host), command], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"bench transfer: {command[:200]!r} failed on {host}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def ours(*args: str) -> dict:
    """The deploy's side, in a process of its own (gevent-patched, as pyinfra's CLI): its JSON answer."""
    proc = subprocess.run([sys.executable, __file__, "--ours", *args], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"bench transfer: ours {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The deploy's side ---------------------------------------------------------------------------------------------------


def _state(names: list[str]):
    from pyinfra.api import Config, Inventory, State

    state_dir, hosts = _lab()
    streams = {"transfer_streams": int(os.environ["BENCH_TRANSFER_STREAMS"])} if os.environ.get("BENCH_TRANSFER_STREAMS") else {}
    data = [(n, {"ssh_hostname": hosts[n]["address"], "ssh_user": "root", "ssh_key": str(state_dir / "id_ed25519"),
                 "ssh_known_hosts_file": str(state_dir / "known_hosts"), "ssh_strict_host_key_checking": "yes", **streams})
            for n in names]
    inventory = Inventory((data, {}))
    state = State(inventory, Config())
    for name in names:
        inventory.get_host(name).connect(raise_exceptions=True)
    return state, inventory


class _Logged:
    """The host as the operations see it, its log lines kept (for the figures' notes)."""

    def __init__(self, host):
        self._host, self.lines = host, []

    def __getattr__(self, name):
        return getattr(self._host, name)

    def log(self, text, *args, **kwargs):
        self.lines.append(text)

    def log_styled(self, text, *args, **kwargs):
        self.lines.append(text)


def _cpu() -> dict:
    """This process's CPU seconds (the relay) and its children's (the ssh processes)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"self": round(me.ru_utime + me.ru_stime, 2), "ssh": round(kids.ru_utime + kids.ru_stime, 2)}


def ours_stream() -> dict:
    from operations.model import transfer

    state, inventory = _state([SOURCE, TARGET])
    target = _Logged(inventory.get_host(TARGET))
    start = time.perf_counter()
    ok = transfer._stream(state, target, SOURCE, f"{STORE}/{MODEL}", f"{STORE}/{MODEL}")
    return {"ok": ok, "s": time.perf_counter() - start, "log": target.lines[-3:], "cpu": _cpu()}


def ours_push(listing: str) -> dict:
    from operations.transport import streaming

    state, inventory = _state([TARGET])
    host = _Logged(inventory.get_host(TARGET))
    files = json.loads(Path(listing).read_text())
    start = time.perf_counter()
    pushes = streaming.Pushes("wheel")
    uploads = [pushes.upload(path, f"{WHEELS_DIR}/{Path(path).name}.part", sha) for path, sha in files]
    ok = all(upload.execute(state, host, {}) for upload in uploads)
    pushed_s = time.perf_counter() - start
    check = "\n".join(f"{sha}  {WHEELS_DIR}/{Path(path).name}.part" for path, sha in files)
    start = time.perf_counter()
    checked, _ = host.run_shell_command(f"printf '%s\\n' {shlex.quote(check)} | sha256sum --check --quiet --strict -", print_output=False)
    return {"ok": ok and checked, "s": pushed_s, "check_s": time.perf_counter() - start, "log": host.lines[-2:], "cpu": _cpu()}


def ours_fanout(listing: str, names: list[str], enabled: bool) -> dict:
    """One stack's wheels to every host of `names` at once, as `venv._changes` yields them on each (every host in a
    greenlet of its own, as pyinfra runs one operation on its hosts): the push, then the check against the pins that
    lets a host serve the next ones (fanout.CheckedWheels). With `enabled` off, every host is pushed from here."""
    import gevent

    from operations.transport import fanout

    fanout.ENABLED = enabled  # a new run (`_state`) below: nothing told or decided in an earlier one
    state, inventory = _state(names)
    files = json.loads(Path(listing).read_text())
    pins = {Path(path).name: sha for path, sha in files}
    check = "\n".join(f"{sha}  {WHEELS_DIR}/{name}.part" for name, sha in pins.items())
    renames = " && ".join(f"mv -f {WHEELS_DIR}/{name}.part {WHEELS_DIR}/{name}" for name in pins)

    def one(name: str) -> tuple[bool, list[str]]:
        host = _Logged(inventory.get_host(name))
        pushes = fanout.WheelPushes("wheel")
        uploads = [pushes.upload(path, f"{WHEELS_DIR}/{Path(path).name}.part", sha) for path, sha in files]
        ok = all(upload.execute(state, host, {}) for upload in uploads)
        checked = fanout.CheckedWheels(f"printf '%s\\n' {shlex.quote(check)} | sha256sum --check --quiet --strict - && {renames}",
                                       WHEELS_DIR, pins)
        return ok and checked.execute(state, host, {})[0], host.lines

    start = time.perf_counter()
    jobs = [gevent.spawn(one, name) for name in names]
    gevent.joinall(jobs)
    elapsed = time.perf_counter() - start
    said = [line for job in jobs for line in job.value[1] if "wheel(s)" in line or "directly" in line]
    return {"ok": all(job.value[0] for job in jobs), "s": elapsed, "log": said, "cpu": _cpu()}


def ours_fanout_model(origin: str, names: list[str], mode: str) -> dict:
    """The model in directory `origin` of this machine staged into every host of `names` at once, as the Models step
    runs `transfer.in_store` on each (every host in a greenlet of its own, as pyinfra runs one operation on its hosts).
    `mode` "on": fan-out, receivers forwarding while they receive; "store": fan-out, a host serving others only once it
    holds the model whole (before operations/model/forwarding.py); "off": every host reads from here."""
    import gevent

    from operations.model import transfer
    from operations.transport import fanout

    # a new run (`_state`) below: nothing told or decided in an earlier one
    fanout.ENABLED, transfer.FOLLOW = mode != "off", mode == "on"
    state, inventory = _state(names)

    def one(name: str) -> tuple[bool, list[str]]:
        host = _Logged(inventory.get_host(name))
        return transfer._fanned_out(state, host, origin, origin, f"{STORE}/{FANOUT_MODEL}"), host.lines

    start = time.perf_counter()
    jobs = [gevent.spawn(one, name) for name in names]
    gevent.joinall(jobs)
    elapsed = time.perf_counter() - start
    said = [f"{name}: {line}" for name, job in zip(names, jobs) for line in (job.value or (False, []))[1]
            if "streamed" in line or "read " in line or "failed" in line or "ended" in line
            or "while it receives" in line or "in place" in line]
    return {"ok": all(job.value and job.value[0] for job in jobs), "s": elapsed, "log": said, "cpu": _cpu()}


# The figures ---------------------------------------------------------------------------------------------------------


def _alternate(name: str, mine, theirs, prepare) -> tuple[list[float], list[float]]:
    a, b = [], []
    for i in range(ROUNDS):
        for side in ((mine, theirs) if i % 2 == 0 else (theirs, mine)):
            prepare()
            (a if side is mine else b).append(side())
    print(f"bench transfer: {name}: ours {[round(s, 2) for s in a]} s, theirs {[round(s, 2) for s in b]} s", file=sys.stderr)
    return a, b


def stream_vs_ssh_pipe() -> None:
    size = MODEL_FILES * MODEL_FILE_MIB * 2**20
    ssh(SOURCE, f"rm -rf {STORE}/{MODEL} && mkdir -p {STORE}/{MODEL} && for i in $(seq -w 1 {MODEL_FILES}); do "
                f"head -c {MODEL_FILE_MIB << 20} /dev/urandom > {STORE}/{MODEL}/model-$i-of-{MODEL_FILES}.safetensors; done")
    clean = f"rm -rf {STORE}/{MODEL} {STORE}/.{MODEL}.partial"
    notes = []

    def mine() -> float:
        answer = ours("stream")
        if not answer["ok"]:
            sys.exit(f"bench transfer: the deploy's stream failed: {answer['log']}")
        notes[:] = answer["log"]
        return answer["s"]

    def theirs() -> float:
        pipe = (f"{shlex.join([*ssh_base(SOURCE), f'tar -C {STORE} -cf - {MODEL}'])} | "
                f"{shlex.join([*ssh_base(TARGET), f'tar -C {STORE} -xf -'])}")
        start = time.perf_counter()
        subprocess.run(["bash", "-o", "pipefail", "-c", pipe], check=True, timeout=1800)
        return time.perf_counter() - start

    try:
        a, b = _alternate("stream_vs_ssh_pipe", mine, theirs, lambda: ssh(TARGET, clean))
        same = f"cd {STORE}/{MODEL} && sha256sum * | sha256sum"
        if ssh(TARGET, same) != ssh(SOURCE, same):
            sys.exit("bench transfer: the streamed model differs from its source")
    finally:
        ssh(TARGET, clean)
        ssh(SOURCE, f"rm -rf {STORE}/{MODEL}")
    print(f"bench transfer: ours said: {notes}", file=sys.stderr)
    print(f"transfer.stream_s: {statistics.median(a):.2f}")
    print(f"transfer.ssh_pipe_s: {statistics.median(b):.2f}")
    print(f"transfer.stream_mib_s: {size / 2**20 / statistics.median(a):.0f}")
    print(f"transfer.stream_vs_ssh_pipe: {statistics.median(a) / statistics.median(b):.2f}")


def _wheels(tmp: Path) -> list[tuple[str, str]]:
    """(path, sha256) of the lab wheelhouse's wheels, and random wheel-sized files after them up to WHEELS_GIB."""
    import hashlib

    house = ROOT / "lab" / "cache" / "wheelhouse"
    files = sorted(str(p) for p in house.glob("*.whl"))
    total = sum(os.path.getsize(p) for p in files)
    i, target = 0, int(WHEELS_GIB * 2**30)
    while total < target:
        i += 1
        path = tmp / f"bench_filler-{i}-py3-none-any.whl"
        size = min(96 << 20, target - total)
        with open(path, "wb") as handle:
            handle.write(os.urandom(size))
        files.append(str(path))
        total += size
    out = []
    for path in files:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out.append((path, digest.hexdigest()))
    return out


def push_vs_scp() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-wheels-") as tmp:
        files = _wheels(Path(tmp))
        listing = Path(tmp) / "files.json"
        listing.write_text(json.dumps(files))
        size = sum(os.path.getsize(p) for p, _ in files)
        clean = f"rm -rf {WHEELS_DIR} {SCP_DIR} && mkdir -m 755 {WHEELS_DIR} {SCP_DIR}"
        checks, notes = [], []

        def mine() -> float:
            answer = ours("push", str(listing))
            if not answer["ok"]:
                sys.exit(f"bench transfer: the deploy's push failed: {answer['log']}")
            checks.append(answer["check_s"])
            notes[:] = answer["log"]
            return answer["s"]

        def theirs() -> float:
            base = ssh_base(TARGET)
            scp = ["scp", "-q", *base[1:-1], *[p for p, _ in files], f"{base[-1]}:{SCP_DIR}/"]
            start = time.perf_counter()
            subprocess.run(scp, check=True, timeout=1800)
            return time.perf_counter() - start

        try:
            a, b = _alternate("push_vs_scp", mine, theirs, lambda: ssh(TARGET, clean))
        finally:
            ssh(TARGET, f"rm -rf {WHEELS_DIR} {SCP_DIR}")
    print(f"bench transfer: ours said: {notes}", file=sys.stderr)
    print(f"transfer.push_files: {len(files)}")
    print(f"transfer.push_mib: {size / 2**20:.0f}")
    print(f"transfer.push_s: {statistics.median(a):.2f}")
    print(f"transfer.scp_s: {statistics.median(b):.2f}")
    print(f"transfer.push_check_s: {statistics.median(checks):.2f}")
    print(f"transfer.push_vs_scp: {statistics.median(a) / statistics.median(b):.2f}")


def _links() -> dict[str, str]:
    """{veth: this machine's address on it} of the lab's running hosts (what lab/link_cap.py caps)."""
    _, hosts = _lab()
    return {rec["veth"]: rec["control_address"] for rec in hosts.values()
            if rec.get("veth") and Path(f"/sys/class/net/{rec['veth']}").exists()}


def fanout_4_vs_1() -> None:
    """A 1 GiB model from this machine to four lab hosts that lack it against the same to one host, this machine's link
    to the hosts capped (FANOUT_CAP); and, beside it, the four with fan-out off, all from here."""
    from bench.lab_hosts import running
    from lab.link_cap import capped
    from tests.lab.labutil import routed

    four = FANOUT_HOSTS
    running(four)  # gpu-c, gpu-d and gpu-e are not among the hosts `make demo` starts
    clean = f"rm -rf {STORE}/{FANOUT_MODEL} {STORE}/.{FANOUT_MODEL}.partial"
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp, routed(four), capped(FANOUT_CAP, _links()):
        origin = Path(tmp) / FANOUT_MODEL
        origin.mkdir()
        for i in range(1, FANOUT_MODEL_FILES + 1):
            with open(origin / f"model-{i:05d}-of-{FANOUT_MODEL_FILES:05d}.safetensors", "wb") as handle:
                for _ in range(FANOUT_MODEL_FILE_MIB):
                    handle.write(os.urandom(1 << 20))
        size = sum(p.stat().st_size for p in origin.iterdir())
        times: dict[str, list[float]] = {"1": [], "4": [], "4_store": [], "4_off": []}
        notes: dict[str, list[str]] = {}
        try:
            for i in range(FANOUT_ROUNDS):
                order = [("1", four[:1], "on"), ("4", four, "on"), ("4_store", four, "store"), ("4_off", four, "off")]
                for key, hosts, mode in (order if i % 2 == 0 else order[::-1]):
                    for name in four:
                        ssh(name, clean)
                    answer = ours("fanout-model", str(origin), ",".join(hosts), mode)
                    if not answer["ok"]:
                        sys.exit(f"bench transfer: the model to {hosts} failed: {answer['log']}")
                    times[key].append(answer["s"])
                    notes[key] = answer["log"]
        finally:
            for name in four:
                ssh(name, clean)
    print(f"bench transfer: fanout (model, {size / 2**30:.2f} GiB, capped at {FANOUT_CAP}): "
          f"{({k: [round(t, 2) for t in v] for k, v in times.items()})} s", file=sys.stderr)
    for key in ("1", "4", "4_store"):
        print(f"bench transfer: fanout to {key} said: {notes.get(key)}", file=sys.stderr)
    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"transfer.fanout_cap: {FANOUT_CAP} (this machine's link to the hosts, each way; host to host uncapped)")
    print(f"transfer.fanout_model_gib: {size / 2**30:.2f}")
    print(f"transfer.fanout_1_s: {median['1']:.2f}")
    print(f"transfer.fanout_4_s: {median['4']:.2f}")
    print(f"transfer.fanout_4_store_and_forward_s: {median['4_store']:.2f}")
    print(f"transfer.fanout_4_off_s: {median['4_off']:.2f}")
    print(f"transfer.fanout_4_vs_1: {median['4'] / median['1']:.2f}")
    print(f"transfer.store_and_forward_4_vs_1: {median['4_store'] / median['1']:.2f}")
    print(f"transfer.through_here_4_vs_1: {median['4_off'] / median['1']:.2f}")


def wheels_fanout_4_vs_1() -> None:
    """One stack's wheels (WHEELS_GIB) to four lab hosts that lack them against the same to one host; and, beside it,
    the four through this machine (fan-out off), as every deploy did before. The link not capped."""
    from bench.lab_hosts import running
    from tests.lab.labutil import routed

    four = FANOUT_HOSTS
    running(four)  # gpu-c, gpu-d and gpu-e are not among the hosts `make demo` starts
    with tempfile.TemporaryDirectory(prefix="bench-wheels-") as tmp, routed(four):
        files = _wheels(Path(tmp))
        listing = Path(tmp) / "files.json"
        listing.write_text(json.dumps(files))
        clean = f"rm -rf {WHEELS_DIR} && mkdir -m 755 {WHEELS_DIR}"
        times: dict[str, list[float]] = {"1": [], "4": [], "4_off": []}
        notes: dict[str, list[str]] = {}
        try:
            for i in range(FANOUT_ROUNDS):
                order = [("1", four[:1], True), ("4", four, True), ("4_off", four, False)]
                for key, hosts, enabled in (order if i % 2 == 0 else order[::-1]):
                    for name in four:
                        ssh(name, clean)
                    answer = ours("fanout", str(listing), ",".join(hosts), "on" if enabled else "off")
                    if not answer["ok"]:
                        sys.exit(f"bench transfer: fan-out to {hosts} failed: {answer['log']}")
                    times[key].append(answer["s"])
                    notes[key] = answer["log"]
        finally:
            for name in four:
                ssh(name, f"rm -rf {WHEELS_DIR}")
    print(f"bench transfer: wheels fanout: {({k: [round(t, 2) for t in v] for k, v in times.items()})} s",
          file=sys.stderr)
    print(f"bench transfer: wheels fanout to 4 said: {notes.get('4')}", file=sys.stderr)
    median = {key: statistics.median(value) for key, value in times.items()}
    print(f"transfer.wheels_fanout_1_s: {median['1']:.2f}")
    print(f"transfer.wheels_fanout_4_s: {median['4']:.2f}")
    print(f"transfer.wheels_fanout_4_through_here_s: {median['4_off']:.2f}")
    print(f"transfer.wheels_fanout_4_vs_1: {median['4'] / median['1']:.2f}")
    print(f"transfer.wheels_through_here_4_vs_1: {median['4_off'] / median['1']:.2f}")


def main() -> None:
    push_vs_scp()
    stream_vs_ssh_pipe()
    wheels_fanout_4_vs_1()
    fanout_4_vs_1()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ours"]:
        if sys.argv[2] == "fanout":
            answer = ours_fanout(sys.argv[3], sys.argv[4].split(","), sys.argv[5] == "on")
        elif sys.argv[2] == "fanout-model":
            answer = ours_fanout_model(sys.argv[3], sys.argv[4].split(","), sys.argv[5])
        else:
            answer = ours_stream() if sys.argv[2] == "stream" else ours_push(sys.argv[3])
        print(json.dumps(answer))
    else:
        chosen = {"fanout": fanout_4_vs_1, "fanout-wheels": wheels_fanout_4_vs_1}.get(sys.argv[1] if sys.argv[1:] else "")
        (chosen or main)()
