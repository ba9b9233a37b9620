"""A checkpoint's snapshot copies only the client states a round replaced (the rest shared with the
previous snapshot), and writes the same files as a snapshot copying every state."""
from __future__ import annotations

from pathlib import Path

import torch

from fedlatent.federated.state import Checkpoints, load_checkpoint


def test_only_the_changed_states_are_copied_and_the_files_are_the_full_copys(tmp_path: Path) -> None:
    states = [{"c": torch.full((3,), float(i))} for i in range(6)]
    every, only = Checkpoints(tmp_path / "every", interval=0.0), Checkpoints(tmp_path / "only", interval=0.0)
    common = {"global_state": {"w": torch.ones(2)}, "server_state": {}}
    with every, only:
        for rnd, trained in enumerate(([1, 4], [0, 4], [5])):
            for cid in trained:  # a round replaces its clients' states (never changes one in place)
                states[cid] = {"c": states[cid]["c"] + 10}
            before = None if only.copies is None else list(only.copies)
            every.save(**common, client_states=states, info={"round": rnd + 1, "elapsed_s": 0.0})
            only.save(**common, client_states=states, info={"round": rnd + 1, "elapsed_s": 0.0}, changed=trained)
            if before is not None:  # the untrained clients' copies are the previous snapshot's objects
                assert all((only.copies[c] is before[c]) == (c not in trained) for c in range(6))
    a, b = load_checkpoint(tmp_path / "every", 6), load_checkpoint(tmp_path / "only", 6)
    assert a is not None and b is not None and a[3] == b[3]
    assert all(torch.equal(x["c"], y["c"]) and torch.equal(x["c"], s["c"]) for x, y, s in zip(a[2], b[2], states))
    digests = [(tmp_path / side / "round00003" / "clients.safetensors").read_bytes() for side in ("every", "only")]
    assert digests[0] == digests[1]
