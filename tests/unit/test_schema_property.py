"""Whatever the schema accepts, the unit holds only lines the template writes.

Hypothesis generates data the schema accepts (services with random names, GPUs, ports, models, engine flags and
values, environment variables, host paths, launcher, user and host name drawn from the accepted kinds, values
full of quotes, `$`, `%`, `\\`, `;`, `#`, `=`, spaces and non-ASCII letters), validates it as a deploy does, renders
the unit with the real rendering code (operations/service/units.py and templates/sglang.service.j2), and asserts that:

- every line is one the template produces for some input: blank, a comment, a section header, a `Key=` line of a
  key the template writes, or a flag continuation line (`    --flag ...`);
- the directives other than the per-value ones (`Environment=`, `BindReadOnlyPaths=`) and the comments are the same,
  in number and kind, as in a unit of plain values: no value started a new line or a new directive;
- systemd reads back exactly the values given: the environment, and `ExecStart=` word for word.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from configuration import kinds, settings, stacks
from configuration.errors import DataError
from operations.run import templates
from operations.service import units
from tests.unit.hosts import make_host

TEMPLATE_KEYS = frozenset(re.findall(r"^([A-Za-z]+)=", (templates.TEMPLATES / "sglang.service.j2").read_text(), re.M))
PER_VALUE_KEYS = ("Environment", "BindReadOnlyPaths")
STACK = "lab-standin"

# Printable text with what a unit file, a shell or systemd's specifiers would read specially.
AWKWARD = st.text(st.sampled_from(list("abcXYZ019 _-./:=,+@\"'\\$%;#&|<>(){}[]*?!~`^éß中")), min_size=1, max_size=12)
# A word naming an address beyond loopback is accepted only with an API key, one holding `user@` not at all.
WORD = AWKWARD.map(str.strip).filter(lambda w: w != "" and not w.startswith("-")).filter(
    lambda w: not any(a.beyond_loopback or a.userinfo for a in kinds.addresses_in(w)))
FLAG = st.from_regex(r"zz-[a-z0-9]{1,8}(-[a-z0-9]{1,6}){0,2}", fullmatch=True)  # no engine option starts with --zz
FLAG_VALUE = st.one_of(st.just(True), WORD, st.integers(-10**6, 10**6), st.floats(-1e6, 1e6, allow_nan=False),
                       st.lists(st.one_of(WORD, st.integers(0, 999)), min_size=1, max_size=3))
ENV_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda n: kinds.env_name_refusal(n) is None and not kinds.credential_env_name(n) and n not in ("PATH", "HOME"))
ENV_VALUE = st.one_of(AWKWARD, st.integers(-10**6, 10**6))
SEGMENT = st.from_regex(r"[A-Za-z0-9_+@:-][A-Za-z0-9_.+@:-]{0,10}", fullmatch=True)
SERVICE_NAME = st.from_regex(kinds.NAME, fullmatch=True).filter(lambda n: n not in kinds.RESERVED_SERVICE_NAMES)
MODEL = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
HOST = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)
MODULE = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}(\.[A-Za-z_][A-Za-z0-9_]{0,8}){0,2}", fullmatch=True)
USER = st.one_of(st.just("root"), st.from_regex(r"[a-z_][a-z0-9_-]{0,15}", fullmatch=True).filter(
    lambda u: kinds.privileged_account(u) is None))


def path_under(root: str):
    return st.lists(SEGMENT, min_size=1, max_size=3).map(lambda parts: "/".join([root, *parts]))


@st.composite
def deploy_data(draw):
    gpu = draw(st.one_of(st.integers(0, 63), st.lists(st.integers(0, 63), min_size=1, max_size=4, unique=True)))
    model = draw(MODEL)
    service = {
        "gpu": gpu,
        "port": draw(st.integers(1024, 65535)),
        "bind": draw(st.sampled_from(["127.0.0.1", "::1", "127.0.0.2"])),
        "model": model,
        "model_in": draw(st.sampled_from(["shm", "store"])),
        "draft_model": draw(st.one_of(st.none(), MODEL.filter(lambda m: m != model))),
        "args": draw(st.dictionaries(FLAG, FLAG_VALUE, max_size=5)),
        "env": draw(st.dictionaries(ENV_NAME, ENV_VALUE, max_size=5)),
    }
    name = draw(SERVICE_NAME)
    data = {
        "stack": STACK,
        "venv_path": draw(path_under("/srv/venvs")),
        "model_store": draw(path_under("/data/models")),
        "shm_dir": draw(st.one_of(st.just("/dev/shm"), path_under("/dev/shm"))),
        "host_wheel_cache": draw(path_under("/var/cache/wheels")),
        "launcher": draw(MODULE),
        "service_user": draw(USER),
        "services": {name: service},
    }
    return draw(HOST), name, data


# What would start a new line or a new directive if it got through: systemd ends a line at \n and \r.
BREAKS = st.sampled_from(["\n", "\r", "\n[Service]\nExecStartPost=+/bin/true", "\x00", "\t", "\u2028", "\x85", "\x1b"])


PLACES = ("host", "name", "model", "launcher", "venv_path", "user", "flag", "flag value", "env name", "env value")


def with_a_line_break(where: str, brk: str, host: str, name: str, data: dict):
    """The same data with a line break put into one value of the kind `where`."""
    service = data["services"][name]
    if where == "host":
        host += brk
    elif where == "name":
        data["services"] = {name + brk: service}
        name += brk
    elif where == "model":
        service["model"] += brk
    elif where == "launcher":
        data["launcher"] += brk
    elif where == "venv_path":
        data["venv_path"] += brk
    elif where == "user":
        data["service_user"] += brk
    elif where == "flag":
        service["args"] = {**service["args"], "zz-q" + brk: ["ExecStartPost=+/bin/touch", "/root/pwned"]}
    elif where == "flag value":
        service["args"] = {**service["args"], "zz-q": "a" + brk + "b"}
    elif where == "env name":
        service["env"] = {**service["env"], "SGLANG_Q" + brk: "1"}
    else:
        service["env"] = {**service["env"], "SGLANG_Q": "a" + brk + "ExecStartPost=+/bin/true"}
    return host, name, data


def render(host_name: str, name: str, data: dict) -> tuple[str, settings.HostConfig]:
    config = settings.host_config(make_host(data, {"run_services": [name]}, name=host_name))
    stack = stacks.load_stack(config.stack)
    return units.render_unit(config, config.services[0], stack, units.inputs_digest(stack, {})), config


def shape(line: str) -> str:
    """What kind of template line `line` is, or a refusal naming it."""
    if line == "" or line.startswith("#") or line in ("[Unit]", "[Service]", "[Install]"):
        return "comment" if line.startswith("#") else line or "blank"
    if line.startswith("    --") or (line.startswith("    ") and line.strip().startswith("--")):
        return "flag"
    key = line.split("=", 1)[0]
    assert "=" in line and key in TEMPLATE_KEYS, f"a line the template does not write: {line!r}"
    return key


def unquote(word: str) -> str:
    return word.replace("%%", "%")


def environment(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            (assignment,) = shlex.split(line.removeprefix("Environment="))
            name, _, value = unquote(assignment).partition("=")
            out[name] = value
    return out


def exec_start(text: str) -> list[str]:
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("ExecStart="))
    logical = lines[i].removeprefix("ExecStart=")
    while logical.endswith("\\"):
        i += 1
        logical = logical[:-1] + " " + lines[i]
    return [unquote(word).replace("$$", "$") for word in shlex.split(logical)]


PLAIN = ("gpu-a", "plain", {
    "stack": STACK, "venv_path": "/srv/venvs/v", "model_store": "/data/models/m", "shm_dir": "/dev/shm",
    "host_wheel_cache": "/var/cache/wheels/w", "launcher": "sglang.launch_server", "service_user": "sglang",
    "services": {"plain": {"gpu": 0, "port": 30000, "model": "m", "args": {"zz-a": "1"}, "env": {"SGLANG_A": "1"}}},
})


def fixed_directives(text: str) -> Counter:
    shapes = Counter(shape(line) for line in text.splitlines())
    for key in (*PER_VALUE_KEYS, "flag"):
        shapes.pop(key, None)
    return shapes


def check_unit(host_name: str, name: str, data: dict) -> None:
    text, config = render(host_name, name, data)
    service = config.services[0]
    plain = PLAIN[2] if config.service_user != "root" else {**PLAIN[2], "service_user": "root"}  # root: User= without Group=
    plain_text, _ = render(PLAIN[0], PLAIN[1], plain)

    assert fixed_directives(text) == fixed_directives(plain_text)
    env = environment(text)
    assert {k: env[k] for k in service.environment_variables()} == service.environment_variables()
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert exec_start(text) == [f"{service.environment.path}/bin/python", "-m", config.launcher, *service.argv()]
    flag_lines = [line for line in text.splitlines() if shape(line) == "flag"]
    assert len(flag_lines) == sum(1 for word in service.argv() if word.startswith("--"))


@hypothesis_settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(deploy_data())
def test_a_unit_of_any_accepted_data_holds_only_the_templates_lines(case):
    try:
        check_unit(*case)
    except DataError as exc:  # the generator draws from the accepted kinds: a refusal is a bug in one of them
        raise AssertionError(f"accepted kinds refused: {exc}") from None


@pytest.mark.parametrize("where", PLACES)
@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=deploy_data(), brk=BREAKS)
def test_a_line_break_in_any_value_is_refused_or_stays_inside_its_line(where, case, brk):
    try:
        check_unit(*with_a_line_break(where, brk, *case))
    except DataError:
        pass  # refused before any host is touched
