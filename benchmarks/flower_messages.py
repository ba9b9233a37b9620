"""fedlatent's own cost per node message on Flower, by message type, without Flower's engine.

One ``fedlatent run`` with ``backend = "flower"`` on a grid whose N nodes are fedlatent's
ClientApp called in this process (one ``Context`` each, node k serving client k: what the
simulation engine's actors run, without Ray, the engine's message store or its threads):
``flower_scale.py``'s workload (Synthetic, 50 samples a client, a cohort of 100, ``eval.every =
1000``, the final evaluation on 100 clients), 2 rounds. Prints, per message type, the messages and
the mean milliseconds a ClientApp handled one (its first, which builds the node's job, included),
and the seconds the server's side took outside the handlers; ``--profile`` adds the handlers'
cProfile (by own time).

    python benchmarks/flower_messages.py --clients 1000
    python benchmarks/flower_messages.py --clients 1000 --profile --set eval.clients=100
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flwr.app import Context, Message, RecordDict  # noqa: E402

import fedlatent  # noqa: E402
from fedlatent.backends.flower import client_app  # noqa: E402
from fedlatent.experiment import run as run_experiment  # noqa: E402
from scale import CONFIG  # noqa: E402  (the scale cell's configuration)


class TimedGrid:
    """A grid of ``n`` one-client nodes, the ClientApp called in this process: each handler's seconds
    by message type, and (with ``profile``) its calls profiled."""

    def __init__(self, n: int, profile: cProfile.Profile | None) -> None:
        from flwr.common.constant import SUPERLINK_NODE_ID
        from flwr.supercore.task_identity import TaskIdentity
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID  # as Flower's engines
        self.contexts = {node: Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                                       node_config={"partition-id": node - 1, "num-partitions": n})
                         for node in range(1, n + 1)}
        self.seconds: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.profile = profile

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: list[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            kind = msg.metadata.message_type
            started = time.perf_counter()
            if self.profile is not None:
                self.profile.enable()
            reply = client_app.app(msg, self.contexts[msg.metadata.dst_node_id])
            if self.profile is not None:
                self.profile.disable()
            self.seconds[kind] += time.perf_counter() - started
            self.count[kind] += 1
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            replies.append(reply)
        return replies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="the handlers' cProfile, by own time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an extra override")
    args = parser.parse_args(argv)
    n = args.clients
    with tempfile.TemporaryDirectory(prefix="fedlatent-flower-messages-") as tmp:
        (Path(tmp) / "scale.toml").write_text(CONFIG)
        config = fedlatent.load_config(Path(tmp) / "scale.toml", [
            'backend="flower"', f"data.num_clients={n}", f"train.participation={100 / n!r}", "train.rounds=2",
            "train.threads=1", "eval.every=1000", f"eval.final_clients={min(100, n)}", *args.set])
        grid = TimedGrid(n, cProfile.Profile() if args.profile else None)
        started = time.perf_counter()
        summary = run_experiment(config, Path(tmp) / "run", echo=None, grid=grid)
        wall = time.perf_counter() - started
    handled = sum(grid.seconds.values())
    print(f"N={n:,d}: {sum(grid.count.values()):,d} messages, run {wall:.1f} s (set-up {summary['setup_seconds']:.1f} s), "
          f"ClientApp handlers {handled:.1f} s, server side {wall - handled:.1f} s")
    for kind in sorted(grid.count):
        print(f"  {kind:20s} {grid.count[kind]:7,d} messages  {1000 * grid.seconds[kind] / grid.count[kind]:7.2f} ms each")
    if grid.profile is not None:
        pstats.Stats(grid.profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
