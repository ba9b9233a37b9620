"""After-training classifier calibration run federatedly: clients compute statistics of their
features under the final global encoder, the server solves (FFC) or retrains (CCVR) the head."""
from __future__ import annotations

import torch

from fedlatent.calibration.ccvr import class_statistics, pool_statistics, retrain_classifier, sample_virtual_features
from fedlatent.calibration.ffc import ffc_solve, ffc_statistics
from fedlatent.data.types import Federation, Split
from fedlatent.methods.parts import Calibration, Tensors
from fedlatent.models.base import FedModel


@torch.no_grad()
def features(model: FedModel, split: Split, batch_size: int, device: torch.device) -> torch.Tensor:
    """z of every sample of ``split`` (eval mode), on the CPU."""
    model.eval()
    return torch.cat([model(split.x[i:i + batch_size].to(device)).z.cpu()
                      for i in range(0, len(split), batch_size)]) if len(split) else torch.zeros(0, model.z_dim)


def _head_keys(model: FedModel) -> tuple[str, str | None]:
    bias = "classifier.bias" if model.classifier.bias is not None else None
    return "classifier.weight", bias


def ffc_head(model: FedModel, split: Split, num_classes: int, batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's FFC statistics (V, U) under ``model``'s encoder."""
    return ffc_statistics(features(model, split, batch_size, device).double(), split.y, num_classes)


def ffc(model: FedModel, fed: Federation, state: Tensors, cal: Calibration, batch_size: int,
        device: torch.device) -> Tensors:
    """FFC (SphereFed Sec. 3.3): W* = (Σ V_k + λI)⁻¹ Σ U_k from every client's sums; bias set to 0."""
    model.load_state_dict(state)
    stats = [ffc_head(model, c.train, fed.num_classes, batch_size, device) for c in fed.clients]
    weight_key, bias_key = _head_keys(model)
    out = dict(state)
    out[weight_key] = ffc_solve(stats, ridge=cal.ridge).to(state[weight_key].dtype)
    if bias_key:
        out[bias_key] = torch.zeros_like(state[bias_key])
    return out


def ccvr(model: FedModel, fed: Federation, state: Tensors, cal: Calibration, batch_size: int,
         device: torch.device, generator: torch.Generator) -> Tensors:
    """CCVR (Luo et al. 2021): pool per-class Gaussians of z, sample virtual features, retrain the head."""
    model.load_state_dict(state)
    stats = [class_statistics(features(model, c.train, batch_size, device), c.train.y, fed.num_classes)
             for c in fed.clients]
    mean, cov, count = pool_statistics(stats)
    per_class = torch.where(count > 0, torch.full_like(count, cal.virtual_per_class), torch.zeros_like(count))
    virtual_x, virtual_y = sample_virtual_features(mean, cov, per_class, generator)
    weight_key, bias_key = _head_keys(model)
    weight, bias = retrain_classifier(state[weight_key], state[bias_key] if bias_key else None, virtual_x,
                                      virtual_y, epochs=cal.epochs, lr=cal.lr, batch_size=64, generator=generator)
    out = dict(state)
    out[weight_key] = weight
    if bias_key:
        out[bias_key] = bias
    return out


def centralized(model: FedModel, fed: Federation, state: Tensors, cal: Calibration, batch_size: int,
                device: torch.device, generator: torch.Generator) -> Tensors:
    """The centralised classifier-only baseline (SphereFed Sec. 5.3, Fig. 4's "sanity check"): the
    head retrained with cross-entropy and SGD (``cal.epochs``, ``cal.lr``, batch 64) on the pooled
    real features of every client's training split under the final global encoder — an oracle
    that sees all the data, the upper bound FFC and CCVR are measured against."""
    model.load_state_dict(state)
    z = torch.cat([features(model, c.train, batch_size, device) for c in fed.clients])
    y = torch.cat([c.train.y for c in fed.clients])
    weight_key, bias_key = _head_keys(model)
    weight, bias = retrain_classifier(state[weight_key], state[bias_key] if bias_key else None, z, y,
                                      epochs=cal.epochs, lr=cal.lr, batch_size=64, generator=generator)
    out = dict(state)
    out[weight_key] = weight
    if bias_key:
        out[bias_key] = bias
    return out


def calibrate(model: FedModel, fed: Federation, state: Tensors, cal: Calibration, batch_size: int,
              device: torch.device, generator: torch.Generator) -> Tensors:
    if cal.kind == "ffc":
        return ffc(model, fed, state, cal, batch_size, device)
    if cal.kind == "ccvr":
        return ccvr(model, fed, state, cal, batch_size, device, generator)
    if cal.kind == "centralized":
        return centralized(model, fed, state, cal, batch_size, device, generator)
    return state
