"""SecAgg+ on the Flower backend (``backends/flower/secagg*.py``): the protocol's arithmetic party
by party (the unmasked sum is the sum of the quantised vectors, bit for bit, with parties dropping
out at each stage), CCVR's per-class sums through the codecs (pooled within the quantisation error
of the clear sums), then runs through fedlatent's messages on the in-process grid — FedAvg within
the quantisation error of the plain Flower run, FFC's head within 1e-4 of FFC in the clear, CCVR's
pooled statistics within the quantisation error of CCVR in the clear, a node lost after sharing its
keys, too few survivors, what each node and the server get to see — and the settings refused in one
line before any run folder exists."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed (pip install 'fedlatent[flower]')")

from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt  # noqa: E402
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat  # noqa: E402

from fedlatent.backends.flower import secagg_codec  # noqa: E402
from fedlatent.calibration.ccvr import class_sums, pool_sums, sample_virtual_features  # noqa: E402
from fedlatent.backends.flower.secagg import (Party, Reconstruction, dequantize, mask_total, neighbours,  # noqa: E402
                                              quantize, shortfall)
from fedlatent.cli import main  # noqa: E402
from fedlatent.errors import RunStopped  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from fedlatent.federated import calibrate, driver  # noqa: E402
from fedlatent.federated.codec import UpdateCodec  # noqa: E402
from tests.flower_procs import InProcessGrid  # noqa: E402
from tests.test_flower import config, max_diff, record_globals  # noqa: E402

SECURE = 'privacy.secure_aggregation="secaggplus"'


# the protocol, party by party -------------------------------------------------------------------
def session(values: dict[int, np.ndarray], threshold: int, *, shares: int | None = None, lost_keys=(),
            lost_after_sharing=(), silent_at_unmask=()) -> tuple[np.ndarray, Reconstruction]:
    """One session among the parties of ``values`` (uint64 vectors), run as the server runs it: the
    parties in ``lost_keys`` never send keys, those in ``lost_after_sharing`` share theirs and send
    no vector, those in ``silent_at_unmask`` send their vector and reveal nothing. Returns the sum
    of the vectors that arrived, unmasked, and what the server knew."""
    ids = sorted(values)
    graph = neighbours(ids, shares or len(ids), np.random.default_rng(0))
    parties = {c: Party.new(c, "s", threshold) for c in ids if c not in lost_keys}
    public = {c: (p.pk1, p.pk2) for c, p in parties.items()}
    sent = {c: p.share("s", {n: public[n] for n in sorted(graph[c] & set(public))}) for c, p in parties.items()}
    inbox: dict[int, dict[int, bytes]] = {c: {} for c in sent}
    for src, out in sent.items():
        for dst, ciphertext in out.items():
            if dst in inbox:
                inbox[dst][src] = ciphertext
    masked = {c: parties[c].mask("s", inbox[c], values[c]) for c in sent if c not in lost_after_sharing}
    active, dropped = set(masked), set(sent) - set(masked)
    revealed: dict[int, list[bytes]] = {}
    for c in sorted(active - set(silent_at_unmask)):
        for owner, share in parties[c].reveal("s", sorted(graph[c] & active), sorted(graph[c] & dropped)).items():
            revealed.setdefault(owner, []).append(share)
    known = Reconstruction(graph, {c: k[0] for c, k in public.items()}, set(sent), active, revealed)
    total = np.sum(list(masked.values()), axis=0, dtype=np.uint64)
    if shortfall(known, threshold) is None:
        total = total - mask_total(known, threshold, total.size)
    return total, known


def vectors(ids, size=50, seed=1) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: quantize(rng.uniform(-8, 8, size), 8.0, 2 ** 40, rng) for c in ids}


def exact_sum(values: dict[int, np.ndarray], ids) -> np.ndarray:
    return np.sum([values[c] for c in ids], axis=0, dtype=np.uint64)


def test_the_unmasked_sum_is_the_sum_of_the_vectors_bit_for_bit():
    values = vectors(range(5))
    total, known = session(values, threshold=3)
    assert np.array_equal(total, exact_sum(values, range(5)))
    masked = Party.new(0, "t", 2)
    assert masked.pk1 != Party.new(0, "t", 2).pk1  # fresh keys: from the system's entropy, not the run's seed


@pytest.mark.parametrize("case", ["one lost after sharing", "two neighbours lost after sharing",
                                  "lost before sharing", "silent at unmasking", "sparse graph"])
def test_dropouts_leave_the_exact_sum_of_the_others(case):
    """Parties lost after sharing their keys are reconstructed from the survivors' shares (their
    pairwise masks taken off, two adjacent ones included); a party lost before sharing was never
    masked with; one silent at unmasking is rebuilt from the others' shares; SecAgg+'s sparse
    graph (3 neighbours of 7) likewise."""
    ids = list(range(7)) if case == "sparse graph" else list(range(5))
    values = vectors(ids)
    kwargs = {"one lost after sharing": {"lost_after_sharing": [2]},
              "two neighbours lost after sharing": {"lost_after_sharing": [1, 2]},
              "lost before sharing": {"lost_keys": [4]},
              "silent at unmasking": {"silent_at_unmask": [0]},
              "sparse graph": {"shares": 3, "lost_after_sharing": [3]}}[case]
    total, known = session(values, threshold=2, **kwargs)
    assert np.array_equal(total, exact_sum(values, sorted(known.active)))
    assert sorted(known.active) == [c for c in ids if c not in kwargs.get("lost_after_sharing", [])
                                    and c not in kwargs.get("lost_keys", [])]


def test_too_few_shares_name_the_party_whose_secret_is_lost():
    _, known = session(vectors(range(4)), threshold=3, lost_after_sharing=[0], silent_at_unmask=[1, 2])
    assert shortfall(known, 3) == ("client 0's pairwise masks (it dropped out after sharing its keys): 1 share(s) "
                                   "revealed, fewer than the threshold t = 3")


def test_a_party_follows_the_stages_and_never_reveals_both_secrets_of_one_neighbour():
    a, b = Party.new(0, "s", 2), Party.new(1, "s", 2)
    public = {0: (a.pk1, a.pk2), 1: (b.pk1, b.pk2)}
    with pytest.raises(ValueError, match="stage 'keys' of session 's', not 'shared' of 's'"):
        a.mask("s", {}, np.zeros(3, np.uint64))
    with pytest.raises(ValueError, match="not 'keys' of 'other'"):
        a.share("other", public)
    a.share("s", public)
    from_b = b.share("s", public)
    back = Party.from_record(a.to_record())  # as a node's context keeps it between messages
    assert back == a
    back.mask("s", {1: from_b[0]}, np.zeros(3, np.uint64))
    with pytest.raises(ValueError, match="reveal both secrets"):
        back.reveal("s", [0, 1], [1])
    with pytest.raises(ValueError, match="would let one share reveal"):
        Party.new(2, "s", 1)
    forged = encrypt(a._channel(1), share_keys_plaintext_concat(5, 1, b"x", b"y"))  # names another sender
    with pytest.raises(ValueError, match="got a share from 5 to 1 as one from 0"):
        b.mask("s", {0: forged}, np.zeros(1, np.uint64))


def test_the_sparse_graph_is_symmetric_seeded_and_k_regular():
    graph = neighbours(range(9), 5, np.random.default_rng(3))
    assert all(len(n) == 5 and c in n for c, n in graph.items())
    assert all(c in graph[n] for c, ns in graph.items() for n in ns)
    assert graph == neighbours(range(9), 5, np.random.default_rng(3))
    assert all(n == set(range(4)) for n in neighbours(range(4), 7, np.random.default_rng(0)).values())


def test_quantisation_is_within_one_step_and_signed():
    """Stochastic rounding to the grid of step 2R / levels: each value within one step, negative
    values through two's complement, a sum of m vectors within m steps, the rounding unbiased; a
    value outside [−R, R] refused (not clipped)."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (3, 1000))
    step = 2 * 2.0 / 2 ** 16
    q = [quantize(row, 2.0, 2 ** 16, rng) for row in x]
    assert np.abs(dequantize(q[0], 2.0, 2 ** 16) - x[0]).max() < step
    summed = np.sum(q, axis=0, dtype=np.uint64)
    assert np.abs(dequantize(summed, 2.0, 2 ** 16) - x.sum(0)).max() < 3 * step
    with pytest.raises(ValueError, match=r"an entry of magnitude 2.5 lies outside the quantisation's range \[-2, 2\]"):
        quantize(np.array([1.0, -2.5]), 2.0, 2 ** 16, rng)
    draws = np.array([dequantize(quantize(np.array([0.3 * step]), 2.0, 2 ** 16, rng), 2.0, 2 ** 16)[0]
                      for _ in range(4000)])
    assert set(np.round(draws / step, 6)) == {0.0, 1.0} and abs(draws.mean() / step - 0.3) < 0.05  # unbiased


# CCVR's per-class sums through the codecs ------------------------------------------------------
def through_the_codecs(stats: dict[int, dict[str, torch.Tensor]], total: int, bound: float,
                       levels: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Each client's statistics through its :class:`MaskingCodec` (one party of a session among all of
    them, its rounding drawn from seed 0) and their sum through :class:`UnmaskingCodec`, as the
    server reads it: the uploads and the sum."""
    ids, threshold = sorted(stats), 2
    parties = {c: Party.new(c, "s", threshold) for c in ids}
    public = {c: (p.pk1, p.pk2) for c, p in parties.items()}
    inbox: dict[int, dict[int, bytes]] = {c: {} for c in ids}
    for src, party in parties.items():
        for dst, ciphertext in party.share("s", public).items():
            inbox[dst][src] = ciphertext
    uploads = []
    for c in ids:
        masking = secagg_codec.Masking("statistics", parties[c], "s", inbox[c], bound, levels,
                                       secagg_codec.rounding(0, "statistics", 0, c))
        codec = secagg_codec.MaskingCodec(UpdateCodec(), masking, total)
        assert codec.statistics_as_sums
        uploads.append(codec.encode_statistics(stats[c]))
    revealed: dict[int, list[bytes]] = {}
    for c in ids:
        for owner, share in parties[c].reveal("s", ids, []).items():
            revealed.setdefault(owner, []).append(share)
    known = Reconstruction({c: set(ids) for c in ids}, {c: k[0] for c, k in public.items()}, set(ids), set(ids),
                           revealed)
    size = uploads[0]["secagg"].numel()
    num_classes, dim = stats[ids[0]]["first"].shape
    entries = secagg_codec.layout(calibrate.summed_statistics("ccvr", num_classes, dim))
    server = secagg_codec.UnmaskingCodec(levels)
    server.expect("statistics", lambda clients: secagg_codec.Unmasking(ids, mask_total(known, threshold, size),
                                                                      entries, bound, float(total)))
    return uploads, server.total(uploads, 0)


def test_ccvr_sums_pooled_through_the_codecs_are_the_clear_ones_within_the_quantisation_error():
    """Three clients' per-class sums (N_c, Σ z, Σ zzᵀ) divided by T, quantised on a coarse grid
    (δ = 2R / L, R = 1, L = 2^24) and masked: each upload one vector of C + Cl + Cl² entries of
    Z_{2^64} (mostly beyond the grid's L / 2: masked), and the unmasked sums within E = m·δ·T of the
    clear ones (each of the m clients off by less than one step, times T). Pooled by ``pool_sums``:
    the counts exact, each mean within E(1 + |μ|) / (N − E), each covariance entry within
    E(3(1 + |μ|)² + |Σ|) / (N − 1 − E) (|μ|, |Σ|: the class's largest entries); the virtual features
    of one seeded generator within the mean's bound plus ‖ΔΣ^(1/2)‖₂ · ‖ε‖, ‖ΔΣ^(1/2)‖₂ at most
    l · (covariance bound) / √λ_min(Σ) (the symmetric root's Lipschitz bound)."""
    rng = torch.Generator().manual_seed(3)
    num_classes, dim, bound, levels = 3, 4, 1.0, 2 ** 24
    stats, sizes = {}, (150, 210, 90)
    for c, n in enumerate(sizes):
        z = 0.3 * torch.randn(n, dim, generator=rng, dtype=torch.float64) + 0.1 * c
        y = torch.randint(0, num_classes, (n,), generator=rng)
        count, first, second = class_sums(z, y, num_classes)
        stats[c] = {"count": count, "first": first, "second": second}
    total = sum(sizes)
    uploads, summed = through_the_codecs(stats, total, bound, levels)
    size = num_classes * (1 + dim + dim * dim)
    for upload in uploads:
        assert list(upload) == ["secagg"] and upload["secagg"].dtype == torch.int64 and upload["secagg"].numel() == size
        assert float((upload["secagg"].abs() > levels // 2).double().mean()) > 0.9
    clear = {key: sum(s[key] for s in stats.values()) for key in ("count", "first", "second")}
    e = len(sizes) * (2 * bound / levels) * total
    for key in clear:
        diff = float((summed[key] - clear[key]).abs().max())
        assert 0 < diff <= e, key
    mean, cov, count = pool_sums(clear["count"], clear["first"], clear["second"], dtype=torch.float64)
    mean_q, cov_q, count_q = pool_sums(summed["count"], summed["first"], summed["second"], dtype=torch.float64)
    assert torch.equal(count, count_q)
    n = count.double()
    mu, sigma = mean.abs().amax(1), cov.abs().amax((1, 2))
    mean_bound = e * (1 + mu) / (n - e)
    cov_bound = e * (3 * (1 + mu) ** 2 + sigma) / (n - 1 - e)
    assert torch.all((mean_q - mean).abs().amax(1) <= mean_bound)
    assert torch.all((cov_q - cov).abs().amax((1, 2)) <= cov_bound)
    x, labels = sample_virtual_features(mean, cov, 40, torch.Generator().manual_seed(5))
    x_q, labels_q = sample_virtual_features(mean_q, cov_q, 40, torch.Generator().manual_seed(5))
    eps = torch.randn(3 * 40, dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    root = dim * cov_bound / torch.linalg.eigvalsh(cov)[:, 0].sqrt()
    sample_bound = (mean_bound + root * float(eps.norm(dim=1).max()))[labels]
    assert torch.equal(labels, labels_q) and torch.all((x_q - x).abs().amax(1) <= sample_bound)


# through the messages ---------------------------------------------------------------------------
class Recording(InProcessGrid):
    """An in-process grid that keeps every message sent and every reply, by node."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        by_id = {m.metadata.message_id: m for m in messages}
        self.log += [(by_id[r.metadata.reply_to_message_id], r) for r in replies]
        return replies


def named_clients(content) -> set[int]:
    """The client ids a message's or a reply's per-client records name."""
    return {int(name.rpartition(".")[2]) for name in [*content.array_records, *content.config_records]
            if name.rpartition(".")[2].isdigit()}


def test_fedavg_through_secagg_is_the_plain_run_within_the_quantisation_error(tmp_path, monkeypatch):
    """A coarse grid (range 1, 2^20 levels: step 2 / 2^20): after round 1 every weight is within
    m · step of the plain Flower run's (m = 4 clients, each off by at most one step; every client
    replied, so T / Σ n_k = 1), and the quantisation shows. What travels: a node is sent only its
    own clients' tasks and shares, and the clients' uploads and statistics reach the server only
    as masked vectors (no client state)."""
    coarse = ["train.rounds=1", "privacy.secagg_update_range=1.0", "privacy.secagg_quantization_range=1048576"]
    plain_rounds = record_globals(monkeypatch)
    run_experiment(config("flower", coarse), tmp_path / "plain", echo=None, grid=InProcessGrid(2))
    secure_rounds = record_globals(monkeypatch)
    grid = Recording(2)
    run_experiment(config("flower", [*coarse, SECURE]), tmp_path / "secure", echo=None, grid=grid)
    step, m = 2 * 1.0 / 2 ** 20, 4
    diff = max_diff(plain_rounds[0], secure_rounds[0])
    assert step / 100 < diff <= m * step + 1e-7
    served = {1: {0, 2}, 2: {1, 3}}
    kinds = set()
    for sent, reply in grid.log:
        node, kind = sent.metadata.dst_node_id, sent.metadata.message_type
        kinds.add(kind)
        assert named_clients(sent.content) <= served[node] and named_clients(reply.content) <= served[node], kind
        if kind == "train":
            uploads = [name for name in reply.content.array_records if not name.startswith("extra.")]
            assert uploads and all(name.startswith("weights.") for name in uploads)  # no "state.<client>"
            assert all(list(reply.content[name]) == ["secagg"] for name in uploads)
    assert kinds >= {"query.secagg_keys", "query.secagg_shares", "train", "query.secagg_unmask"}


def test_an_update_outside_its_range_fails_its_client_naming_the_setting(tmp_path):
    with pytest.raises(RunStopped, match=r"^round 1, client 0: ValueError: SecAgg\+: an entry of .* lies outside the "
                                         r"quantisation's range \[-1e-09, 1e-09\] \(privacy.secagg_update_range\)"):
        run_experiment(config("flower", [SECURE, "privacy.secagg_update_range=1e-9"]), tmp_path / "run", echo=None,
                       grid=InProcessGrid(2))


def calibrated_heads(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """The heads FFC solves from now on (``driver.apply_statistics``'s results)."""
    heads: list[dict[str, torch.Tensor]] = []
    real = driver.apply_statistics

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        heads.append({k: v.clone() for k, v in out.items() if k.startswith("classifier.")})
        return out

    monkeypatch.setattr(driver, "apply_statistics", spy)
    return heads


def test_ffc_under_secagg_is_ffc_in_the_clear_within_1e_4(tmp_path, monkeypatch):
    """SphereFed + FFC (calibrated every round and at the end) with the default grid: each solved
    head within 1e-4 of the one solved from the plain sums, the same accuracies; the masked
    statistics weigh what the plain ones do (8 bytes an entry)."""
    extra = ['algorithm.name="spherefed"', "algorithm.ffc_every=1", "train.rounds=2"]
    heads = calibrated_heads(monkeypatch)
    clear = run_experiment(config("flower", extra), tmp_path / "clear", echo=None, grid=InProcessGrid(2))
    secure = run_experiment(config("flower", [*extra, SECURE]), tmp_path / "secure", echo=None, grid=InProcessGrid(2))
    assert len(heads) == 6
    clear_heads, secure_heads = heads[:3], heads[3:]
    for ours, theirs in zip(clear_heads, secure_heads):
        assert 0 < max_diff(ours, theirs) <= 1e-4
    assert secure["final"]["accuracy"] == pytest.approx(clear["final"]["accuracy"], abs=1e-9)
    assert secure["final"]["bytes_calibration_up"] == clear["final"]["bytes_calibration_up"]


def test_ccvr_under_secagg_is_ccvr_in_the_clear_within_the_quantisation_error(tmp_path, monkeypatch):
    """CCVR after one round on a coarse grid (L = 2^20 levels; statistics' range R = 1: δ = 2 / 2^20):
    the per-class Gaussians the server pools from the unmasked sums within the bounds of the test
    above (E = m·δ·T, m = 4 clients, T their training samples; plus 1e-6 for the float32 they are
    returned in) of ``pool_sums`` of the clients' clear sums, which the clients computed and never
    sent; the counts exact. Against CCVR in the clear: the retrained head within 1e-3 (the round's
    update is quantised too, and SGD on the virtual features is not bounded by a formula: 4e-5
    observed) and the same accuracy. The statistics reach the server as masked vectors alone: no
    mean, covariance or count."""
    extra = ['algorithm.name="ccvr"', "algorithm.ccvr_epochs=2", "train.rounds=1"]
    coarse = ["privacy.secagg_statistics_range=1.0", "privacy.secagg_quantization_range=1048576"]
    heads = calibrated_heads(monkeypatch)
    clear = run_experiment(config("flower", extra), tmp_path / "clear", echo=None, grid=InProcessGrid(2))
    pooled: list[tuple[torch.Tensor, ...]] = []
    sums: list[tuple[torch.Tensor, ...]] = []
    real_pooled, real_sums = calibrate.pooled_classes, calibrate.class_sums
    monkeypatch.setattr(calibrate, "pooled_classes", lambda *a: pooled.append(real_pooled(*a)) or pooled[-1])
    monkeypatch.setattr(calibrate, "class_sums", lambda *a: sums.append(real_sums(*a)) or sums[-1])
    grid = Recording(2)
    secure = run_experiment(config("flower", [*extra, *coarse, SECURE]), tmp_path / "secure", echo=None, grid=grid)
    assert len(sums) == 4 and len(pooled) == 1
    mean, cov, count = pool_sums(*(sum(s[i] for s in sums) for i in range(3)), dtype=torch.float64)
    mean_q, cov_q, count_q = (t.double() for t in pooled[0])
    assert torch.equal(count, count_q)
    n = count.double()
    e = 4 * (2 / 2 ** 20) * float(n.sum())
    mu, sigma = mean.abs().amax(1), cov.abs().amax((1, 2))
    mean_diff, cov_diff = (mean_q - mean).abs().amax(1), (cov_q - cov).abs().amax((1, 2))
    assert torch.all(mean_diff <= e * (1 + mu) / (n - e) + 1e-6) and float(mean_diff.max()) > 1e-6
    assert torch.all(cov_diff <= e * (3 * (1 + mu) ** 2 + sigma) / (n - 1 - e) + 1e-6)
    assert len(heads) == 2 and 0 < max_diff(*heads) <= 1e-3
    assert secure["final"]["accuracy"] == pytest.approx(clear["final"]["accuracy"], abs=1e-9)
    replies = [reply for sent, reply in grid.log if sent.metadata.message_type == "query.statistics"]
    names = [name for reply in replies for name in reply.content.array_records]
    assert sorted(names) == [f"stats.{c}" for c in range(4)]
    assert all(list(reply.content[name]) == ["secagg"] for reply in replies for name in reply.content.array_records)


class GoesSilent(InProcessGrid):
    """Node 2 answers until it has sent its round-1 shares (``after``), then never again."""

    def __init__(self, after: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.after = after

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if any(m.metadata.message_type == self.after for m in messages):
            self.silent.add(2)
        return replies


def test_a_node_lost_after_sharing_its_keys_leaves_the_sum_of_the_others(tmp_path, monkeypatch):
    """Node 2 (clients 1 and 3) is lost once it has sent its clients' key shares in round 1: their
    pairwise masks are rebuilt from clients 0 and 2's shares, the round averages clients 0 and 2,
    and the later rounds go on without node 2 — as the plain run with node 2 lost from round 1's
    training on, within the quantisation."""
    extra = ['train.on_client_error="drop"', 'eval.personalized="never"', "privacy.secagg_threshold=2"]
    plain_rounds = record_globals(monkeypatch)
    run_experiment(config("flower", extra), tmp_path / "plain", echo=None, grid=GoesSilent("query.census", 2))
    secure_rounds = record_globals(monkeypatch)
    run_experiment(config("flower", [*extra, SECURE]), tmp_path / "secure", echo=None,
                   grid=GoesSilent("query.secagg_shares", 2))
    lines = [json.loads(x) for x in (tmp_path / "secure" / "metrics.jsonl").read_text().splitlines()]
    assert [x["clients"] for x in lines] == [[0, 2]] * 3
    assert [d["client"] for d in lines[0]["dropped"]] == [1, 3]
    assert "no reply within flower.timeout" in lines[0]["dropped"][0]["detail"]
    assert "did not share its keys" in lines[1]["dropped"][0]["detail"]
    assert len(secure_rounds) == 3 and max(max_diff(a, b) for a, b in zip(plain_rounds, secure_rounds)) <= 1e-6


def test_fewer_survivors_than_the_threshold_stop_the_round(tmp_path):
    """With the default threshold (3 of 4 clients), losing node 2 after the key shares leaves 2
    masked updates: the round stops, saying so, with a summary."""
    with pytest.raises(RunStopped, match=r"^round 1: secure aggregation stopped: 2 client\(s\) sent their masked "
                                         r"vector, fewer than the threshold t = 3 \(privacy.secagg_threshold\)"):
        run_experiment(config("flower", ['train.on_client_error="drop"', SECURE]), tmp_path / "run", echo=None,
                       grid=GoesSilent("query.secagg_shares", 2))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and "fewer than the threshold" in summary["stop_reason"]


def test_the_server_codec_refuses_a_sum_it_was_not_told_how_to_unmask():
    codec = secagg_codec.UnmaskingCodec(2 ** 32)
    with pytest.raises(ValueError, match="no session of the protocol can unmask"):
        codec.total([{"secagg": torch.zeros(3, dtype=torch.int64)}], 0)


# refusals ---------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
FLOWER = ['backend="flower"', "data.num_clients=4", SECURE]
BAD = {
    "embedded backend": ([SECURE, 'backend="simulation"'], "honoured on backend = 'flower' only, not 'simulation'"),
    "fewer clients than the threshold": ([*FLOWER, "privacy.secagg_threshold=5"],
                                         "the 4 clients sampled per round: its threshold t = 5 is more than"),
    "one client a round": ([*FLOWER, "train.participation=0.25"], "at least 2 parties (clients) in a session, not 1"),
    "threshold one": ([*FLOWER, "privacy.secagg_threshold=1"], "privacy.secagg_threshold = 1: one share"),
    "even shares": ([*FLOWER, "privacy.secagg_num_shares=4"], "privacy.secagg_num_shares = 4: an odd number"),
    "threshold above the shares": ([*FLOWER, "privacy.secagg_num_shares=3", "privacy.secagg_threshold=4"],
                                   "more than the privacy.secagg_num_shares = 3"),
    "scaffold": ([*FLOWER, 'algorithm.name="scaffold"'], "part 'scaffold' uploads extras"),
    "fednova": ([*FLOWER, 'algorithm.name="fednova"'], "part 'fednova' aggregates with weights of its own"),
    "centralized calibration": ([*FLOWER, 'algorithm.calibration="centralized"'],
                                "the centralized calibration's statistics are not sums (FFC's and CCVR's are)"),
    "noise": ([*FLOWER, "privacy.clip_norm=1", "privacy.noise_multiplier=1"], "not combined with"),
    "client diagnostics": ([*FLOWER, 'diagnostics.which=["collapse"]', "diagnostics.clients=true"],
                           "each client's own upload"),
    "unknown protocol": (['privacy.secure_aggregation="secagg"'], "privacy.secure_aggregation"),
    "server reads the data": ([*FLOWER, "flower.server_reads_data=true"], "flower.server_reads_data = true"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_secure_aggregation_setting_exits_2_in_one_line_before_any_run_folder(case, tmp_path, capsys):
    overrides, message = BAD[case]
    out = tmp_path / "run"
    args = [a for o in ["train.rounds=1", *overrides] for a in ("--set", o)]
    assert main(["run", str(ROOT / "configs" / "digits_fedavg.toml"), "--no-progress", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and message in err, err
    assert not out.exists()


def test_a_threshold_above_the_clients_the_census_counts_exits_2_in_one_line_and_leaves_no_run_folder(
        tmp_path, capsys, monkeypatch):
    """One client per domain, counted only by the nodes' census (the server opens no data): a
    threshold above the three clients stops the run right after the census — exit 2, one line, no
    run folder left, no SecAgg+ stage begun."""
    from fedlatent.experiment.runner import single
    from tests.data.test_image_folder import _solid_tree
    _solid_tree(tmp_path / "tree", {"art": {"dog": 6, "house": 5}, "photo": {"dog": 5, "house": 6},
                                    "sketch": {"dog": 7, "house": 4}})
    grid = InProcessGrid(3)
    monkeypatch.setattr(single, "_backend_args", lambda config, _grid, trainer: {"grid": grid})
    out = tmp_path / "run"
    overrides = ['backend="flower"', 'data.dataset="domains"', 'data.partition="domains"',
                 f'data.root="{tmp_path / "tree"}"', "data.num_clients=auto", "train.rounds=1", SECURE,
                 "privacy.secagg_threshold=4"]
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["run", str(ROOT / "configs" / "digits_fedavg.toml"), "--no-progress", *args, "--out", str(out)]) == 2
    # the in-process nodes tell where their images come from (a deployment's nodes, in their own logs)
    err = "\n".join(line for line in capsys.readouterr().err.strip().splitlines() if "the domain folders" not in line)
    assert "\n" not in err and "Traceback" not in err, err
    assert ("privacy.secure_aggregation with the 3 clients sampled per round: its threshold t = 4 is more than the 3 "
            "share holders") in err
    assert not out.exists()
    assert set(grid.sent) == {"query.census"}
