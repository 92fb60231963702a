"""The engine's code outside its service's unit runs as the service user, in the service's sandbox,
never as root.

Two things run the engine's Python on a host besides its unit: the preflight (the engine's own
parser and its launcher's imports, operations/service/preflight.py) and measure.py's benchmark
client (views/measure.py). Both used to run as root, outside any sandbox, so whatever steered them
(a variable of the service's env, the tokenizer directory the server names) chose code that root
ran. Now each is a transient unit of systemd's:

    systemd-run --wait --pipe --collect --quiet -p User=sglang -p Group=sglang -p ... \\
        -- /usr/bin/env -i K=V ... ARGV

with the sandbox properties of the service's own unit (`units.sandbox_properties`: the template is
their one source) and an environment that holds only what the caller names (`env -i`: nothing of
systemd's, root's or the unit's).

What stays root, and why: `systemd-run` itself (only the system manager starts a process as another
user, inside a sandbox, and waits for it) and the shell line that starts it. Nothing of the
engine's, the venv's or the service user's runs in that shell: the command's words are the deploy's
own (`shlex.quote`d), its input is on a pipe.
"""

from __future__ import annotations

import shlex
from typing import Iterable, Mapping, Sequence

# PATH for a run: the system's directories only (root's, not writable by the service user).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def runs_as(sandbox: Iterable[str]) -> str | None:
    """The user a sandbox names (`User=`), `DynamicUser` for a throwaway one, or None when it names
    none."""
    found = None
    for prop in sandbox:
        name, _, value = prop.partition("=")
        if name == "User":
            found = value
        elif name == "DynamicUser" and value in ("yes", "true", "1", "on"):
            found = found or "DynamicUser"
    return found


def command(sandbox: Sequence[str], environment: Mapping[str, str], argv: Sequence[str],
            description: str, max_seconds: int | None = None) -> str:
    """The shell words that run `argv` in a transient unit with `sandbox` (`systemd-run -p`
    assignments) and exactly `environment`; its stdin, stdout and stderr are the caller's
    (`--pipe`), its exit status systemd-run's (`--wait`). `max_seconds`: systemd stops the unit
    after that long (`RuntimeMaxSec=`), also when the caller went away.

    A sandbox that names no user is refused: systemd would run the command as root.
    """
    if runs_as(sandbox) is None:
        raise ValueError(f"{description}: the sandbox names no User= (systemd would run it as "
                         f"root): {list(sandbox)}")
    limit = [f"RuntimeMaxSec={max_seconds}"] if max_seconds else []
    properties = " ".join(f"-p {shlex.quote(prop)}" for prop in [*sandbox, *limit])
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in environment.items())
    return (f"systemd-run --wait --pipe --collect --quiet --working-directory=/ "
            f"--description={shlex.quote('sglang-deploy: ' + description)} {properties} -- "
            f"/usr/bin/env -i {assignments} {' '.join(shlex.quote(word) for word in argv)}")
