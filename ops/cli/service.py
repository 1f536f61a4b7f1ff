"""`pulse up` and `pulse mcp`: serve the data directory's instance, over HTTP and MCP
(streamable HTTP) or over MCP on stdio for an agent host that starts it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from eventlog.errors import PulseError, ValidationError
from ops.cli.declare import Command, arg
from ops.cli.running import open_instance, out_of_the_collectors_sight, wait_for_signal
from ops.progress import ProgressBar
from ops.remote import service_file

SWITCH_INTERVAL = 0.0005  # seconds; see up


def up(args: argparse.Namespace) -> int:
    """Start Pulse: the instance of the data directory, serving its HTTP API and MCP.

    Starts an embedded NATS server (unless --nats-url), creates or updates the streams,
    catches the projection up (with a progress line), and serves until Ctrl-C (or
    SIGTERM): the HTTP JSON API (every declared operation as POST /v1/<name>, OpenAPI at
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
    bodies: at most $PULSE_MAX_BODY_BYTES [8388608], else 413; request line and
    headers at most 64 KiB, else 400. HTTP is parsed by httptools, or by h11 where
    httptools is missing or $PULSE_HTTP is h11 (the same limits either way).
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

    from eventlog.jetstream import JetStreamLog, _without_password
    from eventlog.leaf import LeafLog
    from eventlog.partitioned import LocalLog
    from ops.connect import open_log
    from ops.operator_secret import ensure_secret, secret_file
    from ops.remote import describe_api
    from ops.service import create_app, metrics_app, origin_of
    from sync import PulseDB

    out_of_the_collectors_sight()
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
            # (made at the first request to /mcp: edge.LazyMcp)
            def mcp_server(module: Any) -> Any:  # (module: ops.mcp_server)
                return module.build_mcp(
                    db, host=args.host, session_idle_timeout=limits.mcp_session_idle,
                    max_sessions=limits.max_mcp_sessions, **_mcp_security(args.host, origins),
                )  # fmt: skip

            mcp = edge.LazyMcp("ops.mcp_server", mcp_server, limits)
            app = create_app(
                db, secret=secret, host=args.host, allow_origins=origins,
                private_docs=args.private_docs,
                mcp_routes=mcp.routes(), lifespan=mcp.lifespan,
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
            if isinstance(log, LocalLog):
                layout = log.partitioned.layout
                names = f"{layout.stream(1)}..{layout.stream(layout.partitions)}"
                print(f"  streams  {layout.base} and {names} ({last} events, in "
                      f"{layout.partitions} partitions), {log.settings.activity_name}")  # fmt: skip
            elif isinstance(log, JetStreamLog):
                print(f"  streams  {log.settings.name} ({last} events), "
                      f"{log.settings.activity_name}")  # fmt: skip
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
            print(f"  console  {url}/ui  (in a browser: sign in with an access token or the "
                  "operator secret below)")  # fmt: skip
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
            stop = asyncio.ensure_future(wait_for_signal())
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


def mcp(args: argparse.Namespace) -> int:
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


COMMANDS = (
    Command(
        "up", None, run=up,
        arguments=(
            arg("--leaf-of", metavar="URL", exclusive="edge",
                help="run as an edge host: the embedded NATS becomes a leaf node of the hub "
                "at this leafnode URL, with its leaf credentials (e.g. "
                "nats-leaf://leaf:PASSWORD@hub.example:7422); writes are kept while the "
                "link is down and converge when it returns. The data directory remembers it"),
            arg("--leaf-listen", type=int, metavar="PORT", exclusive="edge",
                help="run as a hub: accept edge hosts' leaf nodes on this port (e.g. 7422; "
                "their password is generated in <data dir>/nats/leaf-credentials.json)"),
            arg("--hub-domain", default="hub",
                help="with --leaf-of: the hub's JetStream domain (default hub, what "
                "--leaf-listen gives)"),
            arg("--leaf-ca", metavar="PEM",
                help="with --leaf-of: the CA of the hub's leafnode TLS (tls:// URLs)"),
            arg("--no-sync", action="store_true",
                help="let the embedded server fsync periodically instead of before every ack"),
            arg("--host", default="127.0.0.1", help="listen here (127.0.0.1)"),
            arg("--follow", metavar="C1,C2",
                help="follow only these collectives (ids, names of any owner, owner/name, "
                "owner:<owner id>); default: what the data directory followed before, "
                "every collective at first"),
            arg("--port", type=int, default=8765, help="HTTP port (default 8765; 0: any free)"),
            arg("--token",
                help="the operator secret's value ($PULSE_TOKEN; default: the one in <data "
                "dir>/operator-token, made on first start): requests that carry it act as "
                "the local operator; it is written to that file"),
            arg("--allow-origin", action="append", metavar="ORIGIN",
                help="a web app's origin that may call the API (e.g. https://app.example; "
                "repeatable; default: $PULSE_ALLOW_ORIGINS, comma-separated), with CORS; "
                "any other Origin but the service's own is refused (403)"),
            arg("--private-docs", action="store_true",
                help="/openapi.json and /docs need a credential too (default: they answer "
                "anyone)"),
            arg("--metrics-listen", metavar="HOST:PORT",
                help="also serve GET /metrics there, without a credential, for scrapers (on "
                "the API's address it is for admins and the operator only)"),
        ),
    ),
    Command("mcp", None, run=mcp),
)  # fmt: skip
