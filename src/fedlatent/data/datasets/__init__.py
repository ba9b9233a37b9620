"""Data sets by name: each module here registers one or more with
:func:`fedlatent.data.registry.register_dataset` (on-disk formats are read by :mod:`fedlatent.data.readers`)."""
