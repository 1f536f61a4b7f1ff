"""The HTTP JSON API of an instance, served by ``pulse up``.

Every public method of ``PulseDB`` is ``POST /v1/<method>`` with its arguments as a JSON
object (the same names as in Python), e.g. ``POST /v1/record_experience {"collective_id":
..., "content": ...}``. One shape for every method keeps the API complete and the same as
the library by construction; the request bodies are the library's pydantic models (or
models derived from the method's signature), so the OpenAPI schema at ``/openapi.json``
carries the data-model limits, and a bad request gets the library's messages:

    422 {"error": "ValidationError", "message": "importance: Input should be ...",
         "problems": ["importance: ..."]}
    404 NotFoundError, 409 ConflictError, 503 LogUnavailable, 401 without the token

Results are JSON with embeddings left out (their ``dimension`` instead), or as lists of
floats with ``?embeddings=true``; ``?format=msgspec`` is the exact typed form
``ops.remote.RemotePulseDB`` decodes. Also: ``GET /v1/watch_experiences`` (server-sent
events), ``GET /health``, ``GET /metrics`` (Prometheus text), and the MCP server's
streamable-HTTP transport at ``/mcp``.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
import collections.abc
import contextlib
import inspect
import ipaddress
import json
import logging
import secrets
import time
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Union

import msgspec
import numpy as np
import pydantic
from fastapi import Body, FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventlog.errors import (
    ConflictError,
    LogUnavailable,
    NotFoundError,
    PulseError,
    ValidationError,
)
from ops.encoding import to_json
from ops.remote import API_METHODS
from sync import models
from sync.instance import PulseDB

log = logging.getLogger("pulse.service")

STATUS: dict[type[PulseError], int] = {
    ValidationError: 422,
    NotFoundError: 404,
    ConflictError: 409,
    LogUnavailable: 503,
}

# methods whose arguments are exactly one of the library's input models
INPUT_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "create_collective": models.CollectiveIn,
    "record_experience": models.ExperienceIn,
    "record_experiences": models.ExperiencesIn,
    "store_relation": models.RelationIn,
    "store_insight": models.InsightIn,
    "register_activity": models.ActivityIn,
    "store_wisdom": models.WisdomIn,
    "get_context_candidates": models.ContextIn,
}


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- request models derived from signatures ------------------------------------------------


def _is_array(tp: Any) -> bool:
    return typing.get_origin(tp) is np.ndarray or tp is np.ndarray


def _schema_type(tp: Any) -> Any:
    """A JSON-friendly annotation for a parameter's annotation (numpy arrays become lists
    of numbers, sequences lists, ``Any`` filters the filter model)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        mapped: list[Any] = []
        for arg in args:
            if _is_array(arg):
                arg = list[float]
            item = _schema_type(arg)
            if item not in mapped:
                mapped.append(item)
        return mapped[0] if len(mapped) == 1 else Union[tuple(mapped)]  # noqa: UP007
    if origin in (collections.abc.Sequence, list, tuple):
        item_type = _schema_type(args[0]) if args else Any
        return list[item_type]  # type: ignore[valid-type]
    if _is_array(tp):
        return list[float]
    return tp


def derived_model(name: str, method: Callable[..., Any]) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(method)
    fields: dict[str, Any] = {}
    for param in list(inspect.signature(method).parameters.values())[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        annotation = _schema_type(hints.get(param.name, Any))
        if param.name == "flt":
            annotation = models.FilterIn | None
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    base = models.ExperienceUpdateIn if name == "update_experience" else models._Input
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_request", __base__=base, **fields
    )
    return model


def request_model(name: str) -> type[pydantic.BaseModel]:
    return INPUT_MODELS.get(name) or derived_model(name, API_METHODS[name])


# -- metrics (Prometheus text format, no client library needed) -----------------------------

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.latency: dict[str, list[float]] = {}  # route -> bucket counts + [sum, count]

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests[(route, method, status)] += 1
        counts = self.latency.setdefault(route, [0.0] * (len(BUCKETS) + 2))
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                counts[i] += 1
        counts[-2] += seconds
        counts[-1] += 1

    def render(self, db: PulseDB, stream_seq: int | None) -> str:
        lines = [
            "# HELP pulse_http_requests_total HTTP requests by route, method and status.",
            "# TYPE pulse_http_requests_total counter",
        ]
        for (route, method, status), n in sorted(self.requests.items()):
            lines.append(
                f'pulse_http_requests_total{{route="{route}",method="{method}",'
                f'status="{status}"}} {n}'
            )
        lines += [
            "# HELP pulse_http_request_duration_seconds HTTP request latency by route.",
            "# TYPE pulse_http_request_duration_seconds histogram",
        ]
        for route, counts in sorted(self.latency.items()):
            for bound, count in zip(BUCKETS, counts, strict=False):
                lines.append(
                    f'pulse_http_request_duration_seconds_bucket{{route="{route}",le="{bound}"}} '
                    f"{int(count)}"
                )
            lines.append(
                f'pulse_http_request_duration_seconds_bucket{{route="{route}",le="+Inf"}} '
                f"{int(counts[-1])}"
            )
            lines.append(f'pulse_http_request_duration_seconds_sum{{route="{route}"}} {counts[-2]}')
            lines.append(
                f'pulse_http_request_duration_seconds_count{{route="{route}"}} {int(counts[-1])}'
            )
        lag = None if stream_seq is None else max(0, stream_seq - db.applied_seq)
        lines += [
            "# HELP pulse_events_applied_total Events applied by the replication loop.",
            "# TYPE pulse_events_applied_total counter",
            f"pulse_events_applied_total {db.events_applied}",
            "# HELP pulse_applied_sequence Last stream sequence applied to the local state.",
            "# TYPE pulse_applied_sequence gauge",
            f"pulse_applied_sequence {db.applied_seq}",
        ]
        if stream_seq is not None:
            lines += [
                "# HELP pulse_stream_sequence Last sequence of the stream.",
                "# TYPE pulse_stream_sequence gauge",
                f"pulse_stream_sequence {stream_seq}",
                "# HELP pulse_replication_lag_events Stream events not yet applied here.",
                "# TYPE pulse_replication_lag_events gauge",
                f"pulse_replication_lag_events {lag}",
            ]
        return "\n".join(lines) + "\n"


METHODS = {"GET", "POST", "HEAD", "OPTIONS", "DELETE"}  # metric labels; others: "other"
KNOWN_ROUTES = ("/health", "/metrics", "/mcp", "/openapi.json", "/docs")


def route_of(path: str) -> str:
    if path.startswith("/v1/") and path[4:] in API_METHODS | {"watch_experiences": None}:
        return path
    return path if path in KNOWN_ROUTES else "other"


def _host_name(scope: Scope) -> str:
    """The host name of the Host header, without the port (IPv6 in brackets)."""
    for key, value in scope["headers"]:
        if key == b"host":
            host: str = value.decode("latin-1")
            if host.startswith("["):
                return host[: host.find("]") + 1]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


class Guard:
    """Without a token, loopback Host names only (no DNS rebinding); with one, the bearer
    token; and request metrics. Plain ASGI, so streaming responses (SSE, MCP) pass
    through untouched."""

    def __init__(self, app: ASGIApp, metrics: Metrics, token: str | None) -> None:
        self.app, self.metrics, self.token = app, metrics, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.token is None and _host_name(scope) not in LOOPBACK_NAMES:
                # loopback only: another Host name is a page rebinding its DNS name to us
                response = JSONResponse(
                    {"error": "BadHost", "message": "this service answers loopback names only"},
                    status_code=400,
                )
                await response(scope, receive, sending)
                return
            if self.token is not None and path != "/health" and not self._authorized(scope):
                response = JSONResponse(
                    {"error": "Unauthorized", "message": "a bearer token is required: "
                     "Authorization: Bearer <token>"},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"},
                )  # fmt: skip
                await response(scope, receive, sending)
                return
            await self.app(scope, receive, sending)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.observe(route_of(path), method, status, time.perf_counter() - started)

    def _authorized(self, scope: Scope) -> bool:
        for key, value in scope["headers"]:
            if key == b"authorization":
                given = value.decode("latin-1")
                expected = f"Bearer {self.token}"
                return secrets.compare_digest(given.encode(), expected.encode())
        return False


# -- the app ----------------------------------------------------------------------------------


def _error(exc: PulseError) -> JSONResponse:
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    problems = getattr(exc, "problems", None)
    if problems:
        body["problems"] = problems
    return JSONResponse(body, status_code=status)


def create_app(
    db: PulseDB,
    *,
    token: str | None = None,
    mcp_routes: list[Any] | None = None,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    app = FastAPI(
        title="Pulse",
        version="1",
        summary="A shared memory for collectives of AI agents",
        description=__doc__,
        lifespan=lifespan,
    )
    metrics = Metrics()
    app.add_middleware(Guard, metrics=metrics, token=token)

    @app.exception_handler(PulseError)
    async def pulse_error(_: Request, exc: PulseError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return JSONResponse(
            {"error": "InternalError", "message": f"{type(exc).__name__}: {exc}"},
            status_code=500,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        for error in errors:
            if error["type"] == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "not valid JSON")
                where = error["loc"][-1] if len(error["loc"]) > 1 else "?"
                return _error(ValidationError(f"body: not valid JSON ({reason} at {where})"))
        if any(tuple(e["loc"]) == ("body",) and e["type"] != "value_error" for e in errors):
            return _error(
                ValidationError(
                    "body: must be a JSON object of the method's arguments "
                    "(Content-Type: application/json)"
                )
            )
        return _error(models.from_errors(errors, skip=("body", "query")))

    for name, method in API_METHODS.items():
        app.add_api_route(
            f"/v1/{name}",
            _endpoint(db, name, request_model(name)),
            methods=["POST"],
            summary=(inspect.getdoc(method) or name).split("\n")[0],
            description=inspect.getdoc(method) or "",
            name=name,
            tags=[_tag(name)],
        )

    @app.get("/v1/watch_experiences", tags=["experiences"])
    async def watch_experiences(request: Request) -> StreamingResponse:
        """Changes to experiences as this instance applies them (server-sent events):
        one ``data: {json}`` line per change, from the moment of the request."""
        watch = db.watch_experiences()

        async def events() -> AsyncIterator[bytes]:
            yield b": watching\n\n"
            iterator = aiter(watch)
            try:
                while not await request.is_disconnected():
                    try:
                        change = await asyncio.wait_for(anext(iterator), 15)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    except StopAsyncIteration:
                        return
                    except PulseError as exc:  # the reader fell too far behind
                        yield b"event: overflow\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
                        return
                    yield b"data: " + json.dumps(to_json(change)).encode() + b"\n\n"
            finally:
                watch.close()

        return StreamingResponse(events(), media_type="text/event-stream")

    stream_head = StreamHead(db)

    @app.get("/health", tags=["service"])
    async def health() -> JSONResponse:
        """NATS connection, last applied vs stream sequence, and the lag."""
        connected = bool(getattr(getattr(db.log, "nc", None), "is_connected", True))
        stream_seq: int | None = None
        try:
            stream_seq = await stream_head.read()
        except (PulseError, TimeoutError):
            connected = False
        failure = db._failure
        ok = connected and failure is None
        body = {
            "status": "ok" if ok else "degraded",
            "nats_connected": connected,
            "replicating": failure is None,
            "applied_seq": db.applied_seq,
            "stream_seq": stream_seq,
            "lag": None if stream_seq is None else max(0, stream_seq - db.applied_seq),
            "instance_id": str(db.instance_id),
        }
        if failure is not None:
            body["error"] = repr(failure)
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["service"])
    async def prometheus() -> Response:
        """Prometheus metrics: requests, latencies, events applied, replication lag."""
        try:
            stream_seq: int | None = await asyncio.wait_for(db.log.last_seq(), 5)
        except (PulseError, TimeoutError):
            stream_seq = None
        return Response(metrics.render(db, stream_seq), media_type="text/plain; version=0.0.4")

    for route in mcp_routes or []:
        app.router.routes.append(route)
    return app


TAGS = (
    ("collective", "collectives"), ("relation", "relations"), ("related", "relations"),
    ("insight", "insights"), ("activit", "activities"), ("heartbeat", "activities"),
    ("agent", "activities"), ("wisdom", "wisdom"), ("search", "search"),
    ("context", "search"), ("sql", "analytics"), ("experience", "experiences"),
)  # fmt: skip


class StreamHead:
    """The stream's last sequence for /health, asked of NATS at most every ``max_age``
    seconds: under load a health probe then costs one pass through the loop, not a
    round trip to NATS behind every queued request. Concurrent probes share one ask."""

    def __init__(self, db: PulseDB, max_age: float = 0.25) -> None:
        self._db = db
        self._max_age = max_age
        self._value: int | None = None
        self._at = -1e9
        self._asking: asyncio.Future[int] | None = None

    async def read(self) -> int:
        if self._value is not None and time.monotonic() - self._at < self._max_age:
            return self._value
        if self._asking is None:
            self._asking = asyncio.ensure_future(asyncio.wait_for(self._db.log.last_seq(), 5))
        asking = self._asking
        try:
            value = await asyncio.shield(asking)
        finally:
            if self._asking is asking and asking.done():
                self._asking = None
        self._value, self._at = value, time.monotonic()
        return value


def _tag(name: str) -> str:
    """The OpenAPI group of a method."""
    return next((tag for word, tag in TAGS if word in name), "state")


def _endpoint(
    db: PulseDB, name: str, model: type[pydantic.BaseModel]
) -> Callable[..., Awaitable[Response]]:
    method = getattr(db, name)
    takes_request = name == "get_context_candidates"

    async def endpoint(
        body: Any = Body(default=None),
        format: Literal["json", "msgspec"] = Query("json"),
        embeddings: bool = Query(False, description="embeddings as lists of floats"),
    ) -> Response:
        if body is None:
            body = models.validated(model)
        if takes_request:
            result = await method(body)
        else:
            result = await method(**body.model_dump(exclude_unset=True))
        if format == "msgspec":
            return Response(msgspec.json.encode(result), media_type="application/json")
        return JSONResponse(to_json(result, embeddings=embeddings))

    endpoint.__annotations__["body"] = model | None  # the request schema FastAPI shows
    endpoint.__name__ = name
    return endpoint
