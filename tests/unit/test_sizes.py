"""One way of writing a number of bytes in the control machine's messages (report/sizes.py)."""

import pytest

from report.sizes import human_bytes


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (200 * 2**20, "200.0 MiB"),
    (int(95.6 * 2**30), "95.6 GiB"), (3 * 2**40, "3072.0 GiB"), (-2 * 2**30, "-2.0 GiB"),
])
def test_the_largest_unit_that_keeps_the_number_at_least_one(n, text):
    assert human_bytes(n) == text


def test_no_other_function_of_the_control_machine_chooses_a_unit():
    """The rule is one function: another that picks GiB or MiB by size would write sizes a second way. (Figures in a
    fixed unit, the transfers' MiB and MiB/s that the benches read, choose nothing.)"""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("operations", "report", "deploys", "configuration"):
        for path in sorted((root / folder).rglob("*.py")):
            if {"remote", "on_host"} & set(path.parts) or path == root / "report" / "sizes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    text = ast.get_source_segment(path.read_text(), node) or ""
                    if "GiB" in text and "MiB" in text and "human_bytes" not in text:
                        found.append(f"{path.relative_to(root)}:{node.name}")
    assert found == []
