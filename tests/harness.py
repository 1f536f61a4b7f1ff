"""The test harness: what many test modules use to drive Pulse as a user would.

`pulse up` as a subprocess (``start``/``stop``, the ``Service`` it answers as), one-shot
CLI runs (``pulse``), the app of `pulse up` served inside the test's own process
(``in_process``), polling for a condition (``eventually``), the scans the forgetting
tests share, and a hold on a connection's incoming messages (``intercept``). Test modules
import these from here, never from one another: a test module is a list of tests, and
importing one runs none of its fixtures or cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from hypothesis import settings

from eventlog import EmbeddedNats
from eventlog.embedded import NatsCredentials
from eventlog.errors import QueryCancelled
from ops.cluster import free_ports
from ops.mcp_server import build_mcp
from ops.operator_secret import read_secret
from ops.service import create_app

if TYPE_CHECKING:
    from eventlog.log import EventLog
    from sync import PulseDB

PULSE = str(Path(sys.executable).parent / "pulse")  # the installed console script


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it is true, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(interval)


def by_profile(ci: int, dev: int) -> int:
    """A size of a costly test (examples of a property, moments checked) under the
    hypothesis profile in use: ``ci`` for `make test`, ``dev`` for
    `HYPOTHESIS_PROFILE=dev make test` (which draws 300 examples where ci draws 60)."""
    return dev if settings.default.max_examples > 100 else ci


# -- `pulse up` as a subprocess ---------------------------------------------------------------


@dataclass
class Service:
    url: str
    data_dir: Path
    process: subprocess.Popen[str]
    token: str | None = None
    banner: str = ""  # what `pulse up` printed before it served
    printed: list[str] = field(default_factory=list)  # its stdout after the banner
    logged: list[str] = field(default_factory=list)  # its stderr
    drains: list[threading.Thread] = field(default_factory=list)

    def client(self, token: str | None = None) -> httpx.AsyncClient:
        """A client acting for ``token``, by default the operator's secret (which
        ``start`` read from the data directory, as the CLI does)."""
        given = token or self.token
        headers = {"Authorization": f"Bearer {given}"} if given else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60)

    def mcp_client(self, token: str | None = None) -> httpx.AsyncClient:
        """An HTTP client for ``streamable_http_client(..., http_client=)``: ``client``'s
        credential, and the MCP SDK's read timeout (its streams wait long)."""
        given = token or self.token
        headers = {"Authorization": f"Bearer {given}"} if given else {}
        return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300))


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``PULSE_*`` setting, plus ``extra``: a
    server or command sees only the settings its test gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env.update(extra)
    return env


def start(
    data_dir: Path, *args: str, env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Service:  # fmt: skip
    """`pulse up` on ``data_dir`` (a free port), returned once its banner says it serves."""
    process = subprocess.Popen(
        [PULSE, "--data-dir", str(data_dir), "up", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or clean_env(),
        preexec_fn=preexec_fn,
    )  # fmt: skip
    assert process.stdout is not None
    # stderr is read from the start: a server that logs more than a pipe holds (64 KiB)
    # before its banner would otherwise block on it, and never print the banner
    logged: list[str] = []
    stderr_reader = drain(process.stderr, logged)
    lines = []
    while not lines or "Ctrl-C stops" not in lines[-1]:
        line = process.stdout.readline()
        if not line:
            stderr_reader.join(timeout=10)
        assert line, f"`pulse up` ended: {''.join(lines)} {''.join(logged)}"
        lines.append(line)
    banner = "".join(lines)
    match = re.search(r"HTTP\s+http://[\d.]+:(\d+)", banner)  # (a --host 0.0.0.0 too)
    assert match, lines
    service = Service(f"http://127.0.0.1:{match.group(1)}", data_dir, process, banner=banner)
    service.token = read_secret(data_dir)  # the operator's, as the CLI reads it
    service.logged = logged
    service.drains = [drain(process.stdout, service.printed), stderr_reader]
    return service


def drain(pipe: Any, into: list[str]) -> threading.Thread:
    """Read ``pipe`` to its end into ``into``, on a thread. A server's pipes must be read
    while it runs: once one holds 64 KiB unread, its next write blocks the server's event
    loop, and every request hangs (CI saw exactly that, from MCP disconnect tracebacks)."""

    def read() -> None:
        with pipe:
            into.extend(pipe)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def stop(service: Service) -> str:
    """Stop the server (SIGTERM); what it printed on stdout after its banner."""
    service.process.send_signal(signal.SIGTERM)
    service.process.wait(timeout=30)
    for reader in service.drains:
        reader.join(timeout=10)
    return "".join(service.printed)


async def call(client: httpx.AsyncClient, method: str, **body: Any) -> Any:
    """``POST /v1/<method>`` with ``body``; its JSON answer, which must be a 200."""
    response = await client.post(f"/v1/{method}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# -- one-shot CLI runs ------------------------------------------------------------------------


def cli_env() -> dict[str, str]:
    """This process's environment without the NATS URL and data directory settings (the
    command takes both from its arguments); other ``PULSE_*`` settings stay."""
    env = dict(os.environ)
    env.pop("PULSE_NATS_URL", None)
    env.pop("PULSE_DATA_DIR", None)
    return env


def pulse(*args: str, data_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`pulse --data-dir DATA_DIR ARGS...` as a user runs it: exit code, stdout, stderr."""
    return subprocess.run(
        [PULSE, "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
    )


# -- the app of `pulse up` in the test's own process ------------------------------------------

IN_PROCESS_SECRET = "in-process-operator"  # the operator secret of in_process's app


class _Quiet(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test runner keeps its signals
        yield


@contextlib.asynccontextmanager
async def in_process(db: PulseDB) -> AsyncIterator[str]:
    """The app of `pulse up` (HTTP API and MCP) over ``db``, served in this process, with
    the operator secret ``IN_PROCESS_SECRET``: for tests that need the instance's own
    object beside its network surface."""
    mcp = build_mcp(db)
    mcp_app = mcp.streamable_http_app()

    @contextlib.asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    app = create_app(
        db, secret=IN_PROCESS_SECRET, mcp_routes=list(mcp_app.routes), lifespan=lifespan
    )
    server = _Quiet(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or serving.done(), what="uvicorn started")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


# -- NATS servers ------------------------------------------------------------------------------


def hub_server(tmp_path: Path) -> tuple[EmbeddedNats, str]:
    """An embedded server taking leaf nodes (domain ``hub``), and its leafnode URL."""
    (port,) = free_ports(1)
    link = NatsCredentials.generate("leaf")
    server = EmbeddedNats(tmp_path / "hub-nats", leaf_listen=port, leaf_credentials=link)
    server.start()
    return server, link.in_url(f"nats-leaf://127.0.0.1:{port}")


# -- what forgetting leaves behind -----------------------------------------------------------


async def raw_payloads(log: EventLog) -> list[str]:
    """Every event left on the stream, as its repr (content, vectors and all)."""
    found = []
    async for batch in log.read(1):
        found.extend(repr(entry.event) for entry in batch)
    return found


def scan(roots: list[Path], needles: dict[str, bytes]) -> dict[str, set[str]]:
    """Which needles each file under ``roots`` holds (file -> needle names)."""
    hits: dict[str, set[str]] = {}
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # (a server's temporary file, gone meanwhile)
                continue
            found = {name for name, needle in needles.items() if needle in data}
            if found:
                hits[str(path)] = found
    return hits


async def sql_retried(db: PulseDB, query: str, **options: Any) -> list[list[Any]]:
    """The rows of ``query`` (``options``: ``as_of``, ``limit``), run again when the
    rewrite of the files after a delete cancelled it (QueryCancelled: forgetting never
    waits for readers, and says retry, as every caller of ``sql`` must)."""
    for _ in range(9):
        try:
            return (await db.sql(query, **options)).rows
        except QueryCancelled:
            continue
    return (await db.sql(query, **options)).rows


Message = tuple[int, bytes, bytes, bytes, bytes]  # (sid, subject, reply, data, headers)


def intercept(nc: Any, take: Callable[[Message], bool]) -> Callable[..., Awaitable[None]]:
    """Pass every message connection ``nc`` receives to ``take`` first: one it takes
    (returns True for) is not delivered. Returns nats-py's own delivery, with which a
    taken message can still be delivered later (late, or never: lost on the way)."""
    original: Callable[..., Awaitable[None]] = nc._process_msg

    async def process(*message: Any) -> None:
        if not take(message):
            await original(*message)

    nc._process_msg = process
    return original


def is_delivery(message: Message) -> bool:
    """A JetStream consumer's delivery (it carries an ack subject)."""
    return message[2].startswith(b"$JS.ACK.")
