"""The HTTP edge of ``pulse up``: how long a client may take and how many it may hold.

uvicorn bounds an idle keep-alive connection, but nothing else a client controls: a
connection that sends one header line every few seconds, or a body one byte at a time,
or never reads its response, is held forever, and once such connections use up the
process's file descriptors the accept loop fails inside its own error logging and the
service exits. So the edge here is uvicorn's httptools protocol (its h11 one where
httptools is missing, or $PULSE_HTTP=h11) with deadlines and an accept loop of its own:

- headers: from a connection's start (or the first byte of its next request) to the end
  of the request's headers, at most ``header_timeout``; then 408 (or, if nothing came at
  all, the connection is just closed);
- body: from the end of the headers to the end of the body, at most ``body_timeout``;
  then 408, and the app sees the client gone;
- idle: between requests on a keep-alive connection, ``keep_alive_timeout``;
- send: a client that reads nothing of its response for ``send_timeout`` is dropped;
- connections: at most ``max_connections`` at once. The accept loop (``Listener``)
  answers a connection past the cap 503 with Retry-After and closes it at once, so
  descriptors never run out because of clients; the cap derives from the open-file
  limit (raised to its hard limit at start) less ``fd_reserve`` for what the instance
  itself opens (NATS, DuckDB, tantivy, FAISS files). Should descriptors run out anyway,
  accepting pauses for a moment (one log line) and every open request goes on.

Streams are capped as well, in total and per token (``Slots``): server-sent events at
/v1/watch_experiences (``ops.http.watch``) and MCP sessions at /mcp (``McpSessionCap``),
each refused with 503 and Retry-After past its cap, the slot given back when the stream
or session ends.

Every limit is an environment variable of ``pulse up`` (``Limits.from_environment``),
listed in ``pulse up --help``.

A ``POST /v1/<name>`` the app's ``api.Front`` takes is handed to it by the httptools
edge itself, past uvicorn's proxy-headers wrapper and the app, and its 200 written by
the edge in one write (``EdgeProtocol._answered``: the bytes uvicorn would write);
every other answer, and every other request, is uvicorn's and the app's as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import importlib
import json
import logging
import math
import os
import resource
import socket
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    HTTPTOOLS = True
except ImportError:  # (httptools is a dependency; h11 serves where it is missing)
    HttpToolsProtocol = H11Protocol  # type: ignore[assignment,misc]  # (never made then)
    HTTPTOOLS = False

from eventlog.errors import ValidationError

if TYPE_CHECKING:
    from sync.access import Principal

log = logging.getLogger("pulse.serving")

RETRY_AFTER = 5  # seconds: the Retry-After of every 503 for a cap
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_BATCH = 64  # connections accepted per wake-up of the listening socket
ACCEPT_PAUSE = 0.1  # seconds without accepting after the process ran out of descriptors
MAX_CONNECTIONS_DEFAULT = 10_000  # the derived cap's ceiling (memory, not descriptors)


@dataclass(frozen=True)
class Limits:
    """What a client may take and hold; each is an environment variable of ``pulse up``."""

    header_timeout: float = 10.0  # $PULSE_HEADER_TIMEOUT
    body_timeout: float = 60.0  # $PULSE_BODY_TIMEOUT
    keep_alive_timeout: float = 5.0  # $PULSE_KEEP_ALIVE_TIMEOUT
    send_timeout: float = 60.0  # $PULSE_SEND_TIMEOUT
    max_connections: int = 1024  # $PULSE_MAX_CONNECTIONS (pulse up: open files less reserve)
    fd_reserve: int = 128  # $PULSE_FD_RESERVE
    max_watchers: int = 64  # $PULSE_MAX_WATCHERS
    max_watchers_per_token: int = 16  # $PULSE_MAX_WATCHERS_PER_TOKEN
    max_mcp_sessions: int = 256  # $PULSE_MAX_MCP_SESSIONS
    max_mcp_sessions_per_token: int = 32  # $PULSE_MAX_MCP_SESSIONS_PER_TOKEN
    mcp_session_idle: float = 1800.0  # $PULSE_MCP_SESSION_IDLE

    @classmethod
    def from_environment(cls, open_files: int) -> Limits:
        """The limits of the environment (``SETTINGS``), the connection cap derived from
        ``open_files`` (the process's open-file limit) unless given; ValidationError
        naming a bad one."""
        given: dict[str, Any] = {}
        for name, variable in SETTINGS.items():
            default = getattr(cls, name)
            if name == "max_connections":
                reserve = given["fd_reserve"]
                default = min(MAX_CONNECTIONS_DEFAULT, max(8, open_files - reserve))
            read = _seconds if isinstance(default, float) else count_setting
            given[name] = read(variable, default)
        limits = cls(**given)
        if limits.max_connections + limits.fd_reserve > open_files:
            log.warning(
                "PULSE_MAX_CONNECTIONS=%d and PULSE_FD_RESERVE=%d exceed the open-file limit "
                "of %d: connections may have to wait for descriptors",
                limits.max_connections, limits.fd_reserve, open_files,
            )  # fmt: skip
        return limits


SETTINGS = {  # each limit's environment variable (fd_reserve before max_connections)
    "header_timeout": "PULSE_HEADER_TIMEOUT",
    "body_timeout": "PULSE_BODY_TIMEOUT",
    "keep_alive_timeout": "PULSE_KEEP_ALIVE_TIMEOUT",
    "send_timeout": "PULSE_SEND_TIMEOUT",
    "fd_reserve": "PULSE_FD_RESERVE",
    "max_connections": "PULSE_MAX_CONNECTIONS",
    "max_watchers": "PULSE_MAX_WATCHERS",
    "max_watchers_per_token": "PULSE_MAX_WATCHERS_PER_TOKEN",
    "max_mcp_sessions": "PULSE_MAX_MCP_SESSIONS",
    "max_mcp_sessions_per_token": "PULSE_MAX_MCP_SESSIONS_PER_TOKEN",
    "mcp_session_idle": "PULSE_MCP_SESSION_IDLE",
}


def count_setting(name: str, default: int) -> int:
    """A positive integer from the environment variable ``name``, or ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValidationError(f"{name}: must be a positive integer, got {text!r}")
    return value


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 86_400):
        raise ValidationError(f"{name}: must be a number of seconds in (0, 86400], got {text!r}")
    return value


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard one; the limit now in force. Every
    connection is a descriptor, and a soft limit of 256 or 1024 is a default, not a plan."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft if soft != resource.RLIM_INFINITY else wanted
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):  # (an unlimited hard limit above the kernel's nr_open)
        return soft
    return wanted


# -- refusals written by the edge itself (before or instead of the app) ----------------------


def _answer(status: int, reason: str, error: str, message: str, *extra: str) -> bytes:
    body = json.dumps({"error": error, "message": message}).encode()
    head = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _too_many_connections(limits: Limits) -> bytes:
    return _answer(
        503, "Service Unavailable", "TooManyConnections",
        f"connections: {limits.max_connections} are open, the limit of this service "
        f"($PULSE_MAX_CONNECTIONS); retry in {RETRY_AFTER} s",
        f"retry-after: {RETRY_AFTER}",
    )  # fmt: skip


def _timed_out(part: str, seconds: float, setting: str) -> bytes:
    return _answer(
        408, "Request Timeout", "RequestTimeout",
        f"{part}: not received within {seconds:g} s, the limit of this service (${setting})",
    )  # fmt: skip


# -- the protocol: uvicorn's httptools one (or h11's) with deadlines -----------------------------

HEADERS_MAX = 64 * 1024  # bytes of a request's target and headers (httptools has no bound)


class HeadersTooLarge(Exception):
    """Raised from the parser's callbacks past ``HEADERS_MAX``: the request is answered 400
    (as uvicorn answers any request it cannot parse) and its connection closed."""


def _nothing() -> None:
    pass


class Cork:
    """A connection's transport as its answers write to it: a write is held back until
    the next one or the end of this turn of the event loop, whichever comes first, so
    an answer's head and a small body go out in one write (one segment to the client,
    one system call) instead of two. A stream's parts still go out as they come."""

    JOIN_MAX = 64 * 1024  # bytes: a larger write is not copied to join it to the held one

    __slots__ = ("transport", "loop", "held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport, self.loop = transport, loop
        self.held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self.held
        if held is None:
            self.held = data
            self.loop.call_soon(self.flush)
            return
        self.held = None
        if len(data) <= self.JOIN_MAX:
            self.transport.write(held + data)
        else:
            self.transport.write(held)
            self.transport.write(data)

    def flush(self) -> None:
        held = self.held
        if held is not None:
            self.held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.flush()
        self.transport.close()


class _SendDeadline:
    """The send deadline of both edge protocols: a client that reads nothing of its
    answer for ``send_timeout`` (the transport's buffer full all along) is cut off."""

    limits: Limits
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _send_timer: asyncio.TimerHandle | None

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout, self._send_late)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()  # type: ignore[misc]

    def _send_late(self) -> None:
        self._send_timer = None
        self.transport.abort()  # (its buffer is what the client did not read)


class EdgeProtocol(_SendDeadline, HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline for each part of a connection's life:
        its first request's headers (``header_timeout``; closed without a word if nothing
        came), a request's headers from its first byte (then 408), its body from the end of
        its headers (``body_timeout``: 408, and the app sees the client gone), the idle time
        between requests (``keep_alive_timeout``, instead of uvicorn's timer), and a client
        that reads nothing of its answer (``send_timeout``). A request's target and headers
        are at most ``HEADERS_MAX`` bytes (400 past it: httptools itself would take any amount
    within the header deadline).

        The deadlines share one timer per connection, moved only when it would fire too
        late: each step of a request just writes down its deadline and what it is for, and
        a timer that fires before the current deadline is set again for it. A busy
        keep-alive connection so costs a clock read per step, not three timers armed and
        cancelled per request."""

    def __init__(self, *args: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._deadline: float | None = None  # (loop time) when the current part is late
        self._part = "start"  # start, head, body, idle: what the deadline is for
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._send_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._cork: Cork | None = None
        self.on_connected: Callable[[], None] = _nothing  # (the Listener's count)
        self._front = front_of(self.app, self.access_logger)

    # the deadlines -----------------------------------------------------------------------

    def _expect(self, part: str, seconds: float) -> None:
        self._part = part
        deadline = self._deadline = self.loop.time() + seconds
        if self._timer_at > deadline:  # (no timer, or one that would fire too late)
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._late)

    def _late(self) -> None:
        self._timer, self._timer_at = None, math.inf
        deadline = self._deadline
        if deadline is None or self.transport.is_closing():
            return
        if self.loop.time() < deadline:  # the deadline moved on since: wait for it
            self._timer_at = deadline
            self._timer = self.loop.call_at(deadline, self._late)
            return
        part = self._part
        if part == "head":
            self.transport.write(
                _timed_out("headers", self.limits.header_timeout, "PULSE_HEADER_TIMEOUT")
            )
        elif part == "body":
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self.transport.write(
                    _timed_out("body", self.limits.body_timeout, "PULSE_BODY_TIMEOUT")
                )
            if cycle is not None:  # the app sees the client gone (its sends are dropped)
                cycle.disconnected = True
                cycle.message_event.set()
        self.transport.close()  # (start, idle: nothing came, so nothing is said)

    # the steps of a connection ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.on_connected()
        self._expect("start", self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline = None
        for timer in (self._timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._send_timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._expect("head", self.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > HEADERS_MAX:
            raise HeadersTooLarge  # (httptools raises it on from feed_data: a 400)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._expect("body", self.limits.body_timeout)  # (until on_message_complete)
        cycle = self.cycle
        if cycle is not None:
            if self._cork is None:
                self._cork = Cork(self.transport, self.loop)
            cycle.transport = self._cork  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._between()

    def on_response_complete(self) -> None:
        # uvicorn's, without its keep-alive timer (the idle deadline stands for it)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        if self._part not in ("head", "body"):  # (else a next request is being read)
            self._between()

    # the API's calls, answered from here ----------------------------------------------------

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, but a request the app's ``Front`` takes (``api.Front.takes``) is
        served by it directly: not through uvicorn's proxy-headers wrapper and the app
        (whose first step is the same ``takes``), and its answer written by
        ``_answered``. Still inside uvicorn's ``run_asgi`` (what an exception or a
        missing answer makes of the request) and its task (counted for the shutdown)."""
        front = self._front
        if front is not None and app is self.app:  # (not uvicorn's 503 for its own cap)
            taken = front.takes(cycle.scope)
            if taken is not None:
                answered = self._answered(cycle)

                def served(scope: Scope, receive: Receive, send: Send) -> Any:
                    return front.serve(scope, receive, send, taken, answered)

                run = cycle.run_asgi(served)
                if self.config.reset_contextvars:
                    task = self.loop.create_task(run, context=contextvars.Context())
                else:
                    task = self.loop.create_task(run)
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
        super()._start_asgi_task(cycle, app)

    def _answered(self, cycle: Any) -> Callable[[bytes, list[tuple[bytes, bytes]]], Any]:
        """What writes a call's answer of ``cycle``: the bytes uvicorn's ``send`` writes
        for its two messages (status line, uvicorn's default headers, Content-Length,
        Content-Type JSON, ``connection: close`` where the connection does not stay,
        the body), in one write, with the same flow control and the same end (the
        response complete, the connection closed or on to its next request)."""
        flow = self.flow

        async def answered(body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
            if flow.write_paused and not cycle.disconnected:
                await flow.drain()
            if cycle.disconnected:
                return
            if cycle.response_started:  # (cannot be: the answer begins here)
                raise RuntimeError("a call's answer after its response began")
            cycle.response_started = True
            cycle.waiting_for_100_continue = False
            head = [_OK]
            for name, value in cycle.default_headers:
                head += (name, b": ", value, b"\r\n")
            head.append(b"content-length: %d\r\ncontent-type: application/json\r\n" % len(body))
            for name, value in extra:  # (a record's outcome: ops.http.api.outcome_headers)
                head += (name, b": ", value, b"\r\n")
            if not cycle.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            cork = self._cork
            if len(body) <= Cork.JOIN_MAX:
                head.append(body)
                whole = b"".join(head)
                if cork is not None and cork.held is not None:
                    cork.write(whole)  # (behind what is held, as it was)
                else:
                    self.transport.write(whole)
            else:
                cycle.transport.write(b"".join(head))
                cycle.transport.write(body)
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                cycle.transport.close()
            cycle.on_response()

        return answered

    def _between(self) -> None:
        """After a request's body: no deadline while its answer is made, then the idle
        one until the next request begins."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._part, self._deadline = "app", None
        else:
            self._expect("idle", self.limits.keep_alive_timeout)


_OK = b"HTTP/1.1 200 OK\r\n"  # (uvicorn's status line of a 200)


def front_of(app: Any, access: logging.Logger) -> Any:
    """The ``api.Front`` of the app uvicorn serves (``ops.service.PulseApp``), where it
    answers exactly as through the app: nothing but uvicorn's proxy-headers wrapper
    around the app (whose changes to the scope, the client's address and scheme, are
    read by uvicorn's access log only), and the access log not written (uvicorn logs
    at warning in ``pulse up``). None otherwise: then every request goes to the app."""
    if access.isEnabledFor(logging.INFO):
        return None
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    return getattr(app, "front", None)


class H11EdgeProtocol(_SendDeadline, H11Protocol):
    """uvicorn's h11 protocol, with a deadline for a request's headers, one for its body,
    and one for a client that does not read; the idle keep-alive timer is uvicorn's. (The
    edge where httptools is not installed: ``edge_protocol``.)"""

    def __init__(self, *args: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.timeout_keep_alive = limits.keep_alive_timeout  # type: ignore[assignment]
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._heard = False  # whether a byte of the current request came
        self.on_connected: Callable[[], None] = _nothing  # (the Listener's count)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.on_connected()
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._body_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._send_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._heard = True
            if self._head_timer is None:
                self._arm_head()  # the first byte of the next request on this connection
        cycle = self.cycle
        super().data_received(data)
        self._follow(cycle)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        self._follow(cycle)  # (a pipelined request may have begun)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _follow(self, before: Any) -> None:
        """Move the timers along with what h11 made of the bytes: headers done (a new
        cycle) stops the header timer and starts the body's; a body done stops it."""
        cycle = self.cycle
        if cycle is not before and cycle is not None:
            self._heard = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            if cycle.more_body:
                self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_late)
        elif cycle is not None and not cycle.more_body and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _arm_head(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._between_requests():
            return
        if self._heard:
            self.transport.write(
                _timed_out("headers", self.limits.header_timeout, "PULSE_HEADER_TIMEOUT")
            )
        self.transport.close()

    def _body_late(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        if not cycle.response_started:
            self.transport.write(_timed_out("body", self.limits.body_timeout, "PULSE_BODY_TIMEOUT"))
        # the app sees the client gone (its sends are dropped from now on)
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()


# -- the accept loop --------------------------------------------------------------------------


class Listener:
    """Accepts connections on ``sock`` up to the cap of ``limits`` (counted by ``open``),
    answering one past it 503 and closing it at once, so its descriptor is free again
    before the next is accepted. When the process runs out of descriptors anyway,
    accepting pauses for ``ACCEPT_PAUSE`` (waiting connections stay in the kernel's
    queue) and one line is logged; requests in flight go on. Stands in for the
    ``asyncio.Server`` uvicorn would make (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        limits: Limits,
        open_connections: Callable[[], int],
    ) -> None:
        self.sockets = [sock]
        self._sock, self._protocol, self._limits = sock, protocol, limits
        self._open_connections = open_connections
        self._loop = asyncio.get_running_loop()
        self._starting: set[asyncio.Task[None]] = set()
        # accepted, not yet among the open connections: their protocol's connection_made
        # calls on_connected (counting the task until it ended counted a connection twice
        # meanwhile, and refused connections under the cap)
        self._pending = 0
        self._paused: asyncio.TimerHandle | None = None
        self._closed = False
        self._warned_at = -math.inf
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._accept)

    @property
    def open(self) -> int:
        return self._open_connections() + self._pending

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS:
                    self._pause(exc)
                else:  # (a connection that failed as it came: the next one is another)
                    _log_safely(logging.WARNING, f"accepting a connection failed: {exc!r}")
                return
            if self.open >= self._limits.max_connections:
                _refuse(conn, _too_many_connections(self._limits))
                continue
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                # no Nagle: an answer's head and body go out at once, not 40 ms apart
                # (asyncio sets this only on sockets it made itself)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pending += 1
            starting = self._loop.create_task(self._start(conn))
            self._starting.add(starting)
            starting.add_done_callback(self._starting.discard)

    async def _start(self, conn: socket.socket) -> None:
        counted = False

        def count() -> None:  # (once it is among the open connections, or failed)
            nonlocal counted
            if not counted:
                counted = True
                self._pending -= 1

        def protocol() -> asyncio.Protocol:
            made = self._protocol()
            made.on_connected = count  # type: ignore[attr-defined]
            return made

        try:
            await self._loop.connect_accepted_socket(protocol, conn)
        except OSError:
            conn.close()
        finally:
            count()

    def _pause(self, exc: OSError) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._paused = self._loop.call_later(ACCEPT_PAUSE, self._resume)
        now = time.monotonic()
        if now - self._warned_at >= 10:
            self._warned_at = now
            _log_safely(
                logging.WARNING,
                f"out of file descriptors ({os.strerror(exc.errno or 0)}) with {self.open} "
                "connections open: new connections wait; lower $PULSE_MAX_CONNECTIONS or "
                "raise $PULSE_FD_RESERVE or the open-file limit",
            )

    def _resume(self) -> None:
        self._paused = None
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._paused is not None:
            self._paused.cancel()
        else:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    async def wait_closed(self) -> None:
        if self._starting:
            await asyncio.wait(set(self._starting))


def _refuse(conn: socket.socket, answer: bytes) -> None:
    """Answer ``conn`` with what fits in its send buffer and close it now. What the client
    already sent is read first (without waiting): closing over unread bytes resets the
    connection, and the client could lose the answer."""
    try:
        conn.setblocking(False)
        conn.send(answer)
        conn.shutdown(socket.SHUT_WR)
        with contextlib.suppress(BlockingIOError):
            conn.recv(65536)
    except OSError:
        pass
    finally:
        conn.close()


def _log_safely(level: int, message: str) -> None:
    """Log one line, or nothing if logging itself fails (it may need a descriptor)."""
    with contextlib.suppress(Exception):
        log.log(level, message)


def survive_descriptor_exhaustion(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop's error reporting work without new descriptors: its handler logs one
    line and never raises (asyncio's default one, logging a traceback through the MCP
    SDK's rich handler, imported rich.traceback from disk on first use; that failing
    with EMFILE inside the handler ended the loop), and rich's traceback module is
    imported now, while a file can still be opened."""
    with contextlib.suppress(ImportError):
        import rich.traceback  # noqa: F401

    def report(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        what = context.get("message", "error in the event loop")
        _log_safely(logging.ERROR, f"{what}: {error!r}" if error else str(what))

    loop.set_exception_handler(report)


def edge_protocol() -> type[EdgeProtocol | H11EdgeProtocol]:
    """The protocol of the edge: httptools' (``EdgeProtocol``), else h11's, or the one
    $PULSE_HTTP names (``h11`` or ``httptools``; the same deadlines either way, h11's
    parser slower by about 0.2 ms a request)."""
    asked = os.environ.get("PULSE_HTTP", "").strip().lower()
    if asked not in ("", "h11", "httptools"):
        raise ValidationError(f"PULSE_HTTP: must be h11 or httptools, got {asked!r:.100}")
    if asked == "h11" or not HTTPTOOLS:
        if asked == "httptools":
            raise ValidationError("PULSE_HTTP: httptools is not installed")
        return H11EdgeProtocol
    return EdgeProtocol


# -- the server -------------------------------------------------------------------------------


class EdgeServer(uvicorn.Server):
    """uvicorn serving through ``EdgeProtocol`` and a ``Listener``, without signal handling
    of its own (``pulse up`` stops it on its signals)."""

    def __init__(self, config: uvicorn.Config, limits: Limits) -> None:
        super().__init__(config)
        self.limits = limits
        self.protocol = edge_protocol()  # (a bad $PULSE_HTTP is refused before serving)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config, state = self.config, self.server_state
        survive_descriptor_exhaustion(asyncio.get_running_loop())
        sock = config.bind_socket()  # (exits with STARTUP_FAILURE when it cannot bind)
        sock.set_inheritable(False)
        sock.listen(config.backlog)

        edge = self.protocol

        def protocol() -> asyncio.Protocol:
            return edge(
                config=config, server_state=state, app_state=self.lifespan.state,
                limits=self.limits,
            )  # fmt: skip

        listener = Listener(sock, protocol, self.limits, lambda: len(state.connections))
        self.servers = [listener]  # type: ignore[list-item]
        self.started = True


# -- caps on streams and sessions -------------------------------------------------------------


def holder_of(principal: Principal | None) -> str:
    """Whose a stream or session is, for the per-token caps: the access token's, else the
    local operator's (else the owner's)."""
    if principal is None:
        return "-"
    if principal.token_id is not None:
        return f"token:{principal.token_id}"
    return "operator" if principal.local else f"owner:{principal.owner}"


class Slots:
    """Open streams, at most ``limit`` in all and ``per_holder`` for one holder
    (``holder_of``)."""

    def __init__(self, limit: int, per_holder: int) -> None:
        self.limit, self.per_holder = limit, per_holder
        self.held: dict[str, int] = {}

    @property
    def open(self) -> int:
        return sum(self.held.values())

    def refusal(self, holder: str) -> str | None:
        """Why another stream of ``holder`` is refused (which cap), or None."""
        if self.open >= self.limit:
            return "total"
        if self.held.get(holder, 0) >= self.per_holder:
            return "token"
        return None

    def take(self, holder: str) -> bool:
        if self.refusal(holder) is not None:
            return False
        self.held[holder] = self.held.get(holder, 0) + 1
        return True

    def give_back(self, holder: str) -> None:
        left = self.held.get(holder, 0) - 1
        if left > 0:
            self.held[holder] = left
        else:
            self.held.pop(holder, None)


def too_many(what: str, setting: str, limit: int, per_token: bool) -> dict[str, str]:
    """The body of a 503 for a cap on sessions."""
    whose = "of this token" if per_token else "of this service"
    return {
        "error": "TooManySessions",
        "message": f"{what}: {limit} are open, the limit {whose} (${setting}); close one, "
        f"or retry in {RETRY_AFTER} s",
    }


MCP_SESSION_HEADER = b"mcp-session-id"


class McpSessions:
    """Open MCP sessions, at most ``max_mcp_sessions`` in all and
    ``max_mcp_sessions_per_token`` per token: a request that would open one more (a POST
    to /mcp without ``Mcp-Session-Id``) past either cap is 503 with Retry-After. A session
    counts from its opening request until the SDK's session manager drops it (the
    client's DELETE, its idle timeout, a crash): ``live`` is the manager's set of session
    ids, asked at each opening. Requests of open sessions pass untouched."""

    def __init__(self, live: Callable[[], Collection[str]], limits: Limits) -> None:
        from ops.http.guard import PRINCIPAL  # (the web stack: not at start-up)

        self.live, self.limits, self.principal_key = live, limits, PRINCIPAL
        self.holders: dict[str, str] = {}  # session id -> holder
        self.opening: dict[str, int] = {}  # holder -> opening requests in flight

    def _counts(self, holder: str) -> tuple[int, int]:
        live = self.live()
        for session in [s for s in self.holders if s not in live]:
            del self.holders[session]
        total = len(self.holders) + sum(self.opening.values())
        mine = sum(1 for h in self.holders.values() if h == holder) + self.opening.get(holder, 0)
        return total, mine

    def _refusal(self, holder: str) -> dict[str, str] | None:
        total, mine = self._counts(holder)
        limits = self.limits
        if total >= limits.max_mcp_sessions:
            return too_many("mcp sessions", "PULSE_MAX_MCP_SESSIONS",
                            limits.max_mcp_sessions, per_token=False)  # fmt: skip
        if mine >= limits.max_mcp_sessions_per_token:
            return too_many("mcp sessions", "PULSE_MAX_MCP_SESSIONS_PER_TOKEN",
                            limits.max_mcp_sessions_per_token, per_token=True)  # fmt: skip
        return None

    async def serve(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        opens = (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not any(key == MCP_SESSION_HEADER for key, _ in scope["headers"])
        )
        if not opens:
            await app(scope, receive, send)
            return
        holder = holder_of(scope.get(self.principal_key))
        refused = self._refusal(holder)
        if refused is not None:
            response = JSONResponse(
                refused, status_code=503, headers={"Retry-After": str(RETRY_AFTER)}
            )
            await response(scope, receive, send)
            return
        self.opening[holder] = self.opening.get(holder, 0) + 1
        counted = True

        def opened() -> None:
            nonlocal counted
            counted = False
            left = self.opening.get(holder, 0) - 1
            if left > 0:
                self.opening[holder] = left
            else:
                self.opening.pop(holder, None)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and counted:
                opened()
                for key, value in message.get("headers", []):
                    if key.lower() == MCP_SESSION_HEADER:
                        self.holders[value.decode("latin-1")] = holder
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            if counted:
                opened()


MCP_PATH = "/mcp"  # where the MCP SDK serves its streamable-HTTP transport (its default)


class LazyMcp:
    """The MCP endpoint (``/mcp``) of `pulse up`, made at its first request.

    Importing the MCP SDK and building the server with every tool costs about 0.7 s of
    CPU, a quarter of the service's start, paid by every start whether an MCP client
    comes or not. Here the first request to ``/mcp`` imports ``module`` on a thread (the
    event loop serves other requests meanwhile), builds the server from it
    (``build(module)``: a FastMCP server), starts its session manager in the app's
    lifespan task group (``lifespan``, which stops it at shutdown) and puts it behind
    ``McpSessions``' caps; every request then goes to it. Requests that arrive while it
    is being built wait for it."""

    def __init__(self, module: str, build: Callable[[ModuleType], Any], limits: Limits) -> None:
        self.module, self.build, self.limits = module, build, limits
        self.sessions: McpSessions | None = None
        self._app: ASGIApp | None = None
        self._building = asyncio.Lock()
        self._group: Any = None  # the lifespan's task group (anyio)

    @contextlib.asynccontextmanager
    async def lifespan(self, _: object) -> Any:
        import anyio

        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                self._group = None
                group.cancel_scope.cancel()  # (the session manager, if it was started)

    def routes(self) -> list[BaseRoute]:
        return [Route(MCP_PATH, endpoint=self)]

    async def _made(self) -> ASGIApp:
        async with self._building:
            if self._app is not None:
                return self._app
            if self._group is None:
                raise RuntimeError("the MCP endpoint is used outside the app's lifespan")
            mcp = self.build(await asyncio.to_thread(importlib.import_module, self.module))
            routes = [r for r in mcp.streamable_http_app().routes if isinstance(r, Route)]
            assert [r.path for r in routes] == [MCP_PATH], routes  # (what the SDK serves)
            manager = mcp.session_manager

            async def run(*, task_status: Any) -> None:
                import anyio

                async with manager.run():
                    task_status.started()
                    await anyio.sleep_forever()  # until the lifespan cancels it

            await self._group.start(run)
            self.sessions = McpSessions(live_mcp_sessions(manager), self.limits)
            self._app = routes[0].app
            return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app if self._app is not None else await self._made()
        assert self.sessions is not None
        await self.sessions.serve(app, scope, receive, send)


def live_mcp_sessions(manager: Any) -> Callable[[], Collection[str]]:
    """The ids of the sessions an MCP SDK session manager holds now. (The 1.x SDK, pinned
    in pyproject, keeps them in ``_server_instances``; it has no public view of them.)"""
    return lambda: manager._server_instances.keys()
