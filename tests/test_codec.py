"""The update codec at the message boundary (``federated.codec``): the plain codec is today's
arithmetic, every mean the server takes goes through ``combine`` and FFC's sums through ``total``;
the clipping codec bounds each client's update by construction on every embedded backend, at
C = ∞ is the plain codec bit for bit, and C ≤ 0 is refused before any run folder exists."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fedlatent
from fedlatent.backends import simulation
from fedlatent.data.federation import build_federation
from fedlatent.errors import ConfigError
from fedlatent.federated.codec import ClipCodec, UpdateCodec, build_codec, clip, update_norm
from fedlatent.federated.trainer import lockstep_update
from fedlatent.federated.round import plan_round
from fedlatent.methods import resolve
from fedlatent.methods.aggregation import weighted_mean
from fedlatent.methods.parts import Upload
from tests.stacked_runs import run_on_each_backend, run_stacked

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = {"simulation": simulation.train_in_turn, "vectorized": lockstep_update}
# one round's updates on this config have norms 1.83 – 1.90 (4 IID digits clients, MLP, one epoch)
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
SMALL = ["data.num_clients=4", "train.rounds=2"]


def _config(*extra: str):
    return fedlatent.load_config(CONFIG, [*SMALL, *extra])


def _setup(config, trainer=simulation.train_in_turn, codec: UpdateCodec | None = None) -> simulation.Setup:
    s = simulation.setup(config, build_federation(config.data, config.data_seed),
                         resolve(config.algorithm, config.terms), trainer)
    if codec is not None:
        s.server.codec = codec
    return s


def _delta(upload: Upload, reference: dict, skip: set[str] = frozenset()) -> dict:
    return {k: upload.state[k].double() - reference[k].double() for k in reference
            if k not in skip and reference[k].is_floating_point()}


# the pure pieces ---------------------------------------------------------------------------------
def test_update_norm_is_the_flat_l2_norm_of_every_entry() -> None:
    update = {"a": torch.tensor([[3.0, 0.0]]), "b": torch.tensor([4.0, 12.0])}
    assert update_norm(update) == pytest.approx(13.0, rel=1e-15)  # √(9 + 16 + 144)
    assert update_norm({}) == 0.0


def test_clip_scales_to_the_bound_and_leaves_a_short_update_itself() -> None:
    update = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}  # norm 5
    clipped = clip(update, 1.0)
    torch.testing.assert_close(clipped["a"], torch.tensor([0.6, 0.0]), rtol=0, atol=1e-7)
    torch.testing.assert_close(clipped["b"], torch.tensor([0.8]), rtol=0, atol=1e-7)
    assert clip(update, 5.0) is update and clip(update, math.inf) is update


@pytest.mark.parametrize("bound", [1e-3, 0.5, 3.0])
def test_clipped_norms_never_exceed_the_bound(bound: float) -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        update = {k: torch.randn(shape, generator=generator) * 10 for k, shape in (("w", (7, 5)), ("b", (5,)))}
        assert update_norm(clip(update, bound)) <= bound * (1 + 1e-6)


def test_the_plain_codec_is_the_weighted_mean_and_the_stacked_sum() -> None:
    generator = torch.Generator().manual_seed(1)
    uploads = [Upload(i, {"w": torch.randn(3, 4, generator=generator), "n": torch.tensor(i)}, 10 + i, 1, 0.1, 0.0)
               for i in range(3)]
    codec = UpdateCodec()
    assert codec.encode(uploads[0], {"w": torch.zeros(3, 4)}, set(), {}) is uploads[0]
    for keys, weights in ((None, None), (["w"], [0.2, 0.3, 0.5])):
        got, want = codec.combine(uploads, keys, weights), weighted_mean(uploads, keys, weights)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    stats = [{"V": torch.randn(4, 4, dtype=torch.float64, generator=generator)} for _ in range(3)]
    assert torch.equal(codec.total(stats, 0)["V"], stats[0]["V"] + stats[1]["V"] + stats[2]["V"])


def test_the_clip_codec_codes_the_update_of_what_travels_only() -> None:
    reference = {"w": torch.zeros(4), "head": torch.ones(2), "count": torch.tensor(3)}
    upload = Upload(0, {"w": torch.tensor([3.0, 4.0, 0.0, 0.0]), "head": torch.full((2,), 9.0),
                        "count": torch.tensor(7)}, 10, 1, 0.1, 0.0, metrics={"train_loss": 0.5})
    message = ClipCodec(1.0).encode(upload, reference, {"head"}, {})
    torch.testing.assert_close(message.state["w"], torch.tensor([0.6, 0.8, 0.0, 0.0]))
    assert message.state["head"] is upload.state["head"] and message.state["count"] is upload.state["count"]
    assert (message.client_id, message.num_samples, message.metrics) == (0, 10, {"train_loss": 0.5})
    assert torch.equal(upload.state["w"], torch.tensor([3.0, 4.0, 0.0, 0.0]))  # the upload itself unchanged
    assert ClipCodec(5.0).encode(upload, reference, {"head"}, {}) is upload


def test_build_codec_and_bad_bounds() -> None:
    assert type(build_codec(_config().privacy)) is UpdateCodec
    codec = build_codec(_config("privacy.clip_norm=0.5").privacy)
    assert isinstance(codec, ClipCodec) and codec.clip_norm == 0.5
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            ClipCodec(bad)
    for bad in ("0", "-0.5", "nan"):
        with pytest.raises(ConfigError, match="privacy.clip_norm"):
            _config(f"privacy.clip_norm={bad}")


def test_a_bad_clip_norm_exits_2_in_one_line_before_any_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fedlatent.cli", "run", str(CONFIG), "--set",
                           "privacy.clip_norm=0", "--out", str(out)], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "privacy.clip_norm" in proc.stderr
    assert not out.exists()


def test_the_default_privacy_section_is_not_written_so_run_folders_keep_their_names() -> None:
    assert "[privacy]" not in fedlatent.config.to_toml(_config())
    written = fedlatent.config.to_toml(_config("privacy.clip_norm=2.5"))
    assert "[privacy]\nclip_norm = 2.5" in written


# on the backends ---------------------------------------------------------------------------------
class Spy(UpdateCodec):
    """The plain codec, counting the server's calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def combine(self, messages, keys=None, weights=None):
        self.calls.append("combine")
        return super().combine(messages, keys, weights)

    def total(self, statistics, release):
        self.calls.append("total")
        return super().total(statistics, release)


@pytest.mark.parametrize("name, combines", [("fedavg", 1), ("fednova", 2), ("feddyn", 2), ("fedadam", 1)])
def test_every_server_mean_goes_through_the_codec_and_changes_nothing(name: str, combines: int) -> None:
    spy = Spy()
    plain, spied = _setup(_config(f'algorithm.name="{name}"')), _setup(_config(f'algorithm.name="{name}"'), codec=spy)
    for rnd in range(2):
        simulation.run_round(plain, rnd)
        simulation.run_round(spied, rnd)
    assert spy.calls == ["combine"] * combines * 2
    assert all(torch.equal(plain.server.global_state[k], v) for k, v in spied.server.global_state.items())


def test_ffc_statistics_are_summed_by_the_codec() -> None:
    spy = Spy()
    config = _config('algorithm.name="spherefed"', "train.rounds=1")
    plain, spied = _setup(config), _setup(config, codec=spy)
    for s in (plain, spied):
        simulation.run_round(s, 0)
    final_plain, final_spied = simulation.finish(plain), simulation.finish(spied)
    assert spy.calls == ["combine", "total"]
    assert final_spied["accuracy"] == final_plain["accuracy"]
    assert all(torch.equal(plain.model.state_dict()[k], v) for k, v in spied.model.state_dict().items())


@pytest.mark.parametrize("backend", sorted(TRAINERS))
@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fednova", "fedrep"])
def test_clip_at_infinity_is_the_plain_codec_bit_for_bit(backend: str, name: str) -> None:
    config = _config(f'algorithm.name="{name}"')
    plain, clipped = _setup(config, TRAINERS[backend]), _setup(config, TRAINERS[backend], ClipCodec(math.inf))
    lines = [[simulation.run_round(s, rnd) for rnd in range(2)] for s in (plain, clipped)]
    assert all(torch.equal(plain.server.global_state[k], v) for k, v in clipped.server.global_state.items())
    assert [x["train_loss"] for x in lines[0]] == [x["train_loss"] for x in lines[1]]


@pytest.mark.parametrize("backend", sorted(TRAINERS))
@pytest.mark.parametrize("name", ["fedavg", "fedrep", "spherefed"])
def test_each_message_s_update_is_within_the_bound(backend: str, name: str) -> None:
    """A bound below every client's update norm: each message's Δ (over what travels) has norm C
    up to float32 rounding of w̄ + Δ; the clients' own layers and a fixed head are left as trained."""
    bound = 0.1
    s = _setup(_config(f'algorithm.name="{name}"', f"privacy.clip_norm={bound}"), TRAINERS[backend])
    tasks = plan_round(s.server, s.config, 0, s.train_sizes)
    messages, _ = s.train(tasks)
    reference, skip = tasks[0].global_state, s.server.untransmitted()
    plain = _setup(_config(f'algorithm.name="{name}"'), TRAINERS[backend])
    uploads, _ = plain.train(plan_round(plain.server, plain.config, 0, plain.train_sizes))
    assert len(messages) == 4
    for message, upload in zip(messages, uploads):
        assert update_norm(_delta(upload, reference, skip)) > bound
        assert update_norm(_delta(message, reference, skip)) == pytest.approx(bound, rel=1e-5)
        assert all(torch.equal(message.state[k], upload.state[k]) for k in skip)


@pytest.mark.parametrize("backend", sorted(TRAINERS))
def test_a_clipped_run_moves_the_global_model_at_most_c_a_round(backend: str) -> None:
    """FedAvg's new model is a convex combination of the messages, so ‖w̄_{t+1} − w̄_t‖ ≤ C when
    every message's update is within C; the unclipped run moves further. Traffic is unchanged."""
    bound = 0.5
    lines, moves = {}, {}
    for label, extra in (("plain", ()), ("clipped", (f"privacy.clip_norm={bound}",))):
        s = _setup(_config(*extra), TRAINERS[backend])
        moves[label], lines[label] = [], []
        for rnd in range(2):
            before = dict(s.server.global_state)
            lines[label].append(simulation.run_round(s, rnd))
            moves[label].append(update_norm({k: s.server.global_state[k].double() - v.double()
                                             for k, v in before.items() if v.is_floating_point()}))
    assert all(m <= bound * (1 + 1e-5) for m in moves["clipped"])
    assert all(m > bound for m in moves["plain"])
    for key in ("bytes_up", "bytes_down", "bytes_head_up"):
        assert [x[key] for x in lines["clipped"]] == [x[key] for x in lines["plain"]]


def test_the_clipped_backends_agree_and_stacked_runs_equal_runs_alone() -> None:
    """Clipping on the simulation and vectorized backends gives the same weights up to float
    rounding; two clipped runs in one lockstep stack give each run's numbers alone."""
    config = _config("privacy.clip_norm=0.5")
    alone = run_on_each_backend(config, _setup, TRAINERS)

    configs = [config, dataclasses.replace(config, seed=1)]
    setups = run_stacked(configs, _setup)
    singles = [alone["vectorized"], _setup(configs[1], lockstep_update)]
    for rnd in range(2):
        simulation.run_round(singles[1], rnd)
    for stacked, single in zip(setups, singles):
        for k, v in single.server.global_state.items():
            torch.testing.assert_close(stacked.server.global_state[k], v, atol=2e-5, rtol=1e-4, msg=k)
