"""Real Flower processes for tests: one ``flower-superlink`` and N ``flower-supernode`` on 127.0.0.1.

Free ports are chosen at run time; each process starts in its own process group (and session) and
is killed with its group when the test ends, passing or failing. TLS certificates (a CA and a
server certificate for 127.0.0.1) and the SuperNodes' authentication keys (SECP384R1 in OpenSSH
format) are generated at test time with ``cryptography`` (a dependency of Flower); SuperNode
authentication is on, each node's public key registered with ``flwr supernode register``.
Telemetry and runtime dependency installation are off. With ``guarded`` set, every process of the
federation logs what it opens under that path (``tests/open_guard/sitecustomize.py``). Beside them, :class:`InProcessGrid` drives
fedlatent's ClientApp in this process (no engine, no network) for tests of the server's logic.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

BIN = Path(sys.executable).parent
ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
       "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
OPEN_GUARD = Path(__file__).resolve().parent / "open_guard"  # its sitecustomize logs reads under a guarded root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tls(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedlatent test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


def write_node_keys(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (private, public), OpenSSH format."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, …), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Proc:
    """A started process, its own group leader, with its output in a log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group and every descendant's group (Flower starts its SuperExec and
        app processes in sessions of their own)."""
        for pid in [self.popen.pid, *descendants(self.popen.pid)]:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.popen.wait(timeout=30)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class LocalFederation:
    """A SuperLink and its SuperNodes on 127.0.0.1, with TLS and SuperNode authentication on."""

    folder: Path
    num_nodes: int
    procs: list[Proc] = field(default_factory=list)
    nodes: list[Proc] = field(default_factory=list)
    port: int = 0
    tls: dict[str, Path] = field(default_factory=dict)
    flwr_home: Path | None = None
    guarded: Path | None = None  # every process logs its reads under this path (tests/open_guard)
    logs_messages: bool = False  # every ClientApp logs the messages it is handed (tests/open_guard)

    @property
    def guard_log(self) -> Path:
        return self.folder / "guard.log"

    @property
    def message_log(self) -> Path:
        return self.folder / "messages.jsonl"

    def received(self) -> list[dict]:
        """The messages the nodes' ClientApps were handed (``logs_messages``), in order."""
        import json
        text = self.message_log.read_text() if self.message_log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def guard_lines(self) -> list[tuple[str, str]]:
        """The open guard's log as (program, what) pairs: ``started``, or an event and its path."""
        text = self.guard_log.read_text() if self.guard_log.exists() else ""
        return [tuple(line.split(" ", 1)) for line in text.splitlines()]  # type: ignore[misc]

    def env(self) -> dict[str, str]:
        env = {**os.environ, **ENV, "FLWR_HOME": str(self.flwr_home),
               "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
        src = str(Path(__file__).resolve().parents[1] / "src")
        guard = str(OPEN_GUARD) if self.guarded is not None or self.logs_messages else ""
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, guard, os.environ.get("PYTHONPATH", "")) if p)
        if self.guarded is not None:
            env.update(FEDLATENT_GUARDED_ROOT=str(self.guarded), FEDLATENT_GUARD_LOG=str(self.guard_log))
        if self.logs_messages:
            env["FEDLATENT_MESSAGE_LOG"] = str(self.message_log)
        return env

    def start(self, name: str, args: list[str]) -> Proc:
        log = self.folder / f"{name}.log"
        popen = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=self.env(),
                                 cwd=self.folder, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], capture_output=True, text=True, env=self.env(),
                              cwd=self.folder, timeout=timeout)

    def start_superlink(self) -> None:
        self.tls = write_tls(self.folder)
        self.flwr_home = self.folder / "flwr-home"
        self.flwr_home.mkdir()
        self.port = free_port()
        (self.flwr_home / "config.toml").write_text(
            '[superlink]\ndefault = "test"\n\n[superlink.test]\n'
            f'address = "127.0.0.1:{self.port}"\nroot-certificates = "{self.tls["ca"]}"\n')
        link = self.start("superlink", [
            str(BIN / "flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
            "--fleet-api-address", f"127.0.0.1:{free_port()}", "--control-api-address", f"127.0.0.1:{free_port()}",
            "--ssl-ca-certfile", str(self.tls["ca"]), "--ssl-certfile", str(self.tls["cert"]),
            "--ssl-keyfile", str(self.tls["key"]), "--enable-supernode-auth",
            "--disable-runtime-dependency-installation", "--database", str(self.folder / "state.db")])
        self.wait_for(link, lambda: self.flwr("supernode", "list", "test", timeout=30).returncode == 0,
                      "the SuperLink's Control API")

    def register(self, public_key: Path) -> subprocess.CompletedProcess:
        return self.flwr("supernode", "register", str(public_key), "test")

    def start_supernode(self, index: int, *, register: bool = True, partitions: int | None = None,
                        partition: int | None = None, terms: str = "") -> Proc:
        """SuperNode ``index``, serving partition-id ``partition`` (``index`` by default) of
        ``partitions``; ``terms``: more node-config items (its own terms, ``node_terms``)."""
        private, public = write_node_keys(self.folder, f"node{index}")
        if register:
            done = self.register(public)
            assert done.returncode == 0, done.stdout + done.stderr
        part = index if partition is None else partition
        node = self.start(f"supernode{index}", [
            str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{self.port}",
            "--root-certificates", str(self.tls["ca"]), "--auth-supernode-private-key", str(private),
            "--port", str(free_port()), "--max-retries", "3",
            "--node-config", f"partition-id={part} num-partitions={partitions or self.num_nodes} {terms}".strip()])
        self.nodes.append(node)
        return node

    def wait_for(self, proc: Proc, ready, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited before {what} was ready:\n{proc.text()[-3000:]}")
            if ready():
                return
            time.sleep(1.0)
        raise TimeoutError(f"{what} not ready after {timeout:.0f} s:\n{proc.text()[-3000:]}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.text()[-4000:]}" for p in self.procs)


class InProcessGrid:
    """A grid whose nodes are fedlatent's ClientApp called in this process, one Context each (node
    k+1 has partition-id k, plus ``node_config[k+1]``); nodes in ``silent`` never reply (a node
    gone mid-round)."""

    def __init__(self, num_nodes: int, node_config: dict[int, dict] | None = None) -> None:
        from flwr.app import Context, RecordDict
        from flwr.common.constant import SUPERLINK_NODE_ID
        from flwr.supercore.task_identity import TaskIdentity

        from fedlatent.backends.flower import client_app
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID  # as Flower's engines do
        self.app = client_app.app
        self.contexts = {node: Context(run_id=1, node_id=node, state=RecordDict(), run_config={},
                                       node_config={"partition-id": node - 1, "num-partitions": num_nodes,
                                                    **(node_config or {}).get(node, {})})
                         for node in range(1, num_nodes + 1)}
        self.silent: set[int] = set()
        self.sent: list[str] = []  # message types, in order

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.sent.append(msg.metadata.message_type)
            node = msg.metadata.dst_node_id
            if node in self.silent:
                continue
            reply = self.app(msg, self.contexts[node])
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            replies.append(reply)
        return replies
