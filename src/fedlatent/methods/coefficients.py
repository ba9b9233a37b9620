"""A method's coefficients, which the runs of one lockstep stack need not share.

The cells of a study train as one stack (:mod:`fedlatent.backends.stacked`) when their clients train
alike. A term's coefficient — FedProx's μ, FedDecorr's β, FedUV's μ and λ, MOON's μ, FedProto's λ,
FedDyn's α, Ditto's λ and its constraints' μ — only scales what the term adds to a client's loss or
update, so cells that differ in one still share a lockstep call, each client row with its own run's
value: a (clients,) tensor broadcast over the per-client terms (or, Ditto's λ, per row in the update
rule's chain) where the rows of a step differ, the plain number where they agree, so that a run
alone — or stacked with runs of its own coefficients — computes exactly what it computed before.

A part's coefficients are its ``weight`` (the factor :func:`fedlatent.federated.client.add_terms`
applies) and the attributes it names in :attr:`~fedlatent.methods.parts.Part.coefficients`: a
factor its term reads (FedProx's μ, FedUV's λ) or its ``begin`` does (FedDyn's α, from which each
client's α_k follows; ``begin`` is called with each client's own run's part). Everything else a
method holds is what stacked runs share (:func:`method_shape`).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import Tensor

from fedlatent.methods.parts import MethodSpec, Part
from fedlatent.methods.program import ClientProgram, ModelCopy

Coefficient = float | Tensor  # one value for a group of clients, or a (clients,) tensor: one per row


def coefficient_names(part: Part) -> tuple[str, ...]:
    """The attributes of ``part`` that may differ between the runs of a stack."""
    return ("weight", *part.coefficients)


def method_shape(spec: MethodSpec) -> str:
    """``spec`` without its coefficients (the parts', the program's and its copies' pulls: Ditto's
    λ), as text: runs whose methods have the same shape train alike but for their coefficients, so
    their clients may share a lockstep call. A part or a program is its type and its configuration
    (numbers, strings, flags and their collections); an attribute holding anything else is a
    working object of the part (a cache), named by its type."""
    return repr(_plain(spec))


def _plain(value: Any) -> Any:
    """``value`` as nested plain values (see :func:`method_shape`)."""
    if isinstance(value, (Part, ClientProgram)):
        names = set(coefficient_names(value) if isinstance(value, Part) else value.coefficients)
        return (type(value).__qualname__,
                tuple((k, _plain(v)) for k, v in sorted(vars(value).items()) if k not in names))
    if isinstance(value, ModelCopy):  # its pull is a coefficient
        value = dataclasses.replace(value, pull=0.0)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__,
                tuple((f.name, _plain(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_plain(v)) for v in value))
    if isinstance(value, dict):
        return tuple(sorted((str(k), _plain(v)) for k, v in value.items()))
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return type(value).__qualname__


class RowCoefficients:
    """The coefficients of clients stacked in one lockstep call, ``specs`` their own runs' methods
    (one per stack row, of one :func:`method_shape`): the parts a step's group computes its terms
    with (:meth:`parts`) and Ditto's λ (:meth:`pull`)."""

    def __init__(self, specs: list[MethodSpec], device: torch.device) -> None:
        self.specs, self.device = specs, device
        first = specs[0]
        # (personal, part index, attribute) -> each row's value, where the rows differ
        self.differing: dict[tuple[bool, int, str], list[float]] = {}
        if any(s is not first for s in specs):
            for personal, parts in ((False, first.parts), (True, first.personalization.parts)):
                for i, part in enumerate(parts):
                    for name in coefficient_names(part):
                        values = [getattr(_parts(s, personal)[i], name) for s in specs]
                        if any(v != values[0] for v in values):
                            self.differing[personal, i, name] = values
        self._groups: dict[tuple[bool, tuple[int, ...]], list[Part]] = {}

    def parts(self, members: list[int], personal: bool = False) -> list[Part]:
        """The parts the clients ``members`` (stack rows) compute their terms with: the first row's
        own where the members' coefficients agree; else copies of them holding, for each coefficient
        the members differ in, a (members,) tensor of their values."""
        key = (personal, tuple(members))
        if key not in self._groups:
            parts = []
            for i, part in enumerate(_parts(self.specs[members[0]], personal)):
                rows = {name: [values[c] for c in members] for (own, j, name), values in self.differing.items()
                        if own == personal and j == i}
                rows = {name: picked for name, picked in rows.items() if any(v != picked[0] for v in picked)}
                if rows:
                    part = copy.copy(part)
                    for name, picked in rows.items():
                        setattr(part, name, torch.tensor(picked, dtype=torch.get_default_dtype(), device=self.device))
                parts.append(part)
            self._groups[key] = parts
        return self._groups[key]

    def pull(self, copy: str) -> Coefficient:
        """The pull of the program's copy ``copy`` towards the round's start (Ditto's λ): one number
        where every row's run has the same, else a (rows,) tensor."""
        values = [next((c.pull for c in s.personalization.copies if c.name == copy), 0.0) for s in self.specs]
        if all(v == values[0] for v in values):
            return values[0]
        return torch.tensor(values, dtype=torch.get_default_dtype(), device=self.device)


def _parts(spec: MethodSpec, personal: bool) -> list[Part]:
    return spec.personalization.parts if personal else spec.parts
