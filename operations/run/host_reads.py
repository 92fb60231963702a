"""One read of each host per run: the deploy's facts answered from one composite fact, through
pyinfra's own path.

pyinfra 3 caches no fact, and this deploy's operations each read what they decide from
(a venv's state by its build, probe and switch; a unit's hash by the preflight and the file
write; systemd's status by each service's enable, start and restart). A converged re-run, what
operators run most, cost several times the floor of merely reaching the hosts, and more with every
service.

The mechanism, public pyinfra only (`host.get_fact`, `FactBase`, `BaseStateCallback`,
`OperationMeta`):
- **Asked explicitly.** Our operations read a fact with `host_reads.get(host, Fact, **arguments)`;
  pyinfra's own operations read theirs as they always do (none sits on the converged path:
  `directory_present` and `group_present` below stand in for `files.directory` and `server.group`
  there).
- **Cached.** A fact read once is answered again from memory until the host changes: an operation
  that ran a command there (`Reads`, a state callback, asks pyinfra's `OperationMeta` whether the
  operation changed or failed once it is complete; our own operations, made with
  `host_reads.operation`, also say so after each of their commands, for a read later in the same
  operation), or one of our commands outside pyinfra's command path (a streamed channel: `forget`).
  Then the host's answers are dropped, and each fact is read again once, when next asked for.
- **Batched.** The first read of a host in a run is one composite fact, `HostRead`, read with
  pyinfra's `host.get_fact`: it reads, in one remote call, every other fact that the same data read
  on that host the last time (the *read set*, kept on the control machine, see `read_set_path`). Our
  python scripts run in one python process (run/on_host/run_scripts.py); pyinfra's shell facts run
  in the same shell. The command that takes the host's deploy lock may run that same batch
  (`lock_read`, run by operations/lock/run_locks.py once the lock is taken; `start_read` collects it
  through `HostRead`'s own `process`). So a converged re-run makes one read call per host.
- Only cheap facts join a batch (`batched`; a full-verify hash or the engine's parser is read only
  when asked for). A read the batch did not have, or that failed in it, is made on its own with
  `host.get_fact`, so errors are reported exactly as pyinfra reports them.

The read set is a hint, never a source of truth: a stale one costs a read nobody asks for, a
missing one a round trip; every answer still comes from the host in this run.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import gevent
from pyinfra import host as context_host
from pyinfra import logger
from pyinfra.api import FactBase
from pyinfra.api import operation as pyinfra_operation
from pyinfra.api.state import BaseStateCallback

from operations.pyinfra_adapter import connector_arguments, connector_context, real_host
from operations.run import read_batch, run_state, this_run
from operations.run.private_dir import cache_root, private_dir


class HostReads:
    """One host's answers in this run."""

    def __init__(self, read_set: Path | None, execution: str, keep_read_set: bool = True):
        self.read_set = read_set
        # False: what this run asks is not saved as the next run's read set
        self.keep_read_set = keep_read_set
        # reads made the deploy's usual way (no operation's _sudo...) are shared and batched
        self.execution = execution
        self.answers: dict[str, object] = {}
        self.read_at: dict[str, float] = {}  # key -> when its answer was read (time.monotonic)
        self.batched = False
        # A count of changes: an answer read while the host changed (another greenlet's operation, a
        # stream into the host) is not kept.
        self.generation = 0
        # key -> (fact name, kwargs): next run's read set
        self.asked: dict[str, tuple[str, dict]] = {}
        # calls that went to the host (batch or single), for tests and the bench
        self.remote_reads = 0
        # reads begun when the run took the host's lock (start_read), not yet joined
        self.pending: list = []
        self.executions: dict[str, str] = {}  # connector_arguments' answers by connector_context
        self.last_op: str | None = None  # the operation that last started on the host (Reads)
        # operations whose change was already accounted for (Reads.operation_end)
        self.accounted: set[str] = set()

    def forget_answers(self) -> None:
        self.generation += 1
        self.answers.clear()

    def keep(self, key: str, value) -> None:
        self.answers[key] = value
        self.read_at[key] = time.monotonic()

    def forget_older_than(self, cls: type, max_age_s: float) -> int:
        """Drop the answers of fact `cls` read more than `max_age_s` ago (the next ask reads it
        again); how many."""
        now, prefix = time.monotonic(), read_batch.fact_name(cls) + " "
        old = [k for k in self.answers
               if k.startswith(prefix) and now - self.read_at.get(k, 0) > max_age_s]
        for key in old:
            del self.answers[key]
        return len(old)


def prepare(state, host, config_digest: str, keep_read_set: bool = True) -> HostReads:
    """Answer `host`'s facts through this module for the rest of the run (once per host per run);
    reads nothing yet.

    `keep_read_set=False`: what this run asks is not saved as the host's next read set (a read-only
    view, such as the status, asks less than a deploy: it must not shrink the deploy's next
    read)."""
    host = real_host(host)
    hosts = run_state.of(state).reads
    reads = hosts.get(host.name)
    if reads is not None:
        return reads
    reads = hosts[host.name] = HostReads(read_set_path(host, config_digest), "", keep_read_set)
    reads.execution = _execution(host, reads)
    if not any(isinstance(h, Reads) for h in state.callback_handlers):
        state.add_callback_handler(Reads())
    return reads


def reads_of(host) -> HostReads | None:
    """`host`'s reads in its run, None where `prepare` was not called for it."""
    state = getattr(host, "state", None)  # an object that is no pyinfra Host (a test's) has none
    run = None if state is None else run_state.found(state)
    return None if run is None else run.reads.get(host.name)


def get(host, cls: type, **kwargs):
    """Fact `cls` of `host` with `kwargs`, as `host.get_fact(cls, **kwargs)` answers it, read once
    per run until the host changes (see the module's docstring); the first read of the host in the
    run reads its read set too.

    Reads with connector arguments of their own (`_sudo=True`...), with arguments that are not plain
    data, or of a host not prepared, are made by pyinfra as asked, every time."""
    reads = reads_of(host)
    if reads is None or any(k.startswith("_") for k in kwargs) or not issubclass(cls, FactBase):
        return host.get_fact(cls, **kwargs)
    canonical = read_batch.canonical(cls, kwargs)
    if canonical is None:
        return host.get_fact(cls, **kwargs)
    host = real_host(host)
    # How the read runs (sudo, su, chdir, env, shell) is part of what it answers.
    execution = _execution(host, reads)
    key = read_batch.fact_key(cls, canonical)
    if execution != reads.execution:
        key += f" {execution}"
    if execution == reads.execution and read_batch.cheap(cls, canonical):
        reads.asked.setdefault(key, (read_batch.fact_name(cls), canonical))
    if key not in reads.answers and not reads.batched:
        reads.batched = True
        _read_batch(host, reads, key, cls, canonical)
    if key in reads.answers:
        return copy.deepcopy(reads.answers[key])
    generation = reads.generation
    reads.remote_reads += 1
    value = host.get_fact(cls, **kwargs)
    if reads.generation == generation:
        reads.keep(key, value)
    return copy.deepcopy(value)


def reader(host):
    """`read(Fact, **arguments)`: `get` for `host`, as the host's plan reads
    (deploys/plan.py)."""
    return lambda cls, **kwargs: get(host, cls, **kwargs)


def start_read(host, running: tuple[read_batch.Batch, object] | None = None) -> None:
    """Begin `host`'s one read in the background: called as soon as the run holds its lock
    (operations/lock/lock.py), so each host's read overlaps the lock pass's next hosts instead of
    waiting for all of them.

    `running` is a read already running on the host, begun by the very command that took its lock
    (`lock_read`): the batch it runs and a greenlet that gives that command's (exit status, output
    lines, stderr). Without it the read is sent now, in a call of its own.

    A read begun under a lock the pass then gives back (to wait for another host's) is dropped with
    it: giving the lock back is a command on the host, which drops the host's answers and any read
    in flight (`HostReads.changed`, called by the lock); the read begins again when the lock is
    taken again.
    """
    reads = reads_of(host)
    if reads is None:
        return  # a host pyinfra has not loaded yet: its own install reads it
    # what an earlier hold of the lock read (or is reading) is not kept: this read replaces it
    reads.forget_answers()
    reads.pending.append(
        gevent.spawn(_background_read, real_host(host), reads, running, reads.generation))


def lock_read(host) -> read_batch.Batch | None:
    """The read to make in the same call that takes `host`'s lock (operations/lock/run_locks.py runs
    its command once the lock is taken, and hands it back to `start_read`); None where there is
    nothing to read yet (no read set) or the host's facts are already being read."""
    reads = reads_of(host)
    if reads is None or reads.batched or reads.pending:
        return None
    try:
        return plan_batch(reads, None, None, None)
    except Exception as exc:  # read on its own, later, where the error is reported as pyinfra does
        logger.debug(f"{host.name}: read with the lock not planned: {exc}")
        return None


def _background_read(host, reads: HostReads, running: tuple[read_batch.Batch, object] | None,
                     generation: int) -> bool:
    try:
        if running is None:
            return _read_batch(host, reads, None, None, None)
        batch, output = running
        reads.remote_reads += 1
        status, lines, stderr = output.get()
        if status != 0 or reads.generation != generation:
            logger.debug(f"{host.name}: read begun with the lock not kept (exit status {status}): "
                         f"{stderr.strip()[-300:]}")
            return False
        _keep_all(reads, batch.read(lines))
        return True
    # the host's own install reads again, and reports what fails as pyinfra does
    except Exception as exc:
        logger.debug(f"{host.name}: read begun with the lock failed: {exc}")
        return False


def install(state, host, config_digest: str, also: tuple[tuple[type, dict], ...] = (),
            keep_read_set: bool = True) -> None:
    """Prepare `host` if not yet, and make its one read now unless a read begun under its lock
    answered.

    `also`: facts (class, arguments) to read in that same call besides the read set (a read-only
    command that asks what the deploy does not, such as the status view's probe); each is answered
    from it when asked for."""
    reads = prepare(state, host, config_digest, keep_read_set)
    if reads.batched:
        return
    pending, reads.pending = reads.pending, []
    gevent.joinall(pending)
    reads.batched = True
    if reads.answers and any(g.value for g in pending):
        return  # answered by a read begun with the lock, and nothing ran on the host since
    # Read now, while pyinfra loads the deploy for every host at once: the hosts' batches overlap,
    # instead of each host's first fact waiting for its turn in the operation order.
    extra = {}
    for cls, kwargs in also:
        canonical = read_batch.canonical(cls, kwargs)
        if canonical is not None:
            extra[read_batch.fact_key(cls, canonical)] = (cls, canonical)
    _read_batch(real_host(host), reads, None, None, None, extra)


def forget(host) -> None:
    """One of our commands changed `host` outside pyinfra's command path (a streamed channel, a lock
    given back): drop its answers."""
    reads = reads_of(host)
    if reads is not None:
        reads.forget_answers()


def fresh(host, cls: type, max_age_s: float) -> None:
    """Make the next read of fact `cls` on `host` come from the host if its kept answer is older
    than `max_age_s`.

    For decisions that cannot wait for the next run to be corrected (a verdict that a service is
    ready, which a removal elsewhere may follow): pyinfra runs each operation on every host before
    the next, so on a host where nothing ran, the answer of its read at the lock can be minutes old
    by the time a late operation asks."""
    reads = reads_of(host)
    if reads is not None:
        reads.forget_older_than(cls, max_age_s)


def read_set_path(host, config_digest: str) -> Path:
    """Where the facts this data read on this host are kept between runs (control machine, per user,
    in a directory of this user's alone: operations/run/private_dir.py). `config_digest` stands for
    the host's validated config, its address included."""
    digest = hashlib.sha256(f"{host.name}\0{config_digest}".encode()).hexdigest()[:32]
    # A read set names the commands every host runs: it is kept where only this user can write (or
    # the run stops).
    return private_dir(cache_root() / "reads") / f"{digest}.json"


def operation(*args, **kwargs):
    """pyinfra's `@operation`, for an operation whose commands change its host: after each of its
    commands ran, the host's answers are dropped, so a fact the operation reads after a command is
    read again.

    pyinfra calls an operation's function twice: while adding it (up to its first command, to learn
    whether it changes anything; nothing runs) and while executing it, when each command runs before
    the function goes on."""

    def decorate(func):
        @functools.wraps(func)
        def commands(*func_args, **func_kwargs):
            generator = func(*func_args, **func_kwargs)
            answer = None
            while True:
                try:
                    command = generator.send(answer)
                except StopIteration as stop:
                    return stop.value
                from_pyinfra = this_run.executing()
                try:
                    answer = yield command
                # pyinfra stopped at this command: it failed, or the run only looked
                except GeneratorExit:
                    if from_pyinfra:
                        forget(context_host)
                    generator.close()
                    raise
                if from_pyinfra:
                    forget(context_host)  # the command ran

        return pyinfra_operation(*args, **kwargs)(commands)

    return decorate


def _execution(host, reads: HostReads) -> str:
    """The connector arguments a fact read on `host` would run with now (an operation's own
    `_sudo`...), as a key.

    pyinfra works them out from the current operation's and deploy's arguments over the host's data
    and the run's config (half a millisecond, on every fact asked for); within a run only the first
    two change, so the answer is kept by them, per host.
    """
    context = connector_context(host)
    if context not in reads.executions:
        reads.executions[context] = json.dumps(connector_arguments(host),
                                               sort_keys=True, default=str)
    return reads.executions[context]


def _load_read_set(path: Path | None) -> list[tuple[type, dict]]:
    if path is None:
        return []
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    known = read_batch.BATCHED
    out = []
    for entry in entries if isinstance(entries, list) else ():
        if (isinstance(entry, list) and len(entry) == 2 and entry[0] in known
                and read_batch.plain_arguments(entry[1])):
            if read_batch.cheap(known[entry[0]], entry[1]):
                out.append((known[entry[0]], entry[1]))
    return out


# What a read set may hold as a fact's arguments: the words this deploy derives from validated data
# (paths, unit and model names, addresses, ports). Some facts put their arguments into a shell
# command unquoted, and the file lives on the control machine between runs: an entry holding
# anything else (a space, a quote, `;`, `$`, a newline) is not something this deploy wrote, and is
# dropped (a dropped entry costs one read, never an answer).
def plan_batch(reads: HostReads, key: str | None, cls: type | None, kwargs: dict | None,
               extra: dict[str, tuple[type, dict]] | None = None) -> read_batch.Batch | None:
    """The batch reading the host's read set (and the fact `key` being asked for, and `extra`: key
    -> (class, arguments), if any); None when there is nothing to share a call with."""
    wanted = {key: (cls, kwargs)} if key is not None and read_batch.cheap(cls, kwargs) else {}
    wanted.update(extra or {})
    for other_cls, other_kwargs in _load_read_set(reads.read_set):
        wanted.setdefault(read_batch.fact_key(other_cls, other_kwargs), (other_cls, other_kwargs))
    if not wanted or (key is not None and len(wanted) < 2):
        return None  # nothing to share a call with: the read goes on its own
    built = read_batch.built_within_bound({key, *(extra or {})}, wanted)
    if built is None:
        return None
    ordered, entries, (command, python_ids) = built
    return read_batch.Batch(command, [fact_key for fact_key, _ in ordered],
                 [fact for _, fact, _ in entries], python_ids)


def _keep_all(reads: HostReads, answers: dict[str, object]) -> None:
    for key, value in answers.items():
        reads.keep(key, value)


def _read_batch(host, reads: HostReads, key: str | None, cls: type | None, kwargs: dict | None,
                extra: dict | None = None) -> bool:
    """Read the host's read set (and the fact `key` being asked for, and `extra`'s, if any) in one
    call; whether answers were kept."""
    try:
        batch = plan_batch(reads, key, cls, kwargs, extra)
    except Exception as exc:  # a fact whose command cannot be built from the stored kwargs
        logger.debug(f"{host.name}: host reads batch not built: {exc}")
        return False
    if batch is None:
        return False
    generation = reads.generation
    reads.remote_reads += 1
    # A batch that fails as a whole (never seen: each job's status is its own) costs a warning and
    # the single reads.
    answers = host.get_fact(read_batch.HostRead, batch=batch, _ignore_errors=True)
    if not answers or reads.generation != generation:
        return False
    _keep_all(reads, answers)
    return True


class Reads(BaseStateCallback):
    """The run's hosts' answers, kept true through pyinfra's own callbacks.

    An operation that ran a command on a host (it changed something, or failed part way) drops that
    host's answers: pyinfra completes an operation's `OperationMeta` just after its host callbacks,
    so this looks at it when the operation has ended on every host (`operation_end`), and where
    hosts run their operations one after another (`--serial`, `--no-wait`), when the host starts its
    next one. When a host disconnects, what it was asked for is kept as the next run's read set."""

    def operation_host_start(self, state, host, op_hash):
        reads = reads_of(host)
        if reads is None:
            return
        previous, reads.last_op = reads.last_op, op_hash
        if (previous is not None and previous not in reads.accounted
                and _ran_commands(state, host, previous)):
            reads.forget_answers()

    def operation_end(self, state, op_hash):
        run = run_state.found(state)
        for name, reads in (run.reads if run is not None else {}).items():
            host = state.inventory.get_host(name, None)
            if host is not None and _ran_commands(state, host, op_hash):
                reads.accounted.add(op_hash)
                reads.forget_answers()

    def host_disconnect(self, state, host):
        reads = reads_of(host)
        if reads is None:
            return
        logger.debug(f"{host.name}: {reads.remote_reads} read call(s) to the host, "
                     f"{len(reads.asked)} distinct batchable facts asked for")
        if reads.read_set is None or not reads.asked or not reads.keep_read_set:
            return
        entries = sorted(([name, kwargs] for name, kwargs in reads.asked.values()), key=json.dumps)
        try:
            reads.read_set.parent.mkdir(parents=True, exist_ok=True)
            tmp = reads.read_set.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(entries, sort_keys=True))
            os.replace(tmp, reads.read_set)
        except OSError as exc:
            logger.debug(f"{host.name}: read set not saved: {exc}")


def _ran_commands(state, host, op_hash: str) -> bool:
    """Whether operation `op_hash`, complete on `host`, ran a command there (pyinfra's
    OperationMeta)."""
    data = state.ops.get(host, {}).get(op_hash)
    meta = getattr(data, "operation_meta", None)
    return meta is not None and meta.is_complete() and (meta.did_change() or meta.did_error())
