"""Errors that mean "the user's input is wrong": the CLI turns them into one line and exit code 2;
and the wording of the two commonest, an unknown key and a value not allowed (with a suggestion)."""
from __future__ import annotations

import difflib
from typing import Iterable


class UserInputError(Exception):
    """Invalid configuration, data or arguments (exit code 2, no traceback)."""


class ConfigError(UserInputError):
    """A configuration key has an invalid value; the message names the key and what is allowed."""


class DataError(UserInputError):
    """Data on disk is missing or malformed; the message names the file or folder expected."""


class RunStopped(RuntimeError):
    """The failure policy ended the run early (exit code 1); ``str()`` is the one-line reason
    (round, client, quantity) and ``rounds_completed`` the rounds whose checkpoints were written."""

    def __init__(self, reason: str, rounds_completed: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rounds_completed = rounds_completed


def did_you_mean(given: object, known: Iterable[object], prefix: str = "", *, quote: bool = True) -> str:
    """``"did you mean <prefix><match>?"`` for the known name closest to ``given`` (difflib's ratio
    ≥ 0.6; a value ``quote``d, a key not), else ``""``."""
    names = [str(k) for k in known]
    close = difflib.get_close_matches(given, names, n=1) if isinstance(given, str) else []
    if not close:
        return ""
    return f"did you mean {prefix}{repr(close[0]) if quote else close[0]}?"


def not_allowed(message: str, given: object, allowed: Iterable[object]) -> str:
    """``message`` (which names the key, the value and the allowed values) with the closest allowed
    value suggested: ``train.optimizer = 'adm': allowed values are sgd, adam, adamw; did you mean 'adam'?``."""
    hint = did_you_mean(given, allowed)
    return f"{message}; {hint}" if hint else message


def unknown_key(key: str, known: Iterable[str], owner: str, *, also: Iterable[str] = ()) -> str:
    """The one wording of an unknown key, wherever the key is declared: ``unknown key data.partion;
    did you mean data.partition? known keys of [data]: …`` (``key`` dotted in full, ``known`` the
    owner's key names without the prefix; ``also``: more names to suggest, not listed — a section's
    keys that other components read)."""
    known = list(known)
    prefix, _, name = key.rpartition(".")
    hint = did_you_mean(name, [*known, *also], prefix + "." if prefix else "", quote=False)
    return f"unknown key {key}; {hint + ' ' if hint else ''}known keys of {owner}: {', '.join(known) or 'none'}"
