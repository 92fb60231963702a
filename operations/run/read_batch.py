"""A host's read as one command: which facts may join it, the command that reads them all at once,
and how its output is split back into each fact's answer.

operations/run/host_reads.py decides when a host is read and keeps the answers; this module is the
batch itself, pure: the registry of facts cheap enough for every batch (`batched`), a fact's key,
the command for a set of entries (`batch_command`: shell facts in the same shell, our python scripts
from one python start), kept below the kernel's bound on one argument (`built_within_bound`), and
`HostRead`, the composite fact pyinfra reads it with.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import re
import shlex
import zlib

from pyinfra.api import FactBase, StringCommand
from pyinfra.facts import files, server, systemd

from operations import remote

MARK = "@@sglang-deploy-read"
# remote.command's shape
_SCRIPT_SHAPE = re.compile(
    r"\A\(cd / && exec python3 -I - (?P<args>.*?) ?<<'PYEOF'\n(?P<body>.*)\nPYEOF\n\)\Z", re.S)

# Facts cheap enough to read in every batch, by 'module:Class' (`batched`), and the slow share of
# them.
BATCHED: dict[str, type] = {}
SLOW: set[str] = set()


def batched(slow: bool = False):
    """Class decorator: the fact may join a host's batch (its read costs little). `slow`: it takes
    far longer than the rest (a venv's RECORD check, nvidia-smi): the batch starts it first."""

    def register(cls: type) -> type:
        BATCHED[fact_name(cls)] = cls
        if slow:
            SLOW.add(fact_name(cls))
        return cls

    return register


def fact_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# pyinfra's own facts that our operations read.
for _fact in (files.File, files.Directory, files.Link, files.Sha1File, files.Sha256File,
              systemd.SystemdStatus, systemd.SystemdEnabled, server.Users,
              server.Groups, server.Os):
    batched()(_fact)


def cheap(cls: type, kwargs: dict) -> bool:
    # A full verify hashes every file of a venv or a model: asked for, never guessed.
    return fact_name(cls) in BATCHED and kwargs.get("verify", "fast") != "full"


def canonical(cls: type, kwargs: dict) -> dict | None:
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


def fact_key(cls: type, kwargs: dict) -> str:
    return f"{fact_name(cls)} {json.dumps(kwargs, sort_keys=True)}"


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
    return (fact_key not in asked, fact_name(fact_cls) not in SLOW,
            not fact_cls.__module__.startswith("operations."))


def built_within_bound(asked: set, wanted: dict):
    """(the entries in run order, their facts, batch_command's answer) for as many of `wanted` as
    fit in MAX_BATCH_BYTES, dropping the least needed first; None when none can be batched."""
    kept = sorted(wanted.items(), key=lambda item: _keep_first(item, asked))
    place = {fact_key: i for i, fact_key in enumerate(wanted)}
    while kept:
        # The longest reads start first (the batch's children run a few at a time): a venv's file
        # check queued behind a dozen short reads would add their time to its own. Otherwise, the
        # read set's order.
        ordered = sorted(kept, key=lambda item: (fact_name(item[1][0]) not in SLOW, place[item[0]]))
        entries = [(i, fact_cls(), fact_kwargs)
                   for i, (_, (fact_cls, fact_kwargs)) in enumerate(ordered)]
        slow = frozenset(i for i, fact, _ in entries if fact_name(type(fact)) in SLOW)
        built = batch_command(entries, slow)
        if built is None:
            return None
        if len(built[0].encode()) <= MAX_BATCH_BYTES or len(kept) == 1:
            return ordered, entries, built
        kept = kept[: max(1, len(kept) * 3 // 4)]
    return None


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
