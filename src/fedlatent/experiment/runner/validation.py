"""Every check of a run's configuration before it trains, written once: ``fedlatent run`` makes
those that need no data (:func:`validate`) before it reads any data or creates any folder, and those
that need the data (:func:`check_fit`) once it has built them, still before its folder exists;
``fedlatent check`` makes exactly these, the second on the data's outline
(:func:`validate_data`: labels and counts, not the decoded samples).

The keys themselves (names, types, choices, ranges) are checked when the configuration is loaded
(:func:`fedlatent.config.from_dict`); here, what depends on several sections at once: the method and
its parts (:func:`fedlatent.methods.resolve`), the trackers, the backend and what it records (the
features each backend declares it honours, :mod:`fedlatent.backends.capabilities`), the
device and the precision it trains in, compilation, and the keys the model must satisfy (a constraint's depth against the model's
layers), on the model's shape built on the meta device from the data set's declared input shape
(the ``shape`` trait of a data set: known from the configuration alone). A data set that declares no
shape (its images' size is read from its files) has that last check made once its data are read,
still before the run's folder exists.

What needs the data: the data set's files and their layout, the partition (more clients, classes
or samples than the data hold: :func:`fedlatent.data.federation.outline` makes the partition from
the labels as the run does, and draws the held-out clients as the run's build does), the
model's keys where the data set declares no shape, the clients a round samples against ``train.min_clients``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Collection

import torch

from fedlatent.backends import capabilities
from fedlatent.backends.flower.secagg_settings import Settings
from fedlatent.calibration.registry import with_sums
from fedlatent.config import DataConfig, PrivacyConfig, RunConfig, holdout_count, memory_budget
from fedlatent.data.clients import sizes_of
from fedlatent.data.federation import outline
from fedlatent.data import holdout
from fedlatent.data.registry import DATASETS
from fedlatent.data.types import Federation, Outline, ServerView
from fedlatent.errors import ConfigError
from fedlatent.experiment.runner import tracking
from fedlatent.experiment.runner.state_size import one_state_bytes
from fedlatent.federated import accounting, compiled, devices, precision
from fedlatent.federated.round import sample_clients
from fedlatent.federated.sampled import check as check_evaluation_sample
from fedlatent.methods import check_model, resolve
from fedlatent.methods.parts import MethodSpec, Part
from fedlatent.methods.program import ClientProgram
from fedlatent.models import build_model
from fedlatent.models.registry import MODELS

BACKEND_NAMES: tuple[str, ...] = next(f.metadata["choices"] for f in dataclasses.fields(RunConfig)
                                      if f.name == "backend")  # as the schema declares them

Shape = tuple[tuple[int, ...], int]  # (input shape, number of classes)


def validate(config: RunConfig) -> MethodSpec:
    """The resolved method of ``config`` after every check that needs no data (see the module's
    docstring); the first failure raises a one-line :class:`~fedlatent.errors.ConfigError`."""
    spec = resolve(config.algorithm, config.terms)
    tracking.check(config)
    if config.backend not in BACKEND_NAMES:  # a configuration changed in code after loading
        raise ConfigError(f"backend = {config.backend!r}: allowed values are {', '.join(BACKEND_NAMES)}")
    check_capabilities(config)
    spec.trace = config.diagnostics.trace_terms
    spec.count_flops = "flops" in config.diagnostics.which
    module, what, extra = capabilities.EXTRAS.get(config.backend, (None, None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(f"backend = {config.backend!r}: {what} is not installed; pip install '{extra}'")
    if config.backend in capabilities.IN_PROCESS:  # Flower's nodes may train on devices this process does not see
        reason = devices.refusal(config.train.device)
        if reason:
            raise ConfigError(f"train.device = {config.train.device!r}: {reason}")
        reason = precision.refusal(config.train.precision, config.train.device)
        if reason:
            raise ConfigError(f"train.precision = {config.train.precision!r} on {config.train.device!r}: {reason}")
    program = spec.personalization
    if program.inner_gradients and precision.resolve(config.train.precision, config.train.device) == "fp16":
        raise ConfigError(f"train.precision = 'fp16': the {program.kind} program's inner gradients are taken "
                          "without fp16's loss scaling (they may underflow); use 'fp32' or 'bf16'")
    if config.train.compile:
        reason = compiled.refusal(config.train.device)
        if reason:
            raise ConfigError(f"train.compile = true: {reason}")
    if config.backend in capabilities.METHOD_CHECKS:
        capabilities.METHOD_CHECKS[config.backend](config, spec)
    if config.privacy.noise_multiplier > 0:
        check_private(config, spec)
    check_releases(config)
    check_client_sampling(config)
    if math.isfinite(config.privacy.sample_clip_norm):
        check_sample_private(config, spec)
    if config.privacy.secure_aggregation != "off":
        check_secure(config, spec)
    if config.data.holdout_clients:
        check_holdout(config, spec)
    check_plain_update(config, spec)
    shape = declared_shape(config.data)
    if shape is not None:
        check_model_fit(config, spec, *shape)
    return spec


def check_client_sampling(config: RunConfig) -> None:
    """Poisson client sampling and the PLD accountant: PLD only with Poisson sampling (dp-accounting's
    PLD accountant has no sampling without replacement); Poisson sampling not with adaptive clipping
    or SecAgg+ yet (the count's sensitivity under add-or-remove, and a session's fixed parties)."""
    t, p = config.train, config.privacy
    if p.accountant == "pld" and t.client_sampling != "poisson":
        raise ConfigError("privacy.accountant = 'pld' needs train.client_sampling = 'poisson': dp-accounting's PLD "
                          "accountant supports Poisson sampling, not the fixed-size sampling without replacement")
    if t.client_sampling == "poisson" and p.adaptive:
        raise ConfigError("train.client_sampling = 'poisson' is not combined with adaptive clipping yet "
                          "(privacy.target_quantile > 0)")
    if t.client_sampling == "poisson" and p.secure_aggregation != "off":
        raise ConfigError("train.client_sampling = 'poisson' is not combined with privacy.secure_aggregation yet "
                          "(a SecAgg+ session needs its parties' number fixed)")


def check_releases(config: RunConfig) -> None:
    """Under DP noise (client- or sample-level), no setting that releases per-client quantities computed
    from un-noised updates or data, outside ε (docs/privacy.md, "What each party sees"): the client
    diagnostics (measures of each local model, the un-noised upload, across client pairs), t-SNE of
    the clients' features, the data figures (each client's label counts and input ranges) and the
    step trace (each client's loss terms every step). The per-client training losses are left out of
    metrics.jsonl instead (``round.close_round``)."""
    p, d = config.privacy, config.diagnostics
    if not (p.noise_multiplier > 0 or p.sample_noise_multiplier > 0):
        return
    key = "privacy.noise_multiplier" if p.noise_multiplier > 0 else "privacy.sample_noise_multiplier"
    released = ("diagnostics.clients = true (each local model: the un-noised upload)" if d.which and d.clients else
                "diagnostics.which 'tsne' (the clients' features)" if "tsne" in d.which else
                "diagnostics.which 'data' (each client's label counts and input ranges)" if "data" in d.which else
                "diagnostics.trace_terms = true (each client's loss terms every step)" if d.trace_terms else None)
    if released:
        raise ConfigError(f"{key} > 0 with {released}: a per-client release outside epsilon; refused (turn it "
                          "off, or run without noise)")


def check_capabilities(config: RunConfig) -> None:
    """The features the run asks for that its backend does not honour, as the backends declare them
    (:mod:`fedlatent.backends.capabilities`), refused in one line with one wording for all."""
    found = capabilities.refusals(config)
    if found:
        raise ConfigError(found[0])


def private_refusal(spec: MethodSpec, cfg: PrivacyConfig) -> str | None:
    """Why DP-FedAvg cannot cover what ``spec``'s clients send, or None: the noise covers the model
    update through the codec, not a part's extras the server reads itself (SCAFFOLD's Δc, FedProto's
    prototypes), a part's own weighted aggregation (FedNova, FedDyn) or the centralised calibration's
    pooled features; FFC's and CCVR's statistics only when they are clipped (a finite
    ``statistics_clip_norm``) and noised (``statistics_noise_multiplier`` > 0)."""
    for part in spec.all_parts():
        if part.owns_aggregation:
            return (f"the part '{part.name}' aggregates with weights of its own, and the DP estimator weights "
                    "every client alike")
        if type(part).server_update is not Part.server_update:
            return f"the part '{part.name}' uploads extras that the server reads outside the update codec"
    kind, declared = spec.calibration.kind, spec.calibration.declared
    if declared.oracle:
        return f"the {kind} calibration sends the clients' features themselves"
    if declared.calibrates and math.isinf(cfg.statistics_clip_norm):
        return (f"the {kind} calibration's statistics need a bound to scale their noise: set "
                "privacy.statistics_clip_norm")
    if declared.calibrates and cfg.statistics_sigma == 0:
        return f"the {kind} calibration's statistics would reach the server without noise (statistics_noise_multiplier = 0)"
    return None


def check_private(config: RunConfig, spec: MethodSpec) -> None:
    """DP-FedAvg (``privacy.noise_multiplier`` > 0): a method whose every upload goes through the
    update codec, and the accountant installed. Every backend honours it (the server's combine and
    the clients' encode are shared), so none is refused."""
    sigma = config.privacy.noise_multiplier
    reason = private_refusal(spec, config.privacy)
    if reason:
        raise ConfigError(f"privacy.noise_multiplier = {sigma} on {spec.name}: {reason}; refused (methods "
                          "sending the model update alone: fedavg, fedprox, fedadam, feduv, moon, ...; with "
                          "clipped, noised statistics: spherefed, ccvr)")
    if not accounting.available():
        raise ConfigError(f"privacy.noise_multiplier = {sigma}: the accountant needs dp-accounting; "
                          f"{accounting.EXTRA}")


def sample_private_refusal(config: RunConfig, spec: MethodSpec) -> str | None:
    """Why sample-level DP-SGD cannot train ``spec`` as ``config`` asks, or None: per-sample gradients
    exist for a loss that is a sum over the batch's samples (the task loss, cross-entropy or MSE) and
    for terms of the weights alone; every data access of a client must go through its private steps."""
    for part in spec.all_parts():
        if part.has_term() and part.term_reads_batch:
            return (f"the term of part '{part.name}' reads the batch (a term of the whole batch, as uniformity, "
                    "variance, decorrelation or MMD, has no per-sample gradients); allowed: the per-sample task loss "
                    "(ce, mse) and terms of the weights alone (fedprox, feddyn)")
    program = type(spec.personalization)
    if program.round is not ClientProgram.round:
        return (f"{spec.name}'s {program.kind} program trains around the trainer (FedRep: its own layers, then the "
                "shared ones), which the accountant does not count yet")
    if program.step is not ClientProgram.step or program.start is not ClientProgram.start:
        return (f"{spec.name}'s {program.kind} program takes its own steps or a round-start procedure on the client's "
                "data, outside the private steps (DP-SGD trains programs whose copies each take one step on their "
                "own loss: plain training, ditto)")
    if spec.calibration.declared.calibrates:
        return f"the {spec.calibration.kind} calibration's statistics read the clients' data outside the private steps"
    if config.train.compile:
        return "sample-level DP-SGD takes per-sample gradients with torch.func, not through the compiled forward; " \
               "set train.compile = false"
    if config.train.precision in ("bf16", "fp16"):
        return "sample-level DP-SGD's per-sample gradients run in float32; set train.precision = 'fp32' (or 'auto')"
    return None


def check_sample_private(config: RunConfig, spec: MethodSpec) -> None:
    """Sample-level DP-SGD (a finite ``privacy.sample_clip_norm``): a method it can train
    (:func:`sample_private_refusal`; every backend does, :mod:`fedlatent.backends.capabilities`), and the accountant installed when it adds noise. The model is
    checked where it is built (:func:`check_model_fit`: no BatchNorm)."""
    bound = config.privacy.sample_clip_norm
    reason = sample_private_refusal(config, spec)
    if reason:
        raise ConfigError(f"privacy.sample_clip_norm = {bound} on {spec.name}: {reason}")
    sigma = config.privacy.sample_noise_multiplier
    if sigma > 0 and not accounting.available():
        raise ConfigError(f"privacy.sample_noise_multiplier = {sigma}: the accountant needs dp-accounting; "
                          f"{accounting.EXTRA}")


def batch_norm_refusal(config: RunConfig, model: torch.nn.Module, why: str, kept: Collection[str] = ()) -> str | None:
    """Why ``model``'s BatchNorm layers cannot take part (``why``: what their statistics break), naming
    the setting that replaces BatchNorm by GroupNorm; None when the model has no BatchNorm layer whose
    running statistics are outside ``kept`` (the state entries each client keeps to itself)."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and f"{n}.running_mean" not in kept]
    if not names:
        return None
    arch = config.model.arch
    head = f"model '{arch}' has BatchNorm ({names[0]}): {why}"
    if all(n.startswith("projector.") for n in names):
        return f"{head}; set model.projector = 0 (no projector), or use a model with GroupNorm"
    if "norm" in MODELS.get(arch).keys:
        return f"{head}; set model.norm = 'group' (GroupNorm)"
    grouped = ", ".join(sorted(name for name in MODELS.names() if "norm" in MODELS.get(name).keys))
    return f"{head}, and it has no GroupNorm variant; use a model with model.norm = 'group' ({grouped}) or the mlp"


def secure_refusal(config: RunConfig, spec: MethodSpec) -> str | None:
    """Why SecAgg+ cannot cover what ``spec``'s clients send, or None (its parties are Flower's
    clients: the backends are :func:`check_capabilities`'s); the server may read sums alone — the model
    update, FFC's statistics and CCVR's per-class sums, not a part's extras or its own weighted
    aggregation, the centralised calibration's features, nor the clients' own models the
    diagnostics measure, nor the data set itself; and noise the server adds to a sum it sees is not combined with it
    (the clients' own shares are: ``privacy.distributed``)."""
    if config.privacy.noise_multiplier > 0 and config.privacy.distributed == "off":
        return ("not combined with central noise (privacy.noise_multiplier > 0: the server would add the noise to a sum "
                "it sees); set privacy.distributed = 'skellam' for the clients' own noise shares")
    if config.flower.server_reads_data:
        return ("the server would open the data set itself (flower.server_reads_data = true: the pool's statistics, "
                "a data set's own clients)")
    if config.privacy.adaptive:
        return ("not combined with adaptive clipping yet (privacy.target_quantile > 0: each client's clipped-or-not "
                "bit would travel in the clear beside its masked update)")
    for part in spec.all_parts():
        if part.owns_aggregation:
            return f"the part '{part.name}' aggregates with weights of its own, and SecAgg+ sums pre-weighted updates"
        if type(part).server_update is not Part.server_update:
            return f"the part '{part.name}' uploads extras that the server reads outside the update codec"
    if spec.calibration.declared.calibrates and spec.calibration.declared.sums is None:
        summed = " and ".join(f"{name.upper()}'s" for name in with_sums())
        return f"the {spec.calibration.kind} calibration's statistics are not sums ({summed} are)"
    d = config.diagnostics
    if d.clients or "alignment" in d.which:
        return "the diagnostics would measure each client's own upload (diagnostics.clients, 'alignment')"
    return None


def check_secure(config: RunConfig, spec: MethodSpec) -> None:
    """``privacy.secure_aggregation``: refused in one line where SecAgg+ cannot cover the run
    (:func:`secure_refusal`)."""
    reason = secure_refusal(config, spec)
    if reason:
        raise ConfigError(f"privacy.secure_aggregation = {config.privacy.secure_aggregation!r} on {spec.name}: "
                          f"{reason}")


def check_holdout(config: RunConfig, spec: MethodSpec) -> None:
    """``data.holdout_clients``: a new-client rule of the method's program when the clients' personalised evaluation is asked (not ``eval.personalized =
    "never"``: the held-out clients are then evaluated on the global model alone)."""
    value = config.data.holdout_clients
    program = spec.personalization
    if config.eval.personalized != "never" and program.new_client_rule is None:
        raise ConfigError(f"data.holdout_clients = {value:g}: {spec.name}'s {program.kind} program has no rule for a "
                          "client that never trained; set eval.personalized = 'never' to evaluate the held-out "
                          "clients on the global model alone")


def check_plain_update(config: RunConfig, spec: MethodSpec) -> None:
    """A method whose paper steps its global copy by plain SGD (pFedMe's w ← w − ηλ(w − θ),
    Per-FedAvg's w ← w − β∇f(w̃)) runs that step only under plain SGD: the run's update rule is that
    step, and a momentum or weight decay would make it another method (pFedMe's personal models then
    end below its own global model). Refused, naming the keys to set."""
    if not spec.personalization.plain_update:
        return
    t = config.train
    wrong = [f"train.{key} = {value!r}" for key, value, plain in (("optimizer", t.optimizer, "sgd"),
             ("momentum", t.momentum, 0.0), ("weight_decay", t.weight_decay, 0.0)) if value != plain]
    if wrong:
        raise ConfigError(f"{', '.join(wrong)}: {spec.name}'s paper steps the global model by plain SGD; set "
                          "train.optimizer = 'sgd', train.momentum = 0 and train.weight_decay = 0")


def validate_data(config: RunConfig, spec: MethodSpec) -> None:
    """The checks of :func:`check_fit` on the data's outline (:func:`fedlatent.data.federation.outline`,
    which refuses what building the federation refuses): what ``fedlatent check`` makes of the data,
    reading their labels and counts, not their samples."""
    check_fit(config, spec, outline(config.data, config.data_seed))


def check_fit(config: RunConfig, spec: MethodSpec, data: Federation | ServerView | Outline) -> None:
    """What the data decide of a run: the model's keys where the data set declares no shape
    (:func:`check_model_fit`), the clients held out (``data.holdout_clients``) against the
    partition's, the clients a round samples of those left (where their number is known before a
    Flower census) against ``train.min_clients``. A run checks its built federation (its held-out
    clients set apart already: :func:`fedlatent.data.federation.build_federation`), ``check`` its outline."""
    if declared_shape(config.data) is None and data.input_shape:  # (): a Flower server's view before its census
        check_model_fit(config, spec, data.input_shape, data.num_classes)
    check_own_count(config, data)
    if data.num_clients is not None:  # a federation's: those that train; a view's or outline's: the partition's
        training = data.num_clients
        if config.data.holdout_clients and not isinstance(data, Federation):  # those left to train are sampled
            training -= holdout_count(config.data.holdout_clients, data.num_clients)
        check_evaluation_sample(config, training)  # eval.clients, eval.final_clients: no more than there are
        sampled = len(sample_clients(config.seed, 0, training, config.train.participation))
        if config.train.min_clients > sampled:
            raise ConfigError(f"train.min_clients = {config.train.min_clients}: more than the {sampled} clients "
                              f"sampled per round")
        reason = Settings.of(config.privacy).refusal(sampled) if config.privacy.secure_aggregation != "off" else None
        if reason:  # each client is a party of SecAgg+: a round's sum needs threshold of them
            raise ConfigError(f"privacy.secure_aggregation with the {sampled} clients sampled per round: {reason} "
                              "(privacy.secagg_threshold, privacy.secagg_num_shares)")
    check_client_sizes(config, data)


def check_own_count(config: RunConfig, data: Federation | ServerView | Outline) -> None:
    """A data set that brings its own clients (LEAF's users, an arrays file's, a clinical site's) has
    as many as it brings, whatever ``data.num_clients`` says — except that clients held out
    (``data.holdout_clients``, which needs it fixed) are counted from it: there a count that differs
    is refused, not ignored."""
    fixed = config.data.num_clients
    if not config.data.holdout_clients or not DATASETS.get(config.data.dataset).traits.get("own_clients"):
        return
    count = data.partition_size if isinstance(data, Federation) else data.num_clients
    if count is not None and count != int(fixed):
        raise ConfigError(f"data.num_clients = {fixed}: data set '{config.data.dataset}' brings {count} clients of its "
                          f"own, and data.holdout_clients counts from it; set data.num_clients = {count}")


def check_client_sizes(config: RunConfig, data: Federation | ServerView | Outline) -> None:
    """What each client's sample counts decide, where they are known before training: a held-out
    client needs a test split (it is evaluated on nothing else: ``data.local_test_fraction``), and a
    training client under ``train.drop_last`` at least one full batch (with none it trains on
    nothing, and round 1 has no loss to report); clients named by their partition ids. A built
    federation's held-out clients are set apart already (its ``held_out``), an outline's named."""
    if isinstance(data, Federation):  # read without building a client
        holdout.check_federation(data)
        named = [(int(n), cid) for n, cid in zip(sizes_of(data.clients)[:, 0],
                                                 holdout.kept(data.partition_size, data.held_out))]
    else:  # a Flower server's view has no sizes: the nodes' census tells
        sizes, new = getattr(data, "client_sizes", ()), getattr(data, "held_out", ())
        if sizes:
            holdout.check_tested(new, [sizes[cid][1] for cid in new])
        held = set(new)
        named = [(n, cid) for cid, (n, _) in enumerate(sizes) if cid not in held]
    smallest = min(named, default=None)
    train = config.train
    if smallest is not None and train.drop_last and smallest[0] < train.batch_size:
        raise ConfigError(f"train.batch_size = {train.batch_size} with train.drop_last = true: client {smallest[1]} "
                          f"has {smallest[0]} training samples, not one full batch, so it would train on nothing; "
                          "lower train.batch_size or set train.drop_last = false")


def declared_shape(data: DataConfig) -> Shape | None:
    """The input shape and class count the data set declares from its configuration alone, or
    None when they are read from its files."""
    declare = DATASETS.get(data.dataset).traits.get("shape")
    return declare(data) if declare is not None else None


def check_model_fit(config: RunConfig, spec: MethodSpec, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Refuse the method's keys the model cannot satisfy (:func:`fedlatent.methods.check_model`: a
    constraint's depth, a layer it names), the user's error rather than a client's failure in
    round 1. The model is built on the meta device: its shape alone, no memory, no weights file read."""
    with torch.device("meta"):
        model = build_model(dataclasses.replace(config.model, weights=""), input_shape, num_classes,
                            config.data.dataset)
    check_model(spec, model)
    budget = memory_budget(config.train.client_state_memory)
    if budget is not None and config.backend in capabilities.IN_PROCESS:
        check_state_budget(config, spec, budget, input_shape, num_classes)
    if math.isfinite(config.privacy.sample_clip_norm):
        reason = batch_norm_refusal(config, model, "its batch statistics mix a batch's samples")
        if reason:
            raise ConfigError(f"privacy.sample_clip_norm = {config.privacy.sample_clip_norm}: {reason}")
    if config.privacy.noise_multiplier > 0:
        kept = spec.personalization.local_keys([n for n, _ in model.named_parameters()], list(model.state_dict()))
        reason = batch_norm_refusal(config, model, "its running statistics would travel in the update, clipped "
                                    "with the weights and noised (a noised variance can turn negative)", kept)
        if reason:
            raise ConfigError(f"privacy.noise_multiplier = {config.privacy.noise_multiplier}: {reason}, or keep "
                              "BatchNorm on the clients (algorithm.name = 'fedbn')")


def check_state_budget(config: RunConfig, spec: MethodSpec, budget: int, input_shape: tuple[int, ...],
                       num_classes: int) -> None:
    """A state budget (``train.client_state_memory``) that holds one client's state at least, measured
    (:func:`~fedlatent.experiment.runner.state_size.one_state_bytes`): the store keeps the states in
    use however many bytes they take, so a budget below one would be no budget."""
    one = one_state_bytes(config, spec, input_shape, num_classes)
    if budget < one:
        raise ConfigError(f"train.client_state_memory = {config.train.client_state_memory!r}: {budget:,} bytes is "
                          f"below one client's state ({one:,} bytes for {spec.name} on model '{config.model.arch}')")
