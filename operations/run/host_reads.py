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
  (`lock_read`, run by operations/lock/lock.py once the lock is taken; `start_read` collects it
  through `HostRead`'s own `process`). So a converged re-run makes one read call per host.
- Only cheap facts join a batch (`batched`; a full-verify hash or the engine's parser is read only
  when asked for). A read the batch did not have, or that failed in it, is made on its own with
  `host.get_fact`, so errors are reported exactly as pyinfra reports them.

The read set is a hint, never a source of truth: a stale one costs a read nobody asks for, a
missing one a round trip; every answer still comes from the host in this run.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import time
import zlib
from pathlib import Path

import gevent
from pyinfra import host as context_host
from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api import operation as pyinfra_operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.facts import files, server, systemd

from operations import remote
from operations.pyinfra_adapter import connector_arguments, connector_context, real_host
from operations.run import run_state, this_run
from operations.run.private_dir import cache_root, private_dir

MARK = "@@sglang-deploy-read"
# remote.command's shape
_SCRIPT_SHAPE = re.compile(
    r"\A\(cd / && exec python3 -I - (?P<args>.*?) ?<<'PYEOF'\n(?P<body>.*)\nPYEOF\n\)\Z", re.S)

# Facts cheap enough to read in every batch, by 'module:Class' (`batched`), and the slow share of
# them.
_BATCHED: dict[str, type] = {}
_SLOW: set[str] = set()


def batched(slow: bool = False):
    """Class decorator: the fact may join a host's batch (its read costs little). `slow`: it takes
    far longer than the rest (a venv's RECORD check, nvidia-smi): the batch starts it first."""

    def register(cls: type) -> type:
        _BATCHED[_name(cls)] = cls
        if slow:
            _SLOW.add(_name(cls))
        return cls

    return register


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# pyinfra's own facts that our operations read.
for _fact in (files.File, files.Directory, files.Link, files.Sha1File, files.Sha256File,
              systemd.SystemdStatus, systemd.SystemdEnabled, server.Users,
              server.Groups, server.Os):
    batched()(_fact)


def _cheap(cls: type, kwargs: dict) -> bool:
    # A full verify hashes every file of a venv or a model: asked for, never guessed.
    return _name(cls) in _BATCHED and kwargs.get("verify", "fast") != "full"


def _canonical(cls: type, kwargs: dict) -> dict | None:
    """The fact's arguments with its defaults filled in, as JSON values; None if they are not plain
    data."""
    try:
        bound = inspect.getcallargs(cls().command, **kwargs)
    except TypeError:
        return None
    bound.pop("self", None)
    try:
        return json.loads(json.dumps(bound, sort_keys=True, default=_plain))
    except (TypeError, ValueError):
        return None


def _plain(value):
    if isinstance(value, (tuple, set, frozenset)):
        return list(value) if isinstance(value, tuple) else sorted(value)
    raise TypeError(type(value).__name__)


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
        now, prefix = time.monotonic(), _name(cls) + " "
        old = [k for k in self.answers
               if k.startswith(prefix) and now - self.read_at.get(k, 0) > max_age_s]
        for key in old:
            del self.answers[key]
        return len(old)


def _key(cls: type, kwargs: dict) -> str:
    return f"{_name(cls)} {json.dumps(kwargs, sort_keys=True)}"


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
    canonical = _canonical(cls, kwargs)
    if canonical is None:
        return host.get_fact(cls, **kwargs)
    host = real_host(host)
    # How the read runs (sudo, su, chdir, env, shell) is part of what it answers.
    execution = _execution(host, reads)
    key = _key(cls, canonical) + (f" {execution}" if execution != reads.execution else "")
    if execution == reads.execution and _cheap(cls, canonical):
        reads.asked.setdefault(key, (_name(cls), canonical))
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


def start_read(host, running: tuple[Batch, object] | None = None) -> None:
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


def lock_read(host) -> Batch | None:
    """The read to make in the same call that takes `host`'s lock (operations/lock/lock.py runs its
    command once the lock is taken, and hands it back to `start_read`); None where there is nothing
    to read yet (no read set) or the host's facts are already being read."""
    reads = reads_of(host)
    if reads is None or reads.batched or reads.pending:
        return None
    try:
        return plan_batch(reads, None, None, None)
    except Exception as exc:  # read on its own, later, where the error is reported as pyinfra does
        logger.debug(f"{host.name}: read with the lock not planned: {exc}")
        return None


def _background_read(host, reads: HostReads, running: tuple[Batch, object] | None,
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
        canonical = _canonical(cls, kwargs)
        if canonical is not None:
            extra[_key(cls, canonical)] = (cls, canonical)
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
    known = _BATCHED
    out = []
    for entry in entries if isinstance(entries, list) else ():
        if (isinstance(entry, list) and len(entry) == 2 and entry[0] in known
                and plain_arguments(entry[1])):
            if _cheap(known[entry[0]], entry[1]):
                out.append((known[entry[0]], entry[1]))
    return out


# What a read set may hold as a fact's arguments: the words this deploy derives from validated data
# (paths, unit and model names, addresses, ports). Some facts put their arguments into a shell
# command unquoted, and the file lives on the control machine between runs: an entry holding
# anything else (a space, a quote, `;`, `$`, a newline) is not something this deploy wrote, and is
# dropped (a dropped entry costs one read, never an answer).
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:@+=,%-]*")


def plain_arguments(value, depth: int = 0) -> bool:
    """Whether `value` (a read-set entry's arguments) holds only plain data: words of `_PLAIN_WORD`
    not starting with `-`, numbers, booleans, None, and lists and maps of them."""
    if depth > 4:
        return False
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return (len(value) < 4096 and not value.startswith("-")
                and _PLAIN_WORD.fullmatch(value) is not None)
    if isinstance(value, list):
        return all(plain_arguments(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _PLAIN_WORD.fullmatch(k) and plain_arguments(v, depth + 1)
                   for k, v in value.items())
    return False


def batch_command(entries: list[tuple[int, FactBase, dict]],
                  slow: frozenset[int] = frozenset()) -> tuple[str, set[int]] | None:
    """One shell command reading every entry (id, fact, kwargs), and the ids run by python; None
    when none can be. The runner imports what the `slow` ids' scripts need before its first forks,
    the rest after them.

    The same fact object must process the output: some keep what their command was given (Sha1File's
    path).

    Our remote scripts (`remote.command`) run from one python start
    (run/on_host/run_scripts.py); every other fact is a shell segment. All run at once, each into a
    file of a private temporary directory; then the files are printed in order: shell facts' output
    followed by a marker line with the id and exit status, then the python jobs, each marker first.
    """
    shell, shell_ids, scripts = [], [], []
    for job_id, fact, kwargs in entries:
        if fact.shell_executable:
            continue
        command = fact.command(**kwargs)
        raw = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        match = _SCRIPT_SHAPE.match(raw)
        if match and remote.is_script(match["body"]):
            scripts.append([job_id, match["body"], split_args(match["args"])])
            continue
        shell_ids.append(job_id)
        requires = (fact.requires_command(**kwargs) if callable(fact.requires_command)
                    else fact.requires_command)
        if requires:
            raw = f"if command -v {requires} >/dev/null 2>&1; then ( {raw}\n); else false; fi"
        # Through a variable: output without a final newline still ends before the marker line.
        shell.append(
            f"( out=$( {raw}\n) </dev/null 2>/dev/null; rc=$?; [ -z \"$out\" ] || printf '%s\\n' "
            f"\"$out\"; echo \"{MARK} {job_id} $rc\" ) > \"$d/s{job_id}\" &"
        )
    if not shell and not scripts:
        return None
    parts = ['d=$(mktemp -d) || exit 1', "trap 'rm -rf \"$d\"' EXIT"]
    parts += shell
    if scripts:
        # zlib's fastest level: level 9 takes several times its CPU, on every host of every run, to
        # save little on the wire (the figures: bench/HISTORY.md).
        # _common.py is inlined in every script (remote.script): the batch carries it once, each
        # body a mark in its place (zlib's window, 32 kB, is shorter than a script: each copy would
        # cost its full compressed size).
        shared = remote.shared_text()
        jobs = [[job_id, body.replace(shared, remote.SHARED_MARK, 1), argv]
                for job_id, body, argv in scripts]
        payload = base64.b64encode(zlib.compress(
            json.dumps({"shared": shared, "jobs": jobs}).encode("utf-8"), 1)).decode("ascii")
        # What the scripts import at their top level (found here when each was inlined): the runner
        # imports it before forking, the slow reads' share before the first forks.
        imports = sorted(
            {module for _, body, _ in scripts for module in remote.top_level_imports(body)})
        early = sorted({module for job_id, body, _ in scripts if job_id in slow
                        for module in remote.top_level_imports(body)})
        runner = remote.script("run_scripts") + f"\nrun_all({payload!r}, {imports!r}, {early!r})\n"
        parts.append(remote.heredoc("python3", "", runner) + ' > "$d/python" &')
    parts.append("wait")
    parts.append(f"echo '{MARK} start'")
    parts += [f"cat \"$d/s{job_id}\"" for job_id in shell_ids]
    if scripts:
        parts.append('cat "$d/python"')
    return "\n".join(parts), {job[0] for job in scripts}


@dataclasses.dataclass
class Batch:
    """One planned read of a host: the command, and what each of its jobs answers."""

    command: str
    keys: list[str]  # the answer's key of each job, by id
    # the fact object that processes each job's output (some keep what their command was given)
    facts: list[FactBase]
    python_ids: set[int]

    # how pyinfra names it in its log: "Loaded fact ...HostRead (batch=...)"
    def __str__(self) -> str:
        return f"{len(self.keys)} facts"

    def read(self, stdout_lines: list[str]) -> dict[str, object]:
        """The answers of the jobs that succeeded, by key (the others are read on their own when
        asked for, so their errors are reported as pyinfra reports them)."""
        answers = {}
        for job_id, (status, lines) in split_batch(stdout_lines, self.python_ids).items():
            if status != 0:
                continue
            fact = self.facts[job_id]
            try:
                answers[self.keys[job_id]] = fact.process(lines) if lines else fact.default()
            except Exception:
                continue
        return answers


class HostRead(FactBase):
    """Many facts of a host in one command: a planned `Batch`'s answers, by key. Read with pyinfra's
    `host.get_fact` (`_read_batch`); the lock's command may run the same batch, whose output
    `Batch.read` takes the same way."""

    def command(self, batch: Batch) -> str:
        # the same object processes the output (as pyinfra's Sha1File keeps its path)
        self.batch = batch
        return batch.command

    def process(self, output: list[str]) -> dict[str, object]:
        return self.batch.read(output)

    @staticmethod
    def default() -> dict[str, object]:
        return {}


def plan_batch(reads: HostReads, key: str | None, cls: type | None, kwargs: dict | None,
               extra: dict[str, tuple[type, dict]] | None = None) -> Batch | None:
    """The batch reading the host's read set (and the fact `key` being asked for, and `extra`: key
    -> (class, arguments), if any); None when there is nothing to share a call with."""
    wanted = {key: (cls, kwargs)} if key is not None and _cheap(cls, kwargs) else {}
    wanted.update(extra or {})
    for other_cls, other_kwargs in _load_read_set(reads.read_set):
        wanted.setdefault(_key(other_cls, other_kwargs), (other_cls, other_kwargs))
    if not wanted or (key is not None and len(wanted) < 2):
        return None  # nothing to share a call with: the read goes on its own
    built = _built_within_bound({key, *(extra or {})}, wanted)
    if built is None:
        return None
    ordered, entries, (command, python_ids) = built
    return Batch(command, [fact_key for fact_key, _ in ordered],
                 [fact for _, fact, _ in entries], python_ids)


# The batch travels as one argument of the host's shell (`sh -c COMMAND`, over SSH and with the
# lock's command around it), and Linux refuses any one argument over 128 KiB (MAX_ARG_STRLEN:
# "Argument list too long"). A read set grows with what a run asked for (a first install asks about
# every wheel it pushes), so the batch is kept well below that, quoting included: what does not fit
# is read on its own when asked for, as before there was a read set.
MAX_BATCH_BYTES = 96 * 1024


def _keep_first(item, asked: set) -> tuple:
    """Which entries a batch too large keeps: the facts being asked for, the slow reads, our own,
    then pyinfra's."""
    fact_key, (fact_cls, _) = item
    return (fact_key not in asked, _name(fact_cls) not in _SLOW,
            not fact_cls.__module__.startswith("operations."))


def _built_within_bound(asked: set, wanted: dict):
    """(the entries in run order, their facts, batch_command's answer) for as many of `wanted` as
    fit in MAX_BATCH_BYTES, dropping the least needed first; None when none can be batched."""
    kept = sorted(wanted.items(), key=lambda item: _keep_first(item, asked))
    place = {fact_key: i for i, fact_key in enumerate(wanted)}
    while kept:
        # The longest reads start first (the batch's children run a few at a time): a venv's file
        # check queued behind a dozen short reads would add their time to its own. Otherwise, the
        # read set's order.
        ordered = sorted(kept, key=lambda item: (_name(item[1][0]) not in _SLOW, place[item[0]]))
        entries = [(i, fact_cls(), fact_kwargs)
                   for i, (_, (fact_cls, fact_kwargs)) in enumerate(ordered)]
        built = batch_command(entries,
                              frozenset(i for i, fact, _ in entries if _name(type(fact)) in _SLOW))
        if built is None:
            return None
        if len(built[0].encode()) <= MAX_BATCH_BYTES or len(kept) == 1:
            return ordered, entries, built
        kept = kept[: max(1, len(kept) * 3 // 4)]
    return None


def _keep_all(reads: HostReads, answers: dict[str, object]) -> None:
    for key, value in answers.items():
        reads.keep(key, value)


_QUOTED_ARG = re.compile(r"""''|[\w@%+=:,./-]+|'(?:[^']|'"'"')*'""")


def split_args(args: str) -> list[str]:
    """`shlex.split(args)` for arguments as our scripts' commands write them (each `shlex.quote`d,
    one space apart), in a fraction of its time (pure-python shlex was a large share of each host's
    read plan: bench/HISTORY.md); anything else goes to shlex.
    The answer is checked by quoting it again: it must give `args` back exactly."""
    tokens = _QUOTED_ARG.findall(args)
    words = [token[1:-1].replace("'\"'\"'", "'") if token.startswith("'") else token
             for token in tokens]
    if " ".join(shlex.quote(word) for word in words) != args:
        return shlex.split(args)
    return words


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
    answers = host.get_fact(HostRead, batch=batch, _ignore_errors=True)
    if not answers or reads.generation != generation:
        return False
    _keep_all(reads, answers)
    return True


def split_batch(stdout_lines: list[str], python_ids: set[int]) -> dict[int, tuple[int, list[str]]]:
    """{id: (exit status, output lines)}: shell jobs print, then their marker; python jobs print
    their marker, then their output."""
    results: dict[int, tuple[int, list[str]]] = {}
    pending: list[str] = []
    in_python: int | None = None
    for line in stdout_lines:
        if line == f"{MARK} start":
            pending = []
            continue
        if line.startswith(MARK + " "):
            _, job, status = line.split()
            job_id, status = int(job), int(status)
            if in_python is not None:
                results[in_python] = (results[in_python][0], pending)
            if job_id in python_ids:
                results[job_id] = (status, [])
                in_python = job_id
            else:
                results[job_id] = (status, pending)
                in_python = None
            pending = []
            continue
        pending.append(line)
    if in_python is not None:
        results[in_python] = (results[in_python][0], pending)
    return results


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
