"""What a local fine-tuning at evaluation trains: every parameter, or the classifier alone on a
fixed feature extractor.

FedBABU (Oh et al., ICLR 2022) fine-tunes the whole model, the head it kept fixed during training
included; SphereFed's personalised "Ours (SGD)" (Dong et al., ECCV 2022, Appendix B) keeps the
global feature extractor fixed and fine-tunes only the classifier. A fixed extractor stays fixed in
its BatchNorm statistics too: its modules run in eval mode while the head trains.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

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
