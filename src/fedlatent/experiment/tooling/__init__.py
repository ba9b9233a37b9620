"""Measurement: ``fedlatent bench`` (:mod:`.bench`), training throughput (:mod:`.throughput`) and
their clocks and tables (:mod:`.timing`). Built on :mod:`fedlatent.experiment.runner`, never imported by it."""
