"""The client trainer, for one client or many at once, as rooms that each do one thing:

- ``entry``: the entry points (:func:`local_update`, :func:`lockstep_update`, :func:`lockstep_runs`)
  and :func:`unsupported`; a call is the client program's round around set-up, steps and end;
- ``schedule``: the batch schedule (epochs of seeded permutations, a budget of local steps, Poisson
  batches), known before anything is drawn where it can be;
- ``batches``: the round's batches of a stack, drawn in the order of a client trained alone, and the
  groups that take a step together;
- ``forms``: one client or a stack — the one place the trainer tells them apart;
- ``weights``: the weight holders (one client's own weights, a stack's) and their update rule;
- ``gradients``: the gradient sources a holder steps on (the loss, fp16's scaled loss, DP-SGD's
  private gradients);
- ``forward``: the forwards on a client's own weights and on a stack; ``frozen``: the frozen models'
  runners (the round-start model, MOON's previous models);
- ``setup``: the round's set-up (clients in stack order, the parts' ``begin``, a holder per copy of
  the program from a table of recipes, frozen models, batches); ``steps``: the round's steps;
  ``step``: a group's step as the program sees it (objectives, terms, recording); ``finish``: the end
  of the round per client; ``rows``: a step's clients as rows of the stacks.

The same update rule, batches, Ditto step, step trace and FLOPs for one client and for many: the
weights agree with clients trained one after another up to floating-point rounding
(``tests/test_vectorized.py``), and a run's numbers are those of the one-module trainer it replaced
(``tests/test_trainer_unchanged.py``)."""
from fedlatent.federated.trainer.entry import local_update, lockstep_runs, lockstep_update, unsupported

__all__ = ["local_update", "lockstep_runs", "lockstep_update", "unsupported"]
