"""A Hugging Face dataset saved to disk (``save_to_disk`` folder or parquet files) as a labelled pool:
its train split to partition, its test split (else a held-out ``data.test_fraction``). Needs the
optional ``datasets`` package (``pip install 'fedlatent[huggingface]'``); decoded once through the
decoded-image cache (:mod:`fedlatent.data.cache`), like the other image data sets."""
from __future__ import annotations

import importlib.util

from fedlatent.config import DataConfig
from fedlatent.data.cache import decoded as cached
from fedlatent.data.datasets.images import _root, _with_test
from fedlatent.data.registry import register_dataset
from fedlatent.data.sources import Pool
from fedlatent.errors import ConfigError
from fedlatent.registry import Key

KEYS = {
    "image_column": Key("", "the column of images (datasets.Image) or fixed-length numeric arrays; "
                        "'' = the one called image or img, else the only Image column"),
    "label_column": Key("", "the column of integer labels; '' = the one called label or labels, "
                        "else the only ClassLabel column"),
    "train_split": Key("train", "the split to partition over the clients"),
    "test_split": Key("test", "the split tested on; without a split 'test', or with '', "
                      "data.test_fraction is held out"),
}


@register_dataset("huggingface", reads=("root", "image_size", "test_fraction"), keys=KEYS)
def _huggingface(cfg: DataConfig, seed: int) -> Pool:
    """A Hugging Face dataset under data.root: a save_to_disk folder or parquet files (needs the datasets package)."""
    if importlib.util.find_spec("datasets") is None:
        raise ConfigError("data.dataset = 'huggingface' needs the Hugging Face datasets package: "
                          "pip install 'fedlatent[huggingface]'")
    from fedlatent.data.readers import huggingface as hf

    root, size = _root(cfg), cfg.image_size or None
    keys = {k: cfg.options.get(k, key.default) for k, key in KEYS.items()}
    return _with_test(*cached("huggingface", hf.LAYOUTS[hf.layout(root)], root, {"image_size": size, **keys},
                              lambda: hf.read_huggingface(root, image_size=size, **keys)))
