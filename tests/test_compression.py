"""Top-k sparsification with error feedback (``federated.compression``, a compress link of the codec
chain, ``federated.codec_chain``): the sent part and the kept residual by hand (a = e + Δ = top_k(a) +
e' exactly, the k largest magnitudes sent), the residual carried from round to round in the client's
state on both embedded backends, the bytes a round sends counted as k values and k indices, a
fraction of 1 the plain run up to rounding, the chain's order enforced, and the bad settings refused
in one line before any run folder exists."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.federated.codec import ClipLink, UpdateCodec, build_codec
from fedlatent.federated.codec_chain import CODED_BYTES, Chain
from fedlatent.federated.compression import RESIDUAL, TopK, residual, top_k
from fedlatent.federated.trainer import lockstep_update
from fedlatent.methods import resolve
from fedlatent.methods.parts import Upload

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}


def _upload(state: dict, client: int = 0) -> Upload:
    return Upload(client, state, 10, 1, 0.1, 0.0)


def test_top_k_keeps_the_k_largest_magnitudes_and_zeroes_the_rest() -> None:
    values = torch.tensor([0.5, -3.0, 0.1, 2.0, -0.2, 1.0])
    assert torch.equal(top_k(values, 2), torch.tensor([0.0, -3.0, 0.0, 2.0, 0.0, 0.0]))
    assert torch.equal(top_k(values, 0), torch.zeros(6)) and torch.equal(top_k(values, 6), values)


def test_the_sent_part_and_the_residual_split_residual_plus_update_exactly_over_two_rounds() -> None:
    """Round 1: a = Δ₁ (no residual yet); k = ⌈0.25 · 8⌉ = 2 entries of a sent, over both tensors
    together, the rest kept. Round 2: a = e₁ + Δ₂; again top-2 sent and a − sent kept. Integer
    entries travel as they are; a withheld entry neither travels nor enters the count."""
    link = TopK(0.25)
    reference = {"w": torch.zeros(2, 3), "b": torch.ones(2), "n": torch.tensor(7), "head": torch.zeros(2)}
    client_state: dict = {"personal.x": torch.zeros(1)}
    codec = UpdateCodec(Chain([link]))
    first = {"w": torch.tensor([[0.1, -0.9, 0.2], [0.3, 0.0, 0.4]]), "b": torch.tensor([1.5, 0.95]),
             "n": torch.tensor(9), "head": torch.ones(2)}
    m1 = codec.encode(_upload(first), reference, {"head"}, {}, client_state)
    assert torch.equal(m1.state["w"], torch.tensor([[0.0, -0.9, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(m1.state["b"], torch.tensor([1.5, 1.0]))  # b: Δ = (0.5, −0.05): 0.5 is the second largest
    assert torch.equal(m1.state["n"], first["n"]) and m1.state["head"] is first["head"]
    kept = residual(client_state)
    assert sorted(kept) == ["b", "w"] and "personal.x" in client_state
    for key in ("w", "b"):  # a = sent + e′, exactly
        assert torch.equal((m1.state[key] - reference[key]) + kept[key], first[key] - reference[key])
    assert m1.metrics[CODED_BYTES] == 2 * (4 + 4) + 8  # two float32 values and int32 indices, plus n (int64)
    second = {"w": torch.tensor([[0.0, 0.0, 0.5], [-0.35, 0.0, 0.0]]), "b": torch.tensor([1.0, 1.0]),
              "n": torch.tensor(9), "head": torch.ones(2)}
    a = {k: kept[k] + (second[k] - reference[k]) for k in ("w", "b")}
    # a: w = [[0.1, 0, 0.7], [−0.05, 0, 0.4]], b = [0, −0.05]: top-2 are 0.7 and 0.4
    m2 = codec.encode(_upload(second), reference, {"head"}, {}, client_state)
    torch.testing.assert_close(m2.state["w"], torch.tensor([[0.0, 0.0, 0.7], [0.0, 0.0, 0.4]]), rtol=0, atol=1e-7)
    assert torch.equal(m2.state["b"], reference["b"])
    for key in ("w", "b"):
        assert torch.equal((m2.state[key] - reference[key]) + residual(client_state)[key], a[key])


def test_without_error_feedback_nothing_is_kept() -> None:
    state: dict = {}
    message = UpdateCodec(Chain([TopK(0.5, error_feedback=False)])).encode(
        _upload({"w": torch.tensor([1.0, -2.0, 0.5, 0.1])}), {"w": torch.zeros(4)}, set(), {}, state)
    assert torch.equal(message.state["w"], torch.tensor([1.0, -2.0, 0.0, 0.0])) and state == {}
    with pytest.raises(ValueError, match="residual"):
        UpdateCodec(Chain([TopK(0.5)])).encode(_upload({"w": torch.ones(4)}), {"w": torch.zeros(4)}, set(), {})


def test_the_chain_runs_its_links_in_the_declared_order_once_each() -> None:
    assert [link.stage for link in Chain([ClipLink(1.0), TopK(0.1)]).encoders] == ["clip", "compress"]
    for links in ([TopK(0.1), ClipLink(1.0)], [TopK(0.1), TopK(0.2)]):
        with pytest.raises(ValueError, match="clip → compress → noise → mask"):
            Chain(links)
    codec = build_codec(fedlatent.load_config(CONFIG, ["privacy.clip_norm=2", 'compression.kind="topk"']).privacy,
                        fedlatent.load_config(CONFIG, ['compression.kind="topk"']).compression)
    assert [type(link) for link in codec.chain.encoders] == [ClipLink, TopK]


def _setup(config, trainer) -> simulation.Setup:
    return simulation.setup(config, build_federation(config.data, config.data_seed),
                            resolve(config.algorithm, config.terms), trainer)


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_a_run_carries_each_clients_residual_and_counts_the_coded_bytes(backend: str, monkeypatch) -> None:
    seen: list[dict] = []  # each encode's residual before it runs: round 2's are round 1's
    encode = TopK.encode

    def spy(self, message, ctx):
        seen.append({k: v.clone() for k, v in residual(ctx.client_state).items()})
        return encode(self, message, ctx)
    monkeypatch.setattr(TopK, "encode", spy)
    config = fedlatent.load_config(CONFIG, ["data.num_clients=4", "train.rounds=2", 'compression.kind="topk"',
                                            "compression.fraction=0.05"])
    s = _setup(config, TRAINERS[backend])
    coded = [key for key, v in s.server.global_state.items() if v.is_floating_point()]
    d = sum(s.server.global_state[key].numel() for key in coded)
    k = math.ceil(0.05 * d)
    dense = sum(v.nbytes for key, v in s.server.global_state.items() if key not in coded)
    for rnd in range(2):
        before = {key: v.clone() for key, v in s.server.global_state.items()}
        line = simulation.run_round(s, rnd)
        assert line["bytes_up"] == 4 * (k * (4 + 4) + dense)
        # the mean of four k-sparse updates (the mean of the states moves the others by rounding alone)
        moved = sum(int(((s.server.global_state[key] - before[key]).abs() > 1e-6).sum()) for key in coded)
        assert 0 < moved <= 4 * k
        for state in s.client_states:
            kept = residual(state)
            assert sorted(kept) == sorted(coded)
            nonzero = sum(int((v != 0).sum()) for v in kept.values())
            assert d // 2 < nonzero <= d - k  # zero where sent (and where a was: pixels always 0 on digits)
        if rnd == 0:
            after_first = [residual(state) for state in s.client_states]
    assert all(key.startswith(RESIDUAL) for key in s.client_states[0] if key.startswith("codec."))
    assert seen[:4] == [{}] * 4
    for kept, given in zip(after_first, seen[4:]):
        assert sorted(given) == sorted(kept) and all(torch.equal(given[k], kept[k]) for k in kept)


def test_a_fraction_of_one_is_the_plain_run_up_to_rounding() -> None:
    base = ["data.num_clients=4", "train.rounds=2"]
    plain = _setup(fedlatent.load_config(CONFIG, base), simulation.train_in_turn)
    full = _setup(fedlatent.load_config(CONFIG, [*base, 'compression.kind="topk"', "compression.fraction=1"]),
                  simulation.train_in_turn)
    for rnd in range(2):
        plain_line, full_line = simulation.run_round(plain, rnd), simulation.run_round(full, rnd)
        assert full_line["bytes_up"] > plain_line["bytes_up"]  # every entry and its index
    for key, value in plain.server.global_state.items():
        torch.testing.assert_close(full.server.global_state[key], value, rtol=0, atol=1e-5)


def test_the_default_compression_section_is_not_written_so_run_folders_keep_their_names() -> None:
    assert "[compression]" not in fedlatent.config.to_toml(fedlatent.load_config(CONFIG))
    assert "[compression]\nkind = \"topk\"" in fedlatent.config.to_toml(
        fedlatent.load_config(CONFIG, ['compression.kind="topk"']))


@pytest.mark.parametrize("case, key", [(["compression.fraction=0"], "compression.fraction"),
                                       (['compression.kind="qsgd2"'], "compression.kind"),
                                       (['compression.kind="topk"', "privacy.clip_norm=1",
                                         "privacy.noise_multiplier=1"], "compression.kind")])
def test_a_bad_compression_setting_exits_2_in_one_line_before_any_run_folder(case, key, tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = [a for c in case for a in ("--set", c)]
    proc = subprocess.run([sys.executable, "-m", "fedlatent.cli", "run", str(CONFIG), *sets, "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and key in proc.stderr
    assert not out.exists()


def test_top_k_runs_on_the_nodes_as_on_the_embedded_backend(tmp_path: Path, monkeypatch) -> None:
    """Through fedlatent's Flower apps (in-process grid, two nodes of two clients): each node keeps
    its clients' residuals in its context, and every round's weights and bytes are the embedded run's."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")
    from tests.flower_procs import InProcessGrid
    from tests.test_flower import assert_parity, run_both
    results = run_both(tmp_path, monkeypatch, ['compression.kind="topk"', "compression.fraction=0.05"],
                       grid=InProcessGrid(2))
    assert_parity(*results)
    lines = [[json.loads(line)["bytes_up"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("embedded", "flower")]
    assert lines[0] == lines[1]


def test_a_resumed_run_restores_each_clients_residual_and_ends_as_the_whole_run(tmp_path: Path, crash_at_round_2,
                                                                                monkeypatch) -> None:
    from tests.methods.resume import resumed_equals_uninterrupted
    config = fedlatent.load_config(CONFIG, ["data.num_clients=4", "train.rounds=3", 'compression.kind="topk"',
                                            "compression.fraction=0.05"])
    states = resumed_equals_uninterrupted(config, tmp_path, monkeypatch)
    assert all(residual(state) for state in states)  # the residuals are in the checkpointed client states
