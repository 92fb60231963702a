"""Fan-out: when several hosts need the same bytes in one run, hosts that have them serve the next
ones.

A run's bulk bytes start at an origin: the control machine's files (a stack's wheels from the
wheelhouse, a model from a directory named in `model_sources`) or an inventory host (a model from
`model_sources: {M: gpu-a}`). Without fan-out, eight hosts that need a new stack each read it from
the control machine at once: its one process and its uplink carry every byte eight times, and a run
on eight hosts costs eight times a run on one. Here each kind of bytes has a `Swarm`: who holds them
(the origin, then every host that got them whole in this run), who is getting them, and who serves
whom. A receiver takes a `Lease` on a source before it reads:

- an idle holder whose files cover what it needs (one receiver at a time per holder: a holder's
  uplink, like the control machine's, is the bound), the least used first;
- else, where the bytes start on the control machine, the control machine itself, but only when no
  holder covers them and nobody is getting them now: then the control machine carries each byte
  about once, and the number of hosts holding the bytes doubles each round (1, 2, 4, 8 ...): N
  receivers take about log2(N) + 1 rounds, not N;
- else it waits for a holder to be free, or for one on its way to arrive (`arrived`) or to give up
  (`gone`).

A receiver that cannot read from a holder directly (no route between the hosts:
operations/transport/peer_keys.py says why) is served by the origin as before, through this machine.
A receiver that got its bytes is on its way until its own check of them (the pinned sha256 of each
wheel, the listing of a model) passed: only then does it serve others, so bytes that did not check
out go nowhere. One that landed but was never checked (its run stopped between) stops counting after
LANDED_GRACE_S. The swarms live for one run (one pyinfra `State`); the decision (`choose`) is a pure
function of who holds, who is busy and who is coming, tested as data (tests/unit/test_fanout.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Mapping

from pyinfra import logger
from pyinfra.api.command import StringCommand

from operations.run import run_state
from operations.transport import openssh, peer_keys, streaming

# a receiver whose bytes landed but whose check never ran (its run stopped) counts this long
LANDED_GRACE_S = 900
WAIT_POLL_S = 5.0  # how often a waiting receiver looks again (besides being woken)
ORIGIN = "origin"  # `choose`'s answer: read from where the bytes start, as without fan-out
WAIT = "wait"  # `choose`'s answer: a holder is busy, or one is on its way


@dataclass(frozen=True)
class Holder:
    """A host that holds the bytes: `names` (name under `root` -> sha256, "" where not pinned) whole
    and checked."""

    host: object
    root: str
    names: Mapping[str, str] = field(default_factory=dict)
    origin: bool = False
    # a receiver still getting the bytes, read as it gets them (`root` its partial copy, where each
    # file has its name only once whole and checked: operations/model/forwarding.py)
    following: bool = False

    @property
    def name(self) -> str:
        return self.host.name

    def covers(self, want: Mapping[str, str]) -> bool:
        return all(self.names.get(name) == sha for name, sha in want.items())


@dataclass
class Coming:
    """A receiver getting the bytes now (`landed_at` set once they are in, before its own check)."""

    want: Mapping[str, str]
    landed_at: float | None = None
    # set by `receiving` once its partial copy holds only whole, checked files: it may forward them
    host: object = None
    root: str | None = None
    closing: bool = False  # renaming its copy into place: no new read of `root`


def covers(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(have.get(name) == sha for name, sha in want.items())


def choose(receiver: str, want: Mapping[str, str], holders: list[Holder], busy: set[str],
           coming: dict[str, Coming], served: Counter, control_origin: bool,
           no_direct: set[str], now: float, follow: bool = False):
    """Where `receiver` reads `want` from now: a `Holder`, ORIGIN (the control machine's files, or
    the named source host as without fan-out), or WAIT (see the module's text). With `follow`, a
    receiver that is getting the bytes itself and forwards them (`receiving`) and serves nobody yet
    is a source too, after an idle holder: the receivers form a chain, each reading what the one
    before it has checked while both receive."""
    covering = [h for h in holders if h.name != receiver and h.covers(want)]
    # it cannot read from another host directly: from the origin, as without fan-out
    if receiver in no_direct:
        covering = [h for h in covering if h.origin]
        if control_origin:
            return ORIGIN
    idle = [h for h in covering if h.name not in busy]
    if idle:
        return min(idle, key=lambda h: (served[h.name], h.origin, h.name))
    if follow and receiver not in no_direct:
        forwarding = [(name, c) for name, c in coming.items()
                      if name != receiver and c.root is not None and not c.closing
                      and name not in busy and covers(c.want, want)]
        if forwarding:
            name, c = forwarding[0]  # the first on its way: the furthest along
            return Holder(c.host, c.root, dict(c.want), following=True)
    if not control_origin:
        return WAIT if covering else ORIGIN
    on_the_way = [name for name, c in coming.items()
                  if name != receiver and covers(c.want, want)
                  and (c.landed_at is None or now - c.landed_at < LANDED_GRACE_S)]
    return WAIT if covering or on_the_way else ORIGIN


class Lease:
    """A receiver's read from one source (`source`: a Holder, or None for the origin, as without
    fan-out)."""

    def __init__(self, swarm: Swarm, receiver: str, source: Holder | None):
        self.swarm, self.receiver, self.source = swarm, receiver, source
        self._ended = False

    @property
    def peer(self) -> Holder | None:
        return self.source

    def ended(self) -> None:
        """The read is over (whatever came of it): the source is free for the next receiver."""
        if not self._ended:
            self._ended = True
            self.swarm._free(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.ended()


class Swarm:
    """One kind of bytes in one run: its holders, who is busy serving, who is on the way (see the
    module's text)."""

    def __init__(self, what: str, control_origin: bool):
        self.what = what
        self.control_origin = control_origin
        self.holders: list[Holder] = []
        self.busy: set[str] = set()
        self.coming: dict[str, Coming] = {}
        self.served: Counter = Counter()
        self.no_direct: set[str] = set()
        # receiver -> where it read from (the run's record, tests)
        self.sources: dict[str, str] = {}
        self.reading: Counter = Counter()  # forwarder -> reads of its partial copy going on
        self.waiting: Counter = Counter()  # receiver -> waiting in `lease` for a source
        self._cond = threading.Condition()

    def hold(self, holder: Holder) -> None:
        """`holder` holds the bytes (the origin, or a receiver whose check passed) and may serve
        others."""
        with self._cond:
            self.holders = [h for h in self.holders if h.name != holder.name] + [holder]
            self.coming.pop(holder.name, None)
            self._cond.notify_all()

    def seed(self, holder: Holder) -> None:
        """`holder` holds the bytes from the start (the source host `model_sources` names), unless
        known already."""
        with self._cond:
            if all(h.name != holder.name for h in self.holders):
                self.holders.append(holder)

    def lease(self, receiver: str, want: Mapping[str, str], timeout_s: float = 6 * 3600,
              follow: bool = False) -> Lease:
        """Wait for a source of `want` for `receiver` (see `choose`); `receiver` is on its way from
        then on, until `hold` (its check passed) or `gone`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.waiting[receiver] += 1
            try:
                while True:
                    answer = choose(receiver, want, self.holders, self.busy, self.coming,
                                    self.served, self.control_origin, self.no_direct,
                                    time.monotonic(), follow)
                    if answer != WAIT or time.monotonic() >= deadline:
                        break
                    self._cond.wait(WAIT_POLL_S)
            finally:
                self.waiting[receiver] -= 1
            source = answer if isinstance(answer, Holder) else None
            # only one that reads counts as on its way (never two waiting)
            self.coming[receiver] = Coming(dict(want))
            if source is not None:
                self.busy.add(source.name)
                self.served[source.name] += 1
            self.sources[receiver] = (
                f"{source.name} (while it receives)" if source and source.following
                else source.name if source else ORIGIN)
            return Lease(self, receiver, source)

    def receiving(self, receiver: str, host, root: str) -> None:
        """`receiver` (`host`) gets the bytes into `root`, which from now on holds only files whole
        and checked against the origin's digests (each named there only then): it may forward them
        (`choose`'s `follow`)."""
        with self._cond:
            if receiver in self.coming:
                self.coming[receiver].host, self.coming[receiver].root = host, root
                self._cond.notify_all()

    def forwarder(self, name: str) -> tuple[str, str | None]:
        """Where a follower of `name` reads now: ("coming", its partial copy), ("closing", None)
        while it renames that copy into place, ("held", its copy) once it holds the bytes whole, or
        ("gone", None)."""
        with self._cond:
            held = next((h for h in self.holders if h.name == name), None)
            if held is not None:
                return "held", held.root
            coming = self.coming.get(name)
            if coming is None or coming.root is None:
                return "gone", None
            return ("closing", None) if coming.closing else ("coming", coming.root)

    def start_reading(self, name: str) -> str | None:
        """A follower starts a read of `name`'s copy: the root to read (which stays where it is
        until `done_reading`), or None while `name` renames its copy (ask `forwarder` again)."""
        with self._cond:
            state, root = self.forwarder(name)
            if state not in ("coming", "held"):
                return None
            self.reading[name] += 1
            return root

    def done_reading(self, name: str) -> None:
        with self._cond:
            self.reading[name] -= 1
            self._cond.notify_all()

    def closing(self, receiver: str, timeout_s: float = 600) -> None:
        """`receiver` is about to rename its partial copy into place: no follower starts a read of
        it from now on, and this returns once the reads started are over."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if receiver in self.coming:
                self.coming[receiver].closing = True
            while self.reading[receiver] > 0 and time.monotonic() < deadline:
                self._cond.wait(WAIT_POLL_S)

    def awaited(self, receiver: str) -> bool:
        """Whether another receiver waits for a source, or follows one: `receiver` then takes its
        files one after another, so that each is whole, and forwarded, as early as it can be."""
        with self._cond:
            return any(n > 0 for name, n in self.waiting.items() if name != receiver) or any(
                source != ORIGIN and name != receiver for name, source in self.sources.items()
                if name in self.coming)

    def changed(self, timeout_s: float) -> None:
        """Wait until a holder, a receiver or a read changes, or `timeout_s`."""
        with self._cond:
            self._cond.wait(timeout_s)

    def no_direct_path(self, receiver: str) -> None:
        """`receiver` cannot read from other hosts directly: from now on it reads from the
        origin."""
        with self._cond:
            self.no_direct.add(receiver)

    def landed(self, receiver: str) -> None:
        """`receiver`'s bytes are in, its own check still to come."""
        with self._cond:
            if receiver in self.coming:
                self.coming[receiver].landed_at = time.monotonic()

    def gone(self, receiver: str) -> None:
        """`receiver` did not get the bytes (or they did not check out): nobody waits for it."""
        with self._cond:
            self.coming.pop(receiver, None)
            self._cond.notify_all()

    def _free(self, lease: Lease) -> None:
        with self._cond:
            if lease.source is not None:
                self.busy.discard(lease.source.name)
            self._cond.notify_all()


# off: every receiver reads from the origin at once, as before fan-out (bench/transfer.py compares)
ENABLED = True


def swarm(state, key: tuple, what: str, control_origin: bool) -> Swarm:
    """The run's swarm for `key` (the same bytes: one stack's wheels by their pins, one model from
    one source)."""
    run = run_state.of(state)
    with run.swarms_lock:
        swarms = run.swarms
        if key not in swarms:
            swarms[key] = Swarm(what, control_origin)
        return swarms[key]


def wheels(state) -> Swarm:
    """The run's wheels: pinned files from the wheelhouse on this machine, matched by name and
    sha256."""
    return swarm(state, ("wheels",), "wheels", control_origin=True)


class CheckedWheels(StringCommand):
    """The command that checks the wheels a host just got against their pins and gives them their
    names: once it passed, the host holds them and may serve them to the next hosts (`wheels`);
    where it failed, nobody waits for it. The command itself is unchanged (its text is what `--dry`
    and the tests see)."""

    def __init__(self, command: str, root: str, names: Mapping[str, str]):
        super().__init__(command.strip())
        self.root, self.names = root, dict(names)

    def execute(self, state, host, connector_arguments):
        swarm = wheels(state)
        try:
            result = super().execute(state, host, connector_arguments)
        except BaseException:
            swarm.gone(host.name)
            raise
        if result[0]:
            swarm.hold(Holder(host, self.root, self.names))
        else:
            swarm.gone(host.name)
        return result


class WheelPushes(streaming.Pushes):
    """`streaming.Pushes` of pinned wheels, read from another host of the run that holds these very
    files (the same names and pins) where one does or is getting them now, else pushed from here.
    The receiver is on its way to holding them until its own check of the pins (`CheckedWheels`)
    passed."""

    def _pushed(self, state, host) -> dict[str, bool]:
        todo = {dest: sha for _, dest, sha in self.files if dest not in self._verified}
        directories = {str(PurePosixPath(dest).parent) for dest in todo}
        if not todo or not ENABLED or len(directories) != 1 or not all(todo.values()) or \
                not all(dest.endswith(".part") for dest in todo):
            return self._push(host)
        swarm = wheels(state)
        want = {PurePosixPath(dest).name[:-len(".part")]: sha for dest, sha in todo.items()}
        with swarm.lease(host.name, want) as lease:
            if lease.source is not None:
                done = self._from_peer(host, lease.source, directories.pop(), want, swarm)
                if done is not None:
                    swarm.landed(host.name)
                    return done
        done = self._push(host)
        swarm.landed(host.name) if done else swarm.gone(host.name)
        return done

    def _from_peer(self, host, holder: Holder, directory: str, want: dict[str, str],
                   swarm: Swarm) -> dict[str, bool] | None:
        """`want` read by `host` from `holder` directly (a one-time key for exactly these files),
        landing as NAME.part in `directory`; None where that could not be done (the push from here
        then sends what did not land whole)."""
        grant = peer_keys.granted(holder.host, host, holder.root, sorted(want), host.log)
        if grant is None:
            swarm.no_direct_path(host.name)
            return None
        local = {PurePosixPath(dest).name[:-len(".part")]: src for src, dest, _ in self.files}
        sizes = {name: streaming.file_size(local[name]) for name in want}
        streams = openssh.streams(host)

        def unpack(names):  # the holder's stream may hold only these files, as pinned here
            return streaming.unpack_command(directory, suffix=".part", listing={
                name: [sizes[name], want[name]] for name in names})

        jobs = [grant.job(f"{self.what}s from {holder.name}", sum(sizes[n] for n in names),
                          names, unpack(names))
                for names in streaming.batches(sizes, streams)]
        total = sum(sizes.values())
        label = f"fetching {len(want)} {self.what}(s) from {holder.name} directly"
        try:
            moved = streaming.transfer_logged(jobs, streams, label, total, host.log)
        finally:
            grant.close()
        if not moved.ok:
            host.log_styled(f"fetching {self.what}s from {holder.name} failed: {moved.why}; "
                            "the rest from this machine",
                            fg="yellow", log_func=logger.warning)
            self._verified = None  # what landed whole (checked against its pin) is not sent again
            self.verified(host)
            return None
        host.log(f"fetched {len(want)} {self.what}(s), {total / 2**20:.0f} MiB in "
                 f"{moved.elapsed_s:.1f} s from {holder.name} directly ({len(jobs)} stream(s), "
                 f"{total / 2**20 / max(moved.elapsed_s, 1e-6):.0f} MiB/s): "
                 "not through this machine")
        return {f"{directory}/{name}.part": True for name in want}
