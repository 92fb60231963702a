"""transfer.in_store with facts given (the streaming itself is exercised on the lab)."""

import pytest
from pyinfra.api import OperationError

from operations import transfer
from tests.unit.test_operations import run

PATH = "/root/models/Qwen3.6-27B"


def test_model_in_the_store_is_a_noop():
    result = run(transfer.in_store, {transfer.StoreListing: {"config.json": 10}}, model="Qwen3.6-27B", path=PATH, source="gpu-b")
    assert result.commands == [] and result.noops == [f"model Qwen3.6-27B is in the store at {PATH}"]


def test_missing_model_without_a_source_names_the_fix():
    with pytest.raises(OperationError) as caught:
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH)
    assert f"model Qwen3.6-27B is not in {PATH} on gpu-a" in str(caught.value)
    assert "model_sources: {Qwen3.6-27B: <a host that has it>}" in str(caught.value)


def test_a_host_cannot_be_its_own_source():
    with pytest.raises(OperationError) as caught:
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-a")
    assert "names gpu-a itself" in str(caught.value)


def test_a_model_is_streamed_from_the_source_hosts_validated_store():
    result = run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-b",
                 source_store="/srv/models")
    assert "streaming it from gpu-b:/srv/models/Qwen3.6-27B" in result.logs[0]
    with pytest.raises(OperationError, match="the model store of gpu-b is not known"):
        run(transfer.in_store, {transfer.StoreListing: None}, model="Qwen3.6-27B", path=PATH, source="gpu-b")
