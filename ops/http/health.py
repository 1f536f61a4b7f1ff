"""``GET /health``: up or down to anyone; to an admin token or the operator, also the
NATS connection, the applied and stream sequences, the lag, the instance id and the
analysts' snapshot (``PulseDB.health()``, and the stream's last sequence).

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.requests import Request

from eventlog.errors import PulseError
from ops import contract
from ops.encoding import to_json
from ops.http.guard import PRINCIPAL
from sync.access import Principal
from sync.instance import PulseDB

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": contract.Health, "description": "up (to admins: the details)"},
    503: {"model": contract.Health, "description": "down (to admins: why)"},
    **contract.responses(contract.EVERY_ROUTE),
}


def router(db: PulseDB) -> APIRouter:
    """``GET /health`` of ``db``."""
    routes = APIRouter()
    stream_head = StreamHead(db)

    @routes.get(
        "/health",
        operation_id="health",
        summary="Tell whether the service is up, and to an admin how far it is behind.",
        tags=["service"],
        response_model=None,
        responses=RESPONSES,
        openapi_extra={"security": contract.PUBLIC},
    )
    async def health(request: Request) -> JSONResponse:
        """Up or down; to an admin token or the operator, also the NATS connection, last
        applied vs stream sequence, the lag, the instance id and the analysts' snapshot
        (sequence numbers tell how much the stream holds: not for every caller)."""
        stream_seq: int | None = None
        connected = True
        try:
            stream_seq = await stream_head.read()
        except (PulseError, TimeoutError):
            connected = False
        health = db.health()  # (sync.instance.Health)
        connected = connected and health.nats_connected
        ok = connected and health.replicating
        body = {
            "status": "ok" if ok else "degraded",
            "nats_connected": connected,
            "replicating": health.replicating,
            "applied_seq": health.applied_seq,
            "stream_seq": stream_seq,
            "lag": None if stream_seq is None else max(0, stream_seq - health.applied_seq),
            "instance_id": str(health.instance_id),
            "snapshot": to_json(health.snapshot),  # (projections.snapshot)
        }
        if health.failure is not None:
            body["error"] = health.failure
        if health.duckdb_writer_error is not None:  # (reads and writes go on; the SQL of
            body["duckdb_writer_error"] = health.duckdb_writer_error  # the present waits)
        principal = request.scope.get(PRINCIPAL)
        if not (isinstance(principal, Principal) and principal.admin):
            body = {"status": "up" if ok else "down"}  # the rest is for admins
        return JSONResponse(body, status_code=200 if ok else 503)

    return routes


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
            self._asking = asyncio.ensure_future(asyncio.wait_for(self._db.last_seq(), 5))
        asking = self._asking
        try:
            value = await asyncio.shield(asking)
        finally:
            if self._asking is asking and asking.done():
                self._asking = None
        self._value, self._at = value, time.monotonic()
        return value
