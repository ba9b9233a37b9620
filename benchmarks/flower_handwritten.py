"""A hand-written Flower app of the digits workload: the baseline ``flower_overhead.py`` compares with.

What a Flower user would write without fedlatent, with Flower's Message API and plain torch:
scikit-learn's digits (a fixed stratified 20 % test split, pixels / 16), 10 IID clients, the MLP
64-128-10, one local epoch of SGD (lr 0.05, momentum 0.9, batch 32) per round, the sample-weighted
mean of the uploads, the global model evaluated on the test set every round, 20 rounds; run on
Flower's simulation engine (Ray backend) with one virtual SuperNode per client.

    python benchmarks/flower_handwritten.py [--rounds 20] [--clients 10]

prints the start-up cost, the median round time and the final accuracy.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

SEED = 0


def digits_split(clients: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    """IID client shards of the digits training split, and the test split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    tr_x, te_x, tr_y, te_y = train_test_split(x, bunch.target, test_size=0.2, stratify=bunch.target, random_state=0)
    order = np.random.default_rng(SEED).permutation(len(tr_x))
    shards = [(torch.from_numpy(tr_x[i]), torch.from_numpy(tr_y[i]).long()) for i in np.array_split(order, clients)]
    return shards, (torch.from_numpy(te_x), torch.from_numpy(te_y).long())


def mlp() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def make_client_app(shards: list[tuple[torch.Tensor, torch.Tensor]]) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        cid = int(context.node_config["partition-id"])
        x, y = shards[cid]
        model = mlp()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        cfg = msg.content["config"]
        opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=0.9)
        gen = torch.Generator().manual_seed(SEED * 1_000_003 + int(cfg["round"]) * 1009 + cid)
        model.train()
        total, steps = 0.0, 0
        for idx in torch.randperm(len(x), generator=gen).split(32):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"num-examples": len(x), "train_loss": total / steps})})
        return Message(content, reply_to=msg)

    return app


def make_server_app(rounds: int, clients: int, test: tuple[torch.Tensor, torch.Tensor], out: dict[str, Any]) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.set_num_threads(1)
        model = mlp()
        nodes = list(grid.get_node_ids())
        while len(nodes) < clients:  # the engine registers its SuperNodes beside this thread
            time.sleep(0.1)
            nodes = list(grid.get_node_ids())
        round_times, accuracy = [], float("nan")
        for rnd in range(rounds):
            started = time.perf_counter()
            arrays = ArrayRecord(model.state_dict())
            messages = [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.05, "round": rnd})}),
                                dst_node_id=node, message_type="train") for node in nodes]
            replies = [r for r in grid.send_and_receive(messages) if r.has_content()]
            weights = [float(r.content["metrics"]["num-examples"]) for r in replies]
            states = [r.content["arrays"].to_torch_state_dict() for r in replies]
            model.load_state_dict({k: sum(w * s[k] for w, s in zip(weights, states)) / sum(weights)
                                   for k in states[0]})
            with torch.no_grad():
                accuracy = float((model(test[0]).argmax(1) == test[1]).double().mean())
            round_times.append(time.perf_counter() - started)
            out.setdefault("first_round_end", time.perf_counter())
        out.update(round_s=round_times, accuracy=accuracy, replies=len(replies))

    return app


def run(rounds: int = 20, clients: int = 10, backend_config: dict | None = None) -> dict[str, Any]:
    """Run the app on the simulation engine: per-round seconds, final accuracy, total seconds and the
    start-up cost: from the call to the end of round 1, less a median round (the engine starts its
    workers while the first messages wait)."""
    started = time.perf_counter()
    shards, test = digits_split(clients)
    out: dict[str, Any] = {}
    run_simulation(make_server_app(rounds, clients, test, out), make_client_app(shards), num_supernodes=clients,
                   backend_config=backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                                     "init_args": {"num_cpus": 1}})
    out["startup_s"] = out.pop("first_round_end") - started - float(np.median(out["round_s"]))
    out["total_s"] = time.perf_counter() - started
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = run(args.rounds, args.clients)
    print(f"start-up {result['startup_s']:.2f} s, round (median) {np.median(result['round_s']):.3f} s, final accuracy {result['accuracy']:.4f}, "
          f"total {result['total_s']:.1f} s")


if __name__ == "__main__":
    main()
