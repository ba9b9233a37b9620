"""Methods as compositions of parts; importing this package registers every preset and part."""
from fedlatent.methods import (ccvr, feddecorr, feddyn, fedavg, fednova, fedopt, fedprox,  # noqa: F401
                               fedproto, feduv, freeze, moon, scaffold, spherefed)
from fedlatent.methods import ditto  # noqa: F401  (registration)
from fedlatent.methods import decov  # noqa: F401  (registration)
from fedlatent.methods import fedrep, lg_fedavg  # noqa: F401  (registration)
from fedlatent.methods import fedbabu  # noqa: F401  (registration)
from fedlatent.methods import apfl, fedbn, fedper  # noqa: F401  (registration)
from fedlatent.methods import fedala, perfedavg, pfedme  # noqa: F401  (registration)
from fedlatent.methods.registry import PARTS, PRESETS, catalogue, check_model, flat_settings, resolve, resolved_keys

__all__ = ["resolve", "resolved_keys", "flat_settings", "check_model", "catalogue", "PRESETS", "PARTS"]
