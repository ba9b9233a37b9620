"""The federated engine: a round's two halves (``round``), the client trainers (``client`` one
client at a time, ``lockstep`` many at once, both with the update rule of ``update``), the run
driver every backend shares (``driver``), the server (``server``), failures, checkpoints,
evaluation, calibration and diagnostics."""
