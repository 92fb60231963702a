"""Served throughput of named services, side by side, with the engine's own benchmark client.
Read only.

    MEASURE_SERVICES=dflash,ddtree pyinfra inventory.py measure.py -y
    # replicas (a name alone: all of them)
    MEASURE_SERVICES=gpu-a/dflash,gpu-b/dflash@2 pyinfra inventory.py measure.py -y
    MEASURE_SERVICES=plain,dflash MEASURE_PROMPTS=16 MEASURE_TOKENIZER=/root/tok \\
        pyinfra INVENTORY measure.py -y

The first service is the baseline. Options (environment variables, with their defaults; the
deploy's `--data` accepts only its own keys): MEASURE_PROMPTS=64, MEASURE_INPUT_LEN=256,
MEASURE_OUTPUT_LEN=256, MEASURE_CONCURRENCY=8 (requests at a time), MEASURE_PROBE=4 (accept-length
probe requests), MEASURE_TIMEOUT_S=1800, MEASURE_OUT=FILE (the raw results' JSON; default
./measure-<UTC time>.json), MEASURE_TOKENIZER=PATH (the client's --tokenizer, an absolute path on
the service's host; default: the path the deploy staged the service's model at). Every service gets
the same load, one service at a time, the client running as the service user in the service's
sandbox (views/measure.py). Nothing is changed, restarted or locked: this file takes no deploy
lock (operations/lock/lock.py is not called) and adds no operation but the measurements.
"""

import os
from pathlib import Path

from pyinfra import host, state

from deploys.run import HostRun
from views import measure

run = HostRun.of(host)
config = run.config
# A service's name measures every replica of it (a row each, `host/replica`); `host/replica` one of
# them.
rows = measure.replicas(measure.requested(os.environ.get("MEASURE_SERVICES")), run.inventory)
options = measure.options_from(os.environ)
out = os.environ.get("MEASURE_OUT")
report = measure.install(state, [label for label, _, _ in rows], options,
                         Path(out) if out else None)
here = {s.name: s for s in config.services}
for label, host_name, replica in rows:
    measure.served(name=f"Measure {label}", service=label,
                   placed=here.get(replica) if host_name == host.name else None,
                   report=report, config=config)
