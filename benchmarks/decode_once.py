"""Decode an image data set into the decoded-image cache once, before a lease's parallel jobs read
it (``benchmarks/full_scale_cifar10.sh``): without it each of the jobs started together finds the
cache empty and decodes the whole tree itself.

    python benchmarks/decode_once.py cifar10 DATA_ROOT
"""
from __future__ import annotations

import argparse
import sys
import time

from fedlatent.config import DataConfig
from fedlatent.data.cache import cache_root
from fedlatent.data.registry import DATASETS
from fedlatent.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a registered data set that reads data.root (cifar10, cifar100, image_folder, …)")
    parser.add_argument("root", help="its data.root")
    args = parser.parse_args(argv)
    if cache_root() is None:
        print("decode once: the decoded-image cache is off (FEDLATENT_CACHE_DIR=off); nothing to do")
        return 0
    start = time.perf_counter()
    try:
        DATASETS.get(args.dataset).build(DataConfig(dataset=args.dataset, root=args.root), 0)
    except ConfigError as err:
        print(f"decode once: {err}", file=sys.stderr)
        return 2
    print(f"decode once: {args.dataset} under {args.root} in the cache {cache_root()} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
