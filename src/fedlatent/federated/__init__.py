"""The federated engine: a round's two halves (``round``), the client trainer (``trainer``: one
client or many at once, with the update rule of ``losses.update``; ``client``: what a client's round
is made of), the run
driver every backend shares (``driver``), the server (``server``), failures, checkpoints,
evaluation, calibration and diagnostics."""
