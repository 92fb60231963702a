"""Hold a one-time key open for a lab test (tests/lab/test_peer_keys.py), as a deploy's transfer holds it.

    python -m tests.lab.peer_grant SOURCE RECEIVER ROOT NAME...

Prints one JSON line, {"argv": the receiver's ssh command line, "ident": the grant's ID} (or {"none": the log} where
no grant was made), then waits for its stdin to end and takes the grant back. Run under gevent, as pyinfra's CLI runs
the deploy.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402

from pyinfra.api import Config, Inventory, State  # noqa: E402

from operations.transport import peer_keys  # noqa: E402
from tests.lab.labutil import STATE, lab_hosts  # noqa: E402


def main() -> None:
    source_name, receiver_name, root, *names = sys.argv[1:]
    hosts = lab_hosts()
    data = [(n, {"ssh_hostname": hosts[n]["address"], "ssh_user": "root", "ssh_key": str(STATE / "id_ed25519"),
                 "ssh_known_hosts_file": str(STATE / "known_hosts"), "ssh_strict_host_key_checking": "yes"})
            for n in (source_name, receiver_name)]
    inventory = Inventory((data, {}))
    State(inventory, Config())
    for name in (source_name, receiver_name):
        inventory.get_host(name).connect(raise_exceptions=True)
    said: list[str] = []
    grant = peer_keys.granted(inventory.get_host(source_name), inventory.get_host(receiver_name), root, names, said.append)
    print(json.dumps({"argv": grant.argv, "ident": grant.ident} if grant else {"none": said}), flush=True)
    sys.stdin.read()
    if grant:
        grant.close()


if __name__ == "__main__":
    main()
