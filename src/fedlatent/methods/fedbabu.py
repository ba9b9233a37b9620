"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for Federated
Image Classification"): the classifier keeps its random initial weights during federated training
(only the body is trained and averaged, as :mod:`freeze`), then each client fine-tunes the whole
model, head included, on its training split before its personal evaluation (``finetune_epochs``,
5 by default as in FedBABU's personalised evaluation; ``finetune_scope`` stays ``"all"``).
SphereFed compares with it in Table 2 (the global model: read ``accuracy``) and Table 8
(personalised: read ``personalized_accuracy``).
"""
from __future__ import annotations

from typing import Any

from fedlatent.errors import ConfigError
from fedlatent.methods.parts import HEAD_INITS, HeadPolicy, MethodSpec
from fedlatent.methods.program import Finetune
from fedlatent.methods.registry import register_preset

FINETUNE_EPOCHS = 5


@register_preset("fedbabu", init="default")
def fedbabu(opts: dict[str, Any]) -> MethodSpec:
    """FedBABU: head fixed at init during training, the whole model fine-tuned per client at evaluation."""
    if opts["init"] not in HEAD_INITS:
        raise ConfigError(f"algorithm.init = {opts['init']!r}: allowed values are {', '.join(HEAD_INITS)}")
    return MethodSpec("fedbabu", head=HeadPolicy(fixed=True, init=opts["init"]),
                      personalization=Finetune(FINETUNE_EPOCHS, scope="all"))
