"""The classifier's own communication and FLOPs over a run, counted as SphereFed's Table 1 counts them.

SphereFed (Dong et al., ECCV 2022), Table 1 and Sec. 4.3 (``spherefed.txt:138-182``): the cost of
the classifier ``W ∈ R^{l×C}`` apart from the encoder, over ``K`` clients and ``R`` rounds, values
sent in 32 bits, FLOPs of clients and server together, the classifier's forward pass never counted
("all approaches require forward of the classifier, we exclude it"). 2 FLOPs per multiply-add, as
the paper's own count of Eq. 9, ``2l|D_k|(l + C)`` per client (:182).

- **a trained head** (FedAvg): each client downloads and uploads ``W`` every round (``2lC`` values);
  training costs ``3lC`` per sample per local epoch — the backward's input gradient ``Wᵀδ``
  (``2lC``) and the weight gradient's outer product ``δzᵀ`` (``lC``), the batch's sum of the outer
  products and the SGD step left out (the count that gives Table 1's 1.9×10⁴ GFLOPs; torch's
  counter, :mod:`fedlatent.models.flops`, gives ``4lC``); the server averages the ``K`` uploads
  (``K·lC`` a round). A fixed head (SphereFed) costs nothing here.
- **FFC** (SphereFed Eq. 9-10): each client sends ``V (l×l)`` and ``U (l×C)`` once; Eq. 9 costs
  ``2l|D_k|(l + C)`` on client ``k``; Eq. 10 sums the clients' statistics (``(K−1)l(l + C)``) and
  solves ``(ΣV) W = ΣU`` by a Cholesky factorisation (``l³/3``) and two triangular solves (``2l²C``).
- **CCVR** (Luo et al., NeurIPS 2021, Sec. 4): each client sends the per-class means ``μ (l×C)``
  and covariances ``Σ (l×l×C)`` once; fitting them costs ``2l² + l`` per sample (the outer product
  accumulated, the sum); the server pools them (``K·C(l² + l)``), factorises each class's
  covariance (``C·l³/3``), draws ``M_c`` virtual features per class (``2l² + 2l`` each: noise times
  the factor, the mean added, Tukey's power transform) and fine-tunes the classifier on them for
  ``E_ft`` epochs (``3lC`` per feature per epoch, as training above).

:func:`table1` gives the paper's setting; ``docs/diagnostics.md`` compares it with the published
numbers (they agree to the printed digits, CCVR's fine-tuning epochs, not stated, inferred).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BYTES_PER_VALUE = 4  # the paper's 32-bit assumption
TRAIN_FLOPS_PER_SAMPLE = 3  # × lC: a trained head's backward per sample per epoch (see above)


@dataclass(frozen=True)
class Cost:
    """Bytes one client sends and receives for the classifier over the run, and the FLOPs of
    clients and server together."""

    bytes_per_client: int
    flops: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes_per_client + other.bytes_per_client, self.flops + other.flops)

    @property
    def megabytes(self) -> float:
        """Per client, in MB (10⁶ bytes), the paper's "Size (MB)"."""
        return self.bytes_per_client / 1e6

    @property
    def gflops(self) -> float:
        """The paper's "FLOPs (G)"."""
        return self.flops / 1e9


def head_training(features: int, classes: int, sample_passes: int, clients: int) -> int:
    """FLOPs of one round's training of a learned head: ``3lC`` per sample pass (a sample of a
    local epoch) over the selected clients' ``sample_passes``, and the server's average of the
    ``clients`` uploads (``K·lC``)."""
    head = features * classes
    return TRAIN_FLOPS_PER_SAMPLE * head * sample_passes + clients * head


def head_traffic(features: int, classes: int) -> int:
    """Bytes one client sends and receives for a learned head in one round: ``W`` down and up."""
    return 2 * features * classes * BYTES_PER_VALUE


def ffc(features: int, classes: int, samples: int, clients: int) -> Cost:
    """FFC once after training (SphereFed Eq. 9-10) on ``samples`` training samples held by
    ``clients`` clients: ``V`` and ``U`` up from each client, Eq. 9 on the clients, Eq. 10 on the server."""
    l, c = features, classes
    statistics = l * (l + c)
    eq9 = 2 * l * samples * (l + c)
    eq10 = (clients - 1) * statistics + l**3 // 3 + 2 * l * l * c
    return Cost(statistics * BYTES_PER_VALUE, eq9 + eq10)


def ccvr(features: int, classes: int, samples: int, clients: int, virtual_per_class: int, epochs: int) -> Cost:
    """CCVR once after training (Luo et al. 2021): ``μ``, ``Σ`` up from each client, their fitting on
    the clients, then on the server their pooling, each class's factorisation, ``virtual_per_class``
    virtual features per class drawn and the head fine-tuned on them for ``epochs`` epochs."""
    l, c = features, classes
    virtual = virtual_per_class * c
    fitting = samples * (2 * l * l + l)
    pooling = clients * c * (l * l + l)
    factorising = c * (l**3 // 3)
    sampling = virtual * (2 * l * l + 2 * l)
    fine_tuning = TRAIN_FLOPS_PER_SAMPLE * l * c * virtual * epochs
    return Cost((l * c + l * l * c) * BYTES_PER_VALUE, fitting + pooling + factorising + sampling + fine_tuning)


def calibration(kind: str, features: int, classes: int, samples: int, clients: int, *,
                virtual_per_class: int = 0, epochs: int = 0) -> Cost:
    """The one-off calibration's cost: ``kind`` ``"ffc"`` or ``"ccvr"``; any other (``"none"``, the
    centralised oracle, which is no federated protocol) costs nothing here."""
    count = _CALIBRATIONS.get(kind)
    return Cost(0, 0) if count is None else count(features, classes, samples, clients, virtual_per_class, epochs)


_CALIBRATIONS: dict[str, Callable[[int, int, int, int, int, int], Cost]] = {
    "ffc": lambda l, c, n, k, _m, _e: ffc(l, c, n, k),
    "ccvr": ccvr,
}


def table1(method: str, *, features: int = 1280, classes: int = 100, clients: int = 10, rounds: int = 100,
           samples: int = 50_000, local_epochs: int = 10, virtual_per_class: int = 500,
           ccvr_epochs: int = 100) -> Cost:
    """A row of SphereFed's Table 1 — ``"fedavg"``, ``"ccvr"`` or ``"spherefed"`` — for full
    participation, every client training ``local_epochs`` epochs over its share of ``samples``
    each round; the defaults are the paper's setting (MobileNetV2 ``l = 1280``, CIFAR-100, 10
    clients, 100 rounds, E = 10, CCVR's 500 virtual features per class from Table 16; CCVR's
    fine-tuning epochs are not stated: 100 reproduces the published 2.1×10⁴)."""
    if method not in TABLE1_ROWS:
        raise ValueError(f"method must be one of {', '.join(TABLE1_ROWS)}, got {method!r}")
    trained, kind = TABLE1_ROWS[method]
    cost = Cost(0, 0)
    if trained:
        per_round = Cost(head_traffic(features, classes),
                         head_training(features, classes, samples * local_epochs, clients))
        cost = Cost(per_round.bytes_per_client * rounds, per_round.flops * rounds)
    return cost + calibration(kind, features, classes, samples, clients,
                              virtual_per_class=virtual_per_class, epochs=ccvr_epochs)


# method → (head trained and sent every round, calibration after training)
TABLE1_ROWS = {"fedavg": (True, "none"), "ccvr": (True, "ccvr"), "spherefed": (False, "ffc")}
