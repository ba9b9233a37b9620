"""privacy.randomness (federated.randomness): the review's attack — a participant holding the run's
configuration and every message it received regenerates a round's noise and recovers another
client's update — works against a seeded run and fails against a secret one; secret draws are
standard normals, secret selections are distinct clients, two secret runs differ, a secret run's
key survives a resume and never travels, and seeded runs draw exactly what they drew before."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import fedlatent
from fedlatent.config import PrivacyConfig
from fedlatent.federated.codec import server_codec
from fedlatent.federated.randomness import (SECRET_KEY, Randomness, SecretStream, resolve, secure_normal,
                                            secure_poisson, standard_normal)
from fedlatent.federated.round import clients_per_round, sample_clients
from fedlatent.methods.parts import Upload
from fedlatent.seeding import PRIVACY_NOISE, derive_seed
from tests.private_runs import small_config

SIGMA, CLIP, DIM = 3.0, 1.0, 20_000  # the review's setting: σ = 3, two clients a round


def _round(randomness: Randomness) -> tuple[dict, dict, dict, dict]:
    """One DP-FedAvg round of two clients over a ``DIM``-entry model under ``randomness``: the global
    state w̄ before, the two clients' clipped updates Δ₀, Δ₁ and the published w̄'."""
    cfg = PrivacyConfig(clip_norm=CLIP, noise_multiplier=SIGMA)
    codec = server_codec(cfg, randomness, num_clients=2, per_round=2)
    g = torch.Generator().manual_seed(7)
    reference = {"w": torch.randn(DIM, generator=g)}
    deltas = [{"w": torch.randn(DIM, generator=g) * (0.5 / math.sqrt(DIM))} for _ in range(2)]  # ‖Δ‖ ≈ 0.5 < C
    uploads = [Upload(k, {"w": reference["w"] + d["w"]}, 10, 1, 0.1, 0.0) for k, d in enumerate(deltas)]
    published = codec.round_combine(0, reference, (), {})(uploads)
    return reference, deltas[0], deltas[1], published


def _attack(seed: int, reference: dict, own: dict, published: dict) -> torch.Tensor:
    """The participant's reconstruction of the other client's update: m (w̄' − w̄) − Δ_own − σC·n̂,
    n̂ the round's noise regenerated from the configuration's seed."""
    regenerated = torch.randn(DIM, generator=torch.Generator().manual_seed(derive_seed(seed, PRIVACY_NOISE, 0)),
                              dtype=torch.float64)
    total = 2 * (published["w"].double() - reference["w"].double())
    return total - own["w"].double() - SIGMA * CLIP * regenerated


def test_the_attack_recovers_another_clients_update_in_a_seeded_run_and_misses_by_the_noise_in_a_secret_one() -> None:
    """Seeded: the reconstruction of client 1's update is off by float32 rounding alone (relative
    error < 1e-4; the review found 4e-6). Secret: it is off by σC(n − n̂), two independent
    N(0, σ²C²) per entry, so the error's RMS per entry is √2·σC within 2 % over 20 000 entries,
    ~80 times the update's own norm: the participant learns nothing of the update."""
    reference, own, other, published = _round(Randomness("seeded", seed=0))
    seeded_error = (_attack(0, reference, own, published) - other["w"].double()).norm() / other["w"].norm()
    assert seeded_error < 1e-4
    reference, own, other, published = _round(Randomness("secret", seed=0))
    error = _attack(0, reference, own, published) - other["w"].double()
    rms = float(error.pow(2).mean().sqrt())
    assert abs(rms / (math.sqrt(2) * SIGMA * CLIP) - 1) < 0.02
    assert error.norm() / other["w"].norm() > 50
    print(f"attack: seeded relative error {float(seeded_error):.2e}; secret error RMS {rms:.3f} "
          f"(sqrt(2) sigma C = {math.sqrt(2) * SIGMA * CLIP:.3f}), relative {float(error.norm() / other['w'].norm()):.1f}")


def test_two_secret_runs_of_one_configuration_draw_different_noise_and_a_key_repeats_its_own() -> None:
    """Two Randomness("secret") draw independent keys, so their rounds' noise differs (correlation
    ≈ 0 over 20 000 entries); one key's stream repeats (what a resumed run relies on)."""
    a, b = Randomness("secret", 0), Randomness("secret", 0)
    assert a.key != b.key and len(a.key) == 32
    na, nb = (standard_normal(DIM, r.generator(PRIVACY_NOISE, 0), torch.float64) for r in (a, b))
    assert abs(float(torch.corrcoef(torch.stack([na, nb]))[0, 1])) < 5 / math.sqrt(DIM)
    again = standard_normal(DIM, Randomness("secret", 0, key=a.key).generator(PRIVACY_NOISE, 0), torch.float64)
    assert torch.equal(na, again)
    other_round = standard_normal(DIM, a.generator(PRIVACY_NOISE, 1), torch.float64)
    assert not torch.equal(na, other_round)


def test_secure_normals_are_standard_normal() -> None:
    """2·10⁶ secure normals: mean within 5 standard errors of 0 (false alarm < 10⁻⁶), variance within
    5 of 1 (the variance's standard error √(2/n)), and the 4th moment near 3 (Gaussian, not the sum's
    summands' law rescaled wrongly). A stream's successive draws differ."""
    stream = SecretStream(b"k" * 32, 1)
    n = 2_000_000
    x = secure_normal(n, stream)
    assert abs(x.mean()) < 5 / math.sqrt(n)
    assert abs(x.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((x ** 4).mean() - 3) < 5 * math.sqrt(96 / n)
    assert not np.array_equal(x[:10], secure_normal(10, stream))


@pytest.mark.parametrize("rate", [0.3, 3.7, 10.0, 55.5, 7.8e7])  # both samplers; 7.8e7: a 20-bit Skellam share's
def test_secure_poisson_draws_have_poissons_moments_and_probabilities(rate: float) -> None:
    """200 000 draws of Poisson(λ) from a secret stream (Knuth's multiplication below 10, PTRS above):
    mean and variance within 4.42 standard errors of λ (Var of the sample variance (λ + 2λ²)/n),
    and below λ = 10 each of P(k), k ≤ 8, within 4.42 standard errors of e^−λ λ^k / k! — a false
    alarm with probability 1e-5 each. Integers, none negative."""
    n, z = 200_000, 4.42
    x = secure_poisson(rate, n, SecretStream(b"p" * 32, int(rate * 10)))
    assert x.dtype == np.int64 and int(x.min()) >= 0
    assert abs(x.mean() - rate) < z * math.sqrt(rate / n)
    assert abs(x.var() - rate) < z * math.sqrt((rate + 2 * rate ** 2) / n)
    if rate < 10:
        for k in range(9):
            p = math.exp(-rate) * rate ** k / math.factorial(k)
            assert abs(float((x == k).mean()) - p) < z * math.sqrt(p * (1 - p) / n) + 1e-12, k


def test_seeded_draws_and_selections_are_todays_bit_for_bit() -> None:
    """Seeded: the generator is (seed, stream, round)'s torch.Generator, its normals torch.randn's, and
    the selection sample_clients' for every round — the numbers of runs before privacy.randomness."""
    r = Randomness("seeded", 5)
    expected = torch.randn((3, 4), generator=torch.Generator().manual_seed(derive_seed(5, PRIVACY_NOISE, 2)),
                           dtype=torch.float64)
    assert torch.equal(standard_normal((3, 4), r.generator(PRIVACY_NOISE, 2), torch.float64), expected)
    for rnd in range(20):
        assert r.select(rnd, 10, clients_per_round(10, 0.3)) == sample_clients(5, rnd, 10, 0.3)


def test_secret_selection_draws_distinct_clients_evenly_and_not_the_seeded_sequence() -> None:
    """Secret: m distinct clients in id order each round; over 3000 rounds each of 10 clients is chosen
    about 3000·3/10 times (within 5 binomial standard deviations); the sequence is not the seed's."""
    r = Randomness("secret", 0)
    chosen = [r.select(rnd, 10, 3) for rnd in range(3000)]
    assert all(len(set(c)) == 3 and c == sorted(c) for c in chosen)
    counts = np.bincount([c for row in chosen for c in row], minlength=10)
    sd = math.sqrt(3000 * 0.3 * 0.7)
    assert np.all(np.abs(counts - 900) < 5 * sd)
    assert chosen[:20] != [sample_clients(0, rnd, 10, 0.3) for rnd in range(20)]


def test_auto_is_secret_on_flower_and_seeded_elsewhere() -> None:
    assert resolve("auto", "flower") == "secret"
    assert [resolve("auto", b) for b in ("simulation", "vectorized")] == ["seeded", "seeded"]
    assert resolve("seeded", "flower") == "seeded"


def test_the_key_is_server_state_a_resumed_run_adopts_and_no_payload_carries(tmp_path: Path) -> None:
    """A secret run's key is in its server state (so a checkpoint keeps it) and in no client's payload;
    a Randomness bound to a state holding a key adopts it (the resume)."""
    from tests.private_runs import set_up
    config = small_config("privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", 'privacy.randomness="secret"')
    s = set_up(config)
    key = bytes(s.server.state[SECRET_KEY].tolist())
    assert key == s.server.randomness.key and len(key) == 32
    assert all(SECRET_KEY not in p for p in s.server.payload().values())
    fresh = Randomness("secret", 0)
    fresh.bind(s.server.state)
    assert fresh.key == key


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    last = sorted((out / "checkpoints").iterdir())[-1]
    return load_file(str(last / "global.safetensors"))


@pytest.mark.parametrize("backend", ["simulation", "vectorized"])
def test_two_secret_runs_differ_and_two_seeded_runs_repeat(backend: str, tmp_path: Path) -> None:
    """Two-round private runs of one configuration: seeded, the global models are equal to the bit;
    secret, they differ (their noise does), and summary.json says which randomness ran and, seeded,
    for whom ε holds."""
    base = ["train.rounds=2", "privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", f'backend="{backend}"',
            "eval.every=2"]
    weights, summaries = {}, {}
    for mode in ("seeded", "secret"):
        for i in range(2):
            out = tmp_path / f"{mode}{i}"
            summaries[mode, i] = fedlatent.run(small_config(*base, f'privacy.randomness="{mode}"'), out)
            weights[mode, i] = _final_weights(out)
    assert all(torch.equal(weights["seeded", 0][k], weights["seeded", 1][k]) for k in weights["seeded", 0])
    assert not all(torch.equal(weights["secret", 0][k], weights["secret", 1][k]) for k in weights["secret", 0])
    assert summaries["seeded", 0]["privacy_randomness"] == "seeded" and "seed" in summaries["seeded", 0]["privacy_note"]
    assert summaries["secret", 0]["privacy_randomness"] == "secret" and "privacy_note" not in summaries["secret", 0]
    assert json.loads((tmp_path / "secret0" / "summary.json").read_text())["privacy_randomness"] == "secret"


def test_a_private_run_shows_epsilon_on_each_progress_line_and_in_the_table_and_warns_when_it_is_meaningless(
        tmp_path: Path, capsys) -> None:
    """σ = 0.01: each progress line carries ``eps``, the final table ``privacy_epsilon`` (as
    summary.json has it, 4 significant digits) and ``privacy_randomness``; the run ends with the seeded
    note and a warning naming ε > 10. A plain run shows none of them."""
    from fedlatent.cli import main
    from tests.private_runs import CONFIG, SMALL
    args = [a for o in [*SMALL, "train.rounds=2", "privacy.clip_norm=1", "privacy.noise_multiplier=0.01"]
            for a in ("--set", o)]
    out = tmp_path / "run"
    assert main(["run", str(CONFIG), "--no-figures", *args, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    progress = [line for line in captured.err.splitlines() if ": round " in line]
    assert len(progress) == 2 and all(", eps " in line for line in progress)
    assert f"privacy_epsilon  {summary['privacy_epsilon']:.4g}" in captured.out
    assert re.search(r"privacy_randomness\s+seeded", captured.out)
    assert summary["privacy_epsilon"] > 10
    assert "fedlatent: note: privacy.randomness = 'seeded'" in captured.err
    assert "fedlatent: warning: privacy_epsilon = " in captured.err and "is above 10" in captured.err
    plain = tmp_path / "plain"
    assert main(["run", str(CONFIG), "--no-figures", "--set", "train.rounds=1", *[a for o in SMALL[:1] for a in
                                                                               ("--set", o)], "--out", str(plain)]) == 0
    captured = capsys.readouterr()
    assert "eps" not in captured.err and "privacy_" not in captured.out and "note:" not in captured.err


def test_dp_sgd_noise_in_a_secret_run_is_each_clients_own_and_differs_between_runs(tmp_path: Path) -> None:
    """Sample-level DP-SGD under privacy.randomness = "secret": each client's step noise is keyed by its
    own OS entropy, so two one-round runs end on different models, where two seeded runs are equal."""
    base = ["train.rounds=1", "privacy.sample_clip_norm=1", "privacy.sample_noise_multiplier=1",
            'privacy.batch_sampling="poisson"', 'backend="simulation"']
    weights = {}
    for mode in ("seeded", "secret"):
        for i in range(2):
            out = tmp_path / f"{mode}{i}"
            fedlatent.run(small_config(*base, f'privacy.randomness="{mode}"'), out)
            weights[mode, i] = _final_weights(out)
    assert all(torch.equal(weights["seeded", 0][k], weights["seeded", 1][k]) for k in weights["seeded", 0])
    assert not all(torch.equal(weights["secret", 0][k], weights["secret", 1][k]) for k in weights["secret", 0])


def _message_bytes(message) -> bytes:
    """Every array's bytes and every config value's text of a Flower message's content."""
    content = message.content
    parts = [arr.numpy().tobytes() for record in content.array_records.values() for arr in record.values()]
    parts += [repr(dict(record)).encode() for record in content.config_records.values()]
    return b"".join(parts)


def test_on_flower_a_noised_run_is_secret_by_default_and_no_message_carries_its_key(tmp_path: Path) -> None:
    """DP-FedAvg on Flower's in-process grid with privacy.randomness left at "auto": the run is secret
    (summary.json), its key is in the ServerApp's checkpoint and in none of the bytes of any message
    the nodes received."""
    pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")
    from safetensors.torch import load_file

    from fedlatent.experiment import run as run_experiment
    from tests.flower_procs import InProcessGrid

    class RecordingGrid(InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            self.received = getattr(self, "received", []) + [_message_bytes(m) for m in messages]
            return super().send_and_receive(messages, timeout=timeout)

    grid = RecordingGrid(2)
    config = small_config('backend="flower"', "flower.supernodes=2", "flower.cpus=2", "train.rounds=2", "privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8",
                          "eval.every=2")
    summary = run_experiment(config, tmp_path / "flower", echo=None, grid=grid)
    assert summary["privacy_randomness"] == "secret" and summary["status"] == "completed"
    last = sorted((tmp_path / "flower" / "checkpoints").iterdir())[-1]
    key = bytes(load_file(str(last / "server.safetensors"))[SECRET_KEY].tolist())
    assert len(key) == 32 and grid.received
    assert not any(key in blob or key.hex().encode() in blob for blob in grid.received)


BEFORE = "a32049f"  # main before privacy.randomness and the server's checks
SCRIPT = """
import sys
from pathlib import Path
import fedlatent
out = Path(sys.argv[1])
base = ["data.num_clients=6", "train.participation=0.5", "train.rounds=3", "model.hidden=[16]"]
dp = ["privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8", "privacy.delta=1e-4"]
runs = {
    "dp-simulation": [*dp, 'backend="simulation"'],
    "dp-vectorized": [*dp, 'backend="vectorized"'],
    "adaptive": [*dp, "privacy.target_quantile=0.5", "privacy.clip_count_noise=1.0", 'backend="simulation"'],
    "ffc": [*dp, 'algorithm.name="spherefed"', "algorithm.ffc_every=1", "privacy.statistics_clip_norm=50",
            "privacy.statistics_noise_multiplier=4", 'backend="simulation"'],
    "dp-sgd": ["privacy.sample_clip_norm=1", "privacy.sample_noise_multiplier=1", 'privacy.batch_sampling="poisson"',
               'backend="simulation"'],
}
for name, extra in runs.items():
    fedlatent.run(fedlatent.load_config(None, [*base, *extra]), out / name)
"""


@pytest.mark.slow
def test_seeded_private_runs_give_the_weights_and_lines_of_the_code_before(tmp_path: Path) -> None:
    """DP-FedAvg on both embedded backends, adaptive clipping, private FFC and DP-SGD, seeded (the
    simulation's default): the final global weights equal the code before's bit for bit, and every
    metrics line too but for the keys this change adds or removes (privacy_over_bound;
    client_train_loss under DP) and ε, which is never above the old (the smaller of two bounds)."""
    from safetensors.torch import load_file

    from tests.code_before import runs_before_and_now
    old_runs, new_runs = runs_before_and_now(BEFORE, SCRIPT, tmp_path)
    names = sorted(p.name for p in old_runs.iterdir())
    assert len(names) == 5
    changed = {"privacy_over_bound", "client_train_loss", "privacy_epsilon"}
    for name in names:
        old, new = old_runs / name, new_runs / name
        a, b = (load_file(str(sorted((d / "checkpoints").iterdir())[-1] / "global.safetensors")) for d in (old, new))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        lines = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (old, new)]
        for was, now in zip(*lines):
            strip = lambda line: {k: v for k, v in line.items() if k not in changed and not k.startswith("time_")}  # noqa: E731
            assert strip(now) == strip(was), name
            if "privacy_epsilon" in was:
                assert now["privacy_epsilon"] <= was["privacy_epsilon"] * (1 + 1e-12)


def test_a_secret_run_stopped_and_resumed_goes_on_with_its_own_key(tmp_path: Path, crash_at_round_2,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS's keys made a known sequence (B for the stopped run, C for its resume, B again for a
    run never stopped): the resumed run adopts B from its checkpoint — its metrics lines, final
    weights and key are those of the uninterrupted run with key B, not of a key C run."""
    import secrets as secrets_module

    from safetensors.torch import load_file

    keys = iter([b"B" * 32, b"C" * 32, b"B" * 32])
    monkeypatch.setattr(secrets_module, "token_bytes", lambda n: next(keys))
    config = small_config("train.rounds=4", "privacy.clip_norm=0.5", "privacy.noise_multiplier=0.8",
                          'privacy.randomness="secret"', 'backend="simulation"')
    with pytest.raises(KeyboardInterrupt):
        fedlatent.run(config, tmp_path / "stopped")
    from fedlatent.backends import simulation
    monkeypatch.setattr(simulation, "run_round", crash_at_round_2)  # the real round again (the keys' patch stays)
    fedlatent.run(config, tmp_path / "stopped", resume=True)
    fedlatent.run(config, tmp_path / "whole")
    lines = {run: [{k: v for k, v in json.loads(x).items() if not k.startswith("time_")}
                   for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("stopped", "whole")}
    assert lines["stopped"] == lines["whole"] and len(lines["whole"]) == 4
    for name in ("global.safetensors", "server.safetensors"):
        a, b = (load_file(str(sorted((tmp_path / run / "checkpoints").iterdir())[-1] / name))
                for run in ("stopped", "whole"))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert bytes(b[SECRET_KEY].tolist()) == b"B" * 32
