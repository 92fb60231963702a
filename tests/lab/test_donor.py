"""A donor host: a new host's venv copied from one already serving the stack (no wheelhouse, no index)."""

from __future__ import annotations

import json

import pytest

from tests.lab.labutil import SPARE, deploy, http_get, ssh, write_inventory

pytestmark = pytest.mark.lab

DONOR = "gpu-a"
LISTING = (
    "/root/venv_sglang/bin/python -c 'import importlib.metadata as m, json; "
    "print(json.dumps(sorted((d.metadata[\"Name\"], d.version, (d.read_text(\"INSTALLER\") or \"\").strip()) for d in m.distributions())))'"
)


def test_donor_copy_gives_an_identical_distribution_list_and_a_working_service(spare):
    assert deploy().returncode == 0  # the donor holds the lab's stack
    service = {"gpu": 0, "port": 30120, "model": "Qwen3.6-27B-DFlash", "model_in": "store"}
    inventory = write_inventory("test_donor", {
        DONOR: {"run_services": []},
        SPARE: {"stack_sources": [{"donor": DONOR}], "services": {"donated": service}, "run_services": ["donated"]},
    })
    result = deploy(inventory, "--limit", SPARE, as_json=False)
    assert result.returncode == 0, result
    assert "copying " in result.stderr and f"from {DONOR}:/root/venv_sglang" in result.stderr
    donor, copy = (json.loads(ssh(h, LISTING).stdout) for h in (DONOR, SPARE))
    # Same names, versions and installers: the dist-info came along, so metadata stays true.
    assert copy == donor
    assert http_get(SPARE, 30120, "/health")[0] == 200
    assert deploy(inventory, "--limit", SPARE).changed == []
