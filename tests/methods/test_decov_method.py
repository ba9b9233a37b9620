"""The DeCov and Structured-DeCov parts and presets (FedDecorr's Table 6 baselines)."""
from __future__ import annotations

import pytest
import torch

import fedlatent
from fedlatent.errors import ConfigError
from fedlatent.losses import decov, structured_decov
from fedlatent.methods import resolve
from fedlatent.methods.parts import TermContext
from fedlatent.models.base import ModelOutput
from fedlatent.models.mlp import MLP


def _ctx(z: torch.Tensor) -> TermContext:
    return TermContext(out=ModelOutput(logits=z[:, :3], z=z), y=torch.zeros(len(z), dtype=torch.long),
                       params={}, global_params={}, global_out=None, prev_out=None, num_classes=3,
                       state={}, payload={})


def test_presets_and_terms_apply_the_pure_functions() -> None:
    z = torch.randn(16, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (part,) = resolve({"name": "decov"}).all_parts()
    assert part.name == "decov" and part.weight == 0.1 and part.output_only
    assert torch.equal(part.loss(_ctx(z)), decov(z))
    (part,) = resolve({"name": "structured_decov", "beta": 0.3, "groups": 2}).all_parts()
    assert part.weight == 0.3 and torch.equal(part.loss(_ctx(z)), structured_decov(z, 2))
    stacked = resolve({"name": "fedprox", "mu": 0.01}, [{"name": "decov", "beta": 0.05}]).all_parts()
    assert [p.name for p in stacked] == ["prox", "decov"] and stacked[1].weight == 0.05


def test_bad_keys_are_rejected() -> None:
    with pytest.raises(ConfigError, match="groups"):
        resolve({"name": "structured_decov", "groups": 0})
    with pytest.raises(ConfigError, match="groups"):
        resolve({"name": "structured_decov", "groups": 2.5})
    (part,) = resolve({"name": "structured_decov", "groups": 9}).all_parts()
    with pytest.raises(ConfigError, match="groups = 9 exceeds the 8 dimensions"):
        part.check_model(MLP(4, [8], 3))  # the run checks it on the model before it starts
    part.check_model(MLP(4, [9], 3))


def test_a_decov_run_records_the_term(tmp_path) -> None:
    cfg = fedlatent.load_config(None, ["train.rounds=1", "data.num_clients=2", "model.hidden=[16]",
                                       'algorithm.name="structured_decov"', "algorithm.groups=4"])
    summary = fedlatent.run(cfg, tmp_path / "run")
    assert summary["rounds_completed"] == 1
    assert "term_structured_decov" in (tmp_path / "run" / "metrics.jsonl").read_text()
