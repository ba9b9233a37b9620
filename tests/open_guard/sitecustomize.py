"""Imported at start-up by every Python process of a test federation whose ``PYTHONPATH`` holds this
folder (``tests/flower_procs.py``): where ``FEDLATENT_GUARDED_ROOT`` and ``FEDLATENT_GUARD_LOG`` are
set, an audit hook appends to that log each path under the root that the process opens or lists,
as ``<program> <event> <path>``, and the process's program once as ``<program> started`` — the
program being ``flwr-serverapp``, ``flwr-clientapp``, … (``/proc/self/cmdline``), so that a test
can tell the ServerApp's reads from the ClientApps'. Where ``FEDLATENT_MESSAGE_LOG`` is set, every
message a ClientApp of the process is handed is appended to that log as one JSON line (:func:`_log_messages`):
what a node receives, for a test to read. Each client a process builds is logged too, as
``<program> built <process id> <partition id>`` (fedlatent's audit event ``fedlatent.client_built``)."""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys

CLIENT_APP = "fedlatent.backends.flower.client_app"


def _program() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "unknown"
    names = [os.path.basename(a.decode(errors="replace")) for a in argv[:2]]
    return next((n for n in names if n.startswith(("flwr", "flower"))), names[0] if names else "unknown")


def _install(root: str, log: str) -> None:
    program = _program()
    with open(log, "a") as f:
        f.write(f"{program} started\n")

    def hook(event: str, args: tuple) -> None:
        if event == "fedlatent.client_built":  # a client's splits built (fedlatent.data.clients), by partition id
            with open(log, "a") as f:
                f.write(f"{program} built {os.getpid()} {args[0]}\n")
            return
        if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, os.PathLike)):
            path = os.path.abspath(os.fspath(args[0]))
            if path.startswith(root) and not path.startswith(log):
                with open(log, "a") as f:  # an open of the log itself: not under root
                    f.write(f"{program} {event} {path}\n")

    sys.addaudithook(hook)


def _received(message, context) -> dict:
    """A message as a node receives it: its type, the node's partition-id, the text of every config
    record (values as ``repr``: the TOML text, numbers, bytes) and every integer entry of its arrays."""
    content = message.content
    ints = sorted({int(v) for record in content.array_records.values() for array in record.values()
                   if array.numpy().dtype.kind in "iub" for v in array.numpy().ravel().tolist()})
    return {"node": str(context.node_config.get("partition-id")), "type": message.metadata.message_type,
            "config": {name: repr(dict(record)) for name, record in content.config_records.items()}, "ints": ints}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once the module ``name`` has been executed (its first import)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


def _log_messages(log: str) -> None:
    """Wrap the ClientApp fedlatent's module defines so that each message it is handed (before its
    handler runs) is appended to ``log``."""
    def wrap(module) -> None:
        cls = type(module.app)
        call = cls.__call__

        def logged(self, message, context):
            with open(log, "a") as f:
                f.write(json.dumps(_received(message, context)) + "\n")
            return call(self, message, context)

        cls.__call__ = logged

    sys.meta_path.insert(0, _AfterImport(CLIENT_APP, wrap))


if os.environ.get("FEDLATENT_MESSAGE_LOG"):
    _log_messages(os.environ["FEDLATENT_MESSAGE_LOG"])
if os.environ.get("FEDLATENT_GUARDED_ROOT") and os.environ.get("FEDLATENT_GUARD_LOG"):
    _install(os.path.abspath(os.environ["FEDLATENT_GUARDED_ROOT"]), os.environ["FEDLATENT_GUARD_LOG"])
