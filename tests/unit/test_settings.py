"""Group data -> `HostConfig`: the typed result, pyinfra's precedence, and a corpus of bad inputs.

Every bad input must stop with a `DataError` whose message is
``"<source>: <key path>: <value repr>: <fix>"``; each case asserts all four pieces.
No host is contacted: `tests/unit/hosts.py` builds pyinfra hosts from plain data.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from configuration import group_files, settings
from configuration.errors import DataError
from configuration.settings import HostConfig, ModelUse, Service
from tests.unit.hosts import make_host

TARGET = "Qwen3.6-27B"
DRAFT = "Qwen3.6-27B-DFlash"
HOST = "inventory (host gpu-a)"
OVERRIDE = "--data"


def base_data() -> dict:
    """Valid `all` data: two services, one per GPU and port (the shape of group_data/all.yml)."""
    return {
        "stack": "lab-standin",
        "venv_path": "/root/venv_sglang",
        "model_store": "/root/models",
        "shm_dir": "/dev/shm",
        "services": {
            "ddtree": {
                "gpu": 0,
                "port": 30000,
                "model": TARGET,
                "model_in": "shm",
                "draft_model": DRAFT,
                "draft_in": "store",
                "args": {"speculative-algorithm": "DFLASH", "speculative-dflash-block-size": 16},
                "env": {"SGLANG_DDTREE_MAX_TOPK": 8},
            },
            "dflash": {
                "gpu": 1,
                "port": 30001,
                "model": TARGET,
                "draft_model": DRAFT,
                "args": {"attention-backend": "triton"},
            },
        },
    }


DELETE = object()


def merged(base: dict, patch: dict) -> dict:
    """`base` with `patch` applied: maps merge key by key, other values replace, DELETE removes."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(autouse=True)
def fresh_key_sources(monkeypatch):
    # load_group_yaml records which file set each key in a module-level map; keep tests apart.
    monkeypatch.setattr(group_files, "_KEY_SOURCES", {})


@pytest.fixture
def group_dir(tmp_path) -> Path:
    """A `group_data/` folder with the thin `all.py` of the real deploy dir."""
    folder = tmp_path / "group_data"
    folder.mkdir()
    (folder / "all.py").write_text((settings.REPO_ROOT / "group_data" / "all.py").read_text())
    return folder


def load_all_yml(group_dir: Path, data_or_text) -> dict:
    """Write `all.yml` and load it the way `group_data/all.py` does."""
    text = data_or_text if isinstance(data_or_text, str) else yaml.safe_dump(data_or_text, sort_keys=False)
    (group_dir / "all.yml").write_text(text)
    return settings.load_group_yaml(str(group_dir / "all.py"))


def config(all_data=None, host_data=None, groups=None, override=None) -> HostConfig:
    all_data = base_data() if all_data is None else all_data
    host_data = {"run_services": ["ddtree"]} if host_data is None else host_data
    return settings.host_config(make_host(all_data, host_data, groups, override))


# Valid data ---------------------------------------------------------------------------


def test_valid_data_gives_typed_host_config():
    data = merged(base_data(), {"services": {"ddtree": {"gpu": [0, 1]}}})
    cfg = config(data, {"run_services": ["ddtree"]})

    # The schema's fields read through from its own model (`data`), with the schema's defaults.
    read = {key: getattr(cfg, key) for key in ("stack", "venv_path", "model_store", "shm_dir", "host_wheel_cache",
                                               "launcher", "readiness_timeout_s", "smoke_test", "lock_wait_s",
                                               "verify_models", "installer", "service_user", "verify_env")}
    assert read == {"stack": "lab-standin", "venv_path": "/root/venv_sglang", "model_store": "/root/models",
                    "shm_dir": "/dev/shm", "host_wheel_cache": "/var/cache/sglang-deploy/wheels",
                    "launcher": "sglang.launch_server", "readiness_timeout_s": 1800, "smoke_test": True,
                    "lock_wait_s": 300, "verify_models": "fast", "installer": "auto", "service_user": "sglang",
                    "verify_env": "fast"}
    assert all(getattr(cfg, key) == getattr(cfg.data, key) for key in read)
    with pytest.raises(AttributeError):
        cfg.no_such_key  # noqa: B018
    assert (cfg.services[0].port, cfg.services[0].bind, cfg.services[0].max_unavailable, cfg.services[0].canary_soak_s,
            cfg.services[0].allow_unauthenticated) == (30000, "127.0.0.1", 1, 0, False)  # the schema's, read through
    assert cfg == HostConfig(
        host="gpu-a",
        data=cfg.data,
        wheelhouse=Path("wheelhouse"),
        stack_sources=(("wheelhouse", "wheelhouse"),),
        failed_gpus=(),
        ssh_address=("gpu-a", 22),
        services=(
            Service(
                name="ddtree",
                definition="ddtree",
                spec=cfg.services[0].spec,
                environment=settings.Environment("/root/venv_sglang", ()),
                gpus=(0, 1),
                target=ModelUse(TARGET, "shm", f"/root/models/{TARGET}", f"/dev/shm/{TARGET}"),
                draft=ModelUse(DRAFT, "store", f"/root/models/{DRAFT}", f"/root/models/{DRAFT}"),
                patch_sets=(),
                args=(("speculative-algorithm", "DFLASH"), ("speculative-dflash-block-size", 16)),
                env=(("SGLANG_DDTREE_MAX_TOPK", "8"),),
            ),
        ),
    )


def test_service_argv_puts_derived_flags_first_then_args_in_data_order():
    service = config(merged(base_data(), {"services": {"ddtree": {"gpu": [0, 1]}}})).services[0]

    assert service.unit_name == "sglang-ddtree.service"
    assert service.argv() == [
        "--model-path", f"/dev/shm/{TARGET}",
        "--speculative-draft-model-path", f"/root/models/{DRAFT}",
        "--host", "127.0.0.1",
        "--port", "30000",
        "--speculative-algorithm", "DFLASH",
        "--speculative-dflash-block-size", "16",
    ]
    assert service.environment_variables() == {"CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_DDTREE_MAX_TOPK": "8"}


def test_model_locations_follow_model_in_and_draft_in():
    data = merged(base_data(), {"services": {"ddtree": {"model_in": "store", "draft_in": "shm"}}})
    service = config(data).services[0]

    assert service.target.load_path == f"/root/models/{TARGET}"
    assert service.draft.load_path == f"/dev/shm/{DRAFT}"
    assert service.argv()[:4] == ["--model-path", f"/root/models/{TARGET}", "--speculative-draft-model-path", f"/dev/shm/{DRAFT}"]


def test_no_draft_model_means_no_draft_flag():
    data = merged(base_data(), {"services": {"ddtree": {"draft_model": DELETE}}})
    service = config(data).services[0]

    assert service.draft is None
    assert service.models == (service.target,)
    assert "--speculative-draft-model-path" not in service.argv()


def test_paths_are_normalised():
    data = merged(base_data(), {"venv_path": "/root//venv_sglang/", "shm_dir": "/dev/shm/"})
    cfg = config(data)

    assert cfg.venv_path == "/root/venv_sglang"
    assert cfg.services[0].target.load_path == f"/dev/shm/{TARGET}"


def test_arg_values_false_and_null_are_omitted_true_is_a_bare_flag_lists_are_several_words():
    args = {
        "enable-metrics": True,
        "disable-radix-cache": False,
        "chunked-prefill-size": None,
        "cuda-graph-bs": [1, 2, 4],
        "--mem-fraction-static": 0.85,
        "random-seed": 0,  # 0 is a value, not an omission (tp-size 0 was used here: the engine refuses it)
    }
    service = config(merged(base_data(), {"services": {"ddtree": {"args": args}}})).services[0]

    assert dict(service.args) == {
        "speculative-algorithm": "DFLASH",
        "speculative-dflash-block-size": 16,
        "enable-metrics": True,
        "cuda-graph-bs": [1, 2, 4],
        "mem-fraction-static": 0.85,
        "random-seed": 0,
    }
    assert service.argv()[8:] == [
        "--speculative-algorithm", "DFLASH",
        "--speculative-dflash-block-size", "16",
        "--enable-metrics",
        "--cuda-graph-bs", "1", "2", "4",
        "--mem-fraction-static", "0.85",
        "--random-seed", "0",
    ]


def test_staged_models_and_patch_sets_are_listed_once_per_host():
    cfg = config(host_data={"run_services": ["ddtree", "dflash"]})

    assert [s.name for s in cfg.services] == ["ddtree", "dflash"]
    assert cfg.staged_models == (ModelUse(TARGET, "shm", f"/root/models/{TARGET}", f"/dev/shm/{TARGET}"),)
    assert cfg.patch_sets == ()


def test_host_without_run_services_runs_nothing():
    assert config(host_data={}).services == ()


def test_services_not_placed_on_the_host_are_ignored():
    cfg = config(host_data={"run_services": ["dflash"]})
    assert [(s.name, s.gpus, s.port) for s in cfg.services] == [("dflash", (1,), 30001)]


def test_the_repos_own_group_data_with_the_lab_overrides_is_valid():
    all_data = settings.load_group_yaml(str(settings.REPO_ROOT / "group_data" / "all.py"))
    all_data.update(settings.load_group_yaml(str(settings.REPO_ROOT / "lab" / "group_data" / "all.py")))
    cfg = config(all_data, {"run_services": {"ddtree": {}, "dflash": None}})

    assert (cfg.stack, cfg.launcher, cfg.readiness_timeout_s) == ("lab-cpu-sglang", "sglang_standin.launch_server", 120)
    assert [(s.name, s.gpus, s.port) for s in cfg.services] == [("ddtree", (0,), 30000), ("dflash", (1,), 30001)]


# Precedence: --data > host data > group data > all ------------------------------------


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ({"all": 1800}, 1800),
        ({"all": 1800, "group": 900}, 900),
        ({"all": 1800, "group": 900, "host": 300}, 300),
        ({"all": 1800, "group": 900, "host": 300, "override": 60}, 60),
        ({"all": 1800, "override": 60}, 60),
        ({"all": 1800, "host": 300}, 300),
        ({}, 1800),  # the default
    ],
    ids=["all", "group>all", "host>group", "override>host", "override>all", "host>all", "default"],
)
def test_precedence_of_data_layers(layers, expected):
    key = "readiness_timeout_s"
    all_data = base_data()
    if "all" in layers:
        all_data[key] = layers["all"]
    groups = {"gpus": {key: layers["group"]}} if "group" in layers else None
    host_data = {"run_services": ["ddtree"], **({key: layers["host"]} if "host" in layers else {})}
    override = {key: layers["override"]} if "override" in layers else None

    assert config(all_data, host_data, groups, override).readiness_timeout_s == expected


def test_run_services_map_overrides_service_keys():
    cfg = config(host_data={"run_services": {"dflash": {"gpu": 0, "port": 30000}}})

    (service,) = cfg.services
    assert (service.name, service.gpus, service.port) == ("dflash", (0,), 30000)
    assert service.environment_variables()["CUDA_VISIBLE_DEVICES"] == "0"
    assert service.argv()[6:8] == ["--port", "30000"]
    # Keys the override does not name keep the service definition's values.
    assert dict(service.args) == {"attention-backend": "triton"}


def test_run_services_override_moves_a_service_next_to_another():
    # The inventory's example: GPU0:30000 is taken, dflash moves to GPU1:30001.
    data = merged(base_data(), {"services": {"dflash": {"gpu": 0, "port": 30000}}})
    cfg = config(data, {"run_services": {"ddtree": None, "dflash": {"gpu": 1, "port": 30001}}})

    assert [(s.name, s.gpus, s.port) for s in cfg.services] == [("ddtree", (0,), 30000), ("dflash", (1,), 30001)]


def test_override_data_beats_host_run_services():
    cfg = config(host_data={"run_services": ["ddtree", "dflash"]}, override={"run_services": {"dflash": {"gpu": 5}}})
    assert [(s.name, s.gpus) for s in cfg.services] == [("dflash", (5,))]


def test_services_from_group_data_replace_all_services_whole():
    # pyinfra merges data key by key: a group's `services` replaces the whole map.
    groups = {"gpus": {"services": {"solo": {"gpu": 2, "port": 31000, "model": "m"}}}}
    cfg = config(host_data={"run_services": ["solo"]}, groups=groups)
    assert [(s.name, s.gpus, s.port, s.draft) for s in cfg.services] == [("solo", (2,), 31000, None)]


# Loading the YAML files ----------------------------------------------------------------


def test_load_group_yaml_returns_the_keys(group_dir):
    data = load_all_yml(group_dir, "stack: lab-standin\nsmoke_test: false\n")
    assert data == {"stack": "lab-standin", "smoke_test": False}


def test_load_group_yaml_of_an_empty_file_is_refused(group_dir):
    # It used to load as {} and every key silently fell back to its default (issue 11).
    with pytest.raises(DataError) as caught:
        load_all_yml(group_dir, "# nothing yet\n")
    assert caught.value.key_path == "(file)" and caught.value.fix.startswith("empty: write the group's keys")


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("stack: lab-standin\nservices: {ddtree: [unclosed\n", "line 3, column 1", "expected ',' or ']'"),
        ("stack: lab-standin\nshm_dir: a: b\n", "line 2, column 11", "mapping values are not allowed here"),
        ("stack: 'lab-standin\n", "line 2, column 1", "found unexpected end of stream"),
        ("services:\n\t- 1\n", "line 2, column 1", "cannot start any token"),
    ],
    ids=["unclosed-flow", "colon-in-value", "unclosed-quote", "tab-indent"],
)
def test_yaml_syntax_error_names_file_line_and_column(group_dir, text, where, problem):
    with pytest.raises(DataError) as caught:
        load_all_yml(group_dir, text)
    message = str(caught.value)
    assert message.startswith(f"{group_dir / 'all.yml'}: {where}: ")
    assert problem in message
    assert message.endswith(": not valid YAML: fix the syntax at that position")


@pytest.mark.parametrize(
    ("text", "key", "value", "fix"),
    [
        ("stak: lab-standin\n", "stak", "'lab-standin'", "unknown key; allowed: " + ", ".join(sorted({*settings.GLOBAL_KEYS, *settings.HOST_KEYS}))),
        ("- stack\n- services\n", "(top level)", "['stack', 'services']", "must be a mapping of key: value"),
        ("just a string\n", "(top level)", "'just a string'", "must be a mapping of key: value"),
        ("gpu: 0\n", "gpu", "0", "unknown key; allowed:"),
    ],
    ids=["unknown-key", "list-file", "scalar-file", "service-key-at-top"],
)
def test_bad_group_file_shape(group_dir, text, key, value, fix):
    with pytest.raises(DataError) as caught:
        load_all_yml(group_dir, text)
    message = str(caught.value)
    assert message.startswith(f"{group_dir / 'all.yml'}: {key}: {value}: ")
    assert fix in message


def test_missing_yml_beside_group_py(group_dir):
    with pytest.raises(DataError) as caught:
        settings.load_group_yaml(str(group_dir / "all.py"))
    assert str(caught.value) == f"{group_dir / 'all.yml'}: (file): None: missing: create it, or delete all.py if group 'all' has no data"


# The corpus of bad values ---------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """One bad input: patches applied to a valid layer, and the four pieces of the message."""

    id: str
    key: str
    value: str  # repr of the value, as shown in the message
    fix: str  # a phrase of the fix
    all: dict = field(default_factory=dict)  # patch to all.yml (loaded from a file)
    host: dict = field(default_factory=lambda: {"run_services": ["ddtree"]})  # host data (replaces)
    override: dict | None = None
    source: str = "yml"  # "yml" (the tmp all.yml), HOST or OVERRIDE


def svc(**keys) -> dict:
    """Patch for services.ddtree."""
    return {"services": {"ddtree": keys}}


DERIVED = "is derived from the service key"
ABS = "must be an absolute path on the host, without '..'"
PORT = "must be a TCP port, an integer from 1 to 65535"
GPU = "must be a GPU index (0-63) or a non-empty list of them"
MODEL = "must be a model directory name inside `model_store`"
FLAG = "flag names are lowercase words joined by '-'"
FLAG_VALUE = "a flag value is a string, number, true (bare flag), false/null (omitted) or a list"
LINE = "must be a non-empty single line without surrounding spaces"
ENV_VALUE = "must be a single-line string or number"
SERVICE_KEYS = "unknown service key; allowed: gpu, port, bind, model, model_in, draft_model, draft_in, patch_sets, args, env"

CORPUS = [
    # Top-level keys
    Bad("sources-not-list", "stack_sources", "'wheelhouse'", "must be a non-empty list of `wheelhouse`", all={"stack_sources": "wheelhouse"}),
    Bad("sources-bad-url", "stack_sources[0].index", "'pypi.org/simple'", "must be a package index URL", all={"stack_sources": [{"index": "pypi.org/simple"}]}),
    Bad("sources-unknown-donor", "stack_sources[1].donor", "'gpu-z'", "must name another host of the inventory", all={"stack_sources": ["wheelhouse", {"donor": "gpu-z"}]}),
    Bad("sources-unknown-kind", "stack_sources[0]", "{'mirror': 'x'}", "must be a non-empty list of", all={"stack_sources": [{"mirror": "x"}]}),
    Bad("installer-unknown", "installer", "'conda'", "must be `auto`", all={"installer": "conda"}),
    Bad("unknown-stack", "stack", "'sglang-9.9'", "unknown stack; available: lab-cpu-sglang, lab-cpu-sglang-abi-mismatch, lab-cpu-sglang-bench, lab-cpu-sglang-kernel-update, lab-standin", all={"stack": "sglang-9.9"}),
    Bad("stack-not-a-name", "stack", "['lab-standin']", "unknown stack; available:", all={"stack": ["lab-standin"]}),
    Bad("venv-relative", "venv_path", "'root/venv_sglang'", ABS, all={"venv_path": "root/venv_sglang"}),
    Bad("venv-dotdot", "venv_path", "'/root/../etc'", ABS, all={"venv_path": "/root/../etc"}),
    Bad("model-store-empty", "model_store", "''", ABS, all={"model_store": ""}),
    Bad("shm-dir-not-a-string", "shm_dir", "5", ABS, all={"shm_dir": 5}),
    Bad("wheel-cache-dotdot", "host_wheel_cache", "'/var/cache/../../tmp'", ABS, all={"host_wheel_cache": "/var/cache/../../tmp"}),
    Bad("wheelhouse-empty", "wheelhouse", "''", "must be a directory path on the control machine", all={"wheelhouse": ""}),
    Bad("launcher-not-a-module", "launcher", "'sglang launch_server'", "must be a Python module name such as sglang.launch_server", all={"launcher": "sglang launch_server"}),
    Bad("timeout-zero", "readiness_timeout_s", "0", "must be whole seconds from 1 to 86400", all={"readiness_timeout_s": 0}),
    Bad("timeout-string", "readiness_timeout_s", "'10'", "must be whole seconds from 1 to 86400", all={"readiness_timeout_s": "10"}),
    Bad("timeout-bool", "readiness_timeout_s", "True", "must be whole seconds from 1 to 86400", all={"readiness_timeout_s": True}),
    Bad("timeout-too-long", "readiness_timeout_s", "86401", "must be whole seconds from 1 to 86400", all={"readiness_timeout_s": 86401}),
    Bad("smoke-test-string", "smoke_test", "'yes please'", "must be true or false", all={"smoke_test": "yes please"}),
    Bad("smoke-test-int", "smoke_test", "1", "must be true or false", all={"smoke_test": 1}),
    # The services map
    Bad("services-list", "services", "['ddtree']", "must be a map of service name -> service definition", all={"services": ["ddtree"]}),
    Bad("service-name-uppercase", "services.DDTree", "'DDTree'", "service names are lowercase letters, digits, '-' and '_'", all={"services": {"DDTree": {"gpu": 3, "port": 1, "model": "m"}}}),
    Bad("service-name-space", "services.dd tree", "'dd tree'", "they name the systemd unit", all={"services": {"dd tree": {"gpu": 3, "port": 1, "model": "m"}}}),
    Bad("service-not-a-map", "services.ddtree", "'gpu0'", "must be a map of service keys: gpu, port", all={"services": {"ddtree": "gpu0"}}),
    Bad("service-unknown-key", "services.ddtree.gpus", "[0]", SERVICE_KEYS, all=svc(gpus=[0])),
    Bad("service-missing-gpu", "services.ddtree.gpu", "None", "required: GPU index", all=svc(gpu=DELETE)),
    Bad("service-missing-port", "services.ddtree.port", "None", "required: TCP port", all=svc(port=DELETE)),
    Bad("service-missing-model", "services.ddtree.model", "None", "required: Target model", all=svc(model=DELETE)),
    Bad("port-zero", "services.ddtree.port", "0", PORT, all=svc(port=0)),
    Bad("port-too-big", "services.ddtree.port", "70000", PORT, all=svc(port=70000)),
    Bad("port-string", "services.ddtree.port", "'30000'", PORT, all=svc(port="30000")),
    Bad("port-bool", "services.ddtree.port", "True", PORT, all=svc(port=True)),
    Bad("gpu-negative", "services.ddtree.gpu", "-1", GPU, all=svc(gpu=-1)),
    Bad("gpu-string", "services.ddtree.gpu", "'0'", GPU, all=svc(gpu="0")),
    Bad("gpu-empty-list", "services.ddtree.gpu", "[]", GPU, all=svc(gpu=[])),
    Bad("gpu-bool", "services.ddtree.gpu", "True", GPU, all=svc(gpu=True)),
    Bad("gpu-64", "services.ddtree.gpu", "[0, 64]", GPU, all=svc(gpu=[0, 64])),
    Bad("gpu-twice", "services.ddtree.gpu", "[0, 0]", "lists a GPU twice; list each index once", all=svc(gpu=[0, 0])),
    Bad("bind-hostname", "services.ddtree.bind", "'my-host'", "must be an IP address such as 127.0.0.1 or 0.0.0.0", all=svc(bind="my-host")),
    Bad("bind-int", "services.ddtree.bind", "0", "must be an IP address", all=svc(bind=0)),
    Bad("model-path", "services.ddtree.model", "'a/b'", MODEL, all=svc(model="a/b")),
    Bad("model-dotdot", "services.ddtree.model", "'..'", MODEL, all=svc(model="..")),
    Bad("model-absolute", "services.ddtree.model", f"'/root/models/{TARGET}'", MODEL, all=svc(model=f"/root/models/{TARGET}")),
    Bad("draft-model-path", "services.ddtree.draft_model", "'../x'", MODEL, all=svc(draft_model="../x")),
    Bad("model-in-ram", "services.ddtree.model_in", "'ram'", "must be `shm` (staged into shm_dir) or `store`", all=svc(model_in="ram")),
    Bad("draft-in-null", "services.ddtree.draft_in", "None", "must be `shm` (staged into shm_dir) or `store`", all=svc(draft_in=None)),
    Bad("patch-sets-string", "services.ddtree.patch_sets", "'ddtree-sample'", "must be a list of patch set names", all=svc(patch_sets="ddtree-sample")),
    Bad("patch-set-unknown", "services.ddtree.patch_sets", "'no-such-set'", "no such patch set; available:", all=svc(patch_sets=["no-such-set"])),
    # args
    Bad("args-list", "services.ddtree.args", "['--tp', 2]", "must be a map of sglang flag -> value", all={"services": {"ddtree": {"args": ["--tp", 2]}}}),
    Bad("arg-flag-uppercase", "services.ddtree.args.Attention-Backend", "'Attention-Backend'", FLAG, all=svc(args={"Attention-Backend": "triton"})),
    Bad("arg-flag-space", "services.ddtree.args.attention backend", "'attention backend'", FLAG, all=svc(args={"attention backend": "triton"})),
    Bad("arg-flag-underscore", "services.ddtree.args.attention_backend", "'attention_backend'", FLAG, all=svc(args={"attention_backend": "triton"})),
    Bad("arg-given-twice", "services.ddtree.args.--attention-backend", "'--attention-backend'", "`attention-backend` is given twice (with and without `--`); keep one", all=svc(args={"attention-backend": "triton", "--attention-backend": "fa3"})),
    Bad("arg-given-twice-dashes-first", "services.ddtree.args.tp-size", "'tp-size'", "`tp-size` is given twice", all=svc(args={"--tp-size": 2, "tp-size": 2})),
    Bad("arg-derived-model-path", "services.ddtree.args.model-path", "'/x'", f"`--model-path` {DERIVED} `model`; set that instead", all=svc(args={"model-path": "/x"})),
    Bad("arg-derived-port", "services.ddtree.args.--port", "30002", f"`--port` {DERIVED} `port`; set that instead", all=svc(args={"--port": 30002})),
    Bad("arg-derived-host", "services.ddtree.args.host", "'0.0.0.0'", f"`--host` {DERIVED} `bind`; set that instead", all=svc(args={"host": "0.0.0.0"})),
    Bad("arg-derived-draft", "services.ddtree.args.speculative-draft-model-path", "'/d'", f"`--speculative-draft-model-path` {DERIVED} `draft_model`; set that instead", all=svc(args={"speculative-draft-model-path": "/d"})),
    Bad("arg-value-dict", "services.ddtree.args.json-model-override-args", "{'a': 1}", FLAG_VALUE, all=svc(args={"json-model-override-args": {"a": 1}})),
    Bad("arg-value-empty-list", "services.ddtree.args.cuda-graph-bs", "[]", FLAG_VALUE, all=svc(args={"cuda-graph-bs": []})),
    Bad("arg-value-list-of-bools", "services.ddtree.args.cuda-graph-bs", "[True]", FLAG_VALUE, all=svc(args={"cuda-graph-bs": [True]})),
    Bad("arg-value-empty-string", "services.ddtree.args.attention-backend", "''", LINE, all=svc(args={"attention-backend": ""})),
    Bad("arg-value-multi-line", "services.ddtree.args.chat-template", "'a\\nb'", LINE, all=svc(args={"chat-template": "a\nb"})),
    Bad("arg-value-padded", "services.ddtree.args.attention-backend", "' triton'", LINE, all=svc(args={"attention-backend": " triton"})),
    # env
    Bad("env-list", "services.ddtree.env", "['A=1']", "must be a map of NAME -> value", all={"services": {"ddtree": {"env": ["A=1"]}}}),
    Bad("env-bad-name", "services.ddtree.env.MY-VAR", "'MY-VAR'", "must be a valid environment variable name", all=svc(env={"MY-VAR": "1"})),
    Bad("env-name-digit", "services.ddtree.env.1X", "'1X'", "must be a valid environment variable name", all=svc(env={"1X": "1"})),
    Bad("env-cuda-reserved", "services.ddtree.env.CUDA_VISIBLE_DEVICES", "'0,1'", "`CUDA_VISIBLE_DEVICES` is derived from the service key `gpu`; set that instead", all=svc(env={"CUDA_VISIBLE_DEVICES": "0,1"})),
    Bad("env-value-bool", "services.ddtree.env.SGLANG_X", "True", ENV_VALUE + ' (quote booleans: "true")', all=svc(env={"SGLANG_X": True})),
    Bad("env-value-multi-line", "services.ddtree.env.SGLANG_X", "'a\\nb'", ENV_VALUE, all=svc(env={"SGLANG_X": "a\nb"})),
    Bad("env-value-null", "services.ddtree.env.SGLANG_X", "None", ENV_VALUE, all=svc(env={"SGLANG_X": None})),
    # run_services (host data)
    Bad("run-unknown-service", "run_services", "'nope'", "no such service; defined services: ddtree, dflash", host={"run_services": ["ddtree", "nope"]}, source=HOST),
    Bad("run-string", "run_services", "'ddtree'", "must be a list of service names or a map name -> overrides", host={"run_services": "ddtree"}, source=HOST),
    Bad("run-null", "run_services", "None", "must be a list of service names or a map", host={"run_services": None}, source=HOST),
    Bad("run-list-of-maps", "run_services", "[{'ddtree': {}}]", "must list service names, e.g. `[ddtree, dflash]`", host={"run_services": [{"ddtree": {}}]}, source=HOST),
    Bad("run-twice", "run_services", "['ddtree', 'dflash', 'ddtree']", "names a service twice; list each once", host={"run_services": ["ddtree", "dflash", "ddtree"]}, source=HOST),
    Bad("run-override-not-a-map", "run_services.dflash", "[1]", "overrides must be a map of service keys", host={"run_services": {"dflash": [1]}}, source=HOST),
    Bad("run-override-unknown-key", "run_services.dflash.gpus", "1", SERVICE_KEYS, host={"run_services": {"dflash": {"gpus": 1}}}, source=HOST),
    Bad("run-override-bad-port", "run_services.dflash.port", "0", PORT, host={"run_services": {"dflash": {"port": 0}}}, source=HOST),
    Bad("run-override-bad-gpu", "run_services.dflash.gpu", "'1'", GPU, host={"run_services": {"dflash": {"gpu": "1"}}}, source=HOST),
    Bad("run-override-bad-arg", "run_services.dflash.args.port", "1", "`--port` is derived from the service key `port`", host={"run_services": {"dflash": {"args": {"port": 1}}}}, source=HOST),
    Bad("run-in-all-yml", "run_services", "'nope'", "no such service", all={"run_services": ["nope"]}, host={}),
    Bad("same-port", "run_services", "['ddtree', 'dflash']", "both use port 30000 on host gpu-a; give each service or replica on a host its own port", host={"run_services": {"ddtree": {}, "dflash": {"port": 30000}}}, source=HOST),
    Bad("same-gpu", "run_services", "['ddtree', 'dflash']", "both use GPU 0 on host gpu-a; give each service or replica on a host its own GPUs", host={"run_services": {"ddtree": {}, "dflash": {"gpu": [1, 0]}}}, source=HOST),
    # Other layers
    Bad("host-data-bad-venv", "venv_path", "'venv'", ABS, host={"run_services": ["ddtree"], "venv_path": "venv"}, source=HOST),
    Bad("host-data-bad-services", "services.ddtree.port", "-1", PORT, host={"run_services": ["ddtree"], "services": {"ddtree": {"gpu": 0, "port": -1, "model": "m"}}}, source=HOST),
    Bad("override-bad-timeout", "readiness_timeout_s", "-5", "must be whole seconds", override={"readiness_timeout_s": -5}, source=OVERRIDE),
    Bad("override-bad-stack", "stack", "'nope'", "unknown stack", override={"stack": "nope"}, source=OVERRIDE),
    Bad("override-run-services", "run_services.ddtree.port", "'x'", PORT, override={"run_services": {"ddtree": {"port": "x"}}}, source=OVERRIDE),
]


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_bad_input_names_source_key_value_and_fix(group_dir, case: Bad):
    all_data = load_all_yml(group_dir, merged(base_data(), case.all))
    source = {"yml": str(group_dir / "all.yml")}.get(case.source, case.source)

    with pytest.raises(DataError) as caught:
        config(all_data, case.host, override=case.override)

    error = caught.value
    message = str(error)
    assert (error.source, error.key_path, repr(error.value)) == (source, case.key, case.value)
    assert message.startswith(f"{source}: {case.key}: {case.value}: ")
    assert case.fix in error.fix
    assert message == f"{source}: {case.key}: {case.value}: {error.fix}"


def test_corpus_is_large_and_ids_are_unique():
    assert len(CORPUS) >= 20
    assert len({c.id for c in CORPUS}) == len(CORPUS)


def test_long_values_are_shortened_in_the_message(group_dir):
    all_data = load_all_yml(group_dir, merged(base_data(), {"venv_path": "x" * 500}))
    with pytest.raises(DataError) as caught:
        config(all_data)
    shown = str(caught.value).split(": ")[2]
    assert len(shown) == 120 and shown.endswith("...")


# Provenance ----------------------------------------------------------------------------


def test_source_of_a_bad_value_loaded_from_a_yml_file_is_that_file(group_dir):
    all_data = load_all_yml(group_dir, merged(base_data(), {"smoke_test": "no"}))
    with pytest.raises(DataError) as caught:
        config(all_data)
    assert str(caught.value) == f"{group_dir / 'all.yml'}: smoke_test: 'no': must be true or false"


def test_source_of_the_later_of_two_yml_files_that_set_a_key(tmp_path):
    # pyinfra reads the deploy dir's group_data, then the inventory dir's: the later file wins.
    first, second = tmp_path / "deploy" / "group_data", tmp_path / "lab" / "group_data"
    for folder in (first, second):
        folder.mkdir(parents=True)
        (folder / "all.py").write_text("")
    data = load_all_yml(first, base_data())
    data.update(load_all_yml(second, {"readiness_timeout_s": "soon"}))
    with pytest.raises(DataError) as caught:
        config(data)
    assert caught.value.source == str(second / "all.yml")


def test_source_of_a_key_the_later_file_did_not_set_stays_the_first_file(tmp_path):
    first, second = tmp_path / "deploy" / "group_data", tmp_path / "lab" / "group_data"
    for folder in (first, second):
        folder.mkdir(parents=True)
        (folder / "all.py").write_text("")
    data = load_all_yml(first, merged(base_data(), {"shm_dir": "shm"}))
    data.update(load_all_yml(second, {"readiness_timeout_s": 120}))
    with pytest.raises(DataError) as caught:
        config(data)
    assert (caught.value.source, caught.value.key_path) == (str(first / "all.yml"), "shm_dir")


def test_source_of_a_bad_value_in_host_data_is_the_inventory():
    with pytest.raises(DataError) as caught:
        config(host_data={"run_services": ["ddtree"], "smoke_test": "no"})
    assert str(caught.value) == "inventory (host gpu-a): smoke_test: 'no': must be true or false"


def test_source_of_a_bad_value_given_with_data_flag():
    with pytest.raises(DataError) as caught:
        config(override={"smoke_test": "no"})
    assert str(caught.value) == "--data: smoke_test: 'no': must be true or false"


def test_source_of_a_bad_value_in_a_group_without_yml_is_its_py_file():
    with pytest.raises(DataError) as caught:
        config(groups={"gpus": {"shm_dir": "shm"}})
    assert str(caught.value).startswith("group_data/gpus.py: shm_dir: 'shm': ")


def test_source_of_a_bad_default_names_the_defaults(monkeypatch):
    monkeypatch.setitem(settings.GLOBAL_KEYS, "readiness_timeout_s", settings.Key(0, "bad default"))
    data = merged(base_data(), {"readiness_timeout_s": DELETE})
    with pytest.raises(DataError) as caught:
        config(data)
    assert str(caught.value).startswith("defaults (configuration/settings.py): readiness_timeout_s: 0: ")


def test_a_bad_value_hidden_by_a_higher_layer_is_not_reported(group_dir):
    all_data = load_all_yml(group_dir, merged(base_data(), {"venv_path": "relative"}))
    assert config(all_data, host_data={"run_services": ["ddtree"], "venv_path": "/opt/venv"}).venv_path == "/opt/venv"


# Bugs found (strict xfail: they pass once fixed, and then the marker must go) -----------


def test_override_with_unknown_key_is_rejected():
    with pytest.raises(DataError) as caught:
        config(override={"readines_timeout_s": 60})
    assert (caught.value.source, caught.value.key_path) == ("--data", "readines_timeout_s")
    assert "unknown key" in caught.value.fix


@pytest.mark.parametrize("bind", ["cafe", "999.1.1.1", ":::"])
def test_bind_must_be_an_ip_address(bind):
    with pytest.raises(DataError) as caught:
        config(merged(base_data(), svc(bind=bind)))
    assert caught.value.key_path == "services.ddtree.bind"


def test_multi_line_string_inside_a_list_arg_value_is_rejected():
    with pytest.raises(DataError) as caught:
        config(merged(base_data(), svc(args={"cuda-graph-bs": ["1", "2\n3"]})))
    assert caught.value.key_path == "services.ddtree.args.cuda-graph-bs"


def test_flag_given_twice_is_rejected_even_when_one_is_false():
    with pytest.raises(DataError) as caught:
        config(merged(base_data(), svc(args={"enable-metrics": False, "--enable-metrics": True})))
    assert "given twice" in caught.value.fix


# Crashes and hangs become messages (issue 25) ------------------------------------------------------


@pytest.mark.parametrize(
    ("host_data", "key"),
    [
        ({"run_services": {"dflash": {"port": 10**5000}}}, "run_services.dflash.port"),
        ({"run_services": {"dflash": {"gpu": [1, 10**5000]}}}, "run_services.dflash.gpu"),
        ({"run_services": {"dflash": {"args": {"random-seed": 10**5000}}}}, "run_services.dflash.args.random-seed"),
        ({"run_services": {"dflash": {"env": {"SGLANG_X": 10**5000}}}}, "run_services.dflash.env.SGLANG_X"),
        ({"run_services": ["ddtree"], "lock_wait_s": 10**5000}, "lock_wait_s"),
    ],
    ids=["port", "gpu-list", "arg-value", "env-value", "seconds"],
)
def test_an_int_python_cannot_write_out_is_a_message(host_data, key):
    # Python refuses str() and repr() of an int of more than 4300 digits: the inventory (Python) can hold one.
    with pytest.raises(DataError) as caught:
        config(host_data=host_data)
    assert (caught.value.source, caught.value.key_path) == (HOST, key)
    assert "far too large a number" in caught.value.fix and "bits>" in str(caught.value)


def test_a_message_shows_a_value_holding_an_int_python_cannot_write_out():
    assert "too long to show" in str(DataError("x.yml", "k", [10**5000], "fix"))


def test_what_a_host_reads_of_other_hosts_comes_from_their_validated_configuration():
    """A donor's live venv, a model source's store and each host's SSH address are the other hosts' validated values:
    no operation reads a host's data (tests/unit/test_layers.py)."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory((
        [
            ("gpu-a", {"run_services": ["ddtree"], "stack_sources": [{"donor": "gpu-b"}, "wheelhouse"], "model_sources": {TARGET: "gpu-b"}}),
            ("gpu-b", {"ssh_hostname": "10.0.0.2", "ssh_port": 2222, "venv_path": "/srv/venv", "model_store": "/srv/models"}),
        ],
        base_data(),
    ))
    State(inventory, Config())
    configs = settings.validate_inventory(inventory.get_host("gpu-a").state)
    assert configs["gpu-a"].peer_venvs == {"gpu-b": "/srv/venv"}
    assert configs["gpu-a"].peer_stores == {"gpu-b": "/srv/models"}
    assert (configs["gpu-a"].ssh_address, configs["gpu-b"].ssh_address) == (("gpu-a", 22), ("10.0.0.2", 2222))
    assert configs["gpu-b"].peer_venvs == configs["gpu-b"].peer_stores == {}
