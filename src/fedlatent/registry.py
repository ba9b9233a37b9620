"""Open lists of named components (models, data sets, partitions): a name, the keys it reads, a builder.

A component is one file that registers itself::

    MODELS = Registry("model", "arch", package="fedlatent.models")

    @MODELS.register("vgg13", reads=("projector",), keys={"norm": Key("batch", "...", ("batch", "group"))})
    def _vgg13(input_shape, num_classes, *, data_name, projector, norm): ...

``reads`` names existing fields of the configuration section the component uses; ``keys`` declares
keys of its own (with default, doc and allowed values), which the section keeps in ``options``.
The registry imports every module of ``package`` on first use, so a new file needs no import
list. :func:`check_section` refuses, in one line, a key the chosen components do not read.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from fedlatent.config import toml_value
from fedlatent.errors import ConfigError, not_allowed, unknown_key


@dataclass(frozen=True)
class Key:
    """A component's own configuration key: default (its type is the key's type), doc, allowed values."""

    default: Any
    doc: str
    choices: tuple[Any, ...] = ()


@dataclass
class Entry:
    """One registered name: its builder, the section fields it ``reads``, its own ``keys`` and
    ``traits`` (free facts other code asks about, e.g. a data set that comes with its own clients)."""

    name: str
    build: Callable[..., Any]
    doc: str
    reads: tuple[str, ...] = ()
    keys: dict[str, Key] = field(default_factory=dict)
    traits: dict[str, Any] = field(default_factory=dict)

    def options(self, cfg: Any) -> dict[str, Any]:
        """The values this entry reads from section ``cfg``: its fields, then its own keys."""
        own = getattr(cfg, "options", {})
        return {**{k: getattr(cfg, k) for k in self.reads},
                **{k: own.get(k, key.default) for k, key in self.keys.items()}}


class Registry:
    """Names → :class:`Entry` for the configuration key ``section.key`` (e.g. ``model.arch``)."""

    def __init__(self, section: str, key: str, *, package: str) -> None:
        self.section, self.key, self.package = section, key, package
        self._entries: dict[str, Entry] = {}
        self._discovered = False

    def register(self, name: str, *, reads: tuple[str, ...] = (), keys: dict[str, Key] | None = None,
                 doc: str = "", **traits: Any) -> Callable:
        """Decorator registering ``build`` under ``name``; the doc defaults to its docstring's first
        paragraph on one line (a first line alone may stop mid-sentence)."""
        def wrap(build: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.section}.{self.key} = '{name}' is registered twice")
            text = doc or " ".join((build.__doc__ or "").strip().split("\n\n")[0].split())
            self._entries[name] = Entry(name, build, text, tuple(reads), dict(keys or {}), traits)
            return build
        return wrap

    def _discover(self) -> None:
        """Import every module of the package once: each registers its entries on import."""
        if self._discovered:
            return
        self._discovered = True
        root = importlib.import_module(self.package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{self.package}."):
            importlib.import_module(info.name)

    def entries(self) -> list[Entry]:
        self._discover()
        return [self._entries[n] for n in sorted(self._entries)]

    def names(self) -> list[str]:
        return [e.name for e in self.entries()]

    def get(self, name: Any) -> Entry:
        """The entry called ``name``, or one :class:`ConfigError` line listing the allowed values."""
        self._discover()
        if name not in self._entries:
            raise ConfigError(not_allowed(f"{self.section}.{self.key} = {name!r}: unknown; allowed values are "
                                          f"{', '.join(self.names())}", name, self.names()))
        return self._entries[name]

    def describe(self) -> str:
        """One comment line per entry: name, doc, the keys it reads and its own keys with their
        defaults (for ``fedlatent config``, whose output is TOML)."""
        rows = [f"# {self.section}.{self.key}:"]
        for e in self.entries():
            keys = list(e.reads) + [f"{k} = {toml_value(v.default)}" for k, v in e.keys.items()]
            rows.append(f"#   {e.name:14s} {e.doc}" + (f"  [{', '.join(keys)}]" if keys else ""))
        return "\n".join(rows)


def same_kind(value: Any, default: Any) -> bool:
    """Whether ``value`` may stand where ``default`` does: bools only for bools, any number for a
    float, integers (not bools) for an int, else the default's type."""
    return (isinstance(value, bool) if isinstance(default, bool) else
            isinstance(value, (int, float)) and not isinstance(value, bool) if isinstance(default, float) else
            isinstance(value, int) and not isinstance(value, bool) if isinstance(default, int) else
            isinstance(value, type(default)))


def _check_value(where: str, value: Any, key: Key) -> Any:
    default = key.default
    if not same_kind(value, default):
        raise ConfigError(f"{where} = {value!r}: expected {type(default).__name__} like {default!r}")
    if key.choices and value not in key.choices:
        raise ConfigError(not_allowed(f"{where} = {value!r}: allowed values are {', '.join(map(str, key.choices))}",
                                      value, key.choices))
    return float(value) if isinstance(default, float) else value


def check_section(cfg: Any, chosen: list[tuple[Registry, Entry]]) -> dict[str, Any]:
    """Validate section ``cfg`` against the ``chosen`` entries and return its resolved options.

    A field some entry of these registries reads is *specific*: set to a non-default value while
    no chosen entry reads it, it is refused (it would be silently ignored). Keys in
    ``cfg.options`` must be declared by a chosen entry and match its type and allowed values (an
    unknown one is told with the keys the section takes with these entries: its fields that are
    not specific or that they read, and their own keys); the result holds every chosen entry's own
    keys, defaults filled in."""
    section = chosen[0][0].section
    who = " with ".join(f"{r.section}.{r.key} = '{e.name}'" for r, e in chosen)
    reads = {k for _, e in chosen for k in e.reads}
    own = {k: key for _, e in chosen for k, key in e.keys.items()}
    allowed = ", ".join(sorted(reads | set(own))) or "none"
    specific = {k for r in {id(r): r for r, _ in chosen}.values() for e in r.entries() for k in e.reads}
    fields = [f.name for f in dataclasses.fields(cfg) if f.name != "options"]
    taken = [k for k in fields if k not in specific or k in reads] + list(own)  # the section's keys with these entries
    for f in dataclasses.fields(cfg):
        if f.name not in specific or f.name in reads:
            continue
        default = f.default if f.default is not dataclasses.MISSING else cast(Callable[[], Any], f.default_factory)()
        value = getattr(cfg, f.name)
        if value != default:
            raise ConfigError(f"{section}.{f.name} = {value!r} is not read by {who}; known keys of {who}: {allowed}")
    resolved = {k: key.default for k, key in own.items()}
    for k, value in getattr(cfg, "options", {}).items():
        if k not in own:
            raise ConfigError(unknown_key(f"{section}.{k}", taken, f"[{section}]", also=fields))
        resolved[k] = _check_value(f"{section}.{k}", value, own[k])
    return resolved


__all__ = ["Entry", "Key", "Registry", "check_section"]
