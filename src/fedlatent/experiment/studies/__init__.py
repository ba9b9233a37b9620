"""Studies over many runs: study files and their cells (:mod:`.study`), sweeps and stacked cells,
the papers' reproduction specs and settings tables, tables, reports and pages, ``fedlatent check``.
Built on :mod:`fedlatent.experiment.runner`, never imported by it."""
