"""The README's variables tables are the documentation of every key: generated from the schema, kept equal to it."""

import re

import pytest

from configuration import schema
from configuration.settings import GLOBAL_KEYS, HOST_KEYS, REPO_ROOT, SERVICE_KEYS

README = (REPO_ROOT / "README.md").read_text()
# | `name` | kind | default | what it does | when to change it |
ROWS = {m.group(1): m.group(3) for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|", README, re.M)}


def test_the_variables_tables_are_the_schemas():
    # A key, its kind, default or text changed in configuration/schema.py and not in the README (or the other way
    # round) fails here: regenerate them with `python -m configuration.schema` and paste them over the old ones.
    for title, model in schema.TABLES:
        generated = schema.table(model)
        assert generated in README, f"README's table after {title!r} differs from the schema: python -m configuration.schema"


def test_every_table_row_is_a_key_of_the_schema():
    section = README[README.index("## Variables"):README.index("\n## ", README.index("## Variables") + 1)]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    assert documented == {*GLOBAL_KEYS, *HOST_KEYS, *SERVICE_KEYS}


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


def _layout_section() -> str:
    start = README.index("## Layout")
    return README[start:README.index("\n## ", start + 1)]


def test_layout_table_names_every_package_and_module():
    # The layout table is how a newcomer finds a thing: each top-level package is a row, and each module of the
    # packages that hold the deploy's code is named in its row.
    layout = _layout_section()
    packages = sorted(p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests")
    assert packages, "no packages found"
    missing = [f"{p}/" for p in packages if f"`{p}/`" not in layout]
    for package in ("configuration", "deploys", "operations", "report", "tools"):
        missing += [f"{package}/{m.stem}" for m in sorted((REPO_ROOT / package).glob("*.py"))
                    if m.stem != "__init__" and f"`{m.stem}`" not in layout]
    assert missing == [], f"README's layout table does not name: {missing}"
