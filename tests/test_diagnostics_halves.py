"""Diagnostics as client halves the server combines: the combined values are those of the pooled
split (moments and hits are sums; float64 references), the uniformity sample is the pooled
subsample, the data figures equal the pooled histograms, and t-SNE's samples are seeded per client."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlatent import load_config
from fedlatent.analysis import diagnostics as dg
from fedlatent.data.types import ClientData, Federation, Split
from fedlatent.federated.diagnostics import (_UNIFORMITY_SAMPLE, Diagnostics, _subsample, combine_statistics, data_record, held_splits,
                                             label_counts, mean_value_counts, mean_value_range, model_statistics,
                                             sample_plan, tsne_features, tsne_record)
from fedlatent.models.mlp import MLP
from fedlatent.seeding import DIAGNOSTICS, derive_seed

CPU = torch.device("cpu")
ALL_FEATURES = {"collapse", "uniformity", "per_class"}
DIGITS_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "digits_fedavg.toml"


def _splits(sizes: list[int], dim: int = 6, num_classes: int = 4, seed: int = 0, shift: float = 0.0) -> list[Split]:
    g = torch.Generator().manual_seed(seed)
    return [Split(torch.randn(n, dim, generator=g, dtype=torch.float64) + shift,
                  torch.randint(0, num_classes, (n,), generator=g)) for n in sizes]


def _model(dim: int = 6, num_classes: int = 4, dtype: torch.dtype = torch.float64) -> MLP:
    torch.manual_seed(3)
    return MLP(dim, [5], num_classes).to(dtype)


@pytest.mark.parametrize("shift", [0.0, 1e4])
def test_pooled_moments_are_the_moments_of_the_pooled_rows(shift: float) -> None:
    parts = [s.x for s in _splits([17, 1, 30, 9], shift=shift)]
    n, mean, scatter = dg.pool_moments([dg.feature_moments(p) for p in parts])
    pooled = torch.cat(parts).numpy()
    centred = pooled - pooled.mean(0)
    assert n == 57
    np.testing.assert_allclose(mean.numpy(), pooled.mean(0), rtol=1e-14)
    np.testing.assert_allclose(scatter.numpy(), centred.T @ centred, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dg.moments_spectrum(n, scatter), dg.covariance_spectrum(torch.cat(parts)),
                               rtol=1e-10, atol=1e-12)
    # another holder order moves only the float rounding
    _, _, reordered = dg.pool_moments([dg.feature_moments(p) for p in reversed(parts)])
    np.testing.assert_allclose(reordered.numpy(), scatter.numpy(), rtol=1e-10, atol=1e-10)


def test_one_part_pools_to_itself_and_no_part_is_refused() -> None:
    part = dg.feature_moments(_splits([8])[0].x)
    assert dg.pool_moments([part]) == part
    with pytest.raises(ValueError, match="at least one part"):
        dg.pool_moments([])


@pytest.mark.parametrize("sizes, cap", [([40, 3, 25], 30), ([40, 3, 25], 1000), ([5, 0, 7], 4)])
def test_sample_plan_is_the_pooled_subsample_in_each_holders_rows(sizes: list[int], cap: int) -> None:
    plan = sample_plan(sizes, cap, seed=9)
    starts = np.cumsum([0, *sizes])[:-1]
    assert all(((p >= 0) & (p < n)).all() for p, n in zip(plan, sizes))
    assert torch.equal(torch.cat([p + int(s) for p, s in zip(plan, starts)]), _subsample(sum(sizes), cap, 9))
    assert sum(len(p) for p in plan) == min(cap, sum(sizes))


def test_combined_statistics_are_the_diagnostics_of_the_pooled_split() -> None:
    splits = _splits([23, 11, 40])
    model = _model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    plan = sample_plan([len(s) for s in splits], 30, seed=2)
    stats = [model_statistics(model, state, s, ALL_FEATURES, 4, p, 8, CPU) for s, p in zip(splits, plan)]
    out = combine_statistics(stats, ALL_FEATURES, 1e-3, 2.0)
    # the pooled features, as each holder computes them, one holder after another
    z, pred = map(torch.cat, zip(*(dg.representations(model, s.x, 8) for s in splits)))
    y = torch.cat([s.y for s in splits])
    expected = dg.collapse(z, 1e-3)
    assert out["num_samples"] == 74 and out["threshold"] == 1e-3
    np.testing.assert_allclose(out["singular_values"], expected["singular_values"], rtol=1e-10, atol=1e-14)
    assert out["significant"] == expected["significant"]
    assert out["effective_rank"] == pytest.approx(expected["effective_rank"], rel=1e-10)
    assert out["uniformity"] == dg.hyperspherical_uniformity(z[_subsample(74, 30, 2)], 2.0)
    assert out["per_class_accuracy"] == dg.per_class_accuracy(pred, y, 4)   # sums of integers: exact
    assert list(out) == ["num_samples", "singular_values", "normalized_spectrum", "significant",
                         "effective_rank", "threshold", "uniformity", "per_class_accuracy"]


def test_a_holder_sends_only_what_the_asked_diagnostics_need() -> None:
    split, model = _splits([12])[0], _model()
    state = model.state_dict()
    assert set(model_statistics(model, state, split, {"per_class"}, 4, torch.arange(3), 8, CPU)) == \
        {"count", "class_correct", "class_count"}
    sent = model_statistics(model, state, split, {"uniformity"}, 4, torch.tensor([1, 5]), 8, CPU)
    assert set(sent) == {"count", "sample"} and sent["sample"].shape == (2, 5)
    torch.testing.assert_close(sent["sample"], model(split.x[[1, 5]]).z)


def test_per_class_hits_sum_to_the_pooled_accuracy_with_absent_classes() -> None:
    pred, y = torch.tensor([0, 1, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1, 3])
    parts = [dg.class_hits(pred[:2], y[:2], 4), dg.class_hits(pred[2:], y[2:], 4)]
    acc = dg.hits_accuracy(parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])
    assert acc[:2] == [2 / 3, 1.0] and acc[3] == 0.0 and math.isnan(acc[2])


def test_data_figures_from_the_clients_halves_equal_the_pooled_histograms() -> None:
    trains = [Split(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0, 1])),
              Split(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long)),
              Split(torch.tensor([[0.0, 2.0], [4.0, 4.0], [4.0, 4.0]]), torch.tensor([2, 2, 0]))]
    edges = dg.histogram_edges([mean_value_range(t) for t in trains], 4)
    record = data_record([label_counts(t, 3) for t in trains], edges, [mean_value_counts(t, edges) for t in trains])
    assert record["label_counts"] == [[1, 1, 0], [0, 0, 0], [1, 0, 2]]
    assert record["mean_value_histogram"] == dg.mean_value_histograms([t.x for t in trains], 4)
    assert record["mean_value_histogram"]["counts"] == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 2]]
    assert dg.histogram_edges([None], 2).tolist() == [0.0, 0.5, 1.0]
    assert dg.histogram_edges([(3.0, 3.0)], 2).tolist() == [3.0, 3.5, 4.0]


def test_tsne_features_are_a_seeded_sample_of_the_class_under_the_state_sent() -> None:
    train, model = _splits([60], num_classes=3)[0], _model(num_classes=3)
    state = model.state_dict()
    a = tsne_features(model, state, train, 1, 5, seed=4, batch_size=8, device=CPU)
    assert a is not None and a.shape == (5, 5)
    assert torch.equal(a, tsne_features(model, state, train, 1, 5, seed=4, batch_size=8, device=CPU))
    rows = torch.nonzero(train.y == 1).flatten()[_subsample(int((train.y == 1).sum()), 5, 4)]
    torch.testing.assert_close(a, model(train.x[rows]).z)
    few = Split(train.x[:3], torch.tensor([1, 0, 0]))
    assert tsne_features(model, state, few, 1, 5, seed=4, batch_size=8, device=CPU) is None
    record = tsne_record({7: a, 2: a[:3]}, {7: "local", 2: "global"}, 1, seed=0)
    assert record["client"] == [2] * 3 + [7] * 5 and record["model_of_client"] == {"2": "global", "7": "local"}


def test_held_splits_are_the_servers_test_set_else_each_clients_own() -> None:
    train, val, test = _splits([10, 4, 6])
    fed = Federation([ClientData(train, val=val), ClientData(train), ClientData(train, val=val)], test, 4, (6,))
    assert held_splits(fed, "test") == [test]
    assert held_splits(fed, "val") == [val, val]
    assert held_splits(fed, "train") == [train] * 3


def test_a_run_on_client_splits_records_the_pooled_values(tmp_path: Path) -> None:
    config = load_config(DIGITS_CONFIG, ['diagnostics.which=["collapse", "uniformity", "per_class", "classifier"]',
                                         'diagnostics.split="train"', "diagnostics.max_samples=50"])
    splits = [Split(s.x.float(), s.y) for s in _splits([30, 14, 25], dim=64, num_classes=10)]
    fed = Federation([ClientData(s) for s in splits], None, 10, (64,))
    model = MLP(64, [16], 10)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    diagnostics = Diagnostics(config, fed, tmp_path / "diagnostics.jsonl")
    diagnostics.start(0)
    diagnostics.record(1, model, state, [])
    line = json.loads((tmp_path / "diagnostics.jsonl").read_text())
    pooled = Split.concat(splits)
    z, pred = dg.representations(model, pooled.x)
    np.testing.assert_allclose(line["singular_values"], dg.covariance_spectrum(z), rtol=1e-5, atol=1e-10)
    assert line["num_samples"] == 69 and line["split"] == "train"
    assert line["uniformity"] == pytest.approx(dg.hyperspherical_uniformity(z[_subsample(69, 50, derive_seed(config.seed, DIAGNOSTICS, _UNIFORMITY_SAMPLE))]))
    assert line["per_class_accuracy"] == [None if math.isnan(a) else a for a in dg.per_class_accuracy(pred, pooled.y, 10)]
    np.testing.assert_allclose(line["classifier_singular_values"], dg.classifier_spectrum(model.classifier.weight))
