"""The Tammes initialisation of a fixed head (SphereFed Appendix D): unit rows whose minimum
pairwise angle beats a random Gaussian draw and orthonormal rows (90°), stays below the simplex
bound arccos(−1/(C−1)), works where C > l rules orthonormal rows out, follows the seed, and is
what ``head_init = "tammes"`` / ``spherefed`` with ``fix = "tammes"`` put in the classifier."""
from __future__ import annotations

import math

import pytest
import torch

from fedlatent.errors import ConfigError
from fedlatent.methods import resolve
from fedlatent.methods.head import apply_head, orthonormal_rows, tammes_rows
from fedlatent.models.mlp import build


def min_angle(rows: torch.Tensor) -> float:
    """Smallest angle (degrees) between two rows, in float64."""
    u = torch.nn.functional.normalize(rows.double(), dim=1)
    cos = (u @ u.T).fill_diagonal_(-1.0)
    return math.degrees(math.acos(cos.max().item()))


def test_more_separated_than_random_and_orthonormal_rows_when_c_le_l() -> None:
    rows = tammes_rows(10, 32, torch.Generator().manual_seed(0), steps=3000)
    torch.testing.assert_close(rows.norm(dim=1), torch.ones(10))
    random = torch.randn(10, 32, generator=torch.Generator().manual_seed(0))
    orthonormal = orthonormal_rows(10, 32, torch.Generator().manual_seed(0))
    assert min_angle(orthonormal) == pytest.approx(90.0, abs=1e-4)
    simplex = math.degrees(math.acos(-1 / 9))  # 96.38°: no 10 unit vectors do better
    assert min_angle(random) < 90.0 < min_angle(rows) <= simplex + 1e-3


def test_works_where_orthonormal_rows_cannot_exist() -> None:
    with pytest.raises(ConfigError, match="head_init"):
        orthonormal_rows(10, 3, torch.Generator().manual_seed(0))
    rows = tammes_rows(10, 3, torch.Generator().manual_seed(1), steps=3000)
    random = torch.randn(10, 3, generator=torch.Generator().manual_seed(1))
    # the best 10 points on the sphere are 64.69° apart (Tammes problem); a Gaussian draw is far off
    assert min_angle(random) < 30.0 and 40.0 < min_angle(rows) <= 64.7
    tetrahedron = math.degrees(math.acos(-1 / 3))  # 109.47°: the best 4 points on the sphere
    assert min_angle(tammes_rows(4, 3, torch.Generator().manual_seed(2), steps=1000)) == \
        pytest.approx(tetrahedron, abs=0.5)


def test_follows_the_seed() -> None:
    a = tammes_rows(6, 4, torch.Generator().manual_seed(3), steps=200)
    b = tammes_rows(6, 4, torch.Generator().manual_seed(3), steps=200)
    c = tammes_rows(6, 4, torch.Generator().manual_seed(4), steps=200)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_keys_put_the_rows_in_a_fixed_classifier() -> None:
    for algorithm in ({"name": "spherefed", "fix": "tammes", "tammes_steps": 50},
                      {"name": "freeze", "head_init": "tammes", "tammes_steps": 50}):
        spec = resolve(algorithm)
        assert (spec.head.init, spec.head.init_steps, spec.head.fixed) == ("tammes", 50, True)
        model = build((1, 8, 8), 10, hidden=[4])
        apply_head(model, spec.head, torch.Generator().manual_seed(7))
        expected = tammes_rows(10, 4, torch.Generator().manual_seed(7), steps=50)
        assert torch.equal(model.classifier.weight.detach(), expected)
        assert not model.classifier.weight.requires_grad
    with pytest.raises(ConfigError, match="algorithm.fix"):
        resolve({"name": "spherefed", "fix": "spread"})
    with pytest.raises(ConfigError, match="algorithm.tammes_steps"):
        resolve({"name": "fedavg", "tammes_steps": -1})
