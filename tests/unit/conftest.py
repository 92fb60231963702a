"""Fixtures several unit test modules share."""

from __future__ import annotations

import pytest

from tests.unit.remote_calls import load_remote_module


@pytest.fixture
def sm(tmp_path, monkeypatch):
    """operations/remote/stage_model.py as a module, its test hook directory moved under tmp_path (the real one is /run/...)."""
    module = load_remote_module("stage_model", "stage_model_under_test")
    monkeypatch.setattr(module, "TEST_HOOK_DIR", str(tmp_path / "hooks"))
    return module
