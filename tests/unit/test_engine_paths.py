"""What the engine loads is root's or the service's (issue 46 item 4): which paths a value names, where each is
judged, and that the service's own directories and the models the deploy stages pass."""

from __future__ import annotations

import pytest

from configuration import engine_paths as E


@pytest.mark.parametrize(("value", "paths"), [
    ("/srv/tok", ["/srv/tok"]),
    ("Qwen/Qwen3-8B", []),                       # a repository id is no path
    ("auto", []), (0.8, []), (True, []),
    ("/srv/a:/tmp/b", ["/srv/a", "/tmp/b"]),     # PATH-like lists
    ("/srv/a,/srv/b;/srv/c /srv/d", ["/srv/a", "/srv/b", "/srv/c", "/srv/d"]),
    ("path=/tmp/x.json", ["/tmp/x.json"]),
    ("file:///run/lock/t.json", ["/run/lock/t.json"]),
    (["/srv/a", "b", "/tmp/c"], ["/srv/a", "/tmp/c"]),
    ("//host/share", []),
])
def test_the_paths_a_value_names(value, paths):
    assert E.paths_in(value) == paths


def test_the_paths_a_units_flags_and_environment_name_each_with_where():
    argv = ["--model-path", "/dev/shm/M", "--port", "30000", "--tokenizer-path=/srv/tok", "--flag-list", "a", "/srv/b"]
    env = {"CUDA_VISIBLE_DEVICES": "0", "TRITON_HOME": "/var/cache/sglang/triton"}
    assert E.in_argv(argv, env) == [("flag --model-path", "/dev/shm/M"), ("flag --tokenizer-path", "/srv/tok"),
                                   ("flag --flag-list", "/srv/b"), ("variable TRITON_HOME", "/var/cache/sglang/triton")]


@pytest.mark.parametrize(("path", "refused"), [
    ("/tmp/x", "/tmp (world-writable)"),
    ("/var/tmp/x", "/var/tmp (world-writable)"),
    ("/home/alice/t", "/home (users' homes, which their users write)"),
    ("/dev/shm/hub", "/dev/shm (world-writable)"),
    ("/dev/shm/Qwen3.6-27B/tokenizer.json", None),   # a model the deploy staged there: root's
    ("/var/lib/sglang/hf", None),                     # the service's own StateDirectory
    ("/var/cache/sglang/triton", None),               # and its CacheDirectory
    ("/srv/tokenizers", None),                        # decided on the host, by its owner
    ("/health", None),
])
def test_where_others_write(path, refused):
    assert E.others_write(path, ["/dev/shm/Qwen3.6-27B"]) == refused
