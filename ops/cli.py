"""The `pulse` command line: thin commands over the library, each documented by its
docstring (shown by --help, with an example)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import os
import re
import signal
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Sequence
from uuid import UUID

from eventlog.errors import Forbidden, PulseError, Unauthorized, ValidationError
from ops.commands import GROUPS, REGISTRY, Command, execute, open_instance
from ops.progress import ProgressBar
from ops.remote import running_service, service_file

if TYPE_CHECKING:
    from eventlog.events import Event
    from eventlog.log import LogEntry

# Start-up: agent hosts run `pulse` once per action, so this module imports only what
# building the parser needs (argparse, the command registry, the docstrings). Asyncio,
# msgspec, NATS, DuckDB, FAISS, tantivy, the web stack and the instance are imported in
# the commands that use them (tests/test_cli_startup.py keeps it so; ops/bench/cli_start.py
# measures it).

DEFAULT_DATA_DIR = ".pulse"


SWITCH_INTERVAL = 0.0005  # seconds; see cmd_up


async def _wait_for_signal() -> None:
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def cmd_up(args: argparse.Namespace) -> int:
    """Start Pulse: the instance of the data directory, serving its HTTP API and MCP.

    Starts an embedded NATS server (unless --nats-url), creates or updates the streams,
    catches the projection up (with a progress line), and serves until Ctrl-C (or
    SIGTERM): the HTTP JSON API (every PulseDB method as POST /v1/<method>, OpenAPI at
    /docs), server-sent events at /v1/watch_experiences, the MCP server at /mcp
    (streamable HTTP), GET /health and GET /metrics. While it runs, the other `pulse`
    commands on this data directory go through it.

    It listens on loopback (127.0.0.1:8765) unless --host. Every request needs a
    credential (Authorization: Bearer), wherever it comes from: an access token (`pulse
    token create`), or the operator secret, which acts as the local operator. pulse up
    keeps that secret in <data dir>/operator-token (mode 0600, made on first start and
    reused); the CLI, `pulse mcp` and RemotePulseDB.from_data_dir read it there by
    themselves ($PULSE_TOKEN, when set, is sent instead), and other users of the machine
    cannot. --token (or $PULSE_TOKEN) chooses its value (written to that file); an access
    token there is refused. The banner's "access" line shows a curl that uses it. Only
    /health (up or down), /openapi.json and /docs answer without a credential
    (--private-docs: those two need one too); /metrics is for admins and the operator,
    or for anyone on --metrics-listen's address.

    A request whose Origin header is not this service's own (http://127.0.0.1:PORT,
    http://localhost:PORT, http://[::1]:PORT, the --host's) is refused (403), and so is
    a body that is not Content-Type application/json (415): web pages cannot act for
    you. A web app of yours may call it from an origin given with --allow-origin
    (repeatable; or $PULSE_ALLOW_ORIGINS, comma-separated), which also turns CORS on
    for exactly those origins.

    An unexpected error answers 500 with an id, and is one line on stderr under that
    id; $PULSE_LOG_LEVEL=DEBUG adds its traceback (default WARNING).

    The embedded NATS server refuses clients without the user and password of
    <data dir>/nats/credentials.json (generated on first start, mode 0600); the first
    lines printed say where it listens and where that file is. A TLS cluster of your own
    (see `pulse nats-config`) takes --nats-creds and --nats-ca.

    example:
      pulse up                       # embedded NATS, data in ./.pulse, API on 127.0.0.1:8765
      pulse --data-dir /srv/pulse up --port 9000
      curl -H "Authorization: Bearer $(cat .pulse/operator-token)" \\
        -H 'Content-Type: application/json' -d '{}' http://127.0.0.1:8765/v1/status
      pulse up --host 0.0.0.0 --allow-origin https://dashboard.example
      pulse up --metrics-listen 127.0.0.1:9101    # /metrics without a token, there only
      pulse --nats-url nats://10.0.0.5:4222,nats://10.0.0.6:4222 --replicas 3 up
      pulse --nats-url tls://h1:4222,tls://h2:4222,tls://h3:4222 --nats-creds \\
        nats-conf/client-credentials.json --nats-ca nats-conf/ca.pem --replicas 3 up
      pulse --nats-url nats://10.0.0.5:4222 up --follow team-api,owner:acme
      pulse --data-dir /srv/hub up --host 0.0.0.0 --leaf-listen 7422     # a hub
      pulse --data-dir /srv/edge up --leaf-of nats-leaf://leaf:PASSWORD@hub.example:7422

    --leaf-of URL makes an edge host: its embedded NATS is a leaf node of the hub (a
    `pulse up --leaf-listen PORT`, whose banner gives the URL and where the password
    is), with a stream of its own that takes writes while the link is down; both sides
    converge when it returns. `pulse status` shows the link and what is still to cross.

    --follow C1,C2 makes a host that reads only those collectives (ids, names, or
    owner:<owner id> for all of an owner's, now and later), plus all wisdom and access
    tokens: its memory and catch-up time grow with what it follows. The data directory
    remembers it; give more later to follow more (caught up without replaying the
    others), never fewer. A request about another collective is refused, naming what
    the host follows.

    Slow or many clients cannot stop the service: each limit is an environment variable
    (seconds or counts; defaults in brackets). A request's headers must arrive within
    $PULSE_HEADER_TIMEOUT [10] of the connection (or of its first byte), its body within
    $PULSE_BODY_TIMEOUT [60] after them, else 408 and the connection closes; an idle
    keep-alive connection closes after $PULSE_KEEP_ALIVE_TIMEOUT [5], one whose client
    reads nothing of its answer after $PULSE_SEND_TIMEOUT [60]. At most
    $PULSE_MAX_CONNECTIONS connections at once (by default the open-file limit, raised to
    its hard limit at start, less $PULSE_FD_RESERVE [128] kept for the instance's own
    files, at most 10000); past that a new connection is answered 503 (Retry-After) and
    closed, and the open ones go on. Server-sent event streams: $PULSE_MAX_WATCHERS [64] in all,
    $PULSE_MAX_WATCHERS_PER_TOKEN [16] per token; MCP sessions: $PULSE_MAX_MCP_SESSIONS
    [256] in all, $PULSE_MAX_MCP_SESSIONS_PER_TOKEN [32] per token, each ended after
    $PULSE_MCP_SESSION_IDLE [1800] idle; past a cap, 503 with Retry-After. Request
    bodies: at most $PULSE_MAX_BODY_BYTES [8388608], else 413.
    """
    import asyncio

    from sync import access

    if args.leaf_of and args.nats_url:
        raise ValidationError(
            "leaf_of: an edge host runs its own embedded NATS server; give --leaf-of or "
            "--nats-url, not both"
        )
    token = args.token or os.environ.get("PULSE_TOKEN") or None
    if token is not None and access.token_id_of(token) is not None:
        where = "--token" if args.token else "$PULSE_TOKEN"
        raise ValidationError(
            f"token: {where} holds an access token (pulse_...), and whoever sends the "
            "operator secret acts as the local operator; give pulse up a secret of its own "
            "with --token, or unset $PULSE_TOKEN to use the one in <data dir>/operator-token"
        )
    # The loop shares the interpreter with the engine thread and SQL queries: hand the
    # GIL over every 0.5 ms instead of 5 so /health and small requests never wait long
    # behind a busy thread.
    sys.setswitchinterval(SWITCH_INTERVAL)
    return asyncio.run(_serve(args, token))


async def _serve(args: argparse.Namespace, token: str | None) -> int:
    import asyncio

    import uvicorn

    from ops import serving as edge

    # (a bad setting is refused before the instance and the web stack are imported)
    limits = edge.Limits.from_environment(edge.raise_open_files_limit())

    from eventlog.jetstream import _without_password
    from eventlog.leaf import LeafLog
    from ops.connect import open_log
    from ops.mcp_server import build_mcp
    from ops.operator_secret import ensure_secret, secret_file
    from ops.remote import describe_api
    from ops.service import create_app, metrics_app, origin_of
    from sync import PulseDB

    _log_in_lines()
    origins = tuple(origin_of(o) for o in _allowed_origins(args))
    metrics_at = _listen_address(args.metrics_listen) if args.metrics_listen else None
    secret = ensure_secret(args.data_dir, token)
    async with open_log(args) as (log, server):
        bar = ProgressBar("catching up")
        db = await PulseDB.attach(
            args.data_dir, log, owns_log=False, progress=bar, collectives=args.follow
        )
        bar.finish()
        try:
            mcp = build_mcp(
                db, host=args.host, session_idle_timeout=limits.mcp_session_idle,
                max_sessions=limits.max_mcp_sessions, **_mcp_security(args.host, origins),
            )  # fmt: skip
            mcp_app = mcp.streamable_http_app()
            sessions = edge.McpSessions(edge.live_mcp_sessions(mcp.session_manager), limits)

            @contextlib.asynccontextmanager
            async def lifespan(_: object) -> AsyncIterator[None]:
                async with mcp.session_manager.run():
                    yield

            app = create_app(
                db, secret=secret, host=args.host, allow_origins=origins,
                private_docs=args.private_docs,
                mcp_routes=sessions.capped(list(mcp_app.routes)), lifespan=lifespan,
                max_watchers=limits.max_watchers,
                max_watchers_per_token=limits.max_watchers_per_token,
            )  # fmt: skip
            web = edge.EdgeServer(
                uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                               lifespan="on", timeout_graceful_shutdown=5),
                limits,
            )  # fmt: skip

            async def serve() -> None:
                try:
                    await web.serve()
                except SystemExit:  # what uvicorn does when it cannot bind
                    raise PulseError(
                        f"port: cannot listen on {args.host}:{args.port} (in use? try --port)"
                    ) from None

            serving = asyncio.create_task(serve())
            while not web.started:
                if serving.done():
                    serving.result()
                    raise PulseError(f"port: cannot listen on {args.host}:{args.port}")
                await asyncio.sleep(0.02)
            host, port = web.servers[0].sockets[0].getsockname()[:2]
            host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # how to reach it here
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            # the API description: what the CLI's requests need of PulseDB (ops.remote)
            info = {"url": url, "pid": os.getpid(), "api": describe_api()}
            # whole or not at all for a CLI reading it meanwhile: written aside, renamed
            written = service_file(args.data_dir).with_suffix(".json.tmp")
            written.write_text(json.dumps(info))
            os.replace(written, service_file(args.data_dir))
            scraped = None
            if metrics_at is not None:
                scraped = edge.EdgeServer(
                    uvicorn.Config(metrics_app(db, app.state.metrics), host=metrics_at[0],
                                   port=metrics_at[1], log_level="warning", lifespan="off"),
                    limits,
                )  # fmt: skip
                scraping = asyncio.create_task(scraped.serve())
                while not scraped.started:
                    if scraping.done():
                        raise PulseError(
                            f"metrics_listen: cannot listen on {args.metrics_listen} (in use?)"
                        )
                    await asyncio.sleep(0.02)
            last = await log.last_seq()
            if server is not None:
                where = (
                    f"embedded nats-server, pid {server.pid}, store {server.dir / 'store'}, "
                    + ("every write synced to disk" if server.sync_always else "periodic fsync")
                )
                if not server.owned:
                    where = f"already running, started by another pulse process (pid {server.pid})"
                nats_url, ca = server.plain_url, None
                # none when reusing the server of an older Pulse, still running
                creds = server.credentials_file if server.credentials else None
            else:
                where, nats_url = "external", args.nats_url
                creds, ca = args.nats_creds, args.nats_ca
            connect = f"PULSE_NATS_URL={nats_url}"
            connect += f" PULSE_NATS_CREDS={creds}" if creds else ""
            connect += f" PULSE_NATS_CA={ca}" if ca else ""
            print("Pulse is up.")
            print(f"  NATS     {nats_url}  ({where})")
            if creds:
                print(f"  creds    {creds}  (user and password NATS asks of every client; 0600)")
            print(f"  streams  {log.settings.name} ({last} events), {log.settings.activity_name}")
            print(f"  state    {Path(args.data_dir) / 'state'} (sequence {db.applied_seq})")
            if db.following is not None:
                print(f"  follows  {', '.join(db.following)} ({len(db.followed())} collectives)")
            if isinstance(log, LeafLog):
                hub_url = _without_password(log.server.leaf_of or "")
                print(
                    f"  leaf     edge host {log.domain}: a leaf node of {hub_url} (JetStream "
                    f"domain {log.hub_domain}); writes are kept here while the link is down"
                )
            elif server is not None and server.leaf_listen is not None:
                leaf_url = f"nats-leaf://leaf:***@{args.host}:{server.leaf_listen}"
                print(
                    f"  leafs    edge hosts connect with --leaf-of {leaf_url} (domain "
                    f"{server.domain}; password in {Path(args.data_dir) / 'nats'}"
                    "/leaf-credentials.json)"
                )
            print(f"  HTTP     {url}  (API /v1, OpenAPI {url}/docs, MCP {url}/mcp)")
            print(
                f"  access   a credential on every request; as the operator: curl -H "
                f'"Authorization: Bearer $(cat {secret_file(args.data_dir)})" {url}/health'
            )
            if origins:
                print(f"  origins  {', '.join(origins)} (CORS) besides this service's own")
            if scraped is not None:
                host, port = scraped.servers[0].sockets[0].getsockname()[:2]
                print(f"  metrics  http://{host}:{port}/metrics (no credential: scrapers only)")
            print(f"Point other hosts here with {connect} (a copy of the file). Ctrl-C stops."
                  if creds else f"Point other hosts here with {connect}. Ctrl-C stops.",
                  flush=True)  # fmt: skip
            stop = asyncio.ensure_future(_wait_for_signal())
            await asyncio.wait({stop, serving}, return_when=asyncio.FIRST_COMPLETED)
            web.should_exit = True
            if scraped is not None:
                scraped.should_exit = True
                await scraping
            await serving
            stop.cancel()
            print("Pulse stopped.", flush=True)
        finally:
            with contextlib.suppress(OSError):
                service_file(args.data_dir).unlink()
            await db.close()
    return 0


def _log_in_lines() -> None:
    """Pulse's own log (``pulse.*``) to stderr, one record a line: an unexpected error
    is one line with its id (ops.service.internal_error), whatever width the terminal
    has (the MCP SDK's handler on the root logger wraps lines to it). $PULSE_LOG_LEVEL
    (default WARNING; DEBUG adds each error's traceback)."""
    import logging

    level = os.environ.get("PULSE_LOG_LEVEL", "WARNING").strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValidationError(
            f"PULSE_LOG_LEVEL: must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {level!r:.40}"
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    pulse_log = logging.getLogger("pulse")
    pulse_log.handlers, pulse_log.propagate = [handler], False
    pulse_log.setLevel(level)


def _allowed_origins(args: argparse.Namespace) -> list[str]:
    """--allow-origin (repeatable), else $PULSE_ALLOW_ORIGINS (comma-separated)."""
    given: list[str] = args.allow_origin or []
    if not given:
        given = [o for o in os.environ.get("PULSE_ALLOW_ORIGINS", "").split(",") if o.strip()]
    return given


def _listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) of --metrics-listen."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValidationError(
            f"metrics_listen: must be HOST:PORT, e.g. 127.0.0.1:9101, got {text!r:.100}"
        )
    return host.strip("[]"), int(port)


def _mcp_security(host: str, origins: tuple[str, ...]) -> dict[str, Any]:
    """The MCP SDK checks Origin itself on a loopback host: let it take the configured
    origins too (ops.service.Guard has refused every other one already)."""
    from ops.service import LOOPBACK

    if not origins or host not in LOOPBACK:
        return {}
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [f"[{name}]:*" if ":" in name else f"{name}:*" for name in LOOPBACK]
    return {
        "transport_security": TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[*(f"http://{h}" for h in hosts), *origins],
        )  # fmt: skip
    }


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve Pulse's MCP tools over stdio, for an agent host that starts it.

    Tools: remember, recall, reinforce, relate, insights, activity, session. When
    `pulse up` serves this data directory, the tools go through it; otherwise this
    process opens the data directory itself (and its embedded NATS). Configure an agent
    host with the command `pulse --data-dir /path/to/data mcp`.

    example:
      pulse mcp
      pulse --data-dir ~/.pulse mcp
    """
    import asyncio

    from ops.mcp_server import build_mcp

    _log_in_lines()

    async def run() -> int:
        db = await open_instance(args)
        try:
            await build_mcp(db).run_stdio_async()
        finally:
            await db.close()
        return 0

    return asyncio.run(run())


def _jsonable(event: Event) -> dict[str, object]:
    """The event as JSON-ready builtins, embeddings as lists of floats (not base64); a
    sealed event's box (its key destroyed) as its size only."""
    import msgspec

    from eventlog.events import Sealed, unpack_vector

    record: dict[str, object] = msgspec.to_builtins(event, builtin_types=(bytes,))
    for key, value in record.items():
        if isinstance(value, bytes):
            if isinstance(event, Sealed):
                record[key] = f"<{len(value)} bytes sealed with a destroyed key>"
            else:
                record[key] = [round(float(x), 6) for x in unpack_vector(value)]
    return record


def _summary(entry: LogEntry) -> str:
    from eventlog.events import event_type_name

    if entry.event is None:
        return f"{entry.seq:>8}  UNREADABLE  {entry.subject}  {entry.error}"
    event = entry.event
    details = []
    for name in (
        "name", "content", "pattern", "agent_id", "relation_type", "applications", "kind",
    ):  # fmt: skip
        value = getattr(event, name, None)
        if value is not None:
            text = str(value).replace("\n", " ")
            details.append(f"{name}={text[:60]!r}" if isinstance(value, str) else f"{name}={value}")
    return f"{entry.seq:>8}  {event_type_name(event):<22}  {entry.subject}  {' '.join(details)}"


def cmd_tail(args: argparse.Namespace) -> int:
    """Print events as they arrive on the log (from the start, or --from-seq / --new).

    One line per event: stream sequence, event type, subject and a few fields; with
    --json, one JSON object per line. Runs until Ctrl-C or --limit events. What the log
    holds sealed (an entity's text and vector) is shown opened with its data key; an
    event whose key a delete destroyed shows as `sealed`, with its kind only.

    example:
      pulse tail                         # everything so far, then live
      pulse tail --new --json            # only what arrives from now on, as JSON lines
      pulse tail --collective 0193f1c2-7a4e-7c3b-9d2e-5f6a7b8c9d0e --limit 10
    """
    import asyncio

    import msgspec

    from eventlog.events import Sealed
    from eventlog.keys import Keyring
    from eventlog.sealing import Sealer
    from eventlog.subjects import collective_filter
    from ops.connect import open_log

    async def run() -> int:
        async with open_log(args) as (log, _server):
            start = (await log.last_seq()) + 1 if args.new else args.from_seq
            subjects = collective_filter(args.collective) if args.collective else None
            count = 0
            sealer = Sealer(Keyring(log.key_store()))
            stream = log.tail(start, subjects=subjects)
            waiter = asyncio.ensure_future(_wait_for_signal())
            try:
                while args.limit is None or count < args.limit:
                    nxt = asyncio.ensure_future(anext(stream))
                    done, _ = await asyncio.wait({nxt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if waiter in done:
                        nxt.cancel()
                        break
                    entry = nxt.result()
                    if isinstance(entry.event, Sealed):  # opened; still sealed: forgotten
                        (entry,) = await sealer.open([entry])
                    if args.json:
                        record = {"seq": entry.seq, "subject": entry.subject}
                        if entry.event is not None:
                            record["event"] = _jsonable(entry.event)
                        else:
                            record["error"] = str(entry.error)
                        print(msgspec.json.encode(record).decode(), flush=True)
                    else:
                        print(_summary(entry), flush=True)
                    count += 1
            finally:
                waiter.cancel()
                await stream.aclose()
        return 0

    return asyncio.run(run())


def cmd_catch_up(args: argparse.Namespace) -> int:
    """Apply new events from the log to the data directory's projection.

    Folds everything past the projection's checkpoint into memory, FAISS and the
    full-text index, writes DuckDB in bulk, with a progress line. Safe to
    interrupt at any moment (even kill -9): the next run resumes from the checkpoint.

    example:
      pulse catch-up
      pulse --data-dir /srv/pulse catch-up --json
    """
    import asyncio

    from ops.connect import open_log
    from projections.engine import Engine
    from projections.projection import ProjectionSettings, state_dir
    from projections.scope import Scope

    async def run() -> int:
        async with open_log(args) as (log, _server):
            # no analysts' snapshot (a whole copy at the end): `pulse up` refreshes it
            settings = ProjectionSettings(
                checkpoint_events=args.checkpoint_every, snapshot_interval=None
            )
            state = state_dir(args.data_dir)
            scope = Scope.load(state)  # a host that follows some collectives: those
            engine = await Engine.start(state, settings)
            try:
                bar = ProgressBar("applying")
                applied = await engine.catch_up(
                    log, progress=bar, subjects=None if scope is None else scope.filters()
                )
                bar.finish()
                seq, total = await engine.checkpoint()
                digest = await engine.digest()
            finally:
                await engine.close()
        _report(
            args,
            {"applied": applied, "seq": seq, "applied_total": total, "digest": digest},
            f"applied {applied:,} events; state at sequence {seq:,}; digest {digest}",
        )
        return 0

    return asyncio.run(run())


def cmd_rebuild(args: argparse.Namespace) -> int:
    """Replay the whole log into a fresh projection, then swap it in atomically.

    The current state stays intact until the new one is complete; then the data
    directory's `state` link is switched in one rename and the old state removed.
    Use it after a schema change, to compact indexes, or to prove the log is enough.

    It refuses (exit 1, the state untouched) while `pulse up` serves the data directory
    or another process has its state open: stop that first (Ctrl-C on pulse up), then
    run pulse rebuild.

    example:
      pulse rebuild
      pulse --data-dir /srv/pulse rebuild --json
    """
    import asyncio

    from ops.connect import open_log
    from projections.projection import ProjectionSettings
    from projections.rebuild import rebuild
    from projections.store import StateInUse

    async def run() -> int:
        async with open_log(args) as (log, _server):
            bar = ProgressBar("rebuilding")
            settings = ProjectionSettings(checkpoint_events=args.checkpoint_every)
            directory, digest = await rebuild(args.data_dir, log, settings=settings, progress=bar)
            bar.finish()
        _report(
            args,
            {"state": str(directory), "digest": digest},
            f"rebuilt {directory}; digest {digest}",
        )
        return 0

    service = running_service(args.data_dir)
    if service is not None:
        raise StateInUse(
            f"rebuild: `pulse up` serves this data directory (pid {service.get('pid')}, "
            f"{service.get('url')}) and holds its state; stop it first (Ctrl-C on pulse up), "
            "then run pulse rebuild"
        )
    with _holding_state(Path(args.data_dir)):
        return asyncio.run(run())


@contextlib.contextmanager
def _holding_state(data_dir: Path) -> Iterator[None]:
    """Hold the current state's DuckDB file the way its owner does (one writer per file):
    refuse while another process has it open, and keep any from opening it (a service
    starting meanwhile fails) until the rebuild has swapped it out."""
    import duckdb

    from projections.projection import state_link
    from projections.store import StateInUse

    link = state_link(data_dir)
    database = link.resolve() / "state.duckdb" if link.exists() else None
    con = None
    if database is not None and database.exists():
        try:
            con = duckdb.connect(str(database))
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                holder = re.search(r"\(PID (\d+)\)", str(exc))
                raise StateInUse(
                    f"rebuild: the state {database} is open in another process"
                    + (f" (pid {holder.group(1)})" if holder else "")
                    + "; stop it first (Ctrl-C on pulse up), then run pulse rebuild"
                ) from None
            # unreadable rather than busy: the rebuild replaces it
    try:
        yield
    finally:
        if con is not None:
            with contextlib.suppress(duckdb.Error):
                con.close()


def cmd_digest(args: argparse.Namespace) -> int:
    """Print a hash of the projection's logical state.

    SHA-256 over every table's rows, sorted, without local-only columns: two hosts
    that applied the same events print the same digest, whatever the order, and so
    does a state before and after `pulse rebuild`. Reads the local state only.

    example:
      pulse digest
      pulse --data-dir /srv/pulse digest --json
    """
    import asyncio

    from projections.engine import Engine
    from projections.projection import ProjectionSettings, state_dir

    async def read() -> tuple[int, int, str]:
        settings = ProjectionSettings(snapshot_interval=None)  # (it reads; nothing to copy)
        engine = await Engine.start(state_dir(args.data_dir), settings)
        try:
            seq, applied = await engine.checkpoint()
            return seq, applied, await engine.digest()
        finally:
            await engine.close()

    seq, applied, digest = asyncio.run(read())
    _report(
        args, {"digest": digest, "seq": seq, "applied": applied}, f"{digest}  (sequence {seq:,})"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Show three hosts agreeing: one embedded NATS, three instances, concurrent writes.

    Starts its own embedded NATS server and three instances with separate data
    directories (a temporary directory unless --dir), records experiences from every
    host, has all three reinforce them at once, then prints each host's digest and
    counts side by side. Exits non-zero if they disagree.

    example:
      pulse demo
      pulse demo --experiences 10 --reinforcements 50 --dir /tmp/pulse-demo
    """
    import asyncio

    from ops.demo import run_demo

    agree = asyncio.run(run_demo(args.dir, args.experiences, args.reinforcements))
    return 0 if agree else 1


def _report(args: argparse.Namespace, record: dict[str, object], text: str) -> None:
    if getattr(args, "json", False):
        print(json.dumps(record), flush=True)
    else:
        print(text, flush=True)


# The commands of this module, and those of modules too heavy to import for the parser,
# named "module:function": their docstrings are read from the source (_docstring) and the
# module is imported when the command (or its --help) needs it.
COMMANDS: dict[str, Callable[[argparse.Namespace], int] | str] = {
    "up": cmd_up,
    "mcp": cmd_mcp,
    "tail": cmd_tail,
    "catch-up": cmd_catch_up,
    "rebuild": cmd_rebuild,
    "digest": cmd_digest,
    "demo": cmd_demo,
    "nats-config": "ops.natsconf:cmd_nats_config",
    "backup": "ops.backup:cmd_backup",
    "restore": "ops.backup:cmd_restore",
}


def _doc(func: Callable[..., object] | str) -> tuple[str, str]:
    doc = textwrap.dedent((func.__doc__ if callable(func) else _docstring(func)) or "").strip()
    summary, _, rest = doc.partition("\n")
    return summary, textwrap.dedent(rest).strip()


def _docstring(name: str) -> str | None:
    """The docstring of "module:function", from the module's source, without importing it."""
    module, _, function = name.partition(":")
    for node in _module_ast(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_docstring(node, clean=False)
    raise LookupError(f"no function {function} in {module}")


_ASTS: dict[str, ast.Module] = {}


def _module_ast(module: str) -> ast.Module:
    if module not in _ASTS:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        _ASTS[module] = ast.parse(Path(spec.origin).read_text(), spec.origin)
    return _ASTS[module]


def _resolve(name: str) -> Any:
    """The object "module:attribute" names (importing the module)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _call(name: str) -> Callable[[argparse.Namespace], int]:
    return lambda args: int(_resolve(name)(args))


class _CommandParser(argparse.ArgumentParser):
    """A command's parser whose arguments are added when it is first used (to parse its
    arguments or print its --help): `pulse record ...` sets up the options of `record`
    only, and none of them costs `pulse --help` anything."""

    def __init__(
        self, *args: Any, setup: Callable[[argparse.ArgumentParser], object] | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self._setup = setup

    def _set_up(self) -> None:
        setup, self._setup = self._setup, None
        if setup is not None:
            setup(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._set_up()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self._set_up()
        return super().format_help()

    def format_usage(self) -> str:
        self._set_up()
        return super().format_usage()


class _PulseParser(argparse.ArgumentParser):
    """The top parser: the summaries of the commands named "module:function" are read
    from their modules' source when its help is shown, not for every command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unread: list[tuple[argparse.Action, str]] = []  # (a command's help line, name)

    def format_help(self) -> str:
        for line, name in self.unread:
            line.help = _doc(name)[0]
        self.unread = []
        return super().format_help()


def _described(
    name: str, setup: Callable[[argparse.ArgumentParser], object] | None
) -> Callable[[argparse.ArgumentParser], None]:
    """The setup of command "module:function", with its description read first."""

    def set_up(sub: argparse.ArgumentParser) -> None:
        summary, body = _doc(name)
        sub.description = f"{summary}\n\n{body}"
        if setup is not None:
            setup(sub)

    return set_up


def build_parser() -> argparse.ArgumentParser:
    parser = _PulseParser(
        prog="pulse",
        description="Pulse: a shared memory for collectives of AI agents, on a NATS JetStream log.",
        epilog="example:\n  pulse up\n  pulse tail --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("PULSE_DATA_DIR", DEFAULT_DATA_DIR),
        help="data directory (default: $PULSE_DATA_DIR or ./.pulse)",
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("PULSE_NATS_URL"),
        help="NATS server URL(s), comma-separated; default: $PULSE_NATS_URL, else an "
        "embedded server in the data directory",
    )
    parser.add_argument(
        "--nats-creds",
        default=os.environ.get("PULSE_NATS_CREDS") or None,
        metavar="FILE",
        help='with --nats-url: credentials file, JSON {"user", "password"} (as `pulse '
        "nats-config` writes it); default: $PULSE_NATS_CREDS",
    )
    parser.add_argument(
        "--nats-ca",
        default=os.environ.get("PULSE_NATS_CA") or None,
        metavar="FILE",
        help="with --nats-url: CA certificate (PEM) of servers that require TLS; "
        "default: $PULSE_NATS_CA",
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="stream replicas: 1, or 3 on a cluster (default 1)"
    )
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser
    )
    for name, func in COMMANDS.items():
        if callable(func):
            summary, body = _doc(func)
            sub = commands.add_parser(
                name,
                help=summary,
                description=f"{summary}\n\n{body}",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                setup=_SETUPS[name],
            )
            sub.set_defaults(func=func)
        else:
            sub = commands.add_parser(
                name,
                help="",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                setup=_described(func, _SETUPS[name]),
            )
            parser.unread.append((commands._choices_actions[-1], func))
            sub.set_defaults(func=_call(func))
    groups: dict[str, Any] = {}
    for cmd in REGISTRY:
        summary, body = _doc(cmd.run)
        parent = commands
        if len(cmd.path) == 2:
            group = cmd.path[0]
            if group not in groups:
                top = commands.add_parser(group, help=GROUPS[group], description=GROUPS[group])
                groups[group] = top.add_subparsers(dest="action", metavar="ACTION", required=True)
            parent = groups[group]
        sub = parent.add_parser(
            cmd.path[-1],
            help=summary,
            description=f"{summary}\n\n{body}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            setup=_registry_setup(cmd),
        )
        sub.set_defaults(func=_runner(cmd))
    return parser


def _registry_setup(cmd: Command) -> Callable[[argparse.ArgumentParser], None]:
    def setup(sub: argparse.ArgumentParser) -> None:
        cmd.setup(sub)
        if cmd.writes:
            sub.add_argument(
                "--idempotency-key", metavar="KEY",
                help="repeating the command with the same key (after a timeout, say) "
                "stores it once and prints the first answer; the same key with other "
                "arguments is refused",
            )  # fmt: skip
        if cmd.reads:
            sub.add_argument(
                "--as-of", metavar="MOMENT",
                help="answer from the memory as it was then: a stream sequence (an integer) "
                "or a time (ISO 8601, e.g. 2026-11-30T09:00:00Z)",
            )  # fmt: skip
        sub.add_argument("--json", action="store_true", help="print one JSON document")

    return setup


def _setup_up(sub: argparse.ArgumentParser) -> None:
    edge = sub.add_mutually_exclusive_group()
    edge.add_argument(
        "--leaf-of",
        metavar="URL",
        help="run as an edge host: the embedded NATS becomes a leaf node of the hub "
        "at this leafnode URL, with its leaf credentials (e.g. "
        "nats-leaf://leaf:PASSWORD@hub.example:7422); writes are kept while the link "
        "is down and converge when it returns. The data directory remembers it",
    )
    edge.add_argument(
        "--leaf-listen",
        type=int,
        metavar="PORT",
        help="run as a hub: accept edge hosts' leaf nodes on this port (e.g. 7422; "
        "their password is generated in <data dir>/nats/leaf-credentials.json)",
    )
    sub.add_argument(
        "--hub-domain",
        default="hub",
        help="with --leaf-of: the hub's JetStream domain (default hub, what --leaf-listen gives)",
    )
    sub.add_argument(
        "--leaf-ca",
        metavar="PEM",
        help="with --leaf-of: the CA of the hub's leafnode TLS (tls:// URLs)",
    )
    sub.add_argument(
        "--no-sync",
        action="store_true",
        help="let the embedded server fsync periodically instead of before every ack",
    )
    sub.add_argument("--host", default="127.0.0.1", help="listen here (127.0.0.1)")
    sub.add_argument(
        "--follow",
        metavar="C1,C2",
        help="follow only these collectives (ids, names of any owner, owner/name, "
        "owner:<owner id>); "
        "default: what the data directory followed before, every collective at first",
    )
    sub.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765; 0: any free)")
    sub.add_argument(
        "--token",
        help="the operator secret's value ($PULSE_TOKEN; default: the one in <data "
        "dir>/operator-token, made on first start): requests that carry it act as the "
        "local operator; it is written to that file",
    )
    sub.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="a web app's origin that may call the API (e.g. https://app.example; "
        "repeatable; default: $PULSE_ALLOW_ORIGINS, comma-separated), with CORS; any "
        "other Origin but the service's own is refused (403)",
    )
    sub.add_argument(
        "--private-docs",
        action="store_true",
        help="/openapi.json and /docs need a credential too (default: they answer anyone)",
    )
    sub.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve GET /metrics there, without a credential, for scrapers (on the "
        "API's address it is for admins and the operator only)",
    )


def _setup_demo(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--dir", type=Path, help="keep the demo's data here")
    sub.add_argument("--experiences", type=_positive, default=5, help="default 5")
    sub.add_argument("--reinforcements", type=_positive, default=20, help="per host (default 20)")


def _setup_state(sub: argparse.ArgumentParser, *, checkpoints: bool = True) -> None:
    """catch-up, rebuild (checkpoints) and digest."""
    sub.add_argument("--json", action="store_true", help="print one JSON object")
    if checkpoints:
        from projections.projection import ProjectionSettings  # (its default, one place)

        sub.add_argument(
            "--checkpoint-every",
            type=_positive,
            default=ProjectionSettings().checkpoint_events,
            metavar="N",
            help="write the state's checkpoint every N events (default %(default)s); "
            "killed, it resumes from the last one",
        )


def _setup_tail(sub: argparse.ArgumentParser) -> None:
    where = sub.add_mutually_exclusive_group()
    where.add_argument("--from-seq", type=_positive, default=1, help="first stream sequence")
    where.add_argument("--new", action="store_true", help="only events stored from now on")
    sub.add_argument(
        "--collective",
        type=UUID,
        action="append",
        help="only this collective (repeatable); wisdom events are always shown",
    )
    sub.add_argument("--limit", type=_positive, help="stop after this many events")
    sub.add_argument("--json", action="store_true", help="one JSON object per line")


def _setup_by_name(name: str) -> Callable[[argparse.ArgumentParser], object]:
    return lambda sub: _resolve(name)(sub)


_SETUPS: dict[str, Callable[[argparse.ArgumentParser], object] | None] = {
    "up": _setup_up,
    "mcp": None,
    "tail": _setup_tail,
    "catch-up": _setup_state,
    "rebuild": _setup_state,
    "digest": lambda sub: _setup_state(sub, checkpoints=False),
    "demo": _setup_demo,
    "nats-config": _setup_by_name("ops.natsconf:setup_nats_config"),
    "backup": _setup_by_name("ops.backup:setup_backup"),
    "restore": _setup_by_name("ops.backup:setup_restore"),
}


def _runner(cmd: Command) -> Callable[[argparse.Namespace], int]:
    return lambda args: execute(cmd, args)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (Unauthorized, Forbidden) as exc:
        # who may do what: always one line (a service's answer included)
        print(f"pulse: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except PulseError as exc:
        print(f"pulse: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
