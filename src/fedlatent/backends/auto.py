"""``backend = "auto"``: the backend a run is measured to be fastest on, with the reason.

``vectorized`` where the run trains in lockstep (:func:`fedlatent.federated.trainer.unsupported`
finds nothing to refuse), ``train.compile`` is off (it compiles the sequential client step) and, on
a CPU, the model has no convolution and enough clients train per round (:data:`FEWEST_CLIENTS`);
``simulation`` otherwise. Both give the same numbers up to float rounding
(``tests/test_vectorized.py``), so the choice is one of speed only; a model with dropout draws an
independent mask per client in lockstep (the same distribution, other draws: a run is still
determined by its configuration and seed, since this choice is). The figures behind it
(``fedlatent bench``, ``benchmarks/README.md``; 2 cores, 1 thread): on the digits MLP the
vectorized round costs ~0.4× the simulation round with 10 clients and less with 100, while the
small CNN's run is ~1.5× slower vectorized on a CPU (vmap turns each
convolution into a grouped one, which the CPU kernels run slower than C separate ones). On a CUDA
device convolutions go vectorized too: there one small kernel per client and operator leaves the
device idle between launches, which is what lockstep removes. Measured on an H200
(``benchmarks/gpu_clients.py``, ``fedlatent bench --device cuda``; 2026-11-26): the small CNN's
round 5.8× faster vectorized with 100 clients and 1.35× with 10 (bench (c)), the digits MLP 5.8×
with 10 clients.
"""
from __future__ import annotations

import torch

from fedlatent.backends import simulation
from fedlatent.federated.trainer import unsupported
from fedlatent.config import RunConfig
from fedlatent.data.types import Federation
from fedlatent.federated.round import sample_clients
from fedlatent.methods.parts import MethodSpec

# Fewest clients per round for which lockstep is faster on a CPU. A lockstep step has a fixed cost
# (the stacked weights' updates, and vmap's dispatch for a model run under it), which only enough
# clients per step amortise; what a step costs besides (loss terms, extra forwards, a personal
# model) is paid once for all clients in lockstep, so such methods break even sooner. Measured with
# benchmarks/backend_choice.py (digits MLP, 2 cores, 1 thread, process CPU time, vectorized /
# simulation round, median of 12; benchmarks/README.md):
# - "stacked", a model with a stacked forward (the MLP's batched products, no vmap; commit 94c7b79):
#   at 2 clients FedAvg 0.88, FedProx 0.66, SCAFFOLD 0.79, FedNova 0.86, FedRep 0.90, LG-FedAvg
#   0.86, Ditto 0.59, MOON 0.71, FedUV 0.76; at 1 client FedAvg 1.21 (FedProx 0.97, Ditto 0.86);
# - "plain" and "terms", the same MLP under vmap (commit 473e8b0), at 2 / 3 / 4 / 5 / 6 clients:
#   FedAvg 1.95 / 1.17 / 1.08 / 0.84 / 0.81, SCAFFOLD 1.54 / 1.02 at 2 / 3, FedNova 1.39 at 3; with
#   a term: FedProx 1.07 / 0.78 / 0.74 / 0.54 / 0.54, FedUV 1.06 / 0.75 / 0.59 / 0.54 / 0.46, MOON
#   1.12 / 0.69, Ditto 1.21 / 0.76 at 2 / 3; every preset 0.30-0.70 at 10 clients and 0.15-0.36 at
#   50 of 100.
FEWEST_CLIENTS = {"stacked": 2, "plain": 5, "terms": 3}


def choose(config: RunConfig, federation: Federation, spec: MethodSpec) -> tuple[str, str]:
    """The backend ``auto`` resolves to for this run and why (a few words, for the log)."""
    model = simulation.make_model(config, federation, spec)
    reason = unsupported(spec)
    if reason:
        return "simulation", f"no lockstep form: {reason}"
    if config.train.compile:
        return "simulation", "train.compile = true compiles the sequential client step"
    if torch.device(config.train.device).type == "cpu":
        if any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()):
            return "simulation", "convolutions run slower in lockstep on a CPU"
        terms = len(spec.personalization.copies) > 1 or any(p.has_term() for p in spec.all_parts())
        kind = "stacked" if model.has_stacked_forward else "terms" if terms else "plain"
        per_round = len(sample_clients(config.seed, 0, len(federation.clients), config.train.participation))
        if per_round < FEWEST_CLIENTS[kind]:
            return "simulation", (f"{per_round} clients a round train faster in turn on a CPU "
                                  f"(lockstep pays off from {FEWEST_CLIENTS[kind]} for this method)")
    return "vectorized", "the run trains in lockstep"
