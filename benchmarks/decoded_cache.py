"""Data loading with and without the decoded-image cache: a run's first load of an image tree
(decode every JPEG, write the cache) against its later loads (fingerprint the files, memory-map
the arrays), in one process and one fresh cache folder, so both sides see the same machine.

    python benchmarks/decoded_cache.py --root ../shared-extracted/cifar10-jpeg --dataset cifar10
    python benchmarks/decoded_cache.py --root ../shared-extracted/pacs-96 --dataset domains --image-size 32

Two timings per side, by wall clock: the data set's loader (what the cache replaces: reading the
files, or fingerprinting them and memory-mapping the arrays) and the whole ``build_federation``
(the loader, then partition and normalisation statistics, which no cache changes). ``--reps``
later loads are timed and their median reported with the ratio later / first.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from fedlatent.config import load_config
from fedlatent.data.federation import build_federation
from fedlatent.data.registry import DATASETS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the extracted image tree (data.root)")
    parser.add_argument("--dataset", default="cifar10", help="data.dataset (cifar10, image_folder, domains, ...)")
    parser.add_argument("--partition", default="", help="data.partition (default: domains for domains, else iid)")
    parser.add_argument("--image-size", type=int, default=0, help="data.image_size (0: the data set's own)")
    parser.add_argument("--reps", type=int, default=3, help="timed loads from the cache")
    args = parser.parse_args()
    partition = args.partition or ("domains" if args.dataset == "domains" else "iid")
    config = load_config(None, [f'data.dataset="{args.dataset}"', f'data.root="{args.root}"',
                                f'data.partition="{partition}"', f"data.image_size={args.image_size}"])
    loader = DATASETS.get(args.dataset)

    def timed(step) -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    def load() -> None:
        loader.build(config.data, config.data_seed)

    def federation() -> None:
        build_federation(config.data, config.data_seed)

    with tempfile.TemporaryDirectory(prefix="fedlatent-cache-bench-") as folder:
        os.environ["FEDLATENT_CACHE_DIR"] = folder
        first_load = timed(load)
        first_federation = timed(federation)  # the loader reads the cache already: its rest is the same
        later_load = statistics.median(timed(load) for _ in range(args.reps))
        later_federation = statistics.median(timed(federation) for _ in range(args.reps))
    first_federation += first_load - later_load  # as if the federation's load had decoded
    print(f"{args.dataset} at {args.root}, later: median of {args.reps}")
    print(f"{'':24s} {'first (decode)':>15s} {'later (cache)':>14s} {'later/first':>12s}")
    for name, first, later in (("loader", first_load, later_load), ("build_federation", first_federation,
                                                                      later_federation)):
        print(f"{name:24s} {first:13.2f} s {later:12.2f} s {later / first:12.3f}")


if __name__ == "__main__":
    main()
