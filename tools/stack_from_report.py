"""A stack's `packages:` from pip's resolution report (files/stacks/README.md, "Adding a stack").

    python -m tools.stack_from_report REPORT.json NAME --python 3.12 --header HEADER.txt \\
        > files/stacks/NAME.yml
    python -m tools.stack_from_report REPORT.json NAME --extends BASE --header HEADER.txt \\
        > files/stacks/NAME.yml

REPORT.json is `pip install --dry-run --ignore-installed --report REPORT.json ...` for the stack's
target (wheels only). For each `install` item: the normalised `metadata.name`, `metadata.version`,
the last path segment of `download_info.url` and its sha256, sorted by name. HEADER.txt holds the
comment lines (without `# `) that say what the stack is and how it was resolved. An sdist, a URL
without a sha256, or a name twice stops it. With `--extends BASE` the stack is written as the
difference from the stack BASE (`extends: BASE`; files/stacks/README.md, "A stack that extends
another"): a pin the base already has, identical, is left out, and `python` is inherited unless
`--python` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from configuration.errors import DataError
from configuration.stacks import Stack, load_stack, normalize


def packages(report: dict) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for item in report.get("install", []):
        name = normalize(item["metadata"]["name"])
        file = unquote(Path(urlparse(item["download_info"]["url"]).path).name)
        digest = (item["download_info"].get("archive_info") or {}).get("hashes", {}).get("sha256")
        if not file.endswith(".whl"):
            raise SystemExit(f"{name}: {file} is not a wheel (resolve with --only-binary=:all:)")
        if not digest:
            raise SystemExit(f"{name}: {file} has no sha256 in the report")
        if name in found:
            raise SystemExit(f"{name}: twice in the report ({found[name]['file']}, {file})")
        found[name] = {"version": item["metadata"]["version"], "file": file, "sha256": digest}
    if not found:
        raise SystemExit("the report installs nothing")
    return dict(sorted(found.items()))


def difference(pins: dict[str, dict[str, str]], base: Stack) -> dict[str, dict[str, str]]:
    """The pins `base` does not already have, identical (version, file and sha256)."""
    same = {p.name: {"version": p.version, "file": p.file, "sha256": p.sha256}
            for p in base.packages}
    return {name: pin for name, pin in pins.items() if same.get(name) != pin}


def render(name: str, python: str | None, header: list[str], pins: dict[str, dict[str, str]],
           extends: str | None = None) -> str:
    lines = [f"# {line}".rstrip() for line in header]
    lines += [f"name: {name}"] + ([f"extends: {extends}"] if extends else [])
    lines += ([f'python: "{python}"'] if python else []) + ["packages:"]
    for dist, pin in pins.items():
        lines.append(f'  {dist}: {{version: "{pin["version"]}", file: "{pin["file"]}", sha256: '
                     f'"{pin["sha256"]}"}}')
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.stack_from_report",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("name")
    parser.add_argument("--python", help='the stack\'s Python version, e.g. "3.12" (required '
                                         'without --extends)')
    parser.add_argument("--extends", metavar="BASE",
                        help="write the stack as the difference from the stack BASE")
    parser.add_argument("--header", type=Path, help="a text file: the stack's comment lines")
    args = parser.parse_args(argv)
    if not args.python and not args.extends:
        parser.error("--python is required (or --extends BASE, whose Python is inherited)")
    header = args.header.read_text(encoding="utf-8").splitlines() if args.header else []
    pins = packages(json.loads(args.report.read_text(encoding="utf-8")))
    if args.extends:
        try:
            pins = difference(pins, load_stack(args.extends, "command line", "--extends"))
        except DataError as exc:
            parser.error(str(exc))
    sys.stdout.write(render(args.name, args.python, header, pins, args.extends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
