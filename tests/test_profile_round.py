"""``benchmarks/profile_round.py``, the lease's account of where a round's time goes: the device's
busy time as the union of its kernels' intervals. The script itself runs on a CPU in the lease's dry
run (``tests/test_full_scale_script.py``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("profile_round", ROOT / "benchmarks" / "profile_round.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_busy_time_is_the_union_of_overlapping_and_nested_intervals() -> None:
    busy = _module().busy_seconds
    assert busy([]) == 0.0
    # [0, 4] ∪ [2, 6] ∪ [3, 5] (nested) ∪ [8, 9] ∪ [9, 10] (touching) = 6 + 2
    assert busy([(8.0, 9.0), (2.0, 6.0), (0.0, 4.0), (3.0, 5.0), (9.0, 10.0)]) == pytest.approx(8.0)
