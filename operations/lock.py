"""One deploy at a time per host.

The lock is taken while `deploy.py` loads (before any operation runs on the host) and given
back when pyinfra disconnects, outside any operation, so that it never counts as a change.
A second deploy waits `lock_wait_s`, then stops naming who holds the lock and since when.
A lock left by a deploy from this control machine whose process is gone (killed) is stale
and is taken over; one held from another machine is never broken automatically.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
import time
import uuid

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback

from operations import remote

_OWNER = {
    "id": uuid.uuid4().hex,
    "who": f"{getpass.getuser()}@{socket.gethostname()}",
    "control": socket.gethostname(),
    "pid": os.getpid(),
    "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
}


class HostLocked(PyinfraError):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(host, *args: str) -> dict:
    ok, output = host.run_shell_command(remote.command("lock_host", *args), print_output=False)
    try:
        return json.loads(output.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostLocked(f"{host.name}: could not take the deploy lock: {output.stderr.strip()[-300:]}") from None


def acquire(host, state, wait_s: int) -> None:
    """Take `host`'s deploy lock (once per run), or raise `HostLocked` naming the holder."""
    if host.name in _Releaser.held:
        return
    owner = shlex.quote(json.dumps(_OWNER))
    result = _run(host, "acquire", owner, "0")
    held_by = result.get("held_by") or {}
    if not result["acquired"] and held_by.get("control") == _OWNER["control"] and not _pid_alive(int(held_by.get("pid", 0))):
        host.log(f"deploy lock left by {held_by.get('who')} (pid {held_by.get('pid')}, since {held_by.get('since')}) is stale: taking it over")
        result = _run(host, "acquire", owner, "0", shlex.quote(held_by["id"]))
    if not result["acquired"]:
        host.log(f"deploy lock held by {held_by.get('who')} since {held_by.get('since')}: waiting up to {wait_s} s")
        result = _run(host, "acquire", owner, str(wait_s))
    if not result["acquired"]:
        held_by = result["held_by"]
        raise HostLocked(
            f"{host.name}: another deploy holds the host's lock: {held_by.get('who')} (pid {held_by.get('pid')}) "
            f"since {held_by.get('since')}; waited {wait_s} s. If no deploy is running there, remove /run/sglang-deploy.lock on the host."
        )
    _Releaser.held.add(host.name)
    if not any(isinstance(h, _Releaser) for h in state.callback_handlers):
        state.add_callback_handler(_Releaser())


class _Releaser(BaseStateCallback):
    held: set[str] = set()

    def host_disconnect(self, state, host):
        if host.name in self.held:
            self.held.discard(host.name)
            try:
                _run(host, "release", shlex.quote(_OWNER["id"]))
            except Exception as exc:  # the connection died (network cut, host rebooted): say so, do not crash the run's end
                host.log(
                    f"deploy lock not given back ({type(exc).__name__}: {exc}): the next deploy from this machine takes it "
                    "over; from another machine, remove /run/sglang-deploy.lock on the host once no deploy runs there",
                    log_func=logger.warning,
                )
