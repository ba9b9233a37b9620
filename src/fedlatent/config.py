"""Typed run configuration: TOML in, validated dataclasses out, one clear line on bad input.

Every key has a default and a one-line ``doc``; unknown keys, wrong types and out-of-range
values raise :class:`~fedlatent.errors.ConfigError` naming the key and what is allowed. Method
keys (``[algorithm]`` beside ``name``, and each ``[[terms]]`` table) are free-form here and are
validated by the method registry, which knows each method's parameters. Likewise the names
``model.arch``, ``data.dataset`` and ``data.partition`` are open lists: the registries of models
and data (layers above this one) plug their checks in with :func:`add_check`, and keys a
component declares for itself are kept in its section's ``options``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from fedlatent.errors import ConfigError, not_allowed, unknown_key


def _key(default: Any, doc: str, *, choices: Iterable[str] | None = None,
         low: float | None = None, high: float | None = None, low_open: bool = False, auto: str = "",
         high_open: bool = False) -> Any:
    """A config field with its documentation and the values it allows (``auto``: what the value
    ``"auto"`` means, for a number that may also be left to the data)."""
    meta = {"doc": doc, "choices": tuple(choices) if choices else None, "low": low, "high": high,
            "low_open": low_open, "auto": auto, "high_open": high_open}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


DEFAULT_CLIENTS = 10  # data.num_clients = "auto" on a pool whose data name no clients of their own


@dataclass
class DataConfig:
    dataset: str = _key("digits", "data set (a registered name: see the list below)")
    root: str = _key("data", "folder holding the data set files (image data sets)")
    path: str = _key("", "per-client arrays file (.npz) for dataset = 'arrays'")
    partition: str = _key("iid", "how samples are split over clients (a registered name: see the list "
                          "below; 'given' = the data set's own clients)")
    alpha: float = _key(0.5, "Dirichlet concentration (label skew; smaller = more skewed)",
                        low=0.0, low_open=True)
    num_clients: int | str = _key("auto", "number of clients, or 'auto': the data's own (one per domain for "
                                  "partition = 'domains', a data set's own clients), else 10", low=1,
                                  auto="the data's own count, else 10")
    classes_per_client: int = _key(2, "classes per client for partition = 'shards'", low=1)
    min_size: int = _key(10, "Dirichlet: smallest client size accepted (the seeds' retry rule)", low=0)
    balance: bool = _key(True, "Dirichlet: stop giving a class to clients holding >= N/n samples")
    max_retries: int = _key(1000, "Dirichlet: passes tried before giving up", low=1)
    test_fraction: float = _key(0.2, "held-out global test fraction for data sets without a test "
                                "split (digits: stratified, fixed)", low=0.0, high=0.9, low_open=True)
    train_per_class: int = _key(0, "at most this many training images per class (per class and domain "
                                "where the data set has domains): a subset fixed by the data seed, "
                                "drawn before partitioning (0 = all)", low=0)
    test_per_class: int = _key(0, "test images per class (per class and domain): the official test split "
                               "cut to at most this many, or, for a data set without one, this many held "
                               "out instead of test_fraction (FedUV's PACS protocol: 40); 0 = all / "
                               "test_fraction", low=0)
    val_fraction: float = _key(0.0, "per-client validation split of each client's training data "
                               "(FedUV protocol: 0.1)", low=0.0, high=0.9)
    local_test_fraction: float = _key(0.0, "per-client test split of each client's data, for "
                                      "personalised evaluation", low=0.0, high=0.9)
    merge_test: bool = _key(False, "merge the official test split into the training pool before partitioning "
                            "(no hold-out either); the global test set is then the union of the clients' "
                            "local_test_fraction splits (SphereFed's personalisation setting, Appendix B: 0.15)")
    augment: bool = _key(False, "random crop (pad 4) + horizontal flip on image batches")
    autoaugment: str = _key("none", "AutoAugment policy applied after crop + flip ('cifar10': the 25 "
                            "sub-policies of Cubuk et al. 2019, as FedDecorr's release uses on CIFAR-100 "
                            "and Tiny-ImageNet)", choices=("none", "cifar10"))
    augment_policy: str = _key("none", "a data set's own training augmentation ('flamby_isic': FLamby's "
                               "Fed-ISIC2019 one — scale, rotate, brightness/contrast, flips, shear, random "
                               "crop to data.image_size, coarse dropout)", choices=("none", "flamby_isic"))
    normalize: bool = _key(True, "standardise inputs with the training set's channel mean/std")
    image_size: int = _key(0, "side length images are resized to; 0 = the data set's own: as stored for "
                           "image_folder and CIFAR trees (all images one size), 32 for domains, ham10000, "
                           "rxrx1 and fed_isic2019", low=0)
    synthetic_alpha: float = _key(0.0, "Synthetic(α, β): model heterogeneity α", low=0.0)
    synthetic_beta: float = _key(0.0, "Synthetic(α, β): feature heterogeneity β", low=0.0)
    synthetic_model: str = _key("two_layer", "Synthetic label map: 'one_layer' (FedProx) or "
                                "'two_layer' (Ditto+MMD paper)", choices=("one_layer", "two_layer"))
    samples_per_client: int = _key(5000, "Synthetic: samples per client (split 64/16/20 "
                                   "train/val/test)", low=10)
    seed: int = _key(-1, "seed of the data (generation and partition); -1 = the run seed",
                     low=-1, high=2**32 - 1)
    holdout_clients: float = _key(0.0, "clients of the partition that never train, evaluated as new clients: a "
                                  "fraction in (0, 1) of data.num_clients (rounded down, at least 1) or a whole "
                                  "count; drawn from the data seed; 0 = none", low=0.0)
    options: dict = _key({}, "keys a data set or partition declares for itself (written flat in [data])")

    def clients(self, default: int = DEFAULT_CLIENTS) -> int:
        """``num_clients``, or ``default`` when it is ``"auto"`` (a pool split into clients the data does not name)."""
        return default if self.num_clients == "auto" else int(self.num_clients)

    def side(self, default: int = 32) -> int:
        """``image_size``, or ``default`` when it is 0 (the data set's own size)."""
        return self.image_size or default



@dataclass
class ModelConfig:
    arch: str = _key("mlp", "network (a registered name: see the list below)")
    hidden: list = _key([128], "mlp: hidden layer widths (the last one is z)")
    width: str = _key("release", "cnn: channel widths 16/32/64 ('release') or 64/128/256 ('paper')",
                      choices=("release", "paper"))
    projector: int = _key(0, "width of a 2-layer FC-BN-ReLU projector before the classifier (0 = none)",
                          low=0)
    softmax_output: bool = _key(False, "feed the model's softmax output to the loss (the Ditto+MMD "
                                "release's double softmax; for faithful runs only)")
    weights: str = _key("", "pretrained weights file (.pth state dict or .safetensors, as published: "
                        "efficientnet-pytorch's efficientnet-b0, torchvision's resnet18); the head is replaced")
    options: dict = _key({}, "keys a model declares for itself, e.g. norm (written flat in [model])")


@dataclass
class TrainConfig:
    rounds: int = _key(20, "communication rounds", low=1)
    local_epochs: int = _key(1, "local epochs per round", low=1)
    local_steps: int = _key(0, "local steps (mini-batches) per round instead of local_epochs, drawn "
                            "epoch after epoch (0 = use local_epochs; Fed-ISIC2019: 100)", low=0)
    optimizer: str = _key("sgd", "client optimiser of the local (and Ditto's personal) model; torch's "
                          "defaults besides lr, momentum (sgd) and weight_decay", choices=("sgd", "adam", "adamw"))
    optimizer_state: str = _key("fresh", "client optimiser state: 'fresh' each round (the papers) or 'kept' "
                                "per client across rounds in its state (the Ditto+MMD release)",
                                choices=("fresh", "kept"))
    batch_size: int = _key(32, "local mini-batch size", low=1)
    lr: float = _key(0.05, "local learning rate", low=0.0, low_open=True)
    momentum: float = _key(0.0, "local SGD momentum", low=0.0, high=0.999)
    weight_decay: float = _key(0.0, "local weight decay", low=0.0)
    participation: float = _key(1.0, "fraction ρ of the N clients sampled each round: floor(ρ·N) of them, "
                                "at least 1 (the seed papers' int(N·ρ): 10 clients at 0.15 → 1, at 0.35 → 3); "
                                "for m clients a round, set m/N", low=0.0, high=1.0, low_open=True)
    client_sampling: str = _key("fixed", "how a round selects its clients: 'fixed' (floor(participation * N) distinct "
                                "clients, uniformly without replacement) or 'poisson' (each client independently "
                                "with probability participation, the sampling dp-accounting's PLD accountant "
                                "supports; a round may then select none, and the model stays)",
                                choices=("fixed", "poisson"))
    drop_last: bool = _key(False, "drop each epoch's last incomplete batch")
    lr_schedule: str = _key("constant", "learning rate over rounds", choices=("constant", "cosine", "multistep"))
    lr_min: float = _key(0.0, "cosine schedule: final learning rate", low=0.0)
    lr_step: int = _key(40, "multistep schedule: multiply the rate by lr_gamma every lr_step rounds", low=1)
    lr_milestones: list = _key([], "multistep schedule: the rounds (0-based) from which the rate is "
                               "multiplied by lr_gamma once more; when given, instead of every lr_step rounds")
    lr_gamma: float = _key(0.1, "multistep schedule: the factor at each step", low=0.0, low_open=True)
    threads: int = _key(1, "torch intra-op threads (1 is fastest for small models on few cores)",
                        low=1)
    device: str = _key("cpu", "torch device for training ('cpu', 'cuda', 'cuda:1', ...)")
    compile: bool = _key(False, "torch.compile the trained model's forward in the sequential client step "
                         "(inductor: a C++ compiler on a CPU); pays off for convolutional models over "
                         "long runs, slower for small MLPs (benchmarks/README.md); not with backend = "
                         "'vectorized'")
    precision: str = _key("auto", "arithmetic of local training: 'fp32', or mixed precision under autocast with "
                          "float32 master weights — 'bf16', 'fp16' (with dynamic loss scaling); 'auto' = bf16 on a "
                          "CUDA device that supports it, else fp32 (the run's config.toml records the choice)",
                          choices=("auto", "fp32", "bf16", "fp16"))
    on_nonfinite: str = _key("stop", "a client whose loss or update is not finite: 'stop' the run "
                             "(exit 1) or 'drop' it from that round's aggregate", choices=("stop", "drop"))
    on_client_error: str = _key("stop", "a client whose local update raises: 'stop' the run (exit 1) "
                                "or 'drop' it from that round's aggregate", choices=("stop", "drop"))
    min_clients: int = _key(0, "fewest clients a round may aggregate after drops; below it the run "
                            "stops (0: a round that drops every client keeps the global model)", low=0)
    client_state_memory: int | str = _key("unbounded", "memory the clients' own states (SCAFFOLD's c_i, Ditto's "
                                          "personal model, ...) may take: bytes, or a number with a unit ('256MiB', "
                                          "'2GB'); the least recently used are kept in files under the run folder "
                                          "instead, the numbers unchanged; 'unbounded' = every state in memory; not on "
                                          "backend = 'flower' (its nodes keep their clients' states)")


@dataclass
class ServerConfig:
    optimizer: str = _key("auto", "server optimiser on the pseudo-gradient ('auto' = the method's: "
                          "sgd with lr 1 is FedAvg)", choices=("auto", "sgd", "momentum", "adam", "adagrad", "yogi"))
    lr: float = _key(-1.0, "server learning rate η (-1 = 1.0 for sgd/momentum, 0.1 for adagrad, 0.01 for adam/yogi)")
    momentum: float = _key(0.9, "momentum β (optimizer = 'momentum')", low=0.0, high=0.999)
    momentum_form: str = _key("hsu", "'hsu': m = βm + Δ; 'ema': m = βm + (1-β)Δ (FedDecorr release)",
                              choices=("hsu", "ema"))
    beta1: float = _key(0.9, "FedOpt β1", low=0.0, high=0.999)
    beta2: float = _key(0.99, "FedOpt β2", low=0.0, high=0.9999)
    tau: float = _key(1e-3, "FedOpt adaptivity τ", low=0.0, low_open=True)


@dataclass
class EvalConfig:
    every: int = _key(1, "evaluate every k rounds (the last round always)", low=1)
    batch_size: int = _key(500, "evaluation batch size", low=1)
    personalized: str = _key("auto", "evaluate each client's model on its own splits: 'auto' (when "
                             "the method personalises or clients have test splits), 'always', 'never'",
                             choices=("auto", "always", "never"))
    clients: int | str = _key("auto", "clients a round's evaluation takes (validation accuracy, held-out clients): "
                              "every one up to this many, above it a seeded sample of this many, reported with "
                              "its standard error", low=1,
                              auto="every client up to 1,000, a sample of 1,000 above")
    final_clients: int | str = _key("auto", "clients the final evaluation takes: a seeded sample of this many, "
                                    "reported with its standard error", low=1, auto="every client")


DIAGNOSTICS = ("collapse", "classifier", "alignment", "layer_alignment", "uniformity", "per_class", "tsne", "data",
               "flops")


@dataclass
class DiagnosticsConfig:
    which: list = _key([], "diagnostics to compute (empty = none, no cost): " + ", ".join(DIAGNOSTICS))
    every: int = _key(1, "compute them every k rounds (the last round always)", low=1)
    split: str = _key("test", "samples they are computed on: 'test' (the global test set, else the "
                      "clients' test splits), 'val' or 'train' (all clients' splits)",
                      choices=("test", "val", "train"))
    clients: bool = _key(False, "also for the local models the selected clients trained that round")
    threshold: float = _key(1e-3, "collapse: sigma_k counts as significant when sigma_k / sigma_1 > threshold",
                            low=0.0, high=1.0, low_open=True)
    uniformity_t: float = _key(2.0, "uniformity: t in log mean exp(-t |z_i - z_j|^2) of unit z",
                               low=0.0, low_open=True)
    max_samples: int = _key(2000, "uniformity: a seeded subsample of at most this many samples "
                            "(the pairwise cost grows as its square)", low=2)
    tsne_class: int = _key(0, "tsne: the class whose features are embedded", low=0)
    tsne_clients: int = _key(5, "tsne: the first clients (by id) holding that class", low=1)
    tsne_samples: int = _key(50, "tsne: at most this many samples per client (seeded subsample)", low=2)
    histogram_bins: int = _key(30, "data: bins of the per-client histogram of mean input values", low=2)
    trace_terms: bool = _key(False, "write every client step's task loss and unweighted loss terms to "
                             "terms_trace.jsonl (the papers' ablation curves; every backend)")


@dataclass
class FlowerConfig:
    supernodes: int = _key(0, "backend = 'flower' on the simulation engine: virtual SuperNodes (0 = one per client; "
                           "fewer: node k serves the clients whose id is k modulo their number)", low=0)
    cpus: int = _key(0, "simulation engine: CPUs given to Ray (0 = the machine's)", low=0)
    client_cpus: float = _key(1.0, "simulation engine: CPUs reserved per ClientApp (cpus / client_cpus run at once)",
                              low=0.0, low_open=True)
    client_gpus: float = _key(0.0, "simulation engine: GPUs reserved per ClientApp (fractions share one)", low=0.0)
    timeout: float = _key(600.0, "seconds the server waits for a round's replies; a client that has not replied "
                          "is left out of the round (train.on_client_error decides what follows)",
                          low=0.0, low_open=True)
    client_state_on_server: bool = _key(True, "clients also send their new state back, so that checkpoints hold it "
                                        "and --resume restores it (false: it stays on the nodes only)")
    server_reads_data: bool = _key(False, "the ServerApp opens the data set itself, for the global test split it "
                                   "evaluates on (false: it opens no data; the nodes evaluate the global model and "
                                   "the census tells the classes, input shape and clients)")


TRACKERS = ("tensorboard", "mlflow", "wandb")


@dataclass
class TrackingConfig:
    backends: list = _key([], "experiment trackers each run is sent to (empty = none, none imported): "
                          + ", ".join(TRACKERS) + " (pip install 'fedlatent[tracking]')")
    experiment: str = _key("fedlatent", "MLflow experiment and W&B project the runs go to")
    tags: dict = _key({}, "tags (a table of name = \"value\") set on the run in every tracker; fedlatent sweep "
                      "adds the study's name and the cell's label on each axis")
    mlflow_uri: str = _key("sqlite:///runs/mlflow.db", "MLflow tracking store: sqlite:///FILE (MLflow's default "
                           "store; three slashes: relative to the working folder), file:FOLDER (recent MLflow: "
                           "with MLFLOW_ALLOW_FILE_STORE=true), or a tracking server's http(s):// address")
    wandb_mode: str = _key("offline", "W&B: 'offline' writes the run's records under the run directory (or "
                           "$WANDB_DIR) for wandb sync; 'online' sends them while it trains (needs wandb login)",
                           choices=("offline", "online"))
    tensorboard_dir: str = _key("", "TensorBoard event files: '' = <run dir>/tensorboard, else "
                                "<tensorboard_dir>/<run dir name>")
    artifacts: bool = _key(True, "at the end, send the run directory's files (plots, metrics, summary, config; "
                           "not checkpoints/) to MLflow and W&B")


@dataclass
class PrivacyConfig:
    clip_norm: float = _key(float("inf"), "each client's update w_k - w (every entry that travels) clipped to this "
                            "L2 norm before aggregation (inf = no clipping: the plain update codec)",
                            low=0.0, low_open=True)
    noise_multiplier: float = _key(0.0, "client-level DP-FedAvg: Gaussian noise of standard deviation "
                                   "noise_multiplier * clip_norm on the sum of the clipped updates (0 = no "
                                   "noise, no privacy accounting; > 0 needs a finite clip_norm)", low=0.0)
    delta: float = _key(1e-5, "the delta at which the accountants report epsilon (0 < delta < 1; "
                        "read when noise_multiplier or sample_noise_multiplier > 0)", low=0.0, low_open=True)
    sample_clip_norm: float = _key(float("inf"), "sample-level DP-SGD: each sample's gradient clipped to this L2 "
                                   "norm inside the local step (inf = off: the plain step)", low=0.0, low_open=True)
    sample_noise_multiplier: float = _key(0.0, "sample-level DP-SGD: Gaussian noise of standard deviation "
                                          "sample_noise_multiplier * sample_clip_norm on the sum of a batch's "
                                          "clipped per-sample gradients (0 = no noise, no accounting; > 0 needs "
                                          "a finite sample_clip_norm and batch_sampling = 'poisson')", low=0.0)
    batch_sampling: str = _key("shuffled", "the local batches under sample-level DP-SGD: 'shuffled' (each epoch's "
                               "permutation, as without DP) or 'poisson' (each sample in each step's batch with "
                               "probability batch_size / n_k, the sampling the accountant assumes)",
                               choices=("shuffled", "poisson"))
    accountant: str = _key("rdp", "the accountant of client-level DP-FedAvg: 'rdp' (dp-accounting's RDP accountant) "
                           "or 'pld' (its privacy-loss-distribution accountant, tighter; needs "
                           "train.client_sampling = 'poisson')", choices=("rdp", "pld"))
    randomness: str = _key("auto", "the source of the DP noise and of each round's client selection: 'secret' (a "
                           "key from the OS's CSPRNG, kept in the checkpoints, never sent: no other party can "
                           "recompute the noise), 'seeded' (from the run's seed: the run repeats to the bit, "
                           "and its epsilon holds only against observers who do not hold the seed) or 'auto' "
                           "(secret on backend = 'flower' when noise is added, else seeded)", choices=("auto", "secret", "seeded"))
    over_bound: str = _key("clip", "the server's check of the clip bound (privacy.clip_norm finite, no secure "
                           "aggregation): an update whose norm exceeds the round's clip norm beyond rounding "
                           "is clipped again ('clip') or left out of the round ('drop'); counted in "
                           "metrics.jsonl as privacy_over_bound", choices=("clip", "drop"))
    # adaptive clipping (Andrew et al. 2021) and the calibration statistics under DP
    target_quantile: float = _key(0.0, "adaptive clipping: the quantile gamma of the clients' update norms that the "
                                  "clip norm tracks, starting from clip_norm (0 = off: clip_norm stays fixed; "
                                  "0.5 = the median; 0 <= gamma < 1)", low=0.0, high=1.0, high_open=True)
    clip_learning_rate: float = _key(0.2, "adaptive clipping: eta_C of the geometric update "
                                     "C <- C * exp(-eta_C * (b - gamma))", low=0.0, low_open=True)
    clip_count_noise: float = _key(0.0, "adaptive clipping: sigma_b, standard deviation of the Gaussian noise on "
                                   "the count of clients within the clip norm (with noise_multiplier > 0 it must "
                                   "exceed noise_multiplier / 2; the paper suggests m / 20)", low=0.0)
    statistics_clip_norm: float = _key(float("inf"), "each client's calibration statistics (FFC's V, U; CCVR's "
                                       "per-class sums) clipped to this L2 norm, all entries together (inf = as "
                                       "computed; a private run with FFC or CCVR needs it finite)",
                                       low=0.0, low_open=True)
    statistics_noise_multiplier: float | str = _key("auto", "Gaussian noise of standard deviation "
                                                    "statistics_noise_multiplier * statistics_clip_norm on the sums "
                                                    "of the calibration statistics", low=0.0,
                                                    auto="noise_multiplier")

    # secure aggregation (SecAgg+, Bell et al. 2020) on the Flower backend: the server learns only sums
    secure_aggregation: str = _key("off", "'secaggplus': each client masks what it sends (its update, its FFC "
                                   "or CCVR statistics) so that the server learns only their sum (backend = 'flower' only)",
                                   choices=("off", "secaggplus"))
    secagg_num_shares: int = _key(0, "SecAgg+: each client's neighbours, itself included, among which its secrets "
                                  "are shared (an odd number >= 3; 0 = every client of the session)", low=0)
    secagg_threshold: int = _key(0, "SecAgg+: shares that reconstruct a client's secret, and the fewest clients "
                                 "whose sum the server can unmask (>= 2; 0 = a majority of the neighbours, at "
                                 "least 2)", low=0)
    secagg_update_range: float = _key(0.0, "SecAgg+: every entry of a client's pre-weighted update must lie in "
                                      "[-range, range], the quantisation's span; one outside fails the client "
                                      "(0 = privacy.clip_norm where finite, else 8)", low=0.0)
    secagg_statistics_range: float = _key(1.0, "SecAgg+: the same for the calibration statistics, each divided by "
                                          "the clients' total training samples (FFC's, CCVR's sums of normalised "
                                          "features: within 1)",
                                          low=0.0, low_open=True)
    secagg_quantization_range: int = _key(2 ** 40, "SecAgg+: levels of the quantisation grid over "
                                          "[-range, range] (its step: 2 range / levels; at most 2**40, so that "
                                          "sums of up to 2**24 clients stay within the 64-bit masks)",
                                          low=2, high=2 ** 40)
    distributed: str = _key("off", "distributed DP: 'skellam' = each client adds its share of Skellam noise to its "
                            "clipped, rotated, quantised update before it leaves (Agarwal, Kairouz and Liu 2021), "
                            "the server sums modulo 2**distributed_bits: noise_multiplier and clip_norm as for "
                            "DP-FedAvg, epsilon for the fewest clients a round may aggregate (embedded backends; "
                            "on Flower with secure_aggregation = 'secaggplus', which masks these vectors)",
                            choices=("off", "skellam"))
    distributed_bits: int = _key(20, "distributed DP: bits b of the modular sum (each message is b bits per "
                                 "coordinate)", low=8, high=48)

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm adapts (``target_quantile`` > 0)."""
        return self.target_quantile > 0

    @property
    def statistics_sigma(self) -> float:
        """The statistics' noise multiplier, ``"auto"`` resolved to ``noise_multiplier``."""
        value = self.statistics_noise_multiplier
        return self.noise_multiplier if value == "auto" else float(value)


@dataclass
class CompressionConfig:
    kind: str = _key("none", "compression of each client's update on its way to the server: 'none' (as it is) or "
                     "'topk' (the fraction of entries of largest magnitude; Stich et al. 2018)",
                     choices=("none", "topk"))
    fraction: float = _key(0.01, "top-k: the share of the update's entries each client sends (0 < fraction <= 1), "
                           "rounded up to a whole entry", low=0.0, high=1.0, low_open=True)
    error_feedback: bool = _key(True, "top-k: what a client leaves out is kept on the client and added to its next "
                                "update (error feedback; false: dropped)")


@dataclass
class RunConfig:
    seed: int = _key(0, "seed of every random choice of the run (numpy's legacy generator, used by "
                     "the Dirichlet partition, takes 0 .. 2**32 - 1)", low=0, high=2**32 - 1)
    backend: str = _key("auto", "who drives the rounds ('auto': vectorized where the run trains in lockstep "
                        "and is measured faster, else simulation; the run's config.toml records the choice)",
                        choices=("auto", "simulation", "vectorized", "flower"))
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: dict = field(default_factory=lambda: {"name": "fedavg"})
    terms: list = field(default_factory=list)
    server: ServerConfig = field(default_factory=ServerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    flower: FlowerConfig = field(default_factory=FlowerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)

    @property
    def data_seed(self) -> int:
        return self.seed if self.data.seed < 0 else self.data.seed


SECTIONS = {f.name: f.type for f in dataclasses.fields(RunConfig)}


def _type_name(tp: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a table"}.get(tp, str(tp))


def _coerce(key: str, value: Any, tp: Any, meta: dict) -> Any:
    """Check one value against its field's type and allowed range; return it in that type."""
    if meta.get("auto"):  # a number, or "auto"
        if value == "auto":
            return value
        tp = tp.split(" | ")[0]
    elif tp == "int | str":  # a number or a string the key's own check reads (a size with its unit)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key} = {value!r}: expected an integer or a string")
        return value
    tp = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}.get(tp, tp)
    ok = (isinstance(value, bool) if tp is bool else
          isinstance(value, int) and not isinstance(value, bool) if tp is int else
          isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float else
          isinstance(value, tp))
    if not ok:
        raise ConfigError(f"{key} = {value!r}: expected {_type_name(tp)}" + (_auto(meta) if meta.get("auto") else ""))
    if tp is float:
        value = float(value)
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(not_allowed(f"{key} = {value!r}: allowed values are {', '.join(meta['choices'])}", value,
                                      meta["choices"]))
    low, high = meta.get("low"), meta.get("high")
    upper = f"< {high}" if meta.get("high_open") else f"<= {high}"
    if low is not None and (value < low or (meta.get("low_open") and value == low)):
        bound = f"> {low}" if meta.get("low_open") else f">= {low}"
        raise ConfigError(f"{key} = {value!r}: must be {bound}" + (f" and {upper}" if high is not None else "")
                          + (_auto(meta) if meta.get("auto") else ""))
    if high is not None and (value > high or (meta.get("high_open") and value == high)):
        raise ConfigError(f"{key} = {value!r}: must be {upper}")
    return value


def _auto(meta: dict) -> str:
    return f", or \"auto\" ({meta['auto']}; also when the key is left out)"


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table of keys")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "options"}
    unknown = sorted(set(raw) - set(fields))
    open_section = any(f.name == "options" for f in dataclasses.fields(cls))
    if unknown and not open_section:
        raise ConfigError(unknown_key(f"{name}.{unknown[0]}", fields, f"[{name}]"))
    values = {k: _coerce(f"{name}.{k}", v, fields[k].type, dict(fields[k].metadata))
              for k, v in raw.items() if k in fields}
    if open_section:  # checked against the chosen component's own keys by the registries' checks
        for k in unknown:
            if isinstance(raw[k], dict):
                raise ConfigError(f"{name}.{k} must be a value, not a table")
        values["options"] = {k: raw[k] for k in unknown}
    return cls(**values)


def from_dict(raw: dict) -> RunConfig:
    """Build and validate a :class:`RunConfig` from a parsed TOML document."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(unknown_key(unknown[0], SECTIONS, "the top level"))
    top = {f.name: f for f in dataclasses.fields(RunConfig)}
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        tp = top[name].type
        if name == "algorithm":
            if not isinstance(value, dict):
                raise ConfigError("[algorithm] must be a table with at least name = '...'")
            kwargs[name] = {"name": "fedavg", **value}
            if not isinstance(kwargs[name]["name"], str):
                raise ConfigError(f"algorithm.name = {kwargs[name]['name']!r}: expected a string")
        elif name == "terms":
            if not isinstance(value, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                      for t in value):
                raise ConfigError("terms must be an array of tables, each with name = '...' ([[terms]])")
            kwargs[name] = value
        elif tp in ("int", "str"):
            kwargs[name] = _coerce(name, value, tp, dict(top[name].metadata))
        else:
            kwargs[name] = _build_section(name, typing.get_type_hints(RunConfig)[name], value)
    config = RunConfig(**kwargs)
    _check_consistency(config)
    for check in _CHECKS:
        check(config)
    return config


UNBOUNDED = "unbounded"  # train.client_state_memory's default: every client's state in memory
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def memory_budget(value: int | str) -> int | None:
    """``train.client_state_memory`` in bytes — an integer, or a number with a unit ("256MiB",
    "2 GB", "1.5GiB") — or None for ``"unbounded"``; a one-line ConfigError for anything else."""
    if value == UNBOUNDED:
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ConfigError(f"train.client_state_memory = {value!r}: expected bytes (an integer, or a number with a "
                          f"unit: KiB, MiB, GiB, KB, MB, GB) or {UNBOUNDED!r}")
    number = int(float(match.group(1)) * _UNITS[unit])
    if number <= 0:
        raise ConfigError(f"train.client_state_memory = {value!r}: must be > 0 bytes (or {UNBOUNDED!r})")
    return number


_CHECKS: list[Callable[[RunConfig], None]] = []
_DESCRIBERS: list[Callable[[], str]] = []


def add_check(check: Callable[[RunConfig], None], describe: Callable[[], str]) -> None:
    """Plug in a check run on every loaded configuration (raising :class:`ConfigError`; it may fill
    in resolved ``options``) and the text it adds to :func:`describe` — how the registries of
    models and data, which live above this layer, validate the names and keys they own."""
    _CHECKS.append(check)
    _DESCRIBERS.append(describe)


def _check_consistency(config: RunConfig) -> None:
    """Rules that involve more than one key."""
    d = config.data
    if d.val_fraction + d.local_test_fraction >= 0.95:
        raise ConfigError("data.val_fraction + data.local_test_fraction must leave training data (< 0.95)")
    if 0 < d.image_size < 8:
        raise ConfigError(f"data.image_size = {d.image_size}: must be 0 (the data set's own size) or >= 8")
    if d.merge_test and d.local_test_fraction == 0:
        raise ConfigError("data.merge_test = true needs data.local_test_fraction > 0 (the clients' test "
                          "splits are then the only test data)")
    if d.holdout_clients:
        if d.num_clients == "auto":
            raise ConfigError(f"data.holdout_clients = {d.holdout_clients:g} needs a fixed data.num_clients (not "
                              "'auto'): the clients held out are counted from it")
        holdout_count(d.holdout_clients, int(d.num_clients))
    if config.server.lr <= 0 and config.server.lr != -1.0:
        raise ConfigError(f"server.lr = {config.server.lr}: must be > 0 (or -1 for the optimiser's default)")
    if not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in config.model.hidden) \
            or not config.model.hidden:
        raise ConfigError(f"model.hidden = {config.model.hidden!r}: expected a non-empty list of positive integers")
    memory_budget(config.train.client_state_memory)
    m = config.train.lr_milestones
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in m) or m != sorted(set(m)):
        raise ConfigError(f"train.lr_milestones = {m!r}: expected increasing positive round numbers")
    _check_diagnostics(config.diagnostics)
    _check_tracking(config.tracking)
    _check_privacy(config.privacy)
    _check_compression(config)
    _check_distributed(config)


def holdout_count(value: float, num_clients: int) -> int:
    """How many of ``num_clients`` clients ``data.holdout_clients = value`` holds out: a fraction ρ in
    (0, 1) gives ⌊ρ·n⌋ (nudged up by 1e-9, as ``train.participation``), at least 1; a whole number
    ≥ 1 is the count. At least one client must be left to train."""
    if not math.isfinite(value) or (value >= 1 and value != int(value)):
        raise ConfigError(f"data.holdout_clients = {value:g}: a fraction in (0, 1) or a whole number of clients")
    count = max(1, math.floor(value * num_clients + 1e-9)) if value < 1 else int(value)
    if count >= num_clients:
        raise ConfigError(f"data.holdout_clients = {value:g} holds out {count} of the {num_clients} clients: at least "
                          "one must be left to train")
    return count


def _check_privacy(cfg: PrivacyConfig) -> None:
    """What the range checks of ``[privacy]`` leave: nan, δ < 1, and noise only with a bound to scale it."""
    if cfg.clip_norm != cfg.clip_norm:
        raise ConfigError("privacy.clip_norm = nan: must be > 0 (inf: no clipping)")
    _check_noise_finite(cfg)
    if not 0 < cfg.delta < 1:
        raise ConfigError(f"privacy.delta = {cfg.delta}: must be > 0 and < 1")
    if cfg.noise_multiplier > 0 and math.isinf(cfg.clip_norm):
        raise ConfigError(f"privacy.noise_multiplier = {cfg.noise_multiplier} needs a finite privacy.clip_norm: "
                          "the noise's scale is noise_multiplier * clip_norm")
    if cfg.sample_clip_norm != cfg.sample_clip_norm:
        raise ConfigError("privacy.sample_clip_norm = nan: must be > 0 (inf: no per-sample clipping)")
    if cfg.sample_noise_multiplier > 0 and math.isinf(cfg.sample_clip_norm):
        raise ConfigError(f"privacy.sample_noise_multiplier = {cfg.sample_noise_multiplier} needs a finite "
                          "privacy.sample_clip_norm: the noise's scale is sample_noise_multiplier * sample_clip_norm")
    if cfg.batch_sampling == "poisson" and math.isinf(cfg.sample_clip_norm):
        raise ConfigError("privacy.batch_sampling = 'poisson' is sample-level DP-SGD's sampling: it needs a finite "
                          "privacy.sample_clip_norm")
    if cfg.sample_noise_multiplier > 0 and cfg.batch_sampling != "poisson":
        raise ConfigError(f"privacy.sample_noise_multiplier = {cfg.sample_noise_multiplier} needs "
                          "privacy.batch_sampling = 'poisson': the accountant's amplification by sampling assumes "
                          "each sample joins each batch independently, not an epoch's shuffle")
    _check_adaptive_and_statistics(cfg)
    _check_secure_aggregation(cfg)


def _check_noise_finite(cfg: PrivacyConfig) -> None:
    """Every noise multiplier a finite number: nan compares false with every bound, and σ = ∞ would
    pass the range check and make the first noisy round's model infinite."""
    for key in ("noise_multiplier", "sample_noise_multiplier", "clip_count_noise", "statistics_noise_multiplier"):
        value = getattr(cfg, key)
        if value != "auto" and not math.isfinite(float(value)):
            raise ConfigError(f"privacy.{key} = {value}: must be a finite number >= 0 (0: no noise)")


def _check_adaptive_and_statistics(cfg: PrivacyConfig) -> None:
    """Adaptive clipping's keys (a start to adapt from, a quantile below 1, a count noise that leaves
    the updates' noise finite: Andrew et al. 2021, Theorem 1) and the statistics' noise (only in a
    private run, whose ε it joins)."""
    for key in ("target_quantile", "clip_learning_rate", "clip_count_noise", "statistics_clip_norm"):
        if getattr(cfg, key) != getattr(cfg, key):
            raise ConfigError(f"privacy.{key} = nan: expected a number")
    if cfg.statistics_sigma != cfg.statistics_sigma:
        raise ConfigError("privacy.statistics_noise_multiplier = nan: expected a number >= 0 or \"auto\"")
    if cfg.adaptive and math.isinf(cfg.clip_norm):
        raise ConfigError(f"privacy.target_quantile = {cfg.target_quantile} needs a finite privacy.clip_norm: the "
                          "adaptive clip norm starts from it")
    if cfg.adaptive and cfg.noise_multiplier > 0 and not 2 * cfg.clip_count_noise > cfg.noise_multiplier:
        raise ConfigError(f"privacy.clip_count_noise = {cfg.clip_count_noise}: must exceed noise_multiplier / 2 = "
                          f"{cfg.noise_multiplier / 2:g}, else the updates' noise (noise_multiplier^-2 - "
                          "(2 clip_count_noise)^-2)^-1/2 is not finite")
    if cfg.statistics_noise_multiplier != "auto" and cfg.noise_multiplier == 0 and cfg.statistics_sigma > 0:
        raise ConfigError(f"privacy.statistics_noise_multiplier = {cfg.statistics_sigma} needs "
                          "privacy.noise_multiplier > 0: the statistics' epsilon composes with the training's")


def _check_secure_aggregation(cfg: PrivacyConfig) -> None:
    """SecAgg+'s keys alone (with the backend and the clients per round: ``validation.check_secure``)."""
    if cfg.secagg_num_shares and (cfg.secagg_num_shares < 3 or cfg.secagg_num_shares % 2 == 0):
        raise ConfigError(f"privacy.secagg_num_shares = {cfg.secagg_num_shares}: an odd number >= 3 (a client and "
                          "as many neighbours on each side; 0 = every client of the session)")
    if cfg.secagg_threshold == 1:
        raise ConfigError("privacy.secagg_threshold = 1: one share would reveal a client's secret; >= 2 (0 = a "
                          "majority of the neighbours)")
    if cfg.secagg_num_shares and cfg.secagg_threshold > cfg.secagg_num_shares:
        raise ConfigError(f"privacy.secagg_threshold = {cfg.secagg_threshold}: more than the "
                          f"privacy.secagg_num_shares = {cfg.secagg_num_shares} share holders of each client")
    if cfg.secagg_update_range != cfg.secagg_update_range or cfg.secagg_statistics_range != cfg.secagg_statistics_range:
        raise ConfigError("privacy.secagg_update_range / secagg_statistics_range = nan: expected a number")


def _check_names(key: str, names: list[str], allowed: Iterable[str], noun: str) -> None:
    """A list-valued key of names: each one of ``allowed`` (a ``noun``), none twice."""
    allowed = tuple(allowed)
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ConfigError(not_allowed(f"{key}: {unknown[0]!r} is not a {noun}; allowed values are {', '.join(allowed)}",
                                      unknown[0], allowed))
    if len(set(names)) != len(names):
        raise ConfigError(f"{key} = {names!r}: names a {noun} twice")


def _check_compression(config: RunConfig) -> None:
    """Top-k's error feedback carries past rounds' updates into a message: its norm is then no longer
    bounded by privacy.clip_norm (the DP noise's sensitivity), and a masked SecAgg+ vector is dense."""
    if config.compression.kind == "none":
        return
    p = config.privacy
    if p.noise_multiplier > 0:
        raise ConfigError(f"compression.kind = {config.compression.kind!r} with privacy.noise_multiplier > 0: a "
                          "compressed update is not bounded by the clip norm the noise is scaled to")
    if p.secure_aggregation != "off":
        raise ConfigError(f"compression.kind = {config.compression.kind!r} with privacy.secure_aggregation = "
                          f"{p.secure_aggregation!r}: the masked vector is dense, nothing would be saved")


def _check_distributed(config: RunConfig) -> None:
    """Distributed DP's settings: σ > 0 and a finite clip norm to scale its noise; what it does not
    cover yet refused in one line."""
    p = config.privacy
    if p.distributed == "off":
        return
    if not (p.noise_multiplier > 0 and math.isfinite(p.clip_norm)):
        raise ConfigError("privacy.distributed = 'skellam' needs privacy.noise_multiplier > 0 and a finite "
                          "privacy.clip_norm: its noise is noise_multiplier * clip_norm on the sum")
    for key, on in (("target_quantile", p.adaptive), ("statistics_clip_norm", math.isfinite(p.statistics_clip_norm))):
        if on:
            raise ConfigError(f"privacy.distributed = 'skellam' with privacy.{key} set: not built yet (the "
                              "distributed noise covers the model updates alone)")
    d = config.diagnostics
    if d.clients or "alignment" in d.which:
        raise ConfigError("privacy.distributed = 'skellam' with diagnostics.clients or 'alignment': a client's message "
                          "is its noised vector, not an update the diagnostics could measure")
    if config.backend == "flower" and p.secure_aggregation == "off":
        raise ConfigError("privacy.distributed = 'skellam' on Flower needs privacy.secure_aggregation = 'secaggplus': "
                          "without the masks the server reads each client's vector, whose own noise share (1/m of "
                          "the noise's variance) is no guarantee against it")


def _check_tracking(t: TrackingConfig) -> None:
    _check_names("tracking.backends", t.backends, TRACKERS, "tracker")
    bad = [k for k, v in t.tags.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"tracking.tags.{bad[0]} = {t.tags[bad[0]]!r}: expected a string")


def _check_diagnostics(d: DiagnosticsConfig) -> None:
    _check_names("diagnostics.which", d.which, DIAGNOSTICS, "diagnostic")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` → (path, value); the value is read as TOML, else taken as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    key, _, value = text.partition("=")
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return path, parsed


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    """Apply ``--set`` overrides to a parsed TOML document (a new dict is returned)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {part} is not a section")
        node[path[-1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a TOML run configuration (or the defaults when ``path`` is None) and apply overrides."""
    raw = {} if path is None else read_toml(Path(path))
    return from_dict(apply_overrides(raw, overrides))


def read_toml(path: Path, what: str = "config file") -> dict:
    """A TOML file's table; a folder, a missing or unreadable file and invalid TOML are one line."""
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder, not a TOML file")
    if not path.is_file():
        raise ConfigError(f"{what} {path} not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot read it ({err.strerror or err})") from None


def to_dict(config: RunConfig) -> dict:
    """The fully resolved configuration as plain data (TOML-writable); a section's ``options`` are
    written flat beside its fields, as they are read."""
    data = dataclasses.asdict(config)
    for section in data.values():
        if isinstance(section, dict) and isinstance(section.get("options"), dict):
            section.update(section.pop("options"))
    return data


def toml_value(value: Any) -> str:
    """``value`` (bool, number, string, list, table) as a TOML value (``tomllib`` reads it back equal)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # a basic string: escape quotes, backslashes and control characters
        return '"' + "".join(
            "\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F
            else c for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table, its keys quoted
        return "{" + ", ".join(f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def show_value(value: Any) -> str:
    """A value as TOML writes it, strings unquoted: ``true``, ``0.001``, ``1e-05``, ``[64, 128]`` — how
    ``fedlatent check`` prints a setting and a tracker records it as a parameter."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


# keys added after run folders were written with this layout, left out of config.toml at their
# defaults (which change no number), so that those folders stay resumable
LATER_KEYS: dict[tuple[str, str], Any] = {
    ("data", "holdout_clients"): 0, ("eval", "clients"): "auto", ("eval", "final_clients"): "auto",
    ("train", "client_sampling"): "fixed", ("privacy", "distributed"): "off", ("privacy", "randomness"): "auto",
    ("privacy", "over_bound"): "clip", ("privacy", "accountant"): "rdp", ("train", "client_state_memory"): UNBOUNDED,
}


def to_toml(config: RunConfig, *, seed: bool = True) -> str:
    """Write the resolved configuration as TOML that :func:`load_config` reads back unchanged
    (``seed=False``: without the run seed, what a Flower SuperNode is sent). A
    ``[tracking]`` section left at its defaults (no tracker) is not written: it changes no number,
    and the run folders written before it existed stay resumable; nor is a ``[privacy]`` section at
    its defaults (the plain update codec: today's numbers, bit for bit), nor a key of :data:`LATER_KEYS`
    at its default."""
    data = to_dict(config)
    if not seed:
        del data["seed"]
    if config.tracking == TrackingConfig():
        del data["tracking"]
    if config.privacy == PrivacyConfig():
        del data["privacy"]
    if config.compression == CompressionConfig():  # no compression: the run folders written before it stay resumable
        del data["compression"]
    if "privacy" in data and config.privacy.distributed == "off":  # run folders written before the keys keep their names
        data["privacy"].pop("distributed_bits")
    for (section, key), default in LATER_KEYS.items():  # the run folders written before them stay resumable
        if section in data and data[section].get(key) == default:
            del data[section][key]
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, (dict, list))]
    for name, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{name}]"] + [f"{k} = {toml_value(v)}" for k, v in value.items()]
    for term in data["terms"]:
        lines += ["", "[[terms]]"] + [f"{k} = {toml_value(v)}" for k, v in term.items()]
    return "\n".join(lines) + "\n"


def describe() -> str:
    """Every key with its default and documentation, as TOML that :func:`load_config` reads back as
    the defaults (for ``fedlatent config``); the registered names as comments."""
    rows = []
    for top in dataclasses.fields(RunConfig):
        if top.name in ("seed", "backend"):
            rows.append(f"{top.name} = {toml_value(top.default)}  # {top.metadata['doc']}")
    hints = typing.get_type_hints(RunConfig)
    for name in ("data", "model", "train", "algorithm", "server", "eval", "diagnostics", "flower", "tracking", "privacy"):
        rows.append(f"\n[{name}]")
        if name == "algorithm":
            rows.append('name = "fedavg"  # a method preset and its keys (fedlatent methods lists them)')
            continue
        for f in dataclasses.fields(hints[name]):
            if f.name == "options":
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = f" ({' | '.join(f.metadata['choices'])})" if f.metadata.get("choices") else ""
            rows.append(f"{f.name} = {toml_value(default)}  # {f.metadata['doc']}{choices}")
    rows += ["\n# registered names and the keys each reads (own keys with their defaults)"]
    rows += [describe_more() for describe_more in _DESCRIBERS]
    return "\n".join(rows)


__all__ = ["RunConfig", "DataConfig", "ModelConfig", "TrainConfig", "ServerConfig", "EvalConfig",
           "DiagnosticsConfig", "FlowerConfig", "TrackingConfig", "PrivacyConfig", "load_config", "read_toml", "from_dict", "to_dict", "to_toml", "toml_value", "apply_overrides", "describe",
           "add_check", "ConfigError"]
