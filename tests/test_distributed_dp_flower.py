"""Distributed DP with SecAgg+ on Flower (``backends/flower/distributed.py``, ``secagg_codec``'s
integer mask and modular unmasking): one secure round through the codecs and the protocol's parties
is the embedded distributed DP round bit for bit; the unmasked sum's noise has the configured
variance σ²C²·n/m with n of m clients surviving, and mean zero, in a statistical test of stated
false-alarm rate (seeded and secret shares); the accountant at the worst case SecAgg+'s threshold
and ``train.min_clients`` allow, against dp-accounting's Gaussian called directly; secret shares
differ from run to run and no seed of them is sent; a seeded run through fedlatent's Flower messages
has the embedded run's weights, ε and bytes every round; the settings refused in one line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from flwr.app import RecordDict  # noqa: E402

import fedlatent  # noqa: E402
from fedlatent.backends.flower import distributed as flower_dp  # noqa: E402
from fedlatent.backends.flower.secagg import Party, Reconstruction, mask_total  # noqa: E402
from fedlatent.backends.flower.secagg_codec import (VECTOR, DistributedUnmaskingCodec, Masking,  # noqa: E402
                                                    MaskingCodec, Unmasking)
from fedlatent.cli import main  # noqa: E402
from fedlatent.errors import RunStopped  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from fedlatent.federated.codec import DistributedCodec, build_codec, server_codec  # noqa: E402
from fedlatent.federated.codec_chain import EncodeContext  # noqa: E402
from fedlatent.federated.distributed_dp import MESSAGE, ORDERS, SkellamAccountant, rounded_bound  # noqa: E402
from fedlatent.federated.randomness import Randomness  # noqa: E402
from fedlatent.federated.round import ClientTask  # noqa: E402
from fedlatent.methods.parts import Upload  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402
from tests.test_flower import assert_parity, config, record_globals  # noqa: E402
from tests.test_secagg import Recording  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_fedavg.toml"
Z = 4.42  # |z| above this under the null: a false alarm with probability 1e-5 (two-sided, normal)
SECURE = 'privacy.secure_aggregation="secaggplus"'
DDP = ['privacy.distributed="skellam"', SECURE]


def _config(m: int, sigma: float, clip: float, randomness: str = "seeded", extra=()):
    return fedlatent.load_config(CONFIG, ['backend="flower"', f"data.num_clients={m}", f"privacy.clip_norm={clip}",
                                          f"privacy.noise_multiplier={sigma}", *DDP,
                                          f'privacy.randomness="{randomness}"', *extra])


def _server(cfg, randomness: Randomness) -> DistributedUnmaskingCodec:
    m = cfg.data.num_clients
    codec = server_codec(cfg.privacy, randomness, m, m, survivors=cfg.train.min_clients)
    assert isinstance(codec, DistributedCodec)
    unmasking = flower_dp.unmasking(codec, cfg)
    assert isinstance(unmasking, DistributedUnmaskingCodec)
    return unmasking


def secure_round(cfg, randomness: Randomness, reference: dict, states: list[dict], alive: list[int],
                 rnd: int = 2) -> tuple[dict, list[Upload]]:
    """One round of distributed DP under SecAgg+ as the Flower apps run it, without the messages:
    every client a party that shares its keys, the server's record of the round, each node's share
    link from it and the masking codec, the clients not in ``alive`` lost after sharing their keys
    (their pairwise masks rebuilt from the others' shares), the server's unmasking codec."""
    server = _server(cfg, randomness)
    ids = list(range(len(states)))
    threshold = flower_dp.survivors(cfg, len(ids))
    parties = {c: Party.new(c, "s", threshold) for c in ids}
    public = {c: (p.pk1, p.pk2) for c, p in parties.items()}
    sent = {c: p.share("s", public) for c, p in parties.items()}
    content = RecordDict()
    flower_dp.attach(content, server, randomness, rnd, ids)
    messages = []
    for c in alive:
        masking = Masking("update", parties[c], "s", {src: out[c] for src, out in sent.items() if c in out}, 1.0,
                          2 ** 40, np.random.default_rng(0))
        task = ClientTask(c, rnd, reference, {}, 0.1, len(ids), 10 * len(ids), randomness.client_seed(c))
        codec = MaskingCodec(build_codec(cfg.privacy), masking, task.total_samples, flower_dp.share(content, cfg, task))
        messages.append(codec.encode(Upload(c, states[c], 10, 1, 0.1, 0.0), reference, set(), {}, None, rnd))
    dropped = sorted(set(ids) - set(alive))
    revealed: dict[int, list[bytes]] = {}
    for c in alive:
        for owner, share in parties[c].reveal("s", alive, dropped).items():
            revealed.setdefault(owner, []).append(share)
    known = Reconstruction({c: set(ids) for c in ids}, {c: k[0] for c, k in public.items()}, set(ids), set(alive),
                           revealed)
    size = messages[0].state[VECTOR].numel()
    mask = mask_total(known, threshold, size)
    server.expect("update", lambda clients: Unmasking(sorted(clients), mask, [], 1.0, 1.0))
    return server.round_combine(rnd, reference, set(), {})(messages, None, None), messages


def test_a_secure_round_is_the_embedded_round_bit_for_bit() -> None:
    """Seeded, the node's share link draws what the embedded client's does (the rotation and the
    noise seed come in the server's record), the mask cancels in Z_{2^b}: the new global state is
    the embedded distributed DP round's, to the bit — the masked vectors themselves being uniform
    in Z_{2^b}, not the shares."""
    cfg = _config(4, 0.7, 1.0, extra=["train.min_clients=3"])
    generator = torch.Generator().manual_seed(3)
    reference = {"a": torch.randn(20, 30, generator=generator), "b": torch.randn(7, generator=generator),
                 "n": torch.tensor(4)}
    states = [{"a": reference["a"] + 0.3 * torch.randn(20, 30, generator=generator),
               "b": reference["b"] + 0.3 * torch.randn(7, generator=generator), "n": torch.tensor(9)} for _ in range(4)]
    randomness = Randomness("seeded", 5)
    secure, masked = secure_round(cfg, randomness, reference, states, [0, 1, 2, 3])
    embedded = server_codec(cfg.privacy, randomness, 4, 4, survivors=3)
    messages = [embedded.encode(Upload(c, s, 10, 1, 0.1, 0.0), reference, set(), {}, None, 2) for c, s in enumerate(states)]
    clear = embedded.round_combine(2, reference, set(), {})(messages, None, None)
    assert secure.keys() == clear.keys()
    assert all(torch.equal(secure[k], clear[k]) for k in clear)
    assert not torch.equal(secure["a"], reference["a"])
    for ours, theirs in zip(masked, messages):  # the same shares, masked: unlike, each within [0, 2^20)
        vector = ours.state[VECTOR]
        assert vector.shape == theirs.state[MESSAGE].shape and not torch.equal(vector, theirs.state[MESSAGE])
        assert 0 <= int(vector.min()) and int(vector.max()) < 2 ** 20


@pytest.mark.parametrize("survivors, randomness", [(6, "seeded"), (4, "seeded"), (6, "secret")])
def test_the_unmasked_sums_noise_has_the_configured_variance_and_mean_zero(survivors: int, randomness: str) -> None:
    """Every client sends w̄ itself (Δ = 0 rounds to 0 exactly), so m·(w̄' − w̄) is γ·D·H·z, z the sum
    of the surviving clients' Skellam shares unmasked by SecAgg+: by Parseval Σ_i S_i² = γ²‖z‖², and
    ‖z‖² over d = 2^16 iid coordinates of variance V = n·μ_k has mean dV and variance d(V + 2V²).
    With n of the m = 6 clients surviving (the others lost after sharing their keys) V·γ² =
    σ²C²·n/m; secret, the shares come from the nodes' own OS entropy (the Poisson draws of
    ``secure_poisson``). The z-scores of ‖z‖² and of Σ S_i stay within ±4.42: a false alarm with
    probability 1e-5 each."""
    sigma, clip, m = 1.3, 0.8, 6
    cfg = _config(m, sigma, clip, randomness, ["privacy.secagg_threshold=4"])
    reference = {"w": torch.full((256, 256), 0.25, dtype=torch.float64)}
    randomness_ = Randomness(randomness, 5)
    summed = (secure_round(cfg, randomness_, reference, [reference] * m, list(range(survivors)))[0]["w"]
              - reference["w"]) * m
    spec = _server(cfg, randomness_).distributed.spec
    gamma, d = spec.scale, summed.numel()
    variance = survivors * spec.share_variance
    assert variance * gamma ** 2 == pytest.approx(sigma ** 2 * clip ** 2 * survivors / m, rel=1e-12)
    energy = float((summed / gamma).square().sum())
    assert abs(energy - d * variance) / math.sqrt(d * (variance + 2 * variance ** 2)) < Z
    assert abs(float(summed.sum()) / gamma) / math.sqrt(d * variance) < Z


def test_the_accountant_takes_the_fewest_survivors_the_threshold_and_min_clients_allow() -> None:
    """t' = max(1, train.min_clients, SecAgg+'s threshold t) shares a round at worst; ε is then
    dp-accounting's Gaussian mechanism (called directly) of multiplier σ·√(t'/m)/(2Δ₂) over the same
    orders at 20 bits (the Skellam terms vanish), more than with all m; a sum of fewer stops the run."""
    dp_accounting = pytest.importorskip("dp_accounting")
    sigma, m, rounds, d = 1.1, 10, 30, 16384
    cases = {(): 6, ("privacy.secagg_threshold=3",): 3, ("privacy.secagg_threshold=3", "train.min_clients=7"): 7,
             ("privacy.secagg_num_shares=5",): 3}  # auto: a majority of the neighbours, ⌊k/2⌋ + 1
    for extra, want in cases.items():
        cfg = _config(m, sigma, 1.0, extra=extra)
        assert flower_dp.survivors(cfg, m) == want, extra
        server = _server(cfg, Randomness("seeded", 0))
        assert server.survivors == want
        server.distributed.modular.dimension = d  # as after a round's combine
        spec = server.distributed.spec
        accountant = dp_accounting.rdp.RdpAccountant(ORDERS)
        l2 = rounded_bound(spec.clip_norm / spec.scale, d) * spec.scale
        accountant.compose(dp_accounting.GaussianDpEvent(sigma * math.sqrt(want / m) / (2 * l2)), rounds)
        assert server.epsilon(rounds) == pytest.approx(accountant.get_epsilon(cfg.privacy.delta), rel=1e-6)
    assert server.epsilon(rounds) > SkellamAccountant(spec, m, cfg.privacy.delta).epsilon(rounds, d)
    reference = {"w": torch.zeros(8)}
    with pytest.raises(RunStopped, match=r"^round 3: distributed DP: 2 client\(s\) in the sum, fewer than the 3 whose"):
        server.round_combine(2, reference, set(), {})([Upload(c, {VECTOR: torch.zeros(8, dtype=torch.int64)}, 1, 1,
                                                              0.1, 0.0) for c in range(2)], None, None)


def test_secret_shares_differ_from_run_to_run_and_no_seed_of_them_is_sent() -> None:
    """Secret: the server's record carries the round's rotation seed and m, no client's noise seed,
    and two nodes' share links of the same update draw different vectors (their own OS entropy);
    seeded, the record carries each of the message's clients' seeds and the vectors repeat."""
    cfg, seeded = _config(4, 1.0, 1.0, "secret"), _config(4, 1.0, 1.0, "seeded")
    reference = {"w": torch.zeros(40)}
    state = {"w": torch.full((40,), 0.05)}
    task = ClientTask(1, 0, reference, {}, 0.1, 4, 40, seeded.seed)  # the stream seed: the codec draws none from it

    def draws(c):
        secret = c.privacy.randomness == "secret"
        content = RecordDict()
        flower_dp.attach(content, _server(c, Randomness("secret" if secret else "seeded", 5)),
                         Randomness("secret" if secret else "seeded", 5), 0, [1, 3])
        record = content[flower_dp.RECORD]
        share = flower_dp.share(content, c, task)
        return record, [share.encode(Upload(1, state, 10, 1, 0.1, 0.0), EncodeContext(reference, set(), {}, None, 0)).state[MESSAGE]
                        for _ in range(2)]

    record, (a, b) = draws(cfg)
    assert list(record["clients"]) == [] and list(record["noise"]) == [] and int(record["per_round"]) == 4
    assert not torch.equal(a, b)
    record, (a, b) = draws(seeded)
    assert list(record["clients"]) == [1, 3] and len(record["noise"]) == 2
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="the train message of round 1 carries no rotation seed"):
        flower_dp.share(RecordDict(), cfg, task)


EXTRA = ["privacy.clip_norm=1.0", "privacy.noise_multiplier=0.7", 'privacy.distributed="skellam"',
         'privacy.randomness="seeded"',  # parity needs the seed's draws (on Flower "auto" is secret)
         "train.min_clients=3"]  # SecAgg+'s threshold of 4 clients: 3, so the same worst case as the embedded run's


def test_parity_with_the_embedded_run_through_messages(tmp_path, monkeypatch):
    """The same seeded configuration on the embedded backend (distributed DP, the plain modular sum)
    and through fedlatent's Flower apps under SecAgg+ (in-process grid, two nodes of two clients):
    the same weights every round to the bit, the same ε and bytes up in every metrics line. What
    travels: each upload one masked vector of Z_{2^20}, each train message the round's record with
    the seeds of its own node's clients alone."""
    pytest.importorskip("dp_accounting", reason="the privacy extra (pip install 'fedlatent[privacy]')")
    grid = Recording(2)
    embedded_rounds = record_globals(monkeypatch)
    embedded = fedlatent.run(config("simulation", EXTRA), tmp_path / "embedded")
    flower_rounds = record_globals(monkeypatch)
    flower = run_experiment(config("flower", [*EXTRA, SECURE]), tmp_path / "flower", echo=None, grid=grid)
    assert_parity(embedded, flower, embedded_rounds, flower_rounds)
    assert all(max(float((a[k] - b[k]).abs().max()) for k in a) == 0 for a, b in zip(embedded_rounds, flower_rounds))
    lines = {name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("embedded", "flower")}
    for key in ("privacy_epsilon", "bytes_up"):
        assert [x[key] for x in lines["flower"]] == [x[key] for x in lines["embedded"]], key
    assert flower["privacy_epsilon"] == embedded["privacy_epsilon"] > 0
    served = {1: [0, 2], 2: [1, 3]}
    for sent, reply in grid.log:
        if sent.metadata.message_type != "train":
            continue
        record = sent.content[flower_dp.RECORD]
        assert list(record["clients"]) == served[sent.metadata.dst_node_id]
        for name in (n for n in reply.content.array_records if n.startswith("weights.")):
            vector = reply.content[name].to_torch_state_dict()[VECTOR]
            assert list(reply.content[name]) == [VECTOR] and 0 <= int(vector.min()) and int(vector.max()) < 2 ** 20


def test_secret_runs_through_messages_draw_their_own_shares_and_report_the_seeded_epsilon(tmp_path, monkeypatch):
    """Flower's default under noise (``randomness = "auto"``: secret): two runs of one configuration
    through the messages complete with different weights (each node's shares from its own entropy,
    the selection and the server's key fresh), the ε of the seeded run (the accountant does not depend
    on the draws), and no train message carries a noise seed."""
    extra = [e for e in EXTRA if "randomness" not in e] + ["train.rounds=2", SECURE]
    grid = Recording(2)
    rounds = record_globals(monkeypatch)
    runs = [run_experiment(config("flower", extra), tmp_path / name, echo=None, grid=g)
            for name, g in (("a", grid), ("b", InProcessGrid(2)))]
    seeded = run_experiment(config("flower", [*extra, 'privacy.randomness="seeded"']), tmp_path / "seeded", echo=None,
                            grid=InProcessGrid(2))
    assert [r["privacy_randomness"] for r in runs] == ["secret", "secret"]
    assert runs[0]["privacy_epsilon"] == runs[1]["privacy_epsilon"] == seeded["privacy_epsilon"] > 0
    assert len(rounds) == 6 and not torch.equal(rounds[1]["classifier.weight"], rounds[3]["classifier.weight"])
    records = [sent.content[flower_dp.RECORD] for sent, _ in grid.log if sent.metadata.message_type == "train"]
    assert records and all(list(r["clients"]) == [] and list(r["noise"]) == [] for r in records)


BAD = {
    "flower without secagg": (['backend="flower"', "data.num_clients=4", 'privacy.distributed="skellam"'],
                              "privacy.distributed = 'skellam' on Flower needs privacy.secure_aggregation = "
                              "'secaggplus'"),
    "central noise under secagg": (['backend="flower"', "data.num_clients=4", SECURE],
                                   "set privacy.distributed = 'skellam' for the clients' own noise shares"),
    "statistics": (['backend="flower"', "data.num_clients=4", *DDP, 'algorithm.name="spherefed"',
                    "privacy.statistics_clip_norm=10"], "privacy.distributed = 'skellam' with "
                                                         "privacy.statistics_clip_norm set"),
    "adaptive": (['backend="flower"', "data.num_clients=4", *DDP, "privacy.target_quantile=0.5",
                  "privacy.clip_count_noise=1"], "privacy.target_quantile set"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_cannot_be_honoured_exits_2_in_one_line_before_any_run_folder(case, tmp_path, capsys):
    overrides, message = BAD[case]
    out = tmp_path / "run"
    args = [a for o in ["train.rounds=1", "privacy.clip_norm=1", "privacy.noise_multiplier=1", *overrides]
            for a in ("--set", o)]
    assert main(["run", str(CONFIG), "--no-progress", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and message in err, err
    assert not out.exists()
