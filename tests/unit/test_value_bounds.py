"""Nothing hangs on a long value (issue 46 item 7): every value that reaches a command line, an environment or a unit
is bounded at validation, and the address scan that judges exposure reads a value once, not once per position.

A 200,000-character flag value held a `--dry` run until an outside timeout killed it at 420 s: the URL pattern tried
every position as a scheme's start and rescanned the rest of the value from each.
"""

from __future__ import annotations

import random
import re

import pytest

from configuration import kinds_addresses, settings
from configuration.errors import DataError
from configuration.kinds_base import VALUE_MAX
from tests.unit.hosts import make_host


def validate(args=None, env=None):
    service = {"gpu": 0, "port": 30000, "model": "M", "args": args or {}, "env": env or {}}
    return settings.host_config(make_host({"stack": "lab-standin"}, {"services": {"x": service}, "run_services": ["x"]}))


@pytest.mark.parametrize("args, env, at", [
    ({"served-model-name": "a" * 200_000}, None, "services.x.args.served-model-name"),
    ({"json-model-override-args": '{"a": "' + "b " * 20_000 + '"}'}, None, "services.x.args.json-model-override-args"),
    ({"served-model-name": ["a", "c" * (VALUE_MAX + 1)]}, None, "services.x.args.served-model-name"),
    (None, {"SGLANG_X": "d" * (VALUE_MAX + 1)}, "services.x.env.SGLANG_X"),
])
def test_a_value_too_long_for_a_command_line_or_unit_is_refused_naming_it(args, env, at):
    with pytest.raises(DataError) as caught:
        validate(args, env)
    assert caught.value.key_path == at and f"at most {VALUE_MAX} go" in caught.value.fix
    assert "characters long" in caught.value.fix and "name the file" in caught.value.fix


def test_a_value_at_the_bound_passes():
    assert validate({"served-model-name": "a" * VALUE_MAX}).services[0].args


OLD_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#\s,;'\"<>(){}|\\]*)")


def test_the_linear_url_scan_finds_what_the_pattern_found():
    rng = random.Random(46)
    alphabet = [*"ab1+.-:/ @x[]*,é", "://", "tcp://", "http://", "ipc://"]
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert kinds_addresses._urls_in(text) == [(m.start(), m.end(), m["scheme"], m["authority"])
                                                  for m in OLD_URL.finditer(text)], text


def test_the_scan_reads_each_character_a_bounded_number_of_times(monkeypatch):
    """Counted, not timed: the authority pattern runs once per `://`, and the scheme walk never goes back past the
    previous URL's end, so a value of letters only costs one pass."""
    calls = []
    real = kinds_addresses._AUTHORITY

    class Counting:
        def match(self, text, pos):
            calls.append(pos)
            return real.match(text, pos)

    monkeypatch.setattr(kinds_addresses, "_AUTHORITY", Counting())
    assert kinds_addresses._urls_in("a" * 100_000) == [] and calls == []
    text = "tcp://h:1 " * 1000
    assert len(kinds_addresses._urls_in(text)) == 1000 and len(calls) == 1000
