"""What a local fine-tuning at evaluation trains: every parameter, or the classifier alone on a
fixed feature extractor.

FedBABU (Oh et al., ICLR 2022) fine-tunes the whole model, the head it kept fixed during training
included; SphereFed's personalised "Ours (SGD)" (Dong et al., ECCV 2022, Appendix B) keeps the
global feature extractor fixed and fine-tunes only the classifier. A fixed extractor stays fixed in
its BatchNorm statistics too: its modules run in eval mode while the head trains. A client that
keeps its own BatchNorm layers (FedBN) and never trained re-estimates their statistics on its data
(:func:`batchnorm_statistics`).
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

import torch

from fedlatent.data.types import Split
from fedlatent.models.base import FedModel

SCOPES = ("all", "head")


def finetuned_names(model: FedModel, scope: str | Collection[str], head_bias: bool) -> set[str]:
    """The parameters a fine-tuning of ``scope`` trains — every one, the head's, or those named (a new
    client's own layers, ``data.holdout_clients``); a head without bias (``head_bias`` False,
    SphereFed) keeps its zero bias."""
    if not isinstance(scope, str):
        return set(scope)
    head = {f"classifier.{n}" for n, _ in model.classifier.named_parameters()}
    if not head_bias:
        head.discard("classifier.bias")
    names = {n for n, _ in model.named_parameters()}
    return (names - {"classifier.bias"} | head) if scope == "all" else head


def _extractor_eval(model: FedModel, _args: object) -> None:
    for name, child in model.named_children():
        if name != "classifier":
            child.eval()


@contextmanager
def finetuning(model: FedModel, scope: str | Collection[str], head_bias: bool) -> Iterator[None]:
    """Within the block only :func:`finetuned_names` are trainable and, for ``scope = "head"``, the
    extractor runs in eval mode; the model's flags are restored afterwards."""
    if isinstance(scope, str) and scope not in SCOPES:
        raise ValueError(f"fine-tuning scope {scope!r}: expected one of {SCOPES}")
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    trained = finetuned_names(model, scope, head_bias)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trained)
    hook = model.register_forward_pre_hook(_extractor_eval) if scope == "head" else None
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])


def batchnorm_statistics(model: FedModel, split: Split, batch_size: int) -> None:
    """Every BatchNorm layer's running mean and variance set to their averages over ``split``'s batches
    (each layer's statistics reset, then its cumulative average, momentum None: one pass in train
    mode without gradients, the batches in order). A new client's own statistics (AdaBN, Li et al.
    2016, "Revisiting Batch Normalization For Practical Domain Adaptation"), in place of a running
    average that keeps most of the values it started from after the few batches of one epoch."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or not len(split):
        return
    momenta = [m.momentum for m in norms]
    training = model.training
    device = next(model.parameters()).device
    try:
        for m in norms:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        with torch.no_grad():
            for i in range(0, len(split), batch_size):
                x = split.x[i:i + batch_size]
                if len(x) > 1:  # a batch of one has no variance to estimate
                    model(x.to(device))
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
        model.train(training)
