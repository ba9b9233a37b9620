"""Does ``torch.compile`` (inductor, CPU) pay off for local training? Compile time, per-round time
eager vs compiled, and the break-even number of rounds.

Two steps are timed, each as one round of the workload's clients (``_common.workloads``: the
digits MLP and the small CNN, 10 clients, batch 32, one epoch):

- **sequential**: what ``federated.client.local_update`` does per client: load the round-start
  weights, a fresh SGD optimiser, then forward, cross-entropy, backward and step per batch. The
  compiled side runs the same loop through ``torch.compile(model)`` (forward compiled, backward by
  AOTAutograd; the optimiser is new for every client, as in the library, so it stays eager).
- **lockstep** (``--lockstep``, MLP only): what ``federated.trainer`` does per step: the clients'
  weights stacked, ``vmap(functional_call)`` forward, per-client cross-entropy, ``autograd.grad``,
  an SGD update of the stacks. The compiled side compiles the vmapped forward.

Compile time is the first compiled round minus an eager round (process CPU time plus that of the
C++ compiler processes inductor starts; ``compile_threads = 1`` keeps the rest in-process), with an empty inductor cache
(``cold``) and again after ``torch._dynamo.reset()`` with the cache that run filled (``warm``: a
second run on the same machine). The trailing short batch of each client is a second shape, so
the first round compiles twice, as a real run would. Then eager and compiled rounds alternate
(``timing.bracketed``: each compiled round over the eager rounds right before and after it; an
eager A/A copy gives the noise floor). Break-even: compile CPU seconds / CPU seconds saved per
round (``never`` when compiled is not faster).

    python benchmarks/compile.py --quick
    python benchmarks/compile.py --models mlp,cnn --lockstep
"""
from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from fedlatent.backends import simulation  # noqa: E402
from fedlatent.federated.trainer.schedule import batches  # noqa: E402
from fedlatent.methods import resolve  # noqa: E402
from fedlatent.seeding import derive_seed  # noqa: E402

DEFAULT_REPS = {True: {"mlp": 4, "cnn": 2}, False: {"mlp": 20, "cnn": 5}}
LR = 0.01


def client_batches(federation, batch_size: int, seed: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every client's (x, y) batches of one epoch, drawn once (the same for every side)."""
    out = []
    for cid, client in enumerate(federation.clients):
        generator = torch.Generator().manual_seed(derive_seed(seed, cid))
        out.append([(client.train.x[idx], client.train.y[idx])
                    for idx in batches(len(client.train), batch_size, False, generator)])
    return out


def sequential_round(model: torch.nn.Module, run: Callable, start: dict, data) -> Callable[[], None]:
    """One round of the clients in turn, through ``run`` (the model itself or its compiled form)."""
    params = list(model.parameters())

    def round_() -> None:
        for client in data:
            model.load_state_dict(start)
            optimizer = torch.optim.SGD(params, lr=LR)
            for x, y in client:
                loss = F.cross_entropy(run(x, frozenset()).logits, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
    return round_


def lockstep_round(model: torch.nn.Module, start: dict, data, compiled: bool) -> Callable[[], None]:
    """One round of all clients at once (stacked weights, vmapped forward), the shortest client's
    batch count and each batch's smallest size for all (the digits clients differ by one sample)."""
    names = [n for n, _ in model.named_parameters()]
    steps = min(len(c) for c in data)
    sizes = [min(len(c[i][1]) for c in data) for i in range(steps)]
    xs = [torch.stack([c[i][0][:n] for c in data]) for i, n in enumerate(sizes)]
    ys = [torch.stack([c[i][1][:n] for c in data]) for i, n in enumerate(sizes)]

    def one(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, params, (x, frozenset())).logits
    forward = vmap(one)
    if compiled:
        forward = torch.compile(forward)

    def round_() -> None:
        stacks = {n: start[n].unsqueeze(0).repeat(len(data), *[1] * start[n].dim()).requires_grad_() for n in names}
        for x, y in zip(xs, ys):
            logits = forward(stacks, x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.shape[1]
            grads = torch.autograd.grad(loss, list(stacks.values()))
            with torch.no_grad():
                stacks = {n: (p - LR * g).requires_grad_() for (n, p), g in zip(stacks.items(), grads)}
    return round_


def sides(kind: str, workload: C.Workload, batch_size: int) -> tuple[Callable, Callable, Callable[[], Callable]]:
    """(eager round, eager A/A copy, a maker of the compiled round) for one workload."""
    config = workload.config()
    federation = C.federation_for(config)
    model = simulation.make_model(config, federation, resolve(config.algorithm, config.terms))
    model.train()
    start = copy.deepcopy(model.state_dict())
    data = client_batches(federation, batch_size, config.seed)
    if kind == "sequential":
        return (sequential_round(model, model, start, data), sequential_round(model, model, start, data),
                lambda: sequential_round(model, torch.compile(model), start, data))
    return (lockstep_round(model, start, data, False), lockstep_round(model, start, data, False),
            lambda: lockstep_round(model, start, data, True))


def children_cpu() -> float:
    """CPU seconds of finished child processes (inductor runs the C++ compiler as one)."""
    t = os.times()
    return t.children_user + t.children_system


def compile_cost(make: Callable[[], Callable], eager: Callable) -> tuple[Callable, dict[str, float]]:
    """The compiled round and its compile time (first round minus an eager round; CPU time of this
    process and of the compiler processes it started), cold then warm, and the graphs compiled."""
    cost = {}
    for cache in ("cold", "warm"):
        torch._dynamo.reset()
        base = C.timed(eager)
        compiled = make()
        before = children_cpu()
        first = C.timed(compiled)
        cost[cache] = first["wall_cpu"] + children_cpu() - before - base["wall_cpu"]
        cost[cache + "_wall"] = first["wall"] - base["wall"]
    cost["graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return compiled, cost


def main(argv: list[str] | None = None) -> int:
    parser = C.base_parser(__doc__.split("\n")[0])
    parser.add_argument("--lockstep", action="store_true", help="also the lockstep step (MLP only)")
    args = parser.parse_args(argv)
    C.set_threads(args.threads)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedlatent-inductor-")
    torch._inductor.config.compile_threads = 1
    loads = C.workloads(args.quick, args.batch_size, args.clients or 10, args.samples or None)
    results = {"machine": C.machine(), "argv": sys.argv[1:], "rows": []}
    rows = []
    cases = [("sequential", m) for m in args.models.split(",")] + ([("lockstep", "mlp")] if args.lockstep else [])
    for kind, name in cases:
        reps = args.reps or DEFAULT_REPS[args.quick][name]
        eager, copy_, make = sides(kind, loads[name], args.batch_size)
        try:
            compiled, cost = compile_cost(make, eager)
        except Exception as exc:  # a backend that cannot compile here is a result, not a crash
            print(f"{kind} {name}: torch.compile failed: {type(exc).__name__}: {exc}".splitlines()[0])
            rows.append([kind, name, "failed", "", "", "", "", "", ""])
            continue
        ratios = C.bracketed(eager, {"compiled": compiled, "eager (A/A)": copy_}, reps, ("wall_cpu", "wall"),
                             progress=lambda msg: print(f"  {kind} {name}: {msg}", file=sys.stderr, flush=True))
        eager_cpu = C.median(ratios[C.BASELINE]["wall_cpu_abs"])
        ratio = C.median(ratios["compiled"]["wall_cpu"])
        saved = eager_cpu * (1 - ratio)
        lo, hi = C.quartiles(ratios["compiled"]["wall_cpu"])
        even = f"{cost['cold'] / saved:.0f} / {cost['warm'] / saved:.0f}" if saved > 0 else "never"
        rows.append([kind, name, f"{cost['cold']:.1f} / {cost['warm']:.1f}", 1e3 * eager_cpu,
                     1e3 * C.median(ratios["compiled"]["wall_cpu_abs"]), ratio, f"{lo:.2f}-{hi:.2f}",
                     C.median(ratios["eager (A/A)"]["wall_cpu"]), even])
        print(f"  {kind} {name}: compile {cost}, compiled / eager {ratio:.3f}", file=sys.stderr, flush=True)
        results["rows"].append({"kind": kind, "model": name, "reps": reps, "compile_s": cost, "ratios": ratios})
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, {args.clients or 10} clients, "
          f"batch {args.batch_size}, one epoch a round, process CPU time, medians\n" + C.table(
              ["step", "model", "compile s cold / warm", "eager round ms", "compiled round ms", "compiled / eager",
               "IQR", "A/A", "break-even rounds cold / warm"], rows))
    C.dump(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
