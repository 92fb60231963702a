"""See the fleet: one read-only row per placed service (and per host without one). Changes nothing.

    pyinfra inventory.py status.py -y                  # the table (narrow terminal: fewer columns)
    STATUS_DETAIL=1 pyinfra inventory.py status.py -y  # every column of every row
    STATUS_JSON=- pyinfra inventory.py status.py -y    # the rows as JSON on stdout (view on stderr)
    STATUS_JSON=status.json STATUS_PROM=/var/lib/node_exporter/textfile/sglang.prom \\
        pyinfra inventory.py status.py -y

Options are environment variables (pyinfra's own `-v` and `--data` mean other things):
STATUS_DETAIL=1, STATUS_JSON=FILE or `-`, STATUS_PROM=FILE (node_exporter's textfile format, written
atomically), STATUS_WIDTH=N (the table's width; default the terminal's). Exit code: 0 converged and
healthy, 2 a deploy would change something, 1 a host not reached or something unhealthy
(views/status.py, report/status_view.py). No deploy lock is taken or waited for (a held one is
shown), no command that writes runs on a host, and no operation is added: each host is read once, as
the deploy reads it.
"""

import os
import shutil

from pyinfra import host, state

from deploys.run import HostRun
from operations.service.service_inputs import watched_inputs
from report import status_view
from views import status as status_reads

options = status_view.options_from(os.environ)
run = HostRun.of(host)
run.observing(state, also=status_reads.also_read(run.config))
watched = {s.name: watched_inputs(s, s.unit_path) for s in run.config.services}
status_view.record(state, host.name, status_reads.read_host(run.host, run.config, run.stack,
                                                            run.patch_sets, watched))
# Added last (after the host read's own callbacks): its host_disconnect ends the process with the
# status's code.
if not any(isinstance(h, status_view.StatusPrinter) for h in state.callback_handlers):
    width = shutil.get_terminal_size((120, 24)).columns
    addresses = {name: c.ssh_address for name, c in run.inventory.items()}
    state.add_callback_handler(status_view.StatusPrinter(
        options, status_reads.COVERS, width,
        lambda h: status_reads.unreachable_reason(*addresses[h.name])))
