"""FedRep (Collins, Hassani, Mokhtari & Shakkottai 2021, "Exploiting Shared Representations for
Personalized Federated Learning", ICML, Algorithm 1).

Each client keeps its own head (the classifier, under ``local.classifier.*`` in its state). A
round first trains that head for ``head_epochs`` with the body frozen, then the body for
``body_epochs`` with the head frozen; only the body is averaged. The global model's head never
moves from its initialisation: the global-test accuracy of a FedRep run is not meaningful, its
personalised accuracy (each client's head on the global body) is. Defaults: 10 head epochs and
1 body epoch (Sec. 5; the release runs ``local_ep = 10``, ``local_rep_ep = 1``, i.e. 9 + 1).
``train.local_epochs`` is not used by this method.
"""
from __future__ import annotations

from typing import Any

from fedlatent.errors import ConfigError
from fedlatent.methods.partial import Partial
from fedlatent.methods.parts import MethodSpec
from fedlatent.methods.registry import register_preset

HEAD = "classifier."


def head_keys(parameters: list[str], keys: list[str]) -> list[str]:
    """The classifier's entries: what a FedRep client keeps to itself."""
    return [k for k in keys if k.startswith(HEAD)]


@register_preset("fedrep", head_epochs=10, body_epochs=1)
def fedrep(opts: dict[str, Any]) -> MethodSpec:
    """FedRep: personal heads trained first (body frozen), then the shared body (head frozen)."""
    if opts["body_epochs"] < 1:
        raise ConfigError(f"algorithm.body_epochs = {opts['body_epochs']}: must be >= 1")
    return MethodSpec("fedrep", personalization=Partial(
        head_keys, local_epochs=opts["head_epochs"], freeze_local=True, shared_epochs=opts["body_epochs"]))
