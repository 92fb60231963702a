"""Exposure judged from the engine's arguments' values, not from a list of flags (configuration/exposure.py, `listens_beyond_loopback`).

Every argument value, whatever the flag is called, that names an address beyond loopback (a URL, `host:port`, zmq's
`*`, a bare IP address, in a list or inside JSON to any depth) makes the service one that listens beyond loopback,
which needs an API key or `allow_unauthenticated: true`.
"""

from __future__ import annotations

import json

import pytest

from configuration import engine_flags, kinds, settings
from configuration.errors import DataError
from configuration.exposure import listens_beyond_loopback
from configuration.typed import Arg
from tests.unit.hosts import make_host
from tests.unit.test_settings import base_data, merged


def dflash(args: dict, **keys) -> settings.Service:
    data = merged(base_data(), {"services": {"dflash": {"args": {"attention-backend": "triton", **args}, **keys}}})
    return settings.host_config(make_host(data, {"run_services": ["dflash"]})).services[0]


# The rule, value by value ------------------------------------------------------------------------------------------

BEYOND = [
    ('{"publisher": "zmq", "endpoint": "tcp://*:5557"}', "tcp://*:5557"),
    ('{"endpoint": "tcp:\\/\\/\\u002a:5557"}', "tcp://*:5557"),  # JSON escapes, as the engine's json.loads reads them
    ('{"a": "{\\"b\\": [\\"tcp://[::]:6000\\"]}"}', "tcp://[::]:6000"),  # JSON inside JSON
    ("tcp://0.0.0.0:5555", "tcp://0.0.0.0:5555"),
    ("tcp://:5557", "tcp://:5557"),  # an empty host before a port binds every interface
    ("*", "*"),
    ("*:5557", "*:5557"),
    ("0.0.0.0", "0.0.0.0"),
    ("::", "::"),
    ("10.0.0.1:5000", "10.0.0.1:5000"),
    ("10.1:5000", "10.1:5000"),  # inet_aton's short form of 10.0.0.1
    ("[::]:5000", "[::]:5000"),
    ("node0.cluster:5000", "node0.cluster:5000"),  # a DNS name may resolve anywhere
    ("http://mirror.example/simple", "http://mirror.example"),  # connected out to: counted all the same
    ("epgm://eth0;239.192.1.1:5555", "epgm://eth0"),
    ("host=0.0.0.0 port=1", "0.0.0.0"),
    (["http://127.0.0.1:8000", "http://10.0.0.3:8000"], "http://10.0.0.3:8000"),
    ('{"bad json": 0.0.0.0:1', "0.0.0.0:1"),  # not JSON: read as text
]
LOOPBACK_OR_NONE = [
    "tcp://127.0.0.1:5557", '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}', "localhost:4317",
    "[::1]:5000", "127.1:5000", "::ffff:127.0.0.1", "ipc:///tmp/feeds/0", "ipc://feeds", "inproc://x", "file:///srv/x",
    "Qwen3.6-27B", "/root/models/Qwen3.6-27B", "0.85", "0.5.23", "12:30", "triton", "DDTREE", "max_tokens:100",
    '{"rope_scaling": {"type": "yarn", "factor": 4.0}}', "[" * 5000, 16, 0.3, True,
]


@pytest.mark.parametrize(("value", "written"), BEYOND, ids=[str(v)[:40] for v, _ in BEYOND])
def test_a_value_naming_an_address_beyond_loopback_is_found(value, written):
    beyond = [a.written for a in kinds.addresses_in(value) if a.beyond_loopback]
    assert beyond and beyond[0] == written


@pytest.mark.parametrize("value", LOOPBACK_OR_NONE, ids=[str(v)[:40] for v in LOOPBACK_OR_NONE])
def test_a_value_naming_loopback_or_no_address_is_not(value):
    assert [a.written for a in kinds.addresses_in(value) if a.beyond_loopback] == []


def test_json_nested_past_what_python_parses_is_read_as_text_not_a_crash():
    deep = "[" * 100_000 + '"tcp://0.0.0.0:1"' + "]" * 100_000
    assert [a.written for a in kinds.addresses_in(deep)] == ["tcp://0.0.0.0:1"]
    strings = json.dumps("tcp://0.0.0.0:2")
    for _ in range(20):  # a string in a string in a string ...: past MAX_JSON_DEPTH it is read as text
        strings = json.dumps(strings)
    assert kinds.addresses_in(strings)


@pytest.mark.parametrize("version", engine_flags.known_versions())
def test_every_flag_of_every_engine_counts_whatever_its_name(version):
    """Not a list of dests: any flag of the engine given an address beyond loopback makes the service exposed."""
    bind = ("group_data/all.yml", "services.x.bind", "127.0.0.1")
    for action in engine_flags.load(version).actions:
        arg = Arg(action.flag, '{"endpoint": "tcp://*:5557"}', f"services.x.args.{action.flag}", action.dest, "all.yml")
        found = listens_beyond_loopback(bind, [arg])
        assert [f[1] for f in found] == [arg.key_path], action.flag


# Through validation ------------------------------------------------------------------------------------------------


def test_a_kv_events_publisher_on_every_interface_without_a_key_is_refused():
    with pytest.raises(DataError) as caught:
        dflash({"kv-events-config": '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'})
    error = caught.value
    assert (error.key_path, error.value) == ("services.dflash.args.kv-events-config", '{"publisher": "zmq", "endpoint": "tcp://*:5557"}')
    assert "`--kv-events-config` naming `tcp://*:5557`, an address beyond loopback" in str(error)
    assert "set `api_key_secret`" in error.fix and "allow_unauthenticated: true" in error.fix


def test_a_kv_events_publisher_on_loopback_is_accepted_and_not_exposed():
    service = dflash({"kv-events-config": '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}'})
    assert not service.exposed_without_key and service.listens_beyond_loopback == ()


def test_allowed_unauthenticated_it_is_marked_with_where_and_why():
    service = dflash({"kv-events-config": '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'}, allow_unauthenticated=True)
    assert service.exposed_without_key
    assert [where for where, _ in service.listens_beyond_loopback] == ["services.dflash.args.kv-events-config"]


def test_a_url_with_a_password_in_a_flag_value_is_refused_and_never_shown():
    with pytest.raises(DataError) as caught:
        dflash({"kv-events-config": '{"endpoint": "tcp://u:hunter2-hunter2@127.0.0.1:5557"}'})
    assert caught.value.value == "<hidden>" and "hunter2" not in str(caught.value)
    assert "holds a URL with a user name or password" in caught.value.fix


def test_the_repos_own_services_listen_on_loopback_only():
    """group_data/all.yml's args (and the bench inventories' kind of args) name no address."""
    data = merged(base_data(), {"services": {"dflash": {"args": {
        "attention-backend": "triton", "grammar-backend": "none", "load-format": "dummy", "mem-fraction-static": 0.3,
        "context-length": 2048, "cuda-graph-max-bs": 8, "disable-cuda-graph": True}}}})
    service = settings.host_config(make_host(data, {"run_services": ["dflash"]})).services[0]
    assert not service.exposed_without_key
