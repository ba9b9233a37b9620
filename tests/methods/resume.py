"""The resume check every personalised method's tests share: a run killed after two of its three
rounds and resumed ends as the uninterrupted run, its global model and every client's state to
the bit (personal models, kept layers, learned values), and its personalised accuracy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.config import RunConfig
from fedlatent.federated.state import load_checkpoint

Tensors = dict[str, torch.Tensor]


def resumed_equals_uninterrupted(config: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 num_clients: int | None = None) -> list[Tensors]:
    """Run ``config`` under the ``crash_at_round_2`` fixture (killed after round 2), then once whole
    and once resumed; assert they end alike and return the clients' final states (to check what each
    method keeps); ``num_clients``: where ``data.num_clients`` is "auto", the data's own count."""
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, tmp_path / "resumed")
    monkeypatch.undo()
    final_full = fedlatent.run(config, tmp_path / "full")["final"]
    final_resumed = fedlatent.run(config, tmp_path / "resumed", resume=True)["final"]
    count = num_clients or int(config.data.num_clients)
    g1, _, clients1, _ = load_checkpoint(tmp_path / "full" / "checkpoints", count)
    g2, _, clients2, _ = load_checkpoint(tmp_path / "resumed" / "checkpoints", count)
    for k in g1:
        torch.testing.assert_close(g2[k], g1[k], rtol=0, atol=0)
    for c1, c2 in zip(clients1, clients2):
        assert set(c1) == set(c2)
        for k in c1:
            torch.testing.assert_close(c2[k], c1[k], rtol=0, atol=0)
    assert final_full.get("personalized_accuracy") == final_resumed.get("personalized_accuracy")
    return clients1
