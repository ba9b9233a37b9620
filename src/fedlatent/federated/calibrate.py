"""After-training classifier calibration run federatedly: each client computes statistics of its
own features under the global encoder (:func:`client_statistics`, the client half), the server
combines them in client-id order and solves (FFC) or retrains (CCVR, the centralised sanity check)
the head (:func:`apply_statistics`, the server half). The server reads no client's data, only what
the client half sends: sums (FFC) or per-class moments (CCVR), except for the centralised sanity
check, an oracle by design, to which every client sends its features and labels.

Both halves go through the run's update codec: the client's statistics leave through its
``encode_statistics`` (clipped to a bound under DP) and the server sums them with its ``total``
(noise added under DP; unmasked under secure aggregation). When the codec bounds or masks the
statistics (:attr:`~fedlatent.federated.codec.UpdateCodec.statistics_as_sums`), CCVR's clients send
per-class sums (Σ n, Σ z, Σ zzᵀ) instead of moments; when it bounds them, FFC's noisy Σ V is
projected onto the positive semidefinite matrices before the solve."""
from __future__ import annotations

from collections.abc import Callable

import torch

from fedlatent.calibration.ccvr import (class_statistics, class_sums, pool_statistics, pool_sums, retrain_classifier,
                                        sample_virtual_features)
from fedlatent.calibration.ffc import ffc_solve, ffc_statistics
from fedlatent.calibration.psd import nearest_psd
from fedlatent.calibration.registry import calibration_kind
from fedlatent.data.types import Split
from fedlatent.federated.codec import UpdateCodec
from fedlatent.methods.parts import Calibration, Tensors
from fedlatent.models.base import FedModel


@torch.no_grad()
def features(model: FedModel, split: Split, batch_size: int, device: torch.device) -> torch.Tensor:
    """z of every sample of ``split`` (eval mode), on the CPU."""
    model.eval()
    return torch.cat([model(split.x[i:i + batch_size].to(device)).z.cpu()
                      for i in range(0, len(split), batch_size)]) if len(split) else torch.zeros(0, model.z_dim)


def head_keys(model: FedModel) -> tuple[str, str | None]:
    """The state keys of the classifier's weight and bias (None without a bias)."""
    bias = "classifier.bias" if model.classifier.bias is not None else None
    return "classifier.weight", bias


def ffc_head(model: FedModel, split: Split, num_classes: int, batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's FFC statistics (V, U) under ``model``'s encoder, in float64."""
    return ffc_statistics(features(model, split, batch_size, device).double(), split.y, num_classes)


def summed_statistics(kind: str, num_classes: int, dim: int) -> Tensors:
    """Zeros of the shapes a client's statistics have when they travel as sums, by key, as the
    calibration declares them (:mod:`fedlatent.calibration.registry`: FFC's V (l × l) and U (l × C);
    CCVR's per-class count (C), Σ z (C × l) and Σ zzᵀ (C × l × l)): what a server that reads only
    their sum (secure aggregation) lays that sum out as."""
    return {key: torch.zeros(shape) for key, shape in calibration_kind(kind).shapes_as_sums(num_classes, dim).items()}


ClientHalf = Callable[[FedModel, Split, int, int, torch.device, UpdateCodec], Tensors]
# (global state, the clients' statistics, the calibration, (weight key, bias key), generator, codec, release)
ServerHalf = Callable[[Tensors, list[Tensors], Calibration, "tuple[str, str | None]", torch.Generator, UpdateCodec,
                       int], Tensors]


def _ffc_client(model: FedModel, train: Split, num_classes: int, batch_size: int, device: torch.device,
                codec: UpdateCodec) -> Tensors:
    v, u = ffc_head(model, train, num_classes, batch_size, device)
    return codec.encode_statistics({"V": v, "U": u})


def _ccvr_client(model: FedModel, train: Split, num_classes: int, batch_size: int, device: torch.device,
                 codec: UpdateCodec) -> Tensors:
    if codec.statistics_as_sums:
        count, first, second = class_sums(features(model, train, batch_size, device), train.y, num_classes)
        return codec.encode_statistics({"count": count, "first": first, "second": second})
    mean, cov, count = class_statistics(features(model, train, batch_size, device), train.y, num_classes)
    return {"mean": mean, "cov": cov, "count": count}


def _centralized_client(model: FedModel, train: Split, num_classes: int, batch_size: int, device: torch.device,
                        codec: UpdateCodec) -> Tensors:
    return {"z": features(model, train, batch_size, device), "y": train.y}


def _ffc_server(out: Tensors, stats: list[Tensors], cal: Calibration, keys: tuple[str, str | None],
                generator: torch.Generator, codec: UpdateCodec, release: int) -> Tensors:
    weight_key, bias_key = keys
    summed = codec.total(stats, release)
    v = summed["V"] if codec.statistics_bound is None else nearest_psd(summed["V"])
    out[weight_key] = ffc_solve((v, summed["U"]), ridge=cal.ridge).to(out[weight_key].dtype)
    if bias_key:
        out[bias_key] = torch.zeros_like(out[bias_key])
    return out


def _retrained(out: Tensors, x: torch.Tensor, y: torch.Tensor, cal: Calibration, keys: tuple[str, str | None],
               generator: torch.Generator) -> Tensors:
    """``out`` with its head retrained on features ``x`` and labels ``y`` (CCVR's and the centralised)."""
    weight_key, bias_key = keys
    out[weight_key], bias = retrain_classifier(
        out[weight_key], out[bias_key] if bias_key else None, x, y,
        epochs=cal.epochs, lr=cal.lr, batch_size=64, generator=generator, loss=cal.loss)
    if bias_key:
        out[bias_key] = bias
    return out


def _ccvr_server(out: Tensors, stats: list[Tensors], cal: Calibration, keys: tuple[str, str | None],
                 generator: torch.Generator, codec: UpdateCodec, release: int) -> Tensors:
    mean, cov, count = pooled_classes(stats, codec, release, out[keys[0]].dtype)
    per_class = torch.where(count > 0, torch.full_like(count, cal.virtual_per_class), torch.zeros_like(count))
    x, y = sample_virtual_features(mean, cov, per_class, generator)
    return _retrained(out, x, y, cal, keys, generator)


def _centralized_server(out: Tensors, stats: list[Tensors], cal: Calibration, keys: tuple[str, str | None],
                        generator: torch.Generator, codec: UpdateCodec, release: int) -> Tensors:
    x, y = torch.cat([s["z"] for s in stats]), torch.cat([s["y"] for s in stats])
    return _retrained(out, x, y, cal, keys, generator)


# each registered calibration's (client half, server half); none's are absent: it sends and changes nothing
HALVES: dict[str, tuple[ClientHalf, ServerHalf] | None] = {
    "none": None, "ffc": (_ffc_client, _ffc_server), "ccvr": (_ccvr_client, _ccvr_server),
    "centralized": (_centralized_client, _centralized_server)}


def client_statistics(model: FedModel, global_state: Tensors, train: Split, cal: Calibration, batch_size: int,
                      device: torch.device, codec: UpdateCodec | None = None) -> Tensors:
    """The client half: what this client sends for calibration, from its training split under the
    global model, as the run's ``codec`` encodes it (the plain codec by default), under the keys the
    calibration declares (:mod:`fedlatent.calibration.registry`). FFC (SphereFed Sec. 3.3): V = ZᵀZ
    and U = Zᵀ onehot(y) in float64; CCVR (Luo et al. 2021, Eq. 3-4): per-class count, mean and
    unbiased covariance of z, or, when the codec bounds or masks the statistics, per-class sums
    (:func:`~fedlatent.calibration.ccvr.class_sums`); the centralised baseline: the features and
    labels themselves (an oracle that sees every client's data)."""
    codec = codec or UpdateCodec()
    model.load_state_dict(global_state)
    halves = HALVES[cal.declared.name]
    if halves is None:
        return {}
    return halves[0](model, train, model.classifier.weight.shape[0], batch_size, device, codec)


def apply_statistics(global_state: Tensors, stats: list[Tensors], cal: Calibration, weight_key: str,
                     bias_key: str | None, generator: torch.Generator, codec: UpdateCodec | None = None,
                     release: int = 0) -> Tensors:
    """The server half: the global state with its head calibrated from the clients' statistics
    (``stats`` in client-id order, so the sums do not depend on reply order). FFC:
    W* = (Σ V_k + λI)⁻¹ Σ U_k, bias set to 0; CCVR: per-class Gaussians pooled, virtual features
    sampled from ``generator``, the head retrained on them; centralised (SphereFed Sec. 5.3,
    Table 4's sanity check): the head retrained with SGD (``cal.epochs``, ``cal.lr``, batch 64) on the
    pooled real features, the upper bound FFC and CCVR are measured against. Both retrain with
    ``cal.loss``: cross-entropy, or MSE (the paper's sanity check reports the better of the two).
    FFC's sums are the run's update ``codec``'s :meth:`~fedlatent.federated.codec.UpdateCodec.total`
    (the plain sums by default), the point where secure aggregation and DP noise plug in, as are
    CCVR's when the codec bounds or masks the statistics (``release``: which of the run's calibrations this
    is, for the codec's noise). Under a bound, FFC solves with Σ V made positive semidefinite
    (:func:`~fedlatent.calibration.psd.nearest_psd`) and ``cal.ridge``; CCVR pools the noisy sums
    (:func:`~fedlatent.calibration.ccvr.pool_sums`, its covariances projected alike)."""
    codec = codec or UpdateCodec()
    halves = HALVES[cal.declared.name]
    if halves is None:
        return dict(global_state)
    return halves[1](dict(global_state), stats, cal, (weight_key, bias_key), generator, codec, release)


def pooled_classes(stats: list[Tensors], codec: UpdateCodec, release: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CCVR's pooled per-class (mean, covariance, count): from the clients' moments
    (:func:`~fedlatent.calibration.ccvr.pool_statistics`), or, when the ``codec`` bounds or masks
    the statistics, from their sums as its ``total`` gives them (noisy under DP, unmasked under
    secure aggregation) in ``dtype``."""
    if not codec.statistics_as_sums:
        return pool_statistics([(s["mean"], s["cov"], s["count"]) for s in stats])
    summed = codec.total(stats, release)
    return pool_sums(summed["count"], summed["first"], summed["second"], dtype=dtype)
