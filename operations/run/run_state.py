"""What one run keeps between its operations and its hosts, on the run object itself (pyinfra's
`State`: one per `pyinfra ... deploy.py`; configuration/run_scope.py), never in module globals: a
second run in the same process (a test, a bench) starts with none of it, and nothing outlives the
run.

    run = run_state.of(host.state)   # made by the first module that asks, for this run

Each field belongs to one module, which alone reads and writes it (named beside it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from configuration import run_scope


@dataclass
class RunState:
    # operations/run/host_reads.py: host name -> its HostReads (the host's one read, its answers)
    reads: dict = field(default_factory=dict)
    # operations/model/model_digests.py: (model, origin) -> [lock, digests], hashed once per run
    digests: dict = field(default_factory=dict)
    digests_lock: threading.Lock = field(default_factory=threading.Lock)
    # operations/transport/fanout.py: what is being sent -> its Swarm (who holds the bytes, who
    # serves next)
    swarms: dict = field(default_factory=dict)
    swarms_lock: threading.Lock = field(default_factory=threading.Lock)
    # operations/lock/lock.py: the deploy locks this run takes (its `_Run`, a state callback
    # handler)
    locks: object | None = None
    # operations/transport/openssh.py: host name -> (its OpenSSH argv or None, why); the hosts told
    # why not
    routes: dict = field(default_factory=dict)
    routes_told: set = field(default_factory=set)
    # operations/transport/peer_keys.py: (source, receiver) pairs told that their bytes go through
    # here
    relays_told: set = field(default_factory=set)


def of(state) -> RunState:
    """The run's state: made on first ask, kept on `state` for the run's life."""
    return run_scope.of(state, RunState)


def of_host(host) -> RunState:
    """The run of `host` (its `state`); an object that stands for a host outside any run (this
    machine as a source) gets a RunState of its own, kept by nothing: each ask decides afresh."""
    state = getattr(host, "state", None)
    return RunState() if state is None else of(state)


def found(state) -> RunState | None:
    """The run's state where a module made it, else None (asks nothing into being)."""
    return run_scope.found(state, RunState)
