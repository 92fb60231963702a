"""operations/run/host_reads.py on pyinfra's @local host: real shell commands, real fact classes.

What must hold: a batch answers each fact exactly as that fact's own read does; a fact is read
from the host once until a command runs there; the read set of one run makes the next run's
first read a single call that answers the rest.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import shlex
import subprocess
import sys
import zlib

import pytest
from pyinfra import host as context_host
from pyinfra.api import Config, FactBase, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.operations import files, server

from operations import remote
from operations.model.transfer import StoreListing
from operations.run import host_reads, read_batch


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_DEPLOY_CACHE", str(tmp_path / "cache"))

    def new_run():
        inventory = Inventory((["@local"], {}))
        state = State(inventory, Config())
        connect_all(state)
        return state, inventory.get_host("@local")

    return new_run


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "weights.bin").write_bytes(b"x" * 1000)
    (root / "no-newline.txt").write_text("last line without a newline")
    return root


def installed(local, digest: str = "d"):
    """A new run on the @local host with host_reads installed: (state, host, its HostReads)."""
    state, host = local()
    host_reads.install(state, host, config_digest=digest)
    return state, host, host_reads.reads_of(host)


def facts_for(tree) -> list[tuple[type, dict]]:
    return [
        (File, {"path": str(tree / "config.json")}),
        (File, {"path": str(tree / "absent")}),
        (Sha1File, {"path": str(tree / "no-newline.txt")}),
        (Directory, {"path": str(tree / "sub")}),
        (StoreListing, {"path": str(tree)}),
        (StoreListing, {"path": str(tree / "absent")}),
    ]


def _no_atime(value):
    return {k: v for k, v in value.items() if k != "atime"} if isinstance(value, dict) and "atime" in value else value


def test_a_batch_answers_every_fact_as_its_own_read_does(local, tree):
    state, host = local()
    alone = [host.get_fact(cls, **kwargs) for cls, kwargs in facts_for(tree)]
    entries = [(i, cls(), kwargs) for i, (cls, kwargs) in enumerate(facts_for(tree))]
    command, python_ids = read_batch.batch_command(entries)
    assert python_ids == {4, 5}  # both model listings run in the one python process
    ok, output = host.run_shell_command(command, print_output=False)
    assert ok, output.stderr
    results = read_batch.split_batch(output.stdout_lines, python_ids)
    assert sorted(results) == list(range(len(entries)))
    batched = [fact.process(results[i][1]) if results[i][1] else fact.default() for i, fact, _ in entries]
    assert all(results[i][0] == 0 for i, _, _ in entries)
    # A directory's atime moves when the model listing walks it: every other field must agree.
    assert [_no_atime(v) for v in batched] == [_no_atime(v) for v in alone]
    assert alone[1] is None and alone[4] == {"config.json": 2, "sub/weights.bin": 1000, "no-newline.txt": 27}


def _run_runner(jobs, prelude: str = "", imports: list[str] | None = None) -> subprocess.CompletedProcess:
    payload = base64.b64encode(zlib.compress(json.dumps(jobs).encode())).decode()
    runner = prelude + remote.script("run_scripts") + f"\nrun_all({payload!r}, {imports or []!r})\n"
    return subprocess.run([sys.executable, "-"], input=runner, capture_output=True, text=True, check=True)


def test_a_script_that_fails_in_the_runner_keeps_its_status_and_the_next_script_still_runs():
    jobs = [[7, "import sys\nprint('half')\nsys.exit(3)", []], [8, "import sys\nprint(sys.argv[1:])", ["a b"]], [9, "raise KeyError('x')", []]]
    proc = _run_runner(jobs)
    assert read_batch.split_batch(proc.stdout.splitlines(), {7, 8, 9}) == {7: (3, ["half"]), 8: (0, ["['a b']"]), 9: (1, [])}
    assert "KeyError" in proc.stderr


@pytest.mark.parametrize("prelude", ["", "import os\ndel os.memfd_create\n"], ids=["memory-file", "temporary-file"])
def test_the_runner_returns_each_output_whole_in_memory_files_or_temporary_ones(prelude):
    """Outputs of any size and any text come back whole and in job order, from anonymous memory files where the
    kernel has them and from unnamed temporary files where it does not; an empty output stays empty."""
    big = "print('x' * 3_000_000)"  # over a pipe's buffer and over one read of the output
    jobs = [[1, big, []], [2, "print('naïve ✓ line')\nprint('second')", []], [3, "pass", []], [4, "import sys\nsys.stdout.write('no newline')", []]]
    proc = _run_runner(jobs, prelude)
    results = read_batch.split_batch(proc.stdout.splitlines(), {1, 2, 3, 4})
    assert results[1] == (0, ["x" * 3_000_000])
    assert results[2] == (0, ["naïve ✓ line", "second"])
    assert results[3] == (0, []) and results[4] == (0, ["no newline"])


def test_the_runner_imports_only_what_the_scripts_import():
    """tempfile (and the shutil, bz2, lzma and random it brings), traceback: none is loaded by a read that
    does not fail. They were a fifth of the imports every host's read paid."""
    probe = "import sys\nprint(sorted(m for m in ('tempfile', 'shutil', 'traceback', 'bz2', 'lzma', 'logging') if m in sys.modules))"
    imports = sorted({m for name in ("gpu_state", "venv_state", "service_state", "model_state", "model_owned", "placement_units", "model_listing", "installed_files") for m in remote.top_level_imports(remote.script(name))})
    proc = _run_runner([[1, probe, []]], imports=imports)
    assert read_batch.split_batch(proc.stdout.splitlines(), {1}) == {1: (0, ["[]"])}


def run_operations(state, *operations) -> None:
    """Add each (operation, arguments) on the @local host and run them, as pyinfra's CLI does."""
    for op, kwargs in operations:
        add_op(state, op, **kwargs)
    run_ops(state)


def test_a_fact_is_read_once_until_an_operation_runs_a_command_on_the_host(local, tree):
    state, host, reads = installed(local, "data-1")
    path = str(tree / "config.json")
    first = host_reads.get(host, Sha1File, path=path)
    (tree / "config.json").write_text('{"changed": true}')  # behind pyinfra's back: not seen (one read per run)
    assert host_reads.get(host, Sha1File, path=path) == first
    assert reads.remote_reads == 1
    seen = []

    @host_reads.operation()
    def look():
        if context_host.state.is_executing:
            seen.append(host_reads.get(context_host, Sha1File, path=path))
        context_host.noop("looked")
        yield from ()

    run_operations(
        state,
        (files.directory, {"path": str(tree / "sub")}),  # changes nothing: the answers are kept...
        (look, {}),
        (server.shell, {"commands": [f"echo '{{}}' > {shlex.quote(path)}"]}),  # ...a command drops them
        (look, {}),
    )
    assert seen[0] == first and seen[1] not in (first, None)
    assert reads.remote_reads == 2


def test_our_operation_reads_again_after_each_of_its_own_commands(local, tree):
    """`host_reads.operation`: a fact read after the operation's own command (in the same operation) is the
    host's answer after that command; while pyinfra only looks at an operation (before executing it) nothing
    is dropped."""
    state, host, reads = installed(local, "d")
    path = str(tree / "config.json")
    seen = []

    @host_reads.operation()
    def write_then_read():
        seen.append(host_reads.get(context_host, Sha1File, path=path))
        yield f"echo changed > {shlex.quote(path)}"
        seen.append(host_reads.get(context_host, Sha1File, path=path))

    before = host_reads.get(host, Sha1File, path=path)
    add_op(state, write_then_read)
    assert seen == [before] and reads.remote_reads == 1  # looked at up to its first command: nothing ran, nothing dropped
    run_ops(state)
    assert seen[1] == before and seen[2] != before  # executing: read again after its command ran
    assert reads.remote_reads == 2


def test_the_next_run_reads_what_the_last_one_asked_for_in_one_call(local, tree):
    state, host = local()
    host_reads.install(state, host, config_digest="data-1")
    first = [host_reads.get(host, cls, **kwargs) for cls, kwargs in facts_for(tree)]
    assert host_reads.reads_of(host).remote_reads == len(facts_for(tree))
    state.trigger_callbacks("host_disconnect", host)

    state, host = local()
    host_reads.install(state, host, config_digest="data-1")
    second = [host_reads.get(host, cls, **kwargs) for cls, kwargs in reversed(facts_for(tree))]
    assert [_no_atime(v) for v in second[::-1]] == [_no_atime(v) for v in first]
    assert host_reads.reads_of(host).remote_reads == 1

    # Other data on the same host: another read set (none yet), so each fact is read on its own.
    state, host = local()
    host_reads.install(state, host, config_digest="data-2")
    [host_reads.get(host, cls, **kwargs) for cls, kwargs in facts_for(tree)]
    assert host_reads.reads_of(host).remote_reads == len(facts_for(tree))


def test_a_full_verify_is_never_read_ahead(local, tmp_path):
    from operations.environment.venv_read import VenvState

    state, host, reads = installed(local, "d")
    kwargs = {"live": str(tmp_path / "venv"), "wanted": str(tmp_path / "venv"), "host_cache": "/nonexistent"}
    host_reads.get(host, VenvState, verify="full", **kwargs)
    host_reads.get(host, VenvState, **kwargs)  # the default, fast: the same as verify="fast"
    host_reads.get(host, VenvState, verify="fast", **kwargs)
    assert reads.remote_reads == 2
    state.trigger_callbacks("host_disconnect", host)
    saved = json.loads(reads.read_set.read_text())
    assert [entry[1]["verify"] for entry in saved] == ["fast"]


class Fails(FactBase):
    """A fact whose command fails on the host."""

    def command(self, code: int = 3) -> str:
        return f"echo partial; exit {int(code)}"

    def process(self, output):
        return output


def test_a_fact_that_fails_in_the_batch_is_read_on_its_own_and_fails_as_pyinfra_reports_it(local, tree, monkeypatch):
    monkeypatch.setitem(read_batch.BATCHED, read_batch.fact_name(Fails), Fails)
    state, host = local()
    host_reads.install(state, host, config_digest="d")
    with pytest.raises(PyinfraError):
        host_reads.get(host, Fails)
    host_reads.get(host, File, path=str(tree / "config.json"))
    state.trigger_callbacks("host_disconnect", host)

    state, host = local()
    host_reads.install(state, host, config_digest="d")  # the batch: File answers, Fails is left out
    reads = host_reads.reads_of(host)
    assert reads.remote_reads == 1 and host_reads.get(host, File, path=str(tree / "config.json"))["size"] == 2
    with pytest.raises(PyinfraError):
        host_reads.get(host, Fails)  # read on its own, and the host fails as it would without the batch
    assert reads.remote_reads == 2


def test_an_operations_upload_drops_the_answers_too(local, tree):
    state, host, reads = installed(local, "d")
    path = str(tree / "config.json")
    before = host_reads.get(host, Sha1File, path=path)
    source = tree / "new.json"
    source.write_text('{"new": 1}')
    run_operations(state, (files.put, {"src": str(source), "dest": path}))
    assert host_reads.get(host, Sha1File, path=path) != before and reads.remote_reads == 2


def test_an_answer_read_while_another_greenlet_changed_the_host_is_not_kept(local, tree, monkeypatch):
    """Host A's operation reads a fact of host B (a donor) while B's own operation changes B: that answer may
    predate the change, so it is returned to its reader but not kept for B's later reads."""
    import gevent

    state, host, reads = installed(local, "d")
    original = host.get_fact

    def read_during_a_change(cls, **kwargs):
        value = original(cls, **kwargs)
        gevent.spawn(host_reads.forget, host).join()  # B changes meanwhile (B's operation, a stream into B)
        return value

    monkeypatch.setattr(host, "get_fact", read_during_a_change)
    path = str(tree / "config.json")
    host_reads.get(host, Sha1File, path=path)
    assert reads.answers == {}
    monkeypatch.setattr(host, "get_fact", original)
    host_reads.get(host, Sha1File, path=path)
    host_reads.get(host, Sha1File, path=path)
    assert reads.remote_reads == 2  # read again once, then kept


def test_the_batch_has_its_scripts_imports_made_once_before_the_forks():
    from operations.service import readiness

    command, python_ids = read_batch.batch_command([(0, readiness.ServiceState(), {"unit": "u.service", "address": "127.0.0.1", "port": 1})])
    assert python_ids == {0}
    call = next(line for line in command.splitlines() if line.startswith("run_all("))
    imports = ast.literal_eval(call[len("run_all("):-1])[1]
    assert "socket" in imports and "json" in imports  # service_state.py's own, and _common's


def _a_run_that_asked(local, tree, digest: str):
    """Leave a read set behind: one run on @local that asked for every fact of facts_for(tree)."""
    state, host = local()
    host_reads.install(state, host, config_digest=digest)
    [host_reads.get(host, cls, **kwargs) for cls, kwargs in facts_for(tree)]
    state.trigger_callbacks("host_disconnect", host)


def test_a_read_begun_when_the_lock_is_taken_answers_the_run(local, tree):
    _a_run_that_asked(local, tree, "lock-1")
    state, host = local()
    host_reads.prepare(state, host, config_digest="lock-1")
    reads = host_reads.reads_of(host)
    assert reads.remote_reads == 0  # prepared: nothing read yet
    host_reads.start_read(host)  # what lock.acquire's on_held does as the host's lock is taken
    host_reads.install(state, host, config_digest="lock-1")
    answers = [host_reads.get(host, cls, **kwargs) for cls, kwargs in facts_for(tree)]
    assert reads.remote_reads == 1 and answers[1] is None and answers[4]["config.json"] == 2


def test_a_read_under_a_lock_given_back_is_dropped_and_read_again(local, tree):
    # The pass gives a lock back (to wait for another host's) with a command on the host: what was read under
    # it may be stale once another run has had the host, so the run reads again.
    _a_run_that_asked(local, tree, "lock-2")
    state, host = local()
    host_reads.prepare(state, host, config_digest="lock-2")
    reads = host_reads.reads_of(host)
    host_reads.start_read(host)
    import gevent

    gevent.joinall(reads.pending)  # the read is done...
    assert reads.answers
    (tree / "config.json").write_text('{"another run": 1}')
    host_reads.forget(host)  # ...then the lock is given back (operations/lock/run_locks.py `_give_back` says so)
    assert not reads.answers
    host_reads.install(state, host, config_digest="lock-2")
    assert reads.remote_reads == 2  # read again, in one call
    assert host_reads.get(host, StoreListing, path=str(tree))["config.json"] == len('{"another run": 1}')
    assert reads.remote_reads == 2


def test_only_the_newest_hold_of_the_lock_keeps_its_read(local, tree, monkeypatch):
    # Two holds of one lock in a run (given back, taken again): the first hold's read, answering late, must not
    # overwrite what the second read found.
    import gevent

    _a_run_that_asked(local, tree, "lock-3")
    state, host = local()
    host_reads.prepare(state, host, config_digest="lock-3")
    reads = host_reads.reads_of(host)
    real_run, calls = host.run_shell_command, []

    def slow_first(*args, **kwargs):
        result = real_run(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            gevent.sleep(0.5)  # read now, answer late
        return result

    monkeypatch.setattr(host, "run_shell_command", slow_first)
    host_reads.start_read(host)  # the first hold
    while not calls:
        gevent.sleep(0.01)
    (tree / "config.json").write_text('{"taken again": true}')
    host_reads.start_read(host)  # the second
    host_reads.install(state, host, config_digest="lock-3")
    assert len(calls) == 2 and not reads.pending
    assert host_reads.get(host, StoreListing, path=str(tree))["config.json"] == len('{"taken again": true}')


def _run_locally(command: str, answer_after_s: float = 0.0):
    """A greenlet giving (exit status, output lines, stderr) of `command`: what operations/lock/run_locks.py hands on for the
    read it ran in the command that took the host's lock. The command runs at once; its answer may come later."""
    import gevent

    def run():
        proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        gevent.sleep(answer_after_s)
        return proc.returncode, proc.stdout.splitlines(), proc.stderr

    return gevent.spawn(run)


def test_a_read_run_by_the_command_that_took_the_lock_answers_the_run_without_another_call(local, tree, monkeypatch):
    _a_run_that_asked(local, tree, "with-lock-1")
    state, host = local()
    assert host_reads.lock_read(host) is None  # not prepared: nothing to read with the lock
    host_reads.prepare(state, host, config_digest="with-lock-1")
    batch = host_reads.lock_read(host)
    assert batch is not None and len(batch.keys) == len(facts_for(tree))
    calls = []
    real_run = host.run_shell_command
    monkeypatch.setattr(host, "run_shell_command", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    host_reads.start_read(host, (batch, _run_locally(batch.command)))
    host_reads.install(state, host, config_digest="with-lock-1")
    reads = host_reads.reads_of(host)
    answers = [host_reads.get(host, cls, **kwargs) for cls, kwargs in facts_for(tree)]
    assert calls == [] and reads.remote_reads == 1
    assert answers[1] is None and answers[4]["config.json"] == 2


@pytest.mark.parametrize("spoil", ["fails", "host changed"])
def test_a_read_run_with_the_lock_that_failed_or_went_stale_is_read_again(local, tree, spoil):
    import gevent

    _a_run_that_asked(local, tree, f"with-lock-{spoil}")
    state, host = local()
    host_reads.prepare(state, host, config_digest=f"with-lock-{spoil}")
    reads = host_reads.reads_of(host)
    batch = host_reads.lock_read(host)
    if spoil == "fails":
        host_reads.start_read(host, (batch, _run_locally(f"{batch.command}\nexit 3")))
    else:
        host_reads.start_read(host, (batch, _run_locally(batch.command, answer_after_s=0.5)))
        gevent.sleep(0.2)  # read, not yet answered...
        (tree / "config.json").write_text('{"changed": 1}')
        host_reads.forget(host)  # ...when the lock is given back
    host_reads.install(state, host, config_digest=f"with-lock-{spoil}")
    assert reads.remote_reads == 2  # the lock's read, then one call of its own
    expected = len('{"changed": 1}') if spoil == "host changed" else 2
    assert host_reads.get(host, StoreListing, path=str(tree))["config.json"] == expected
    assert reads.remote_reads == 2


def test_the_scripts_arguments_are_split_as_shlex_splits_them():
    """split_args is shlex.split made fast for what our commands write (shlex.quote'd words, one space apart): any
    word, quoted that way, comes back as it was; any other text is split exactly as shlex splits it."""
    import random
    import string

    rnd = random.Random(13)
    alphabet = string.printable + "üé'\"$`\\"
    texts = ["", "a b", "'it'\"'\"'s' plain", "a  b", " a", "a\tb", "'a'b'c'", "\"a b\" c"]
    for _ in range(2000):
        words = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 8))) for _ in range(rnd.randint(0, 5))]
        assert read_batch.split_args(" ".join(shlex.quote(w) for w in words)) == words
        texts.append(" ".join(words))
    for text in texts:
        try:
            expected = shlex.split(text)
        except ValueError:
            with pytest.raises(ValueError):
                read_batch.split_args(text)
            continue
        assert read_batch.split_args(text) == expected, text


@pytest.mark.parametrize("path", [
    "/x; touch {pwned}", "/x$(touch {pwned})", "/x`touch {pwned}`", "/x\ntouch {pwned}", "/x' ; touch '{pwned}",
    "/x && touch {pwned}", "/x|touch {pwned}", "-x; touch {pwned}",
])
def test_a_planted_read_set_runs_nothing_but_the_reads_this_deploy_derives(local, tree, tmp_path, path):
    """The read set is a file on the control machine, and some facts put their arguments into a shell command
    unquoted: an entry whose arguments are not the plain words the deploy derives is dropped, never run."""
    pwned = tmp_path / "pwned"
    state, host = local()
    read_set = host_reads.read_set_path(host, "d")
    read_set.parent.mkdir(parents=True, exist_ok=True)
    planted = [["pyinfra.facts.files:File", {"path": path.format(pwned=pwned)}],
               # pyinfra's SystemdStatus puts `machine` into its command unquoted
               ["pyinfra.facts.systemd:SystemdStatus", {"machine": path.format(pwned=pwned)}],
               ["pyinfra.facts.files:File", {"path": str(tree / "config.json")}],
               ["pyinfra.facts.files:Directory", {"path": str(tree)}]]
    read_set.write_text(json.dumps(planted))
    host_reads.install(state, host, config_digest="d")
    assert host_reads.reads_of(host).remote_reads == 1  # the plain entries still share one read
    assert host_reads.get(host, File, path=str(tree / "config.json"))["size"] == 2
    assert not pwned.exists()


@pytest.mark.parametrize(("value", "plain"), [
    ("/root/venv_sglang", True), ("sglang-ddtree.service", True), ("127.0.0.1", True), (30000, True), (None, True),
    (["/dev/shm/Qwen3.6-27B/.sglang-deploy-staged.json", "/etc/systemd/system/x.service"], True), ({"a": ["b", 1]}, True),
    ("a b", False), ("a;b", False), ("$(x)", False), ("a\n", False), ("'", False), ("-rf", False), ({"a b": 1}, False),
    ([[[[[["deep"]]]]]], False), (b"bytes", False),
])
def test_plain_arguments(value, plain):
    assert read_batch.plain_arguments(value) is plain


def test_an_answer_older_than_a_decision_allows_is_read_again(local, tree, monkeypatch):
    """`fresh(host, Fact, max_age_s)`: an answer kept longer than that is read from the host again; younger ones,
    and other facts' answers, are kept."""
    state, host, reads = installed(local, "d")
    config = str(tree / "config.json")
    host_reads.get(host, File, path=config)
    host_reads.get(host, Directory, path=str(tree))
    assert reads.remote_reads == 2
    host_reads.fresh(host, File, max_age_s=60)
    host_reads.get(host, File, path=config)
    assert reads.remote_reads == 2  # young enough: kept
    clock = [host_reads.time.monotonic() + 120]
    monkeypatch.setattr(host_reads.time, "monotonic", lambda: clock[0])
    host_reads.fresh(host, File, max_age_s=60)
    (tree / "config.json").write_text("{}\n")
    assert host_reads.get(host, File, path=config)["size"] == 3  # read again: the host's answer now
    assert reads.remote_reads == 3
    host_reads.get(host, Directory, path=str(tree))
    assert reads.remote_reads == 3  # another fact's answer is not dropped


@pytest.mark.parametrize("make", ["other-owner", "open-mode", "symlink"])
def test_a_read_set_directory_that_is_not_this_users_alone_stops_the_run(local, tmp_path, make):
    """Another local user who makes the cache directory first (or a directory anyone may write) could plant read
    sets: the run stops naming the directory, before any host is read."""
    reads_dir = tmp_path / "cache" / "reads"
    if make == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        (tmp_path / "cache").mkdir(mode=0o700)
        reads_dir.symlink_to(tmp_path / "elsewhere")
    else:
        reads_dir.mkdir(parents=True, mode=0o700)
        if make == "other-owner":
            os.chown(reads_dir, 65534, 65534)
        else:
            reads_dir.chmod(0o777)
    state, host = local()
    with pytest.raises(PyinfraError, match=f"{reads_dir}: expected a directory of .* with mode 0700"):
        host_reads.prepare(state, host, config_digest="d")


def test_a_read_set_too_large_for_one_shell_argument_is_batched_in_part_and_the_rest_read_alone(local, tree, tmp_path):
    """Linux refuses a single argument over 128 KiB ("Argument list too long"), and the batch is one: a first
    install asked about every wheel it pushed, and the next run's lock-and-read command failed on gpu-b. The batch
    keeps the fact asked for and our own reads first and stays under MAX_BATCH_BYTES; the rest is read on its own."""
    many = tmp_path / "many"
    many.mkdir()
    paths = []
    for i in range(400):
        path = many / (f"wheel-{i:03d}-" + "x" * 150 + ".whl.part")
        path.write_text("")
        paths.append(str(path))
    state, host = local()
    read_set = host_reads.read_set_path(host, "d")
    entries = [["pyinfra.facts.files:File", {"path": p}] for p in paths]
    entries.append(["operations.model.transfer:StoreListing", {"path": str(tree)}])
    read_set.write_text(json.dumps(entries))
    reads = host_reads.HostReads(read_set, "x")
    batch = host_reads.plan_batch(reads, None, None, None)
    assert len(batch.command.encode()) <= read_batch.MAX_BATCH_BYTES < 128 * 1024
    assert any("StoreListing" in k for k in batch.keys)  # ours are kept before pyinfra's
    assert 0 < len(batch.keys) < len(entries)
    host_reads.install(state, host, config_digest="d")
    assert host_reads.get(host, File, path=paths[-1]) is not None  # one the batch left out: read on its own
    assert host_reads.get(host, File, path=paths[0]) is not None


def test_facts_asked_beside_the_read_set_come_from_the_same_single_call(local, tree):
    """`install(..., also=...)`: a read-only command's own facts (the status view's probe) join the host's one read."""
    state, host = local()
    read_set = host_reads.read_set_path(host, "d")
    read_set.write_text(json.dumps([["pyinfra.facts.files:File", {"path": str(tree / "config.json")}]]))
    host_reads.install(state, host, config_digest="d", also=((Directory, {"path": str(tree)}), (Sha1File, {"path": str(tree / "config.json")})))
    reads = host_reads.reads_of(host)
    assert host_reads.get(host, Directory, path=str(tree)) is not None
    assert host_reads.get(host, Sha1File, path=str(tree / "config.json")) == "bf21a9e8fbc5a3846fb05b4fa0859e0917b2202f"
    assert host_reads.get(host, File, path=str(tree / "config.json"))["size"] == 2
    assert reads.remote_reads == 1



def test_a_two_service_gpu_hosts_read_set_fits_one_call_with_the_shared_helpers_sent_once():
    """_common.py is inlined into every script; sent as it is, each copy costs its whole compressed size (zlib's window,
    32 kB, is shorter than a script), and the lab's gpu-a read set (two services) outgrew MAX_BATCH_BYTES: its python
    reads were dropped from the lock's call and made one by one (20 calls). The batch carries it once: these five
    reads took 82.7 kB before, 42 kB now."""
    from operations.environment import venv_read
    from operations.gpu import gpu_read
    from operations.model import models
    from operations.service import readiness

    entries = [(0, gpu_read.GpuState(), {"models": ("/root/models/A", "/root/models/B")})]
    for i, unit in enumerate(("sglang-ddtree.service", "sglang-dflash.service")):
        entries.append((len(entries), readiness.ServiceState(), {"unit": unit, "address": "127.0.0.1", "port": 30000 + i,
                                                                 "inputs": (f"/etc/systemd/system/{unit}", "/root/venv")}))
    entries.append((len(entries), models.StagedModel(), {"src": "/root/models/A", "dest": "/dev/shm/A"}))
    entries.append((len(entries), venv_read.VenvState(), {"live": "/root/venv", "wanted": "/root/venv.generations/g",
                                                     "host_cache": "/var/cache/sglang-deploy/wheels"}))
    command, python_ids = read_batch.batch_command(entries)
    assert python_ids == {0, 1, 2, 3, 4}  # nvidia-smi's read is a script of ours too
    assert len(command.encode()) < read_batch.MAX_BATCH_BYTES // 2, len(command.encode())
    shared = remote.shared_text()
    payload = ast.literal_eval(next(line for line in command.splitlines() if line.startswith("run_all("))[len("run_all("):-1])[0]
    sent = json.loads(zlib.decompress(base64.b64decode(payload)))
    assert sent["shared"] == shared and all(shared not in body for _, body, _ in sent["jobs"])
    assert sum(remote.SHARED_MARK in body for _, body, _ in sent["jobs"]) == 5  # each names what it uses of _common
    assert remote.SHARED_MARK in remote.script("run_scripts")


def test_the_runner_puts_the_shared_text_back_in_each_body():
    jobs = {"shared": "GREETING = 'hi'", "jobs": [[1, f"{remote.SHARED_MARK}\nprint(GREETING)", []]]}
    assert read_batch.split_batch(_run_runner(jobs).stdout.splitlines(), {1}) == {1: (0, ["hi"])}
