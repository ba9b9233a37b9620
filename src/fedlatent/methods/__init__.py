"""Methods as compositions of parts; importing this package registers every preset and part."""
from fedlatent.methods import fedavg, fedprox  # noqa: F401  (registration)
from fedlatent.methods.registry import PARTS, PRESETS, catalogue, resolve

__all__ = ["resolve", "catalogue", "PRESETS", "PARTS"]
