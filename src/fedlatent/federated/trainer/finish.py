"""The end of the round per client: the parts' ``finish`` on its trained weights, what it keeps (the
program's kept copies and values, MOON's previous model, the kept optimiser states and loss scales),
its upload with its metrics, step trace and FLOPs; in the caller's order."""
from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from fedlatent.federated.client import client_upload, finish_parts, keep_models, save_optimizer
from fedlatent.federated.trainer.setup import Round
from fedlatent.methods.parts import ClientRound, Part, Upload
from fedlatent.methods.program import GLOBAL


def finish(r: Round) -> list[Upload]:
    """Every client's upload, in the caller's order."""
    spec, s = r.spec, r.s
    program = spec.personalization
    seconds = time.perf_counter() - r.started
    uploads = []
    finishing = any(type(p).finish is not Part.finish for p in spec.parts)
    rows = r.copies[GLOBAL].weights.client_rows()  # views: keep_models copies what a client keeps (MOON)
    # the round's one read of its recorded values off the device: per client, as Python floats
    sums_of, seen_by = _host_rows(r.sums), _host_rows(r.seen)
    if r.traces is not None:
        read_traces(r.traces)
    losses = [c.loss_key for c in program.copies]
    for c, (rc, trained, own_spec) in enumerate(zip(r.rcs, rows, r.owns)):
        rc.steps = r.steps[c]
        if finishing and r.form.stacked:
            r.ws.model.load_state_dict(trained)  # finish reads the trained weights off rc.model
        extras = finish_parts(rc, own_spec.all_parts())  # each client's own run's parts (stacked runs)
        keep_models(rc, own_spec, trained, {name: t.weights.client_state(c) for name, t in r.copies.items()
                                            if t.decl.kept})
        _keep_training_state(r, rc, c)
        program.finish(rc, c, r.data)
        own = {k: v[c] for k, v in sums_of.items() if k in losses or seen_by[k][c]}
        uploads.append(client_upload(rc, trained, s, extras, own, rc.steps, seconds / r.count,
                                     r.flops[c] if spec.count_flops else None,
                                     r.traces[c] if r.traces is not None else None, program.copies))
    return [uploads[i] for i in sorted(range(r.count), key=r.order.__getitem__)]  # the caller's order


def _keep_training_state(r: Round, rc: ClientRound, c: int) -> None:
    """Client ``c``'s optimiser states (when kept across rounds) and fp16 loss scales, per copy."""
    client = r.form.client(c)
    if r.s.keep_optimizer:
        for t in r.copies.values():
            save_optimizer(t.weights.optimizer, r.trainable, rc.state, t.decl.optim_prefix, client=client)
    for t in r.copies.values():
        if t.weights.scale is not None:
            rc.state.update(t.weights.scale.save(t.decl.amp_prefix, client))


def _host_rows(values: dict[str, Tensor]) -> dict[str, list]:
    """Each key's per-client values as Python numbers, read off the device in one copy."""
    keys = list(values)
    return dict(zip(keys, torch.stack([values[k] for k in keys]).tolist())) if keys else {}


def read_traces(traces: list[list[dict[str, Any]]]) -> None:
    """The step traces' values, recorded on the device as (value, present) pairs, read in one copy
    and written into their rows as Python floats; a value its client had no term for (present
    False) is left out, as its term is."""
    cells = [(row, name, value, on) for rows in traces for row in rows for name, (value, on) in row.items()]
    if not cells:
        return
    values = torch.stack([value for _, _, value, _ in cells])
    ons = torch.stack([torch.ones_like(value, dtype=torch.bool) if on is None else on for _, _, value, on in cells])
    for (row, name, _, _), value, on in zip(cells, values.tolist(), ons.tolist()):
        if on:
            row[name] = value
        else:
            del row[name]
