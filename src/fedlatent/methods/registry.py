"""Names → method parts and presets; the only place a method's name is looked up.

``register_part("prox", mu=0.01)`` declares a part (usable as ``[[terms]] name = "prox"``) and its
keys with defaults; ``register_preset("fedprox", mu=0.01)`` declares an ``algorithm.name`` value.
Keys are validated against the defaults' types, so a typo or a wrong type is one clear line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fedlatent.calibration.registry import CALIBRATIONS
from fedlatent.config import RunConfig, to_dict, toml_value
from fedlatent.errors import ConfigError, not_allowed, unknown_key
from fedlatent.methods.head import check_head
from fedlatent.methods.parts import HEAD_INITS, Calibration, HeadPolicy, MethodSpec, Part
from fedlatent.methods.program import PROGRAMS, Finetune
from fedlatent.models.base import FedModel
from fedlatent.registry import same_kind

# keys every preset accepts (None = the preset's own choice)
COMMON_KEYS: dict[str, Any] = {
    "loss": "",                 # "" (preset) | ce | mse
    "temperature": 1.0,         # cross-entropy of logits / temperature (SphereFed Table 3's CE rows)
    "head": "",                 # "" | learned | fixed
    "head_init": "",            # "" | default | orthogonal | tammes
    "tammes_steps": 10_000,     # head_init = tammes: SGD steps (SphereFed App. D)
    "normalize_z": "",          # "" | "true" | "false" (tri-state, TOML has no null)
    "calibration": "",          # "" | none | ffc | ccvr | centralized
    "calibration_epochs": 0,    # ccvr / centralized: SGD epochs of the head (0 = 5)
    "calibration_lr": 0.0,      # ccvr / centralized: its learning rate (0 = 0.01)
    "calibration_loss": "",     # ccvr / centralized: "" (ce) | ce | mse (SphereFed Table 4's sanity check tries both)
    "calibration_ridge": 0.0,
    "calibration_every": 0,
    "calibration_personal": False,
    "finetune_epochs": 0,
    "finetune_scope": "",       # "" (preset; all) | all | head
}
CHOICES = {"loss": ("", "ce", "mse"), "head": ("", "learned", "fixed"),
           "head_init": ("", *HEAD_INITS), "normalize_z": ("", "true", "false"),
           "calibration": ("", *CALIBRATIONS), "calibration_loss": ("", "ce", "mse"),
           "finetune_scope": ("", "all", "head")}


@dataclass
class Entry:
    defaults: dict[str, Any]
    build: Callable[[dict[str, Any]], Any]
    doc: str


PARTS: dict[str, Entry] = {}
PRESETS: dict[str, Entry] = {}


def register_part(name: str, **defaults: Any) -> Callable:
    def wrap(factory: Callable[[dict[str, Any]], Part]) -> Callable:
        PARTS[name] = Entry(defaults, factory, (factory.__doc__ or "").strip().split("\n")[0])
        return factory
    return wrap


def register_preset(name: str, **defaults: Any) -> Callable:
    def wrap(build: Callable[[dict[str, Any]], MethodSpec]) -> Callable:
        PRESETS[name] = Entry(defaults, build, (build.__doc__ or "").strip().split("\n")[0])
        return build
    return wrap


def _validated(where: str, given: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for key, value in given.items():
        if key == "name":
            continue
        if key not in defaults:
            raise ConfigError(unknown_key(f"{where}.{key}", defaults, f"'{given.get('name')}'"))
        default = defaults[key]
        if not same_kind(value, default):
            raise ConfigError(f"{where}.{key} = {value!r}: expected {type(default).__name__} like {default!r}")
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(not_allowed(f"{where}.{key} = {value!r}: allowed values are "
                                          f"{', '.join(c for c in CHOICES[key] if c)}", value, CHOICES[key]))
        # a negative default (FedUV's λ = -1: C/4) may be written as `fedlatent methods` lists it
        if isinstance(default, (int, float)) and not isinstance(default, bool) and value < 0 and value != default:
            raise ConfigError(f"{where}.{key} = {value!r}: must be >= 0")
        out[key] = float(value) if isinstance(default, float) else value
    return out


def build_part(table: dict[str, Any], where: str = "terms") -> Part:
    name = table.get("name")
    if name not in PARTS:
        raise ConfigError(not_allowed(f"{where}.name = {name!r}: unknown part; known: {', '.join(sorted(PARTS))}",
                                      name, PARTS))
    return PARTS[name].build(_validated(where, table, PARTS[name].defaults))


def resolve(algorithm: dict[str, Any], terms: list[dict[str, Any]] = ()) -> MethodSpec:
    """The method a configuration names: a preset with its keys, plus any extra ``[[terms]]``."""
    name = algorithm.get("name", "fedavg")
    if name not in PRESETS:
        raise ConfigError(not_allowed(f"algorithm.name = {name!r}: unknown; known: {', '.join(sorted(PRESETS))}",
                                      name, PRESETS))
    entry = PRESETS[name]
    opts = _validated("algorithm", algorithm, {**COMMON_KEYS, **entry.defaults})
    spec: MethodSpec = entry.build(opts)
    spec.name = name
    spec.parts += [build_part(t, f"terms[{i}]") for i, t in enumerate(terms)]
    for part in spec.all_parts():
        part.configure(spec)
    _apply_common(spec, opts)  # after configure: a switch given explicitly wins over a part's choice
    owners = [p.name for p in spec.parts if p.owns_aggregation]
    if len(owners) > 1:
        raise ConfigError(f"terms: {' and '.join(owners)} both replace the aggregation; use one")
    return spec


def resolved_keys(algorithm: dict[str, Any], terms: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """The method's keys after defaults (the preset's, the universal switches and each term's):
    what identifies a method in a run's summary, so runs of the same preset stay comparable."""
    name = algorithm.get("name", "fedavg")
    if name not in PRESETS:
        raise ConfigError(not_allowed(f"algorithm.name = {name!r}: unknown; known: {', '.join(sorted(PRESETS))}",
                                      name, PRESETS))
    keys = {"name": name, **_validated("algorithm", algorithm, {**COMMON_KEYS, **PRESETS[name].defaults})}
    resolved_terms = []
    for i, t in enumerate(terms):
        if t.get("name") not in PARTS:
            raise ConfigError(not_allowed(f"terms[{i}].name = {t.get('name')!r}: unknown part; known: "
                                          f"{', '.join(sorted(PARTS))}", t.get("name"), PARTS))
        resolved_terms.append({"name": t["name"], **_validated(f"terms[{i}]", t, PARTS[t["name"]].defaults)})
    return {**keys, "terms": resolved_terms}


def flat_settings(config: RunConfig) -> dict[str, Any]:
    """Every resolved key of ``config`` as dotted key → value: each section's fields and own keys,
    then the method's keys after defaults (``algorithm.mu``, ``terms[0].beta``)."""
    flat: dict[str, Any] = {}
    for name, value in to_dict(config).items():
        if name in ("algorithm", "terms"):
            continue
        if isinstance(value, dict):
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            flat[name] = value
    keys = resolved_keys(config.algorithm, config.terms)
    flat.update({f"algorithm.{k}": v for k, v in keys.items() if k != "terms"})
    for i, term in enumerate(keys["terms"]):
        flat.update({f"terms[{i}].{k}": v for k, v in term.items()})
    return flat


def _apply_common(spec: MethodSpec, opts: dict[str, Any]) -> None:
    """Universal switches override the preset's choices when given."""
    if opts["loss"]:
        spec.loss = opts["loss"]
    if opts["temperature"] != 1.0:
        if opts["temperature"] <= 0 or spec.loss != "ce":
            raise ConfigError(f"algorithm.temperature = {opts['temperature']}: must be > 0, with loss = 'ce' "
                              f"('{spec.name}' trains with '{spec.loss}')")
        spec.temperature = opts["temperature"]
    head: HeadPolicy = spec.head
    if opts["head"]:
        head.fixed = opts["head"] == "fixed"
    if opts["head_init"]:
        head.init = opts["head_init"]
    head.init_steps = opts["tammes_steps"]
    if opts["normalize_z"]:
        head.normalize_z = opts["normalize_z"] == "true"
    if opts["calibration"]:
        spec.calibration = Calibration(kind=opts["calibration"])
    if spec.calibration.declared.calibrates:
        spec.calibration.ridge = opts["calibration_ridge"] or spec.calibration.ridge
        spec.calibration.every = opts["calibration_every"] or spec.calibration.every
        spec.calibration.personal = opts["calibration_personal"] or spec.calibration.personal
        spec.calibration.epochs = opts["calibration_epochs"] or spec.calibration.epochs
        spec.calibration.lr = opts["calibration_lr"] or spec.calibration.lr
        spec.calibration.loss = opts["calibration_loss"] or spec.calibration.loss
    program = spec.personalization
    if opts["finetune_epochs"]:
        if isinstance(program, Finetune):
            program.epochs = opts["finetune_epochs"]
        elif program.personalizes:
            raise ConfigError(f"algorithm.finetune_epochs: '{spec.name}' already personalises")
        else:
            spec.personalization = Finetune(opts["finetune_epochs"])
    if opts["finetune_scope"]:
        if not isinstance(spec.personalization, Finetune):
            raise ConfigError(f"algorithm.finetune_scope = {opts['finetune_scope']!r}: '{spec.name}' does not "
                              "fine-tune; set algorithm.finetune_epochs > 0")
        spec.personalization.scope = opts["finetune_scope"]


def check_model(spec: MethodSpec, model: FedModel) -> None:
    """Refuse the method's keys that ``model`` cannot satisfy — a part's (a constraint's depth or
    layers, Structured-DeCov's groups) or the head's (orthonormal rows wider than z) — with one
    ConfigError naming the key. ``model`` may be built on the meta device: only its shape is read."""
    check_head(spec.head, model)
    for part in spec.all_parts():
        part.check_model(model)


def catalogue() -> str:
    """Every preset and part with its keys at their defaults (for ``fedlatent methods``), as TOML
    blocks separated by blank lines: each one, copied into a configuration, chooses that preset
    (``[algorithm]``, with the client program it runs) or adds that part (``[[terms]]``); then the
    client programs."""
    blocks = ["# method presets: [algorithm], its keys at their defaults"]
    blocks += [_block("[algorithm]", n, e, resolve({"name": n}).personalization.kind) for n, e in sorted(PRESETS.items())]
    blocks += ["# parts: [[terms]], added to any preset"]
    blocks += [_block("[[terms]]", n, e) for n, e in sorted(PARTS.items())]
    blocks += ["\n".join(['# keys every preset accepts, in [algorithm] beside name ("" = the preset\'s own choice)',
                          "[algorithm]", *(f"{k} = {toml_value(v)}" for k, v in COMMON_KEYS.items())])]
    blocks += ["\n".join(["# client programs (what a client does in its round; each preset names its own):",
                          *(f"#   {n}: {(c.__doc__ or '').strip().splitlines()[0]}" for n, c in sorted(PROGRAMS.items()))])]
    return "\n\n".join(blocks)


def _block(header: str, name: str, entry: Entry, program: str = "none") -> str:
    """One preset's or part's TOML table: its doc as a comment (and its client program, where it has
    one of its own), its name and keys."""
    return "\n".join([f"# {name}: {entry.doc}" if entry.doc else f"# {name}",
                      *([f"# client program: {program}"] if program != "none" else []), header,
                      f"name = {toml_value(name)}", *(f"{k} = {toml_value(v)}" for k, v in entry.defaults.items())])
