"""``federated.devices.refusal``: which torch devices a run may name, found before any data is read."""
from __future__ import annotations

import pytest
import torch

from fedlatent.federated import devices


def test_the_cpu_is_always_accepted() -> None:
    assert devices.refusal("cpu") is None and devices.refusal("cpu:0") is None


@pytest.mark.parametrize("name, words", [("gpu0", "not a torch device"), ("cuda:x", "not a torch device"),
                                         ("xla", "is not supported")])
def test_names_that_are_no_usable_device_type_are_refused(name: str, words: str) -> None:
    assert words in devices.refusal(name)


def test_cuda_is_refused_without_a_cuda_device(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.refusal("cuda") == "this machine has no CUDA device that torch can use"


def test_a_cuda_index_beyond_the_machines_devices_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.refusal("cuda") is None and devices.refusal("cuda:1") is None
    assert devices.refusal("cuda:2") == "this machine has 2 CUDA device(s), cuda:0 to cuda:1"


def test_mps_follows_torchs_own_answer(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert "no MPS device" in devices.refusal("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert devices.refusal("mps") is None
