"""The former one-module trainer's name for :func:`fedlatent.federated.trainer.unsupported`, kept only
for ``experiment/studies/stacking.py``, which imports it from here (the trainer is the package
:mod:`fedlatent.federated.trainer`)."""
from fedlatent.federated.trainer import unsupported

__all__ = ["unsupported"]
