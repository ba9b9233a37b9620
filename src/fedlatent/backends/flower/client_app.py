"""The client half of fedlatent as a Flower ClientApp (Message API).

Every message carries the run's resolved configuration (TOML text) without the run seed, the data
seed written out and the initial model's seeds, and, once the server is set up, the stream seeds
of the node's own clients alone (:mod:`.node_view`: every draw of a client derives from its stream
seed, a secret of the server's key in a secret run), so a SuperNode needs nothing but fedlatent and
its data: it builds the model and its client's splits once per process (a
ClientApp may be a fresh object for every message) and keeps each client's state (SCAFFOLD c_i,
Ditto's personal model, MOON's previous model, MMD kernels, …) in the node's ``Context.state`` as
one ArrayRecord per client, where it survives between rounds. Which clients a node serves comes
from its node config: ``partition-id`` k of ``num-partitions`` P serves the client ids ≡ k (mod P)
(one client per node when P is the number of clients; the simulation engine sets both), and
``data-path`` may point at the node's own arrays file (``data.dataset = "arrays"`` format, its
client 0) instead of the configuration's data set: the node then serves client ``partition-id``
with it, standardised (``data.normalize``) with the statistics the server pools from such nodes'
censuses (per-channel Σx, Σx², n), which every later message carries.

Messages: ``query.census`` (the served clients, the sizes of their splits and their training label
counts, the number of clients of the node's federation), ``train`` (the
node's :class:`~fedlatent.federated.round.ClientTask` of a round, one message per node → their
uploads), ``evaluate.test`` (the global model's counts on the node's shares of the global test split,
or on its clients' test splits: the server opens no data), ``evaluate.validate`` (validation
accuracy of the served clients), ``query.statistics``
(calibration statistics), ``query.diagnostics``, ``query.tsne`` and ``query.data`` (the client
halves of ``[diagnostics]``, :mod:`.diagnostics`), ``evaluate.report`` (the personalised report rows),
``evaluate.new`` (the held-out clients it serves, ``data.holdout_clients``: set apart from the
federation it builds as the embedded backends set them apart, counted in the census's number of
clients but not among its served ones). Each upload carries its client's step trace
(``diagnostics.trace_terms``), and a round trains under the run's sample-level DP-SGD settings. A client whose
update raises or is not finite is a failure record naming it in the node's reply.

Under secure aggregation (``privacy.secure_aggregation = "secaggplus"``) each served client is a
SecAgg+ party kept in the node's ``Context.state`` (:mod:`.secagg`): ``query.secagg_keys``,
``query.secagg_shares`` and ``query.secagg_unmask`` are the protocol's stages 0, 1 and 3, and
``train`` and ``query.statistics`` carrying a session are its stage 2 — the update or the
statistics leave quantised and masked (:mod:`.secagg_codec`), the client's state never.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from fedlatent.backends.flower import distributed as flower_dp
from fedlatent.backends.flower import messages as M
from fedlatent.backends.flower import node_terms, node_view
from fedlatent.backends.flower.diagnostics import GLOBAL_TEST
from fedlatent.backends.flower.secagg import Party
from fedlatent.backends.flower.secagg_settings import Settings
from fedlatent.backends.flower.secagg_codec import Masking, MaskingCodec, rounding
from fedlatent.backends.simulation import make_model
from fedlatent.config import RunConfig
from fedlatent.data import holdout
from fedlatent.data.compact import Images
from fedlatent.data.federation import build_federation, channel_census
from fedlatent.data.types import ClientData, Federation, Split
from fedlatent.errors import ConfigError
from fedlatent.federated import devices, evaluation
from fedlatent.federated.calibrate import client_statistics
from fedlatent.federated.client import Workspace, state_to_cpu, workspace_for
from fedlatent.federated.codec import UpdateCodec, build_codec
from fedlatent.federated.diagnostics import (label_counts, mean_value_counts, mean_value_range, split_statistics,
                                             tsne_features, tsne_seed)
from fedlatent.federated.evaluation import Tally, client_validation
from fedlatent.federated.failures import ClientFailure, error_detail
from fedlatent.federated.personal import client_report, new_client_reports
from fedlatent.federated.round import checked, client_update, encoded, local_settings, round_lr
from fedlatent.federated.server import untransmitted_keys
from fedlatent.methods import resolve
from fedlatent.methods.parts import MethodSpec, Tensors, trainable_names
from fedlatent.seeding import FINETUNE, derive_seed

STATE = "client."  # Context.state record name prefix of a client's state
PARTY = "secagg."  # Context.state record name prefix of a client's SecAgg+ party


@dataclass
class Job:
    """What a node works with: the run's configuration and method, the data set (all of it, or the
    node's own file), the models, and the clients it serves."""

    config: RunConfig
    spec: MethodSpec
    federation: Federation
    clients: dict[int, ClientData]
    workspace: Workspace
    device: torch.device
    initial: Tensors  # the seeded initial model: the entries the server does not send (a fixed head, own layers)
    codec: UpdateCodec  # the run's update codec: the client side of the server's
    untransmitted: frozenset[str]  # the entries that never travel (a fixed head, own layers): not coded
    new_clients: dict[int, ClientData] = dataclasses.field(default_factory=dict)  # held out, served here


def served(node_config: dict[str, Any], num_clients: int) -> list[int]:
    """The client ids a node serves: those ≡ partition-id (mod num-partitions)."""
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no partition-id in its node config "
                         "(start it with --node-config 'partition-id=K num-partitions=P')")
    k = int(node_config["partition-id"])
    p = int(node_config.get("num-partitions", num_clients))
    return list(range(k, num_clients, p)) if 0 <= k < p else []  # not a scan of the federation per message


_BUILT: dict[str, Job] = {}


def own_census(client: ClientData) -> Tensors:
    """A node's share of the normalisation census: per-channel Σx, Σx² (float64) and the count of
    its own file's training samples, in the units the model reads ([0, 1] for uint8 images)."""
    x = client.train.x
    raw = x.data.numpy().astype(np.float64) / 255 if isinstance(x, Images) else x.numpy()
    total, squares, count = channel_census(raw)
    return {"sum": torch.from_numpy(total), "squares": torch.from_numpy(squares), "count": torch.tensor(count)}


def normalized(split: Split | None, mean: Tensor, std: Tensor) -> Split | None:
    """``split`` (raw, as its file holds it) standardised with the pooled ``mean`` and ``std``."""
    if split is None:
        return None
    if isinstance(split.x, Images):
        return Split(Images(split.x.data, mean.numpy(), std.numpy(), split.x.crop), split.y)
    return Split((split.x - mean) / std, split.y)


def job_for(run: ConfigRecord, node_config: dict[str, Any], normalization: Tensors | None = None) -> Job:
    """The node's :class:`Job` of the ``run`` record (:func:`.node_view.run_record`): the
    configuration's method, data and models, built on first use and
    kept for the process (the simulation engine's workers serve many nodes of one run), with the
    clients this node serves. A node's own file is standardised with the ``normalization`` the
    server pooled from the nodes' censuses (mean, std) once it sends them; raw before."""
    data_path = str(node_config.get("data-path", ""))
    if not data_path:
        normalization = None
    norm_key = b"".join(t.numpy().tobytes() for t in normalization.values()) if normalization else b""
    seeds = node_view.model_seeds(run)
    key = hashlib.sha256(f"{run['config']}\0{seeds}\0{data_path}\0".encode() + norm_key).hexdigest()
    if key not in _BUILT:
        _BUILT.clear()  # one run at a time per process
        config = node_view.node_config(run)  # no run seed: the data seed is data.seed, the model's are ``seeds``
        if data_path:
            config = dataclasses.replace(config, data=dataclasses.replace(
                config.data, dataset="arrays", path=data_path, partition="given"))
        torch.set_num_threads(config.train.threads)
        spec = resolve(config.algorithm, config.terms)
        spec.count_flops = "flops" in config.diagnostics.which  # counted by the client, summed by the server
        spec.trace = config.diagnostics.trace_terms  # each step's terms, in the upload (the server writes them)
        if config.data.holdout_clients and data_path:
            raise ConfigError("data.holdout_clients: held out of the configured data set, which a SuperNode with "
                              "its own data-path does not build")
        federation = build_federation(config.data, config.data_seed)  # the clients that never train set apart
        holdout.check_federation(federation)  # each with a test split, as the embedded backends' checks refuse
        if normalization:
            mean, std = normalization["mean"], normalization["std"]
            federation = dataclasses.replace(federation, clients=[
                ClientData(*(normalized(s, mean, std) for s in (c.train, c.val, c.test))) for c in federation.clients])
        device = torch.device(config.train.device)
        model = devices.prepare(make_model(config, federation, spec, seeds), device)
        ws = workspace_for(model, spec, config.train.compile)
        initial = state_to_cpu(model)
        frozen, local = untransmitted_keys(spec, [n for n, _ in model.named_parameters()], trainable_names(model),
                                           list(initial))
        _BUILT[key] = Job(config, spec, federation, {}, ws, device, initial, build_codec(config.privacy, config.compression),
                          frozenset(frozen + local))
    job = _BUILT[key]
    if data_path:  # the node's own file holds its one client: client partition-id
        clients = {int(node_config["partition-id"]): job.federation.clients[0]}
    else:
        clients = {cid: job.federation.clients[cid] for cid in served(node_config, len(job.federation.clients))}
    new = job.federation.new_clients  # numbered after the training clients, served by the same rule
    total = len(job.federation.clients) + len(new)
    return dataclasses.replace(job, clients=clients,
                               new_clients={cid: new[cid] for cid in served(node_config, total) if cid in new})


def _job(msg: Message, context: Context) -> Job:
    norm = msg.content.array_records.get("normalization")
    return job_for(msg.content[node_view.RUN], dict(context.node_config),
                   M.from_record(norm) if norm is not None else None)


def _refused(msg: Message, context: Context) -> Message | None:
    """The node's error reply where the message, or the run it belongs to, asks for less than the
    node's own terms (:mod:`.node_terms`, from its ``--node-config``); None when they hold."""
    config = node_view.node_config(msg.content[node_view.RUN])
    reason = node_terms.refusal(dict(context.node_config), msg.metadata.message_type,
                                "secagg" in msg.content.config_records, config)
    return None if reason is None else Message(Error(code=node_terms.REFUSED, reason=reason), reply_to=msg)


def _state(context: Context, cid: int) -> Tensors | None:
    name = f"{STATE}{cid}"
    return M.from_record(context.state[name]) if name in context.state.array_records else None


app = ClientApp()


@app.query("census")
def census(msg: Message, context: Context) -> Message:
    """The clients this node serves, the sizes of their splits and their training label counts, and
    how many clients the federation it builds has (the server's census; a node with its own file
    tells none); the classes, the input shape and the size of the global test split it holds (0 for a
    node with its own file: it holds its clients' test splits alone); such a node with
    ``data.normalize`` on adds its normalisation census (``norm.<client>``)."""
    refused = _refused(msg, context)
    if refused is not None:
        return refused
    job = _job(msg, context)
    content = RecordDict()
    own_file = bool(context.node_config.get("data-path"))
    if own_file and job.config.data.normalize:
        for cid, client in job.clients.items():
            content[f"norm.{cid}"] = M.to_record(own_census(client))
    clients = job.clients.values()
    values: dict[str, Any] = {
        "clients": list(job.clients), "train_sizes": [len(c.train) for c in clients],
        "val_sizes": [len(c.val) if c.val is not None else 0 for c in clients],
        "test_sizes": [len(c.test) if c.test is not None else 0 for c in clients],
        "label_counts": [label_counts(c.train, job.federation.num_classes) for c in clients]}
    if not own_file:  # the partition's clients, those held out included (the server counts them out)
        values["num_clients"] = len(job.federation.clients) + len(job.federation.new_clients)
        values["new_clients"] = list(job.new_clients)  # the held-out ones this node serves
    fed = job.federation
    values.update(num_classes=fed.num_classes, input_shape=list(fed.input_shape), global_test=held_test_size(job, own_file))
    content["census"] = M.pack_values(values)
    return Message(content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """A round of the node's selected clients, in turn: each task (the global model completed
    from the node's seeded initial model where the server withheld entries) with the client's
    state from the node's context (or the server's copy the first time a resumed run reaches it)
    → its upload, checked and then encoded by the run's update codec (the message, without the
    entries the server withholds from uploads), the new state kept in the context; a client that
    raises or is not finite keeps its old state."""
    refused = _refused(msg, context)
    if refused is not None:
        return refused
    job = _job(msg, context)
    cfg = job.config
    outcomes: list[M.Outcome] = []
    _, withheld_up = M.withheld(msg.content)
    secure = "secagg" in msg.content.config_records
    for task, restore in M.unpack_tasks(msg.content, job.initial):
        if task.client_id not in job.clients:
            raise ValueError(f"client {task.client_id} is not served by this node (it serves {list(job.clients)})")
        state = _state(context, task.client_id)
        if state is None:
            state = restore or {}
        settings = local_settings(cfg.train, task.lr, cfg.train.local_epochs, job.federation.augment,
                                  job.federation.num_classes, job.device, cfg.privacy)  # sample-level DP-SGD's too
        codec = job.codec
        if secure:  # the update leaves masked: the party's stage 2 (its state kept whatever happens)
            masking = _masking(msg, context, job, task.client_id, "update", task.round, task.seed)
            # under distributed DP, with the client's Skellam share first (backends.flower.distributed)
            codec = MaskingCodec(job.codec, masking, task.total_samples, flower_dp.share(msg.content, cfg, task))
        try:
            upload, new_state = client_update(job.workspace, job.spec, task, job.clients[task.client_id].train,
                                              state, settings)
            [outcome] = encoded(codec, [checked(upload, new_state)], task, job.untransmitted,
                                 {task.client_id: new_state})
        except ConfigError as exc:  # the user's error: the server ends the run with it (exit 2)
            outcome = ClientFailure(task.client_id, "config", str(exc))
        except Exception as exc:  # any other error of the client's update is that client's failure
            outcome = ClientFailure(task.client_id, "error", error_detail(exc))
        finally:
            if secure:
                context.state[f"{PARTY}{task.client_id}"] = masking.party.to_record()
        if isinstance(outcome, ClientFailure):
            outcomes.append((outcome, None))
            continue
        context.state[f"{STATE}{task.client_id}"] = M.to_record(new_state)
        # under secure aggregation a client's state stays on its node: the server learns only sums
        outcomes.append((outcome, new_state if cfg.flower.client_state_on_server and not secure else None))
    return Message(M.pack_outcomes(outcomes, withheld_up), reply_to=msg)


def _masking(msg: Message, context: Context, job: Job, cid: int, kind: str, index: int, seed: int) -> Masking:
    """Client ``cid``'s stage 2 of the session ``msg`` names: its party from the node's context, the
    shares its neighbours sent it (``forward.<cid>``), the quantisation of ``kind`` ("update",
    "statistics"; ``index`` the round) drawn from the client's stream ``seed``."""
    session = str(msg.content["secagg"]["session"])
    forward = msg.content[f"forward.{cid}"]
    settings = Settings.of(job.config.privacy)
    bound = settings.update_range if kind == "update" else settings.statistics_range
    return Masking(kind, Party.from_record(context.state[f"{PARTY}{cid}"]), session,
                   dict(zip((int(c) for c in forward["srcs"]), forward["ctxts"])),
                   bound, settings.levels, rounding(seed, kind, index, cid))


@app.evaluate("validate")
def validate(msg: Message, context: Context) -> Message:
    """Validation accuracy of the global model on each served client's validation split."""
    job = _job(msg, context)
    global_state = M.from_record(msg.content["global"])
    values = {}
    for cid, client in job.clients.items():
        value = client_validation(job.workspace.model, global_state, client.val, job.federation.num_classes,
                                  job.config.eval.batch_size, job.device)
        if value is not None:
            values[str(cid)] = value
    return Message(RecordDict({"values": M.pack_values(values)}), reply_to=msg)


def held_test_size(job: Job, own_file: bool) -> int:
    """The samples of the run's global test split this node holds (it builds the configured data set:
    all of them; with its own file: none; none either where the global test split is the clients'
    tests together, ``test_of_clients``: each node tallies its own clients' tests, and builds no
    other client's)."""
    test = job.federation.test
    return 0 if own_file or test is None or job.federation.test_of_clients else len(test)


@app.evaluate("test")
def test(msg: Message, context: Context) -> Message:
    """The global model's :class:`~fedlatent.federated.evaluation.Tally` on this node's shares of
    the global test split (``shard``: their indices of ``count`` contiguous shares, by batches of
    ``eval.batch_size``), or without ``shard`` on each served client's test split (those of
    ``clients`` alone when the server sends it: a sampled evaluation), for the server to add up
    (:meth:`.server_app.ServerRun.test`)."""
    job = _job(msg, context)
    model, fed, batch = job.workspace.model, job.federation, job.config.eval.batch_size
    model.load_state_dict(M.from_record(msg.content["global"]))
    shard = msg.content.config_records.get("shard")
    tallies: dict[str, Tally] = {}
    if shard is not None:
        assert fed.test is not None, "a shard of the global test split asked of a node without it"
        for index in shard["indices"]:
            rows = evaluation.shard(len(fed.test), batch, int(index), int(shard["count"]))
            tallies[f"shard.{index}"] = evaluation.tally(model, fed.test, fed.num_classes, batch, job.device, rows)
    else:
        asked = msg.content.config_records.get("clients")  # a sampled evaluation's clients of this node
        chosen = job.clients if asked is None else {int(c): job.clients[int(c)] for c in asked["ids"]}
        for cid, client in chosen.items():
            if client.test is not None and len(client.test):
                tallies[f"client.{cid}"] = evaluation.tally(model, client.test, fed.num_classes, batch, job.device)
    return Message(M.pack_tallies(tallies), reply_to=msg)


@app.query("statistics")
def statistics(msg: Message, context: Context) -> Message:
    """Each served client's calibration statistics (FFC: V, U; CCVR: per-class count, mean,
    covariance, or per-class sums where the codec bounds or masks them) of its training split under
    the global model; under secure aggregation, as one masked vector (:meth:`.MaskingCodec.encode_statistics`)."""
    refused = _refused(msg, context)
    if refused is not None:
        return refused
    job = _job(msg, context)
    global_state = M.from_record(msg.content["global"])
    content = RecordDict()
    secure = msg.content.config_records.get("secagg")
    for cid, client in job.clients.items():
        if secure is not None and cid not in secure["clients"]:
            continue  # out of the session: nothing leaves in the clear
        codec = job.codec
        if secure is not None:  # masked, each divided by the clients' total training samples
            masking = _masking(msg, context, job, cid, "statistics", 0, node_view.stream_seed(msg.content, cid))
            codec = MaskingCodec(job.codec, masking, int(secure["total_samples"]))
        try:
            stats = client_statistics(job.workspace.model, global_state, client.train, job.spec.calibration,
                                      job.config.eval.batch_size, job.device, codec)
        finally:
            if secure is not None:
                context.state[f"{PARTY}{cid}"] = masking.party.to_record()
        content[f"stats.{cid}"] = M.to_record(stats)
    return Message(content, reply_to=msg)


# SecAgg+'s stages 0, 1 and 3 (stage 2 is the session's own message: train, query.statistics),
# each client a party of its own (backends.flower.secagg_session)
@app.query("secagg_keys")
def secagg_keys(msg: Message, context: Context) -> Message:
    """Stage 0: a party for each client the session names, with fresh key pairs; their public halves."""
    cfg = msg.content["secagg"]
    content = RecordDict()
    for cid in cfg["clients"]:
        party = Party.new(int(cid), str(cfg["session"]), int(cfg["threshold"]))
        context.state[f"{PARTY}{cid}"] = party.to_record()
        content[f"keys.{cid}"] = ConfigRecord({"pk1": party.pk1, "pk2": party.pk2})
    return Message(content, reply_to=msg)


@app.query("secagg_shares")
def secagg_shares(msg: Message, context: Context) -> Message:
    """Stage 1: each party's shares of its secrets, encrypted for each of its neighbours."""
    return _each_party(msg, context, "public", "shares", lambda party, session, r: _ciphertexts(party.share(
        session, dict(zip((int(i) for i in r["ids"]), zip(r["pk1"], r["pk2"]))))))


@app.query("secagg_unmask")
def secagg_unmask(msg: Message, context: Context) -> Message:
    """Stage 3: each party's shares of its active neighbours' mask seeds and dropped neighbours' keys."""
    def reveal(party: Party, session: str, r: ConfigRecord) -> ConfigRecord:
        shares = party.reveal(session, [int(c) for c in r["active"]], [int(c) for c in r["dropped"]])
        return ConfigRecord({"owners": list(shares), "shares": list(shares.values())})
    return _each_party(msg, context, "unmask", "revealed", reveal)


def _ciphertexts(by_destination: dict[int, bytes]) -> ConfigRecord:
    return ConfigRecord({"dsts": list(by_destination), "ctxts": list(by_destination.values())})


def _each_party(msg: Message, context: Context, asked: str, answer: str,
                step: Callable[[Party, str, ConfigRecord], ConfigRecord]) -> Message:
    """``step`` of each party the session names, on its record ``<asked>.<client>``, its state kept in
    the node's context; the answers as ``<answer>.<client>``."""
    cfg = msg.content["secagg"]
    session = str(cfg["session"])
    content = RecordDict()
    for cid in cfg["clients"]:
        party = Party.from_record(context.state[f"{PARTY}{cid}"])
        content[f"{answer}.{cid}"] = step(party, session, msg.content[f"{asked}.{cid}"])
        context.state[f"{PARTY}{cid}"] = party.to_record()
    return Message(content, reply_to=msg)


def _models(msg: Message) -> dict[str, Tensors]:
    return {name[len("model."):]: M.from_record(record) for name, record in msg.content.array_records.items()
            if name.startswith("model.")}


@app.query("diagnostics")
def diagnostics(msg: Message, context: Context) -> Message:
    """Each served client's diagnostics statistics of every sent model on its split (the client
    half, :func:`fedlatent.federated.diagnostics.split_statistics`), for the clients the server
    sent rows of the uniformity sample to (those holding the split) — or of the global test split
    (``sample.global``), the server holding no copy of it."""
    refused = _refused(msg, context)
    if refused is not None:
        return refused
    job = _job(msg, context)
    asked = M.unpack_values(msg.content["diagnostics"])
    models = _models(msg)
    content = RecordDict()
    splits: dict[str, Split | None] = {str(cid): getattr(client, asked["split"]) for cid, client in job.clients.items()}
    splits[GLOBAL_TEST] = job.federation.test
    rows = {key: M.from_record(msg.content[f"sample.{key}"])["rows"] for key in splits
            if f"sample.{key}" in msg.content.array_records}
    model = job.workspace.model
    for name, state in models.items():
        model.load_state_dict(state)  # once for all the node's clients
        for key, sample in rows.items():
            split = splits[key]
            assert split is not None, f"diagnostics asked of a split {key} does not hold"
            content[f"stats.{name}.{key}"] = M.to_record(split_statistics(
                model, split, set(asked["which"]), job.federation.num_classes, sample,
                job.config.eval.batch_size, job.device))
    return Message(content, reply_to=msg)


@app.query("tsne")
def tsne(msg: Message, context: Context) -> Message:
    """Each served client's t-SNE features of the asked class, through its local model when the
    server sent one (``model.client<id>``), else the global model."""
    refused = _refused(msg, context)
    if refused is not None:
        return refused
    job = _job(msg, context)
    asked = M.unpack_values(msg.content["tsne"])
    models = _models(msg)
    content = RecordDict()
    for cid, client in job.clients.items():
        z = tsne_features(job.workspace.model, models.get(f"client{cid}", models["global"]), client.train,
                          int(asked["class"]), int(asked["cap"]), tsne_seed(node_view.stream_seed(msg.content, cid), cid),
                          job.config.eval.batch_size, job.device)
        if z is not None:
            content[f"tsne.z.{cid}"] = M.to_record({"z": z})
    return Message(content, reply_to=msg)


@app.query("data")
def data(msg: Message, context: Context) -> Message:
    """Each served client's data figures: label counts and the range of its samples' mean input
    values; sent the common bin ``edges``, its histogram counts over them."""
    job = _job(msg, context)
    edges = np.asarray(M.unpack_values(msg.content["edges"])["edges"]) if "edges" in msg.content else None
    values = {str(cid): {"counts": label_counts(c.train, job.federation.num_classes), "range": mean_value_range(c.train)}
              if edges is None else {"histogram": mean_value_counts(c.train, edges)} for cid, c in job.clients.items()}
    return Message(RecordDict({"data": M.pack_values(values)}), reply_to=msg)


@app.evaluate("report")
def report(msg: Message, context: Context) -> Message:
    """The personalised report rows of the served clients with a test split (those of ``clients``
    alone when the server sends it: a sampled evaluation): the model each client would use
    (personal, own layers, fine-tuned or global), its accuracy and the majority baseline."""
    job = _job(msg, context)
    cfg, spec, fed = job.config, job.spec, job.federation
    global_state = M.from_record(msg.content["global"])
    restore = {int(name[len(STATE):]): M.from_record(msg.content[name])
               for name in msg.content.array_records if name.startswith(STATE)}
    settings = local_settings(cfg.train, round_lr(cfg.train, cfg.train.rounds - 1), spec.personalization.epochs,
                              fed.augment, fed.num_classes, job.device)
    asked = msg.content.config_records.get("clients")  # a sampled evaluation's clients of this node
    chosen = job.clients if asked is None else {int(c): job.clients[int(c)] for c in asked["ids"]}
    rows = []
    for cid, client in chosen.items():
        state = _state(context, cid)
        row = client_report(job.workspace, spec, cid, client, restore.get(cid, {}) if state is None else state,
                            global_state, num_classes=fed.num_classes, batch_size=cfg.eval.batch_size,
                            device=job.device, settings=settings,
                            generator=torch.Generator().manual_seed(
                                derive_seed(node_view.stream_seed(msg.content, cid), FINETUNE, cid)))
        if row is not None:
            rows.append(row)
    return Message(RecordDict({"rows": M.pack_values({"rows": rows})}), reply_to=msg)


@app.evaluate("new")
def new(msg: Message, context: Context) -> Message:
    """The held-out clients this node serves (``data.holdout_clients``), as on the embedded backends
    (:func:`~fedlatent.federated.personal.new_client_reports`): the global model's tally on each
    one's test split and, when ``personal``, its report under the program's new-client rule (those
    of ``clients`` alone when the server sends it: a sampled evaluation)."""
    job = _job(msg, context)
    cfg, spec, fed = job.config, job.spec, job.federation
    settings = local_settings(cfg.train, round_lr(cfg.train, cfg.train.rounds - 1), spec.personalization.epochs,
                              fed.augment, fed.num_classes, job.device)
    asked = msg.content.config_records.get("clients")  # a sampled evaluation's held-out clients of this node
    chosen = job.new_clients if asked is None else {int(c): job.new_clients[int(c)] for c in asked["ids"]}
    tallies, rows = new_client_reports(job.workspace, spec, chosen, M.from_record(msg.content["global"]),
                                       num_classes=fed.num_classes, batch_size=cfg.eval.batch_size, device=job.device,
                                       settings=settings, personal=bool(msg.content["new"]["personal"]),
                                       seeds={cid: node_view.stream_seed(msg.content, cid) for cid in chosen})
    content = M.pack_tallies({f"client.{cid}": t for cid, t in tallies.items()})
    content["rows"] = M.pack_values({"rows": rows})
    return Message(content, reply_to=msg)


__all__ = ["app", "served", "job_for"]
