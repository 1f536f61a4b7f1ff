"""A NATS JetStream cluster on loopback: the shape of a multi-host deployment, on one
machine. Used by the fault tests and benchmarks; ``node_config`` is also the template for
a real node's configuration (swap the loopback addresses for the hosts').
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from eventlog.embedded import EmbeddedNatsError, _die_with_parent, find_nats_server
from eventlog.streams import check_durability, durability_tag


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports (all held until all are chosen: one
    ``free_port`` after another may get the same port back)."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def node_config(
    name: str,
    store: Path,
    client: int,
    route: int,
    monitor: int,
    peers: list[int],
    cluster: str,
    durability: str = "fsync",
) -> str:
    """A node's nats.conf; ``durability``: ``fsync`` (every write synced before it is
    acknowledged) or ``replicated`` (synced on the server's interval), and the node's
    tag saying which (``eventlog.streams.durability_tag``)."""
    routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in peers)
    return "\n".join(
        [
            f'server_name: "{name}"',
            'host: "127.0.0.1"',
            f"port: {client}",
            f'http: "127.0.0.1:{monitor}"',
            f'server_tags: ["{durability_tag(durability)}"]',
            "jetstream {",
            f"  store_dir: {json.dumps(str(store))}",
            *(["  sync_interval: always"] if durability == "fsync" else []),
            "}",
            "cluster {",
            f'  name: "{cluster}"',
            f'  listen: "127.0.0.1:{route}"',
            f"  routes: [{routes}]",
            "}",
            "",
        ]
    )


class LocalCluster:
    """``size`` nats-server processes clustered on loopback, each with its own store.

    ``configs``: run these configurations instead of plain ones (e.g. written by
    ``ops.natsconf.write_cluster`` for this cluster's ports, with TLS and credentials);
    set them before ``start``. ``urls`` stay ``nats://``: a server that requires TLS
    upgrades the connection."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        size: int = 3,
        name: str = "pulse",
        durability: str | Sequence[str] = "fsync",
    ) -> None:
        self.root = Path(root)
        self.size = size
        self.name = name
        # each node's (one for all, or one each): ``node_config``
        self.durability = [durability] * size if isinstance(durability, str) else list(durability)
        for chosen in self.durability:
            check_durability(chosen)
        ports = free_ports(3 * size)
        self.client_ports = ports[:size]
        self.route_ports = ports[size : 2 * size]
        self.monitor_ports = ports[2 * size :]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.configs: list[Path] | None = None

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    def start(self, ready_timeout: float = 30.0) -> list[str]:
        try:
            for i in range(self.size):
                self.start_node(i, wait=False)
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop()  # no node left running behind a failed start
            raise
        return self.urls

    def start_node(self, i: int, *, wait: bool = True) -> None:
        node_dir = self.root / f"n{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        conf = node_dir / "nats.conf"
        peers = [p for j, p in enumerate(self.route_ports) if j != i]
        if self.configs is not None:
            conf = self.configs[i]
        else:
            conf.write_text(
                node_config(
                    f"n{i}",
                    node_dir / "store",
                    self.client_ports[i],
                    self.route_ports[i],
                    self.monitor_ports[i],
                    peers,
                    self.name,
                    self.durability[i],
                )
            )
        with open(node_dir / "nats.log", "ab") as logfile:
            self.processes[i] = subprocess.Popen(
                [find_nats_server(), "-c", str(conf)],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        if wait:
            self.wait_ready(30.0, nodes=[i])

    def wait_ready(self, timeout: float, nodes: list[int] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for i in nodes if nodes is not None else range(self.size):
            url = f"http://127.0.0.1:{self.monitor_ports[i]}/healthz"
            while True:
                process = self.processes[i]
                if process is not None and process.poll() is not None:
                    raise EmbeddedNatsError(
                        f"cluster node n{i} exited: see {self.root}/n{i}/nats.log"
                    )
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(url, timeout=0.5) as response:  # noqa: S310
                        if response.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise EmbeddedNatsError(f"cluster node n{i} not healthy within {timeout:g}s")
                time.sleep(0.05)

    def kill(self, i: int) -> None:
        """Kill node ``i`` hard (SIGKILL), as a crashed host would go."""
        process = self.processes[i]
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            self.processes[i] = None

    def stop(self) -> None:
        for process in self.processes:
            if process is not None:
                process.terminate()
        for i, process in enumerate(self.processes):
            if process is not None:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
                self.processes[i] = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
