"""One host's part of a run: the machinery that deploy.py, status.py and measure.py each set up
before their own steps, behind one object.

    run = HostRun.of(host)       # the validated data: this host's, the inventory's, its stack and
                                 # patch sets (a bad value anywhere stops the run before any host
                                 # is touched)
    run.deploying(state)         # deploy.py: the summary, the host's one read, its lock, the timers
    run.observing(state, also)   # status.py: the one read (and `also` in it), no lock, nothing kept

measure.py needs the data only (`HostRun.of`). What each entry point then does with it - the
deploy's plan and components, the status view's rows, the measurements - stays in that file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from configuration import settings, stacks
from configuration.patch_sets import PatchSet, load_patch_set
from configuration.settings import HostConfig
from operations.lock import lock, run_locks
from operations.pyinfra_adapter import real_host
from operations.run import host_reads
from report import health_timer, plan_view, summary


@dataclass(frozen=True)
class HostRun:
    host: object  # pyinfra's Host (not its context proxy: real_host)
    config: HostConfig  # this host's validated configuration
    inventory: dict[str, HostConfig]  # every host's, validated once per run
    stack: stacks.Stack
    patch_sets: dict[str, PatchSet]

    @classmethod
    def of(cls, host) -> HostRun:
        """The validated data. The whole inventory (every host, every service placed or not, its
        stacks and patch sets) is validated once per run by the first host to get here; every
        host's load raises the same DataError, so a bad value anywhere stops the run before any
        host's lock is taken (configuration/settings.py)."""
        config = settings.host_config(host)
        return cls(real_host(host), config, settings.validate_inventory(host.state),
                   stacks.load_stack(config.stack),
                   {name: load_patch_set(name) for name in config.patch_sets})

    @property
    def digest(self) -> str:
        """What the host's read set is kept under: this configuration
        (operations/run/host_reads.py)."""
        return repr(self.config)

    def deploying(self, state) -> None:
        """A deploy's machinery: the run's summary, then every fact of this host read once (one
        batched call on a converged host, begun as soon as the run holds the host's lock) and
        again only after a command ran there; the lock (waiting as long as each host's
        `lock_wait_s` says); the health timer; last, the plan view (under --dry with PLAN_JSON it
        ends the process with the plan's exit code)."""
        summary.install_summary(state)
        host_reads.prepare(state, self.host, config_digest=self.digest)
        lock.acquire(self.host, state, self.config.lock_wait_s, on_held=host_reads.start_read,
                     read=host_reads.lock_read,
                     waits={name: c.lock_wait_s for name, c in self.inventory.items()})
        host_reads.install(state, self.host, config_digest=self.digest)
        health_timer.install_timer(state)
        plan_view.install(state, os.environ)

    def observing(self, state, also: tuple[tuple[type, dict], ...] = ()) -> None:
        """A read-only view's machinery: the host's one read as the deploy reads it, with `also`
        (the view's own small reads) in it; no lock is taken or waited for, and nothing is kept on
        the control machine (what it asks is not saved as the next read set)."""
        # each command otherwise waits for a delayed ACK (operations/lock/run_locks.py)
        run_locks.send_without_delay(self.host)
        # a host that stops answering is dropped within seconds, not waited for
        run_locks.watch_connection(self.host)
        host_reads.prepare(state, self.host, config_digest=self.digest, keep_read_set=False)
        host_reads.install(state, self.host, config_digest=self.digest, also=also)
