"""Environments per (stack, patch sets), and the preflight's command and verdict."""

import json
import shlex

import pytest
import yaml

from configuration import settings
from configuration.settings import REPO_ROOT
from operations.environment import transient
from operations.service import preflight, units
from tests.unit.hosts import make_host


def lab_data() -> dict:
    data = yaml.safe_load((REPO_ROOT / "group_data" / "all.yml").read_text())
    data.update(yaml.safe_load((REPO_ROOT / "lab" / "group_data" / "all.yml").read_text()))
    return data


def test_services_that_agree_on_patch_sets_share_a_venv_and_others_get_a_sibling():
    data = lab_data()
    data["services"]["third"] = {**data["services"]["dflash"], "gpu": 2, "port": 30002}
    config = settings.host_config(make_host(data, {"run_services": ["ddtree", "dflash", "third"]}))
    paths = {s.name: s.environment.path for s in config.services}
    assert paths == {
        "ddtree": "/root/venv_sglang+ddtree-sample",
        "dflash": "/root/venv_sglang",
        "third": "/root/venv_sglang",
    }
    assert [e.path for e in config.environments] == ["/root/venv_sglang+ddtree-sample", "/root/venv_sglang"]


def test_a_services_venv_does_not_depend_on_its_neighbours():
    alone = settings.host_config(make_host(lab_data(), {"run_services": ["ddtree"]}))
    together = settings.host_config(make_host(lab_data(), {"run_services": ["dflash", "ddtree"]}))
    assert alone.services[0].environment == [s for s in together.services if s.name == "ddtree"][0].environment


def split_command(cmd: str) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """(systemd-run's words, its -p properties, the run's environment, the command it runs) of a preflight command."""
    words = shlex.split(cmd.splitlines()[0].split("<<")[0].removeprefix("cd / && "))
    dash = words.index("--")
    run, rest = words[:dash], words[dash + 1:]
    properties = [run[i + 1] for i, w in enumerate(run) if w == "-p"]
    assert rest[:2] == ["/usr/bin/env", "-i"]
    python = next(i for i, w in enumerate(rest) if w.endswith("/bin/python"))
    return run, properties, dict(w.split("=", 1) for w in rest[2:python]), rest[python:]


def unit_text(**service_patch) -> tuple[str, object]:
    from tests.unit.test_units import lab_config, render

    config = lab_config(**service_patch)
    return render(config), config


def test_preflight_command_runs_the_venv_python_in_the_services_sandbox_as_its_user_with_the_units_gpus():
    text, _ = unit_text()
    sandbox = units.sandbox_properties(text)
    cmd = preflight.command("/root/venv_sglang", "sglang.launch_server", ["--port", "30000"],
                            {"CUDA_VISIBLE_DEVICES": "1", "SGLANG_DDTREE_MAX_TOPK": "8"}, sandbox, "ddtree")
    run, properties, env, argv = split_command(cmd)
    assert run[:5] == ["systemd-run", "--wait", "--pipe", "--collect", "--quiet"]
    # The unit's own sandbox, from the unit text: its user, not root, and every protection it has.
    assert properties == [*sandbox, "RuntimeMaxSec=300"] and "User=sglang" in properties and "Group=sglang" in properties
    assert not any(p == "User=root" for p in properties)
    # A real engine's parser asks the GPU for defaults: hidden GPUs fail it on a GPU host (H200, sglang 0.5.11).
    assert env == {"PATH": transient.SYSTEM_PATH, "HOME": "/var/lib/sglang", "CUDA_VISIBLE_DEVICES": "1",
                   "SGLANG_DDTREE_MAX_TOPK": "8"}
    assert argv == ["/root/venv_sglang/bin/python", "-I", "-", json.dumps(["--port", "30000"]), "sglang.launch_server",
                    json.dumps([])]  # no path named
    assert "prepare_server_args" in cmd


def test_the_preflight_sandbox_is_the_units_whole_sandbox():
    """Every [Service] directive of the unit but what it runs and how it restarts: a directive added to the template
    reaches the preflight and measure.py's client without being named anywhere else."""
    from tests.unit.test_unit_sandbox import HARDENING

    text, config = unit_text()
    sandbox = units.sandbox_properties(text)
    for directive in HARDENING:
        assert directive in sandbox, directive
    binds = [p for p in sandbox if p.startswith("BindReadOnlyPaths=")]
    assert binds == ["BindReadOnlyPaths=/root/venv_sglang+ddtree-sample", "BindReadOnlyPaths=-/root/venv_sglang+ddtree-sample.generations",
                     "BindReadOnlyPaths=-/root/models/Qwen3.6-27B-DFlash"]
    service_lines = text.split("[Service]\n", 1)[1].split("[Install]")[0]
    named = {line.split("=", 1)[0] for line in service_lines.splitlines() if line and not line.startswith((" ", "#"))}
    assert {p.split("=", 1)[0] for p in sandbox} == named - units.NOT_SANDBOX
    assert not any(p.startswith(("Environment=", "ExecStart=", "WorkingDirectory=")) for p in sandbox)
    # As root where the data says so (`service_user: root`): the same sandbox, no Group=.

    from tests.unit.test_units import render

    root = units.sandbox_properties(render(config.with_data(service_user="root")))
    assert "User=root" in root and not any(p.startswith("Group=") for p in root)


def test_a_sandbox_that_names_no_user_is_refused_and_no_sandbox_is_a_throwaway_user():
    with pytest.raises(ValueError, match="names no User="):
        transient.command(["ProtectSystem=strict"], {}, ["/bin/true"], "x")
    _, properties, _, _ = split_command(preflight.command("/root/v", "sglang.launch_server", [], {}))
    assert properties == ["DynamicUser=yes", "RuntimeMaxSec=300"]


# Names the preflight drops whatever their value: loaders, interpreters, glibc's modules and locales, OpenSSL's
# config (which loads engines and providers, shared objects), caches and homes the service user writes, and names
# nobody has checked.
DROPPED = [
    "OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES", "SSL_CERT_FILE", "GCONV_PATH", "LOCPATH", "NLSPATH", "TZDIR",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "ld_audit", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "BASH_ENV",
    "MALLOC_CHECK_", "GLIBC_TUNABLES", "HOME", "PATH", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_DIRS",
    "TRITON_CACHE_DIR", "TRITON_HOME", "CUDA_CACHE_PATH", "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME",
    "HF_MODULES_CACHE", "TORCH_EXTENSIONS_CACHE", "TORCH_HOME", "NUMBA_CACHE_DIR", "SGLANG_EXTERNAL_MODEL_PACKAGE",
    "STANDIN_STEP_S", "SOME_NAME_NOBODY_KNOWS",
]


@pytest.mark.parametrize("name", DROPPED)
def test_the_preflight_takes_only_the_variables_on_its_allow_list(name):
    """The preflight's environment is an allow list (PARSER_ENV): a variable of the unit that is not on it, such as
    OPENSSL_CONF pointing at a file the service user writes, does not reach the parser, whatever the data's own
    checks let through. PATH and HOME are the run's own values, never the unit's."""
    cmd = preflight.command("/root/v", "sglang.launch_server", [], {name: "/var/lib/sglang/x", "SGLANG_DDTREE_MAX_TOPK": "8"})
    _, _, env, argv = split_command(cmd)
    assert env.get(name) != "/var/lib/sglang/x" and name not in set(env) - {"PATH", "HOME"}
    assert env == {"PATH": transient.SYSTEM_PATH, "HOME": "/var/lib/sglang", "SGLANG_DDTREE_MAX_TOPK": "8"}
    assert argv[1] == "-I"  # isolated: PYTHON* ignored even if one got through, no user site, no cwd on sys.path


def test_the_allow_list_holds_only_documented_names_and_nothing_else_passes():
    assert set(preflight.PARSER_ENV) == {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SGLANG_DDTREE_MAX_TOPK", "SGLANG_DDTREE_DEPTH_BONUS"}
    assert all(len(why) > 40 for why in preflight.PARSER_ENV.values())
    everything = {name: "1" for name in [*DROPPED, *preflight.PARSER_ENV]}
    assert set(preflight.parser_environment(everything)) == {"PATH", "HOME", *preflight.PARSER_ENV}


def inner_command(cmd: str) -> str:
    """The command the transient unit runs, as a plain shell line (no systemd here): `cd / && env -i ... <<heredoc`."""
    first, rest = cmd.split("\n", 1)
    return "cd / && " + first[first.index(" -- ") + 4:] + "\n" + rest


def test_the_isolated_preflight_still_parses_in_a_real_venv(tmp_path):
    """`python -I -` with the script on stdin still finds the venv's packages (pyvenv.cfg), ignores PYTHONPATH, and
    reports the user it ran as."""
    import os
    import pwd
    import subprocess
    import sys

    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sglang.py").write_text("raise SystemExit('planted sglang imported')\n")
    cmd = inner_command(preflight.command(sys.prefix, "json", [], {"PYTHONPATH": str(planted)})).replace(
        f"{sys.prefix}/bin/python", sys.executable)
    # The allow list drops PYTHONPATH; force it past the filter to show -I alone also holds.
    cmd = cmd.replace("env -i ", f"env -i PYTHONPATH={planted} ", 1)
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "planted" not in json.dumps(result)
    assert (result["uid"], result["user"]) == (os.getuid(), pwd.getpwuid(os.getuid()).pw_name)


def test_the_preflight_judges_every_path_the_flags_and_environment_name_as_the_engines_user(tmp_path):
    """Issue 46 item 4, on the host: each path a flag or variable names, and every directory above it, must be root's
    or the preflight's own user's (the service account's) and writable by them alone. Run here for real: a
    directory another uid owns, one its group may write, and a link to one, are named; our own file is not."""
    import os
    import subprocess
    import sys

    ours = tmp_path / "ours"
    ours.mkdir(mode=0o755)
    (ours / "template.jinja").write_text("{{ x }}")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    (tmp_path / "link").symlink_to(theirs)
    tmp_path.chmod(0o755)
    argv = ["--chat-template", str(ours / "template.jinja"), "--tokenizer-path", str(theirs / "tok"),
            "--download-dir", str(shared)]
    env = {"TRITON_HOME": str(tmp_path / "link" / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = inner_command(preflight.command(sys.prefix, "json", argv, env)).replace(f"{sys.prefix}/bin/python", sys.executable)
    proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    named = {(where, path): why for where, path, why in result["untrusted"]}
    assert set(named) == {("flag --tokenizer-path", str(theirs / "tok")), ("flag --download-dir", str(shared)),
                          ("variable TRITON_HOME", str(tmp_path / "link" / "cache"))}, result
    assert "uid 65534" in named[("flag --tokenizer-path", str(theirs / "tok"))]
    reason = preflight.verdict(result)
    assert reason.startswith("the flag --tokenizer-path names ") and "only root or the service account may write" in reason


@pytest.mark.parametrize(("resolved", "open_ok", "expected"), [
    ([["host", "127.0.0.1"], ["engine_info_bootstrap_url", "http://127.0.0.1:6789"], ["otlp_traces_endpoint", "localhost:4317"]],
     False, None),
    ([["kv_events_config.endpoint", "tcp://*:5557"]], False,
     "the engine resolves `kv_events_config.endpoint` to `tcp://*:5557`, naming `tcp://*:5557`, an address beyond loopback "
     "the data does not name: without an API key anyone who reaches it can use it; name a loopback address for it in the "
     "service's args (e.g. tcp://127.0.0.1:5557), or set `api_key_secret` (or `allow_unauthenticated: true` to accept that)"),
    ([["kv_events_config.endpoint", "tcp://*:5557"]], True, None),   # an API key, or allow_unauthenticated
    ([["kv_events_config.endpoint", "tcp://127.0.0.1:5557"], ["kv_events_config.replay_endpoint", "tcp://0.0.0.0:5558"]],
     False, "the engine resolves `kv_events_config.replay_endpoint` to `tcp://0.0.0.0:5558`"),
    ([["kv_events_config", "unresolved (ModuleNotFoundError: No module named 'annotated_types')"]], False,
     "the engine's `kv_events_config` is set and where it listens could not be read on the host"),
], ids=["loopback-defaults", "default-endpoint", "default-endpoint-with-a-key", "replay", "unresolved"])
def test_the_engines_resolved_settings_are_judged_like_the_datas(resolved, open_ok, expected):
    """Issue 46 item 5: exposure from what the engine will do, defaults included."""
    reason = preflight.verdict({"parser": "sglang 0.5.23", "resolved": resolved}, open_ok)
    assert (reason is None) if expected is None else reason.startswith(expected), reason


@pytest.mark.parametrize(("result", "expected"), [
    ({"parser": "sglang 0.5.23", "parse_error": None, "import_error": None}, None),
    ({"parser": "sglang 0.5.23", "parse_error": "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer", "import_error": None},
     "sglang 0.5.23 refuses the flags: sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"),
    ({"parser": None, "parse_error": None, "import_error": "import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"},
     "the server cannot start: import sglang.launch_server: ModuleNotFoundError: No module named 'soundfile'"),
])
def test_verdict(result, expected):
    assert preflight.verdict(result) == expected


# --dry: the preflight runs at once (a read-only fact) -------------------------------------


def run_dry(monkeypatch, verdict, sha1="0" * 40, inputs_changed=None, unit="[Unit]\n"):
    import sys
    from unittest import mock

    from pyinfra.context import ctx_host, ctx_state
    from pyinfra.facts.files import Sha1File

    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", "deploy.py", "--dry"])
    host = make_host({})
    answers = {Sha1File: sha1, preflight.Verdict: verdict}
    asked = []

    def get_fact(cls, **kwargs):
        asked.append((cls, kwargs) if cls is preflight.Verdict else cls)
        return answers[cls]

    with (
        mock.patch.object(host, "get_fact", side_effect=get_fact), mock.patch.object(host, "log") as log,
        mock.patch.object(host, "log_styled") as styled, mock.patch.object(host, "noop"),
        ctx_state.use(host.state), ctx_host.use(host),
    ):
        commands = list(preflight.passed._inner(
            service="dflash", venv_path="/root/venv_sglang", launcher="sglang.launch_server", argv=["--port", "30001"],
            environment={}, endpoint="e", unit_path="/etc/systemd/system/sglang-dflash.service", unit_text=unit,
            inputs_changed=inputs_changed,
        ))
    lines = [c.args[0] for c in log.call_args_list] + [c.args[0] for c in styled.call_args_list]
    verdicts = [kwargs for kind in asked if isinstance(kind, tuple) for kwargs in kind[1:]]
    return commands, lines, host in host.state.failed_hosts, [kind[0] if isinstance(kind, tuple) else kind for kind in asked], verdicts


def test_dry_run_shows_the_parsers_refusal_and_fails(monkeypatch):
    refused = {"parser": "sglang 0.5.23", "parse_error": "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer", "import_error": None}
    _, lines, failed, asked, _ = run_dry(monkeypatch, refused)
    assert preflight.Verdict in asked and failed
    assert ("dflash: PREFLIGHT WILL FAIL, unit and running service would be left as they are: sglang 0.5.23 refuses the flags: "
            "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer") in lines


def test_dry_run_that_passes_or_cannot_check_yet_does_not_fail(monkeypatch):
    _, lines, failed, _, _ = run_dry(monkeypatch, {"parser": "sglang 0.5.23", "parse_error": None, "import_error": None})
    assert not failed and "dflash: preflight would pass (sglang 0.5.23)" in lines
    _, lines, failed, _, _ = run_dry(monkeypatch, {"absent": True})
    assert not failed and "dflash: preflight runs once this run has built /root/venv_sglang" in lines


def test_dry_run_names_the_inputs_the_run_changes_first(monkeypatch):
    from pyinfra.api.operation import OperationMeta

    from operations.run.this_run import Inputs

    passing = {"parser": "sglang 0.5.23", "parse_error": None, "import_error": None}
    rebuilt, same, probe = OperationMeta("a", True), OperationMeta("b", False), OperationMeta("c", True)
    _, lines, failed, asked, _ = run_dry(monkeypatch, passing, inputs_changed=Inputs((("b", same, False), ("a", rebuilt, False), ("c", probe, True))))
    assert preflight.Verdict in asked and not failed
    assert "dflash: preflight would pass (sglang 0.5.23) (the run first changes: a)" in lines
    _, lines, _, _, _ = run_dry(monkeypatch, passing, inputs_changed=Inputs((("b", same, False),)))
    assert "dflash: preflight would pass (sglang 0.5.23)" in lines


def test_verdict_fact_reports_a_missing_venv_without_running_it():
    cmd = preflight.Verdict().command(venv_path="/root/v", cmd="echo hi")
    assert cmd.startswith("if [ -x /root/v/bin/python ]; then\necho hi\nelse echo '{\"absent\": true}'; fi")
    assert preflight.Verdict().process(['{"absent": true}']) == {"absent": True}


@pytest.mark.parametrize(("venv", "account", "expected"), [
    (True, True, "ran"), (True, False, '{"absent_user": true}'), (False, True, '{"absent": true}'), (False, False, '{"absent": true}'),
])
def test_verdict_fact_waits_for_the_account_the_preflight_runs_as(tmp_path, venv, account, expected):
    """Under --dry on a host the run has not yet given its service user, the preflight cannot run as that user."""
    import getpass
    import subprocess

    python = tmp_path / "bin" / "python"
    if venv:
        python.parent.mkdir()
        python.write_text("")
        python.chmod(0o755)
    user = getpass.getuser() if account else "no-such-user-sglang-deploy"
    cmd = preflight.Verdict().command(venv_path=str(tmp_path), cmd="echo ran", user=user)
    assert subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout.strip() == expected


def test_dry_run_runs_as_the_units_user_and_waits_for_its_account(monkeypatch):
    text, _ = unit_text()
    passing = {"parser": "sglang 0.5.23", "parse_error": None, "import_error": None, "user": "sglang", "uid": 998}
    _, lines, failed, _, verdicts = run_dry(monkeypatch, passing, unit=text)
    assert not failed and "dflash: preflight would pass (sglang 0.5.23, as sglang)" in lines
    assert verdicts[0]["user"] == "sglang" and "-p User=sglang -p Group=sglang" in verdicts[0]["cmd"]
    _, lines, failed, _, _ = run_dry(monkeypatch, {"absent_user": True}, unit=text)
    assert not failed and "dflash: preflight runs once this run has created the account sglang, which it runs as" in lines


def test_a_refusal_quoting_a_credential_is_masked():
    """The parser's message quotes what it refused: a credential the run was never told about is masked too."""
    reason = preflight.verdict({"parser": "sglang 0.5.23", "import_error": None,
                                "parse_error": "error: argument --hf-token: invalid value hf_token=hf_abcdefghijklmnopqrstu"})
    assert "hf_abcdefghijklmnopqrstu" not in reason and "hf_token=<redacted>" in reason
