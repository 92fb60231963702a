"""The README's variables table is the documentation of every key: keep it complete."""

import re

import pytest

from configuration.settings import GLOBAL_KEYS, HOST_KEYS, REPO_ROOT, SERVICE_KEYS

README = (REPO_ROOT / "README.md").read_text()
ROWS = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \|", README, re.M)}


@pytest.mark.parametrize("key,spec", [*GLOBAL_KEYS.items(), *HOST_KEYS.items(), *SERVICE_KEYS.items()])
def test_every_key_is_in_the_readme_with_its_default(key, spec):
    assert key in ROWS, f"README.md variables table lacks `{key}`"
    shown = ROWS[key].strip()
    if spec.required:
        assert shown == "(required)"
    elif spec.default is None:
        assert shown == "`null`"
    elif isinstance(spec.default, bool):
        assert shown == f"`{str(spec.default).lower()}`"
    else:
        assert shown == f"`{spec.default}`"


def test_readme_names_both_commands():
    assert "make demo" in README and "make test" in README
