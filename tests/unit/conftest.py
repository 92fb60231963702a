"""Fixtures several unit test modules share."""

from __future__ import annotations

import pytest

from configuration import settings, stacks
from configuration.patch_sets import load_patch_set
from tests.unit.remote_calls import load_remote_module
from tests.unit.test_units import lab_config


@pytest.fixture
def sm(tmp_path, monkeypatch):
    """operations/model/on_host/stage_model.py as a module, its test hook directory moved under tmp_path (the real one is /run/...)."""
    module = load_remote_module("stage_model", "stage_model_under_test")
    monkeypatch.setattr(module, "TEST_HOOK_DIR", str(tmp_path / "hooks"))
    return module


@pytest.fixture
def lab(monkeypatch):
    """The lab's configuration, stack and patch sets, as the host plan's tests read them (test_host_plan.py,
    test_plan_agrees.py): ddtree has an API key (its key file, the secrets directory), dflash none; the group files'
    key sources start empty."""
    monkeypatch.setattr(settings, "_KEY_SOURCES", {})
    monkeypatch.setenv("SGLANG_DEPLOY_SECRET_DDTREE_KEY", "k" * 32)
    config = lab_config(run_services=("ddtree", "dflash"), api_key_secret="ddtree-key")
    stack = stacks.load_stack(config.stack)
    patch_sets = {name: load_patch_set(name) for name in config.patch_sets}
    return config, stack, patch_sets
