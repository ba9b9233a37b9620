"""Partitions by name: each module here registers one or more with
:func:`fedlatent.data.registry.register_partition` (the pure functions are in :mod:`fedlatent.data.partition`)."""
