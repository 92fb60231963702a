"""The docs' checkable claims hold (issue 50 item 4): every repository path, `make` target, `python -m` module and engine
advisory id that the README and docs/ name exists as named, and every advisory in the file has a heading of its own.
A stale claim fails here, not in a newcomer's hands."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("operations", "configuration", "deploys", "report", "tools", "files", "bench", "lab", "tests", "docs", "templates",
       "group_data", ".ci")
# A path written as a pattern or with a part the reader fills in, not one file.
PLACEHOLDER = re.compile(r"[<>*{}$|\[\]]|\.\.\.|NAME|SERVICE|HOST|STACK|VERSION|FILE|PART|ID\b")
# Paths the project makes at run time or on hosts, not in the checkout (each a prefix).
# group_data/gpu_hosts.*: the README's example of a group file the operator writes; lab/inventory.py: written by
# lab/lab.py when it starts the hosts.
MADE = ("lab/state", "lab/cache", "lab/run", "lab/test_", "files/patches/ddtree-0_5_13", "bench/results/h200-donor",
        ".secrets", "group_data/gpu_hosts", "lab/inventory.py")


def spans(text: str) -> list[str]:
    """Backticked spans and link targets, outside fenced code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)#\s]+)", text)


def named_paths(page: Path) -> set[str]:
    found = set()
    for span in spans(page.read_text()):
        for token in re.split(r"[\s,;]+", span):
            token = token.strip("()'\":").rstrip(".")
            token = re.sub(r":\d+(-\d+)?$", "", token)  # file.py:123
            if token.endswith(".md") and not token.startswith(TOP):  # a link, relative to its page
                token = str((page.parent / token).resolve().relative_to(ROOT)) if (
                    (page.parent / token).resolve().is_relative_to(ROOT)) else token
            if (token.startswith(tuple(f"{t}/" for t in TOP)) and not PLACEHOLDER.search(token)
                    and not token.startswith(MADE)):
                found.add(token)
    return found


def exists(path: str) -> bool:
    """A file or directory; a module named without `.py` (`operations/run/redact`); a module's name
    (`operations/openssh.ssh_argv`), which its source defines."""
    if (ROOT / path).exists() or (ROOT / f"{path}.py").exists():
        return True
    module, _, name = path.rpartition(".")
    source = ROOT / f"{module}.py"
    return bool(module) and source.is_file() and re.search(rf"^(def|class) {re.escape(name)}\b|^{re.escape(name)} =",
                                                          source.read_text(), re.M) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_a_page_names_exists(page):
    missing = sorted(p for p in named_paths(page) if not exists(p))
    assert missing == [], f"{page.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_make_target_and_python_module_a_page_names_exists(page):
    commands = "\n".join(spans(page.read_text()) + re.findall(r"```.*?```", page.read_text(), re.S))
    targets = make_targets()
    # `make X` where a command starts (not `apt-get install make systemd-container`)
    wrong = [f"make {t}" for t in re.findall(r"(?:^|[;&|(]\s*|\n\s*)make ([a-z][\w-]*)", commands, re.M)
             if t not in targets]
    for module in re.findall(r"python3? -m ([\w.]+)", commands):
        if not (ROOT / module.split(".")[0]).is_dir():
            continue  # another project's module (pip, pytest, sglang.bench_serving)
        if importlib.util.find_spec(module) is None:
            wrong.append(f"python -m {module}")
    assert wrong == [], f"{page.relative_to(ROOT)} names commands that do not exist: {sorted(set(wrong))}"


def advisory_ids() -> set[str]:
    return {a["id"] for a in yaml.safe_load((ROOT / "files/engine_advisories.yml").read_text())["advisories"]}


def test_each_advisory_heading_names_ids_the_file_has_and_each_advisory_has_one():
    headings = re.findall(r"^### \d+\. (.+)$", (ROOT / "docs/engine-advisories.md").read_text(), re.M)
    named = set()
    for heading in headings:
        if heading.startswith("Known"):
            continue
        named |= {name.strip() for name in heading.split(" (")[0].split(",")}
    ids = advisory_ids()
    assert named - ids == set(), f"headings name advisories the file does not have: {sorted(named - ids)}"
    assert ids - named == set(), f"advisories without a heading in docs/engine-advisories.md: {sorted(ids - named)}"


def test_every_advisory_id_a_page_names_in_backticks_is_one_the_file_has():
    ids = advisory_ids()
    pattern = re.compile(r"advisory `([a-z0-9][a-z0-9.-]+)`")
    wrong = {(page.name, name) for page in PAGES for name in pattern.findall(page.read_text()) if name not in ids}
    assert wrong == set(), f"advisory ids named that files/engine_advisories.yml does not have: {sorted(wrong)}"


def test_the_checker_sees_a_stale_path_and_a_made_up_target(tmp_path):
    """The rules above fail on what they exist to catch."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("See `operations/no_such_module.py:12`, [x](other.md), `lab/state/hosts` and `files/stacks/<name>.yml`.")
    assert named_paths(page) == {"operations/no_such_module.py"}
    assert not exists("operations/no_such_module.py") and exists("operations/run/redact") and exists("operations/transport/openssh.ssh_argv")
    assert not exists("operations/openssh.no_such_function")
    assert "nosuchtarget" not in make_targets() and "test" in make_targets()
