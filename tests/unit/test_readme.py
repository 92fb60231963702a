"""The README and the reference files under docs/ it links: the variables tables (docs/variables.md) are the
documentation of every key, generated from the schema and kept equal to it; the layout (docs/layout.md) names every
package and module; every relative link resolves, to a file and, for `#anchor`, to a heading in it."""

import re
import subprocess
from pathlib import Path

import pytest

from configuration import schema
from configuration.settings import GLOBAL_KEYS, HOST_KEYS, REPO_ROOT, SERVICE_KEYS

README_PATH = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
README = README_PATH.read_text()
# The reference sections the README links, each in a file of its own.
VARIABLES = (DOCS / "variables.md").read_text()  # the variables tables, data layers, validation, the bad-data corpus
LAYOUT = (DOCS / "layout.md").read_text()  # every top-level path and module
# | `name` | kind | default | what it does | when to change it |
ROWS = {m.group(1): m.group(3) for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|", VARIABLES, re.M)}
MARKDOWN = [README_PATH, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _section(text: str, title: str) -> str:
    """From the heading `title` (any level) to the next heading of its level or above, or the end."""
    heading = re.search(rf"^(#+) {re.escape(title)}\n", text, re.M)
    assert heading, f"no heading {title!r}"
    end = re.compile(rf"^#{{1,{len(heading.group(1))}}} ", re.M).search(text, heading.end())
    return text[heading.start():end.start() if end else len(text)]


def test_the_variables_tables_are_the_schemas():
    # A key, its kind, default or text changed in configuration/schema.py and not in docs/variables.md (or the other
    # way round) fails here: regenerate them with `python -m configuration.schema` and paste them over the old ones.
    for title, model in schema.TABLES:
        generated = schema.table(model)
        assert generated in VARIABLES, f"docs/variables.md's table after {title!r} differs from the schema: python -m configuration.schema"


def test_every_table_row_is_a_key_of_the_schema():
    section = _section(VARIABLES, "Variables")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    assert documented == {*GLOBAL_KEYS, *HOST_KEYS, *SERVICE_KEYS}


@pytest.mark.parametrize("key,spec", [*GLOBAL_KEYS.items(), *HOST_KEYS.items(), *SERVICE_KEYS.items()])
def test_every_key_is_in_the_readme_with_its_default(key, spec):
    assert key in ROWS, f"docs/variables.md's variables table lacks `{key}`"
    shown = ROWS[key].strip()
    if spec.required:
        assert shown == "(required)"
    elif spec.default is None:
        assert shown == "`null`"
    elif isinstance(spec.default, bool):
        assert shown == f"`{str(spec.default).lower()}`"
    else:
        assert shown == f"`{spec.default}`"


def test_the_variables_doc_reports_the_corpus_size():
    # tests/unit/test_bad_data.py checks the README's sentence; this checks the corpus paragraph beside the tables.
    cases = sorted((REPO_ROOT / "tests" / "unit" / "bad_data").glob("*/*.yml"))
    text = " ".join(VARIABLES.split())
    assert f"holds {len(cases)} bad inputs" in text and f"all {len(cases)} are refused" in text


def test_readme_names_both_commands():
    assert "make demo" in README and "make test" in README


def test_readme_names_the_stand_ins():
    # What this machine cannot have, and the lab's stand-in for it: GPUs, the GPU serving process, model weights.
    lab = _section(README, "The local lab, and what in it is a stand-in")
    for stand_in in ("`nvidia-smi`", "`sglang-standin`", "`sglang-kernel`", "model weights"):
        assert f"| {stand_in} |" in lab, f"README's stand-in table lacks {stand_in}"


def test_layout_table_names_every_package_and_module():
    # The layout table is how a newcomer finds a thing: each top-level package is a row, and each module of the
    # packages that hold the deploy's code is named in its row.
    layout = _section(LAYOUT, "Layout")
    packages = sorted(p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests")
    assert packages, "no packages found"
    missing = [f"{p}/" for p in packages if f"`{p}/`" not in layout]
    for package in ("configuration", "deploys", "operations", "report", "tools", "views"):
        missing += [str(m.relative_to(REPO_ROOT)) for m in sorted((REPO_ROOT / package).rglob("*.py"))
                    if m.stem != "__init__" and f"`{m.stem}`" not in layout]
    # operations/ is rooms by step: each room is named, as `room/`
    missing += [f"operations/{room.name}/" for room in sorted((REPO_ROOT / "operations").iterdir())
                if (room / "__init__.py").exists() and f"`{room.name}/`" not in layout]
    assert missing == [], f"docs/layout.md's layout table does not name: {missing}"


def test_the_readme_map_names_every_top_level_directory():
    # The README's short map of the code: a row for each top-level directory the repository holds, and each layer.
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    directories = sorted({path.split("/")[0] for path in tracked if "/" in path and not path.startswith(".")})
    code_map = _section(README, "Map of the code")
    missing = [d for d in [*directories, "operations/remote"] if f"`{d}/`" not in code_map]
    assert missing == [], f"README's map of the code does not name: {missing}"


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _relative(links: list[str]) -> list[str]:
    return [link for link in links if not re.match(r"[a-z]+:", link)]


def test_every_docs_file_the_readme_links_exists():
    linked = [link.split("#")[0] for link in _relative(_links(README_PATH)) if link.startswith("docs/")]
    assert linked, "README links no docs/ file"
    assert [link for link in linked if not (REPO_ROOT / link).is_file()] == []


def test_every_docs_file_is_linked_from_the_readme():
    linked = {(REPO_ROOT / link.split("#")[0]).resolve() for link in _relative(_links(README_PATH))}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"README's Reference links none of: {unlinked}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for link in _relative(_links(path)):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.is_file():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in _anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(REPO_ROOT)}")
    assert broken == [], f"{path.relative_to(REPO_ROOT)}: {broken}"
