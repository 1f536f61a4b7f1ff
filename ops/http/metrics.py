"""``GET /metrics``: Prometheus text (``ops.metrics``) for admin tokens and the operator
on the API's address, or for anyone on an address of its own (``metrics_app``, for
``pulse up --metrics-listen``).

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from eventlog.errors import PulseError
from ops import contract
from ops.http.guard import header, principal_of
from ops.metrics import CONTENT_TYPE, Metrics
from sync.instance import PulseDB

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the Prometheus text exposition format 0.0.4",
        "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
    },
    **contract.responses(
        {**contract.EVERY_ROUTE, **contract.UNAUTHORIZED, 403: contract.ADMINS_ONLY}
    ),
}


def router(db: PulseDB, metrics: Metrics) -> APIRouter:
    """``GET /metrics`` of ``db``, with the request counts of ``metrics``."""
    routes = APIRouter()

    @routes.get(
        "/metrics",
        operation_id="metrics",
        summary="Read the service's Prometheus metrics.",
        tags=["service"],
        response_model=None,
        response_class=Response,
        responses=RESPONSES,
    )
    async def prometheus(request: Request) -> Response:
        """Requests, latencies, events applied, replication lag. For admin tokens and the
        operator (or anyone on --metrics-listen's address)."""
        principal_of(request).need_admin("reading /metrics")
        return await metrics_response(db, metrics)

    return routes


async def metrics_response(db: PulseDB, metrics: Metrics) -> Response:
    try:
        stream_seq: int | None = await asyncio.wait_for(db.last_seq(), 5)
    except (PulseError, TimeoutError):
        stream_seq = None
    return Response(metrics.render(stream_seq), media_type=CONTENT_TYPE)


def metrics_app(db: PulseDB, metrics: Metrics) -> ASGIApp:
    """``GET /metrics`` alone, without a credential, for ``pulse up --metrics-listen``: an
    address of its own that only the scrapers reach (a private network, or loopback for
    an agent beside it). Why not a ``metrics`` token scope: a scope is a value in the
    token events, and hosts of an older Pulse would refuse (dead-letter) a token created
    with a scope they do not know; an address of its own needs nothing on the log. On
    the API's address /metrics stays for admins and the operator (stream totals are not
    for every caller). Foreign Origins are refused here too."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        response: Response
        if header(scope, b"origin"):
            response = JSONResponse(
                {"error": "Forbidden", "message": "origin: this address serves scrapers only"},
                status_code=403,
            )
        elif scope["path"] != "/metrics" or scope["method"] not in ("GET", "HEAD"):
            response = JSONResponse(
                {"error": "NotFoundError", "message": "path: this address serves GET /metrics"},
                status_code=404,
            )
        else:
            response = await metrics_response(db, metrics)
        await response(scope, receive, send)

    return serve
