"""Imported at start-up by every Python process of a test federation whose ``PYTHONPATH`` holds this
folder (``tests/flower_procs.py``): where ``FEDLATENT_GUARDED_ROOT`` and ``FEDLATENT_GUARD_LOG`` are
set, an audit hook appends to that log each path under the root that the process opens or lists,
as ``<program> <event> <path>``, and the process's program once as ``<program> started`` — the
program being ``flwr-serverapp``, ``flwr-clientapp``, … (``/proc/self/cmdline``), so that a test
can tell the ServerApp's reads from the ClientApps'. Each client a process builds is logged too, as
``<program> built <process id> <partition id>`` (fedlatent's audit event ``fedlatent.client_built``)."""
from __future__ import annotations

import os
import sys


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


if os.environ.get("FEDLATENT_GUARDED_ROOT") and os.environ.get("FEDLATENT_GUARD_LOG"):
    _install(os.path.abspath(os.environ["FEDLATENT_GUARDED_ROOT"]), os.environ["FEDLATENT_GUARD_LOG"])
