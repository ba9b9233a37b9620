"""The registered calibrations' declarations hold for what their halves do: a client sends the keys
its calibration declares, in the clear and (where they are sums) under a bound with the declared
shapes; every registered calibration has its halves; only the declared ones honour ``every`` and
``personal``."""
from __future__ import annotations

import math

import pytest
import torch

from fedlatent.calibration.registry import CALIBRATIONS, calibration_kind, with_sums
from fedlatent.data.types import Split
from fedlatent.federated.calibrate import HALVES, apply_statistics, client_statistics, head_keys, summed_statistics
from fedlatent.federated.codec import ClipCodec
from fedlatent.federated.round import calibration_due
from fedlatent.methods.parts import Calibration, MethodSpec
from fedlatent.models.mlp import MLP

CPU = torch.device("cpu")
CLASSES, DIM, FEATURES = 3, 6, 4


def _sent(kind: str, codec: ClipCodec | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    split = Split(torch.randn(20, DIM, generator=g), torch.randint(0, CLASSES, (20,), generator=g))
    torch.manual_seed(1)
    model = MLP(DIM, [FEATURES], CLASSES)
    return client_statistics(model, dict(model.state_dict()), split, Calibration(kind), 8, CPU, codec)


def test_every_registered_calibration_has_its_halves() -> None:
    assert set(HALVES) == set(CALIBRATIONS)
    assert [k for k, halves in HALVES.items() if halves is None] == [k for k, c in CALIBRATIONS.items() if not c.calibrates]


@pytest.mark.parametrize("kind", sorted(CALIBRATIONS))
def test_a_client_sends_the_keys_its_calibration_declares(kind: str) -> None:
    assert list(_sent(kind)) == list(calibration_kind(kind).sent)


@pytest.mark.parametrize("kind", with_sums())
def test_statistics_as_sums_have_the_declared_keys_and_shapes(kind: str) -> None:
    bounded = _sent(kind, ClipCodec(math.inf, statistics_clip_norm=1e9))
    declared = calibration_kind(kind).shapes_as_sums(CLASSES, FEATURES)
    assert {k: tuple(v.shape) for k, v in bounded.items()} == declared
    assert {k: tuple(v.shape) for k, v in summed_statistics(kind, CLASSES, FEATURES).items()} == declared


def test_statistics_that_are_not_sums_have_no_summed_layout() -> None:
    assert with_sums() == ["ffc", "ccvr"]
    with pytest.raises(ValueError, match="'centralized' calibration's statistics are not sums"):
        summed_statistics("centralized", CLASSES, FEATURES)
    with pytest.raises(KeyError, match="unknown calibration 'platt'"):
        calibration_kind("platt")


def test_none_changes_nothing_and_only_the_periodic_one_runs_every_r_rounds() -> None:
    torch.manual_seed(1)
    model = MLP(DIM, [FEATURES], CLASSES)
    state = dict(model.state_dict())
    out = apply_statistics(state, [], Calibration("none"), *head_keys(model), torch.Generator())
    assert out == state and out is not state
    due = {kind: calibration_due(MethodSpec("m", calibration=Calibration(kind, every=2)), 1) for kind in CALIBRATIONS}
    assert due == {kind: c.periodic for kind, c in CALIBRATIONS.items()} == {
        "none": False, "ffc": True, "ccvr": False, "centralized": False}
    personal = {kind: MethodSpec("m", calibration=Calibration(kind, personal=True)).personalizes for kind in CALIBRATIONS}
    assert personal == {"none": False, "ffc": True, "ccvr": False, "centralized": False}
