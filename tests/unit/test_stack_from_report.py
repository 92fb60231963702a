"""tools/stack_from_report: a stack's pins from pip's resolution report, whole or as the difference from a base."""

from __future__ import annotations

import json

import pytest
import yaml

from configuration import stacks
from tools import stack_from_report

SHA = "b" * 64


def item(name: str, version: str, file: str, sha256: str) -> dict:
    return {"metadata": {"name": name, "version": version},
            "download_info": {"url": f"https://files.example/packages/ab/{file}", "archive_info": {"hashes": {"sha256": sha256}}}}


def report_with_one_base_pin() -> dict:
    tqdm = next(p for p in stacks.load_stack("lab-cpu-sglang").packages if p.name == "tqdm")
    return {"install": [
        item("Tokenizers", "0.23.2", "tokenizers-0.23.2-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", SHA),
        item("tqdm", tqdm.version, tqdm.file, tqdm.sha256),  # the base's own pin, identical
    ]}


def test_a_whole_stack_names_its_python_and_every_pin(tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(report_with_one_base_pin()))
    assert stack_from_report.main([str(report), "demo", "--python", "3.11"]) == 0
    written = yaml.safe_load(capsys.readouterr().out)
    assert written["name"] == "demo" and written["python"] == "3.11" and "extends" not in written
    assert list(written["packages"]) == ["tokenizers", "tqdm"]


def test_extends_writes_only_what_the_base_lacks_and_loads_as_the_base_plus_that(tmp_path, capsys, monkeypatch):
    report, header = tmp_path / "r.json", tmp_path / "header.txt"
    report.write_text(json.dumps(report_with_one_base_pin()))
    header.write_text("what it is\nhow it was resolved\n")
    assert stack_from_report.main([str(report), "demo-bench", "--extends", "lab-cpu-sglang", "--header", str(header)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# what it is\n# how it was resolved\nname: demo-bench\nextends: lab-cpu-sglang\npackages:\n")
    assert "python:" not in text and "tqdm" not in text  # inherited, and the base's identical pin left out
    assert yaml.safe_load(text)["packages"] == {"tokenizers": {
        "version": "0.23.2", "file": "tokenizers-0.23.2-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "sha256": SHA}}

    # Written beside the real stacks, it loads as the base with the one distribution added.
    for real in stacks.STACKS_DIR.glob("*.yml"):
        (tmp_path / real.name).write_text(real.read_text())
    (tmp_path / "demo-bench.yml").write_text(text)
    monkeypatch.setattr(stacks, "STACKS_DIR", tmp_path)
    stacks._load_stack_file.cache_clear()
    try:
        base, bench = stacks.load_stack("lab-cpu-sglang"), stacks.load_stack("demo-bench")
    finally:
        stacks._load_stack_file.cache_clear()
    assert bench.python == base.python and bench.wanted() == {**base.wanted(), "tokenizers": "0.23.2"}


def test_without_python_or_a_base_it_stops(tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(report_with_one_base_pin()))
    with pytest.raises(SystemExit):
        stack_from_report.main([str(report), "demo"])
    assert "--python is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stack_from_report.main([str(report), "demo", "--extends", "no-such-stack"])
    assert "unknown stack" in capsys.readouterr().err
