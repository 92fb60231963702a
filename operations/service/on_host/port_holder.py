# Is every socket listening on a service's port held by a process of the service's unit? (Peer
# identity: docs/threat-model.md.) For a client that makes its own connections (measure.py's
# benchmark client): root runs this before the client and after it; a port held by anyone else means
# its answers were not the service's. Prints the reason and exits 1 when not; exits 0 silently when
# it is.
# argv: UNIT PORT
import sys

from _common import (  # noqa: E402 - remote.script puts _common.py here
    port_untrusted,
    systemctl_show,
)

unit, port = sys.argv[1], int(sys.argv[2])
control_group = systemctl_show([unit], ("ControlGroup",)).get(unit, {}).get("ControlGroup")
why = port_untrusted(port, unit, control_group)
if why:
    print(f"{unit} cannot be measured: {why}")
    sys.exit(1)
