"""``GET /v1/watch_experiences``: changes to experiences as server-sent events, each
stream holding one of a capped number of slots (``ops.serving.Slots``) until it ends.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from eventlog.errors import PulseError, Unauthorized
from ops import contract
from ops.encoding import to_json
from ops.http.guard import principal_of, resolve
from ops.serving import Slots, holder_of
from sync.instance import PulseDB

PATH = "/v1/watch_experiences"
RETRY_AFTER = 5  # seconds, the Retry-After of a watch refused for the cap
KEEP_ALIVE = 15  # seconds without a change before a keep-alive comment

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "a stream of server-sent events",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **contract.responses(
        {
            **contract.EVERY_ROUTE,
            **contract.UNAUTHORIZED,
            403: contract.EVERY_METHOD[403],
            503: "TooManyWatchers: $PULSE_MAX_WATCHERS streams are open, or "
            "$PULSE_MAX_WATCHERS_PER_TOKEN of this token (see Retry-After); or "
            "LogUnavailable",
        }
    ),
}


def router(db: PulseDB, secret: str, watching: Slots) -> APIRouter:
    """The watch route over ``db``; ``secret`` (the operator's) to tell whether a
    stream's credential still holds, ``watching`` the caps on open streams."""
    routes = APIRouter()

    @routes.get(
        PATH,
        operation_id="watch_experiences",
        summary="Stream the changes to experiences as server-sent events.",
        tags=["experiences"],
        response_model=None,
        response_class=StreamingResponse,
        responses=RESPONSES,
    )
    async def watch_experiences(request: Request) -> Response:
        """Changes to experiences as this instance applies them: one ``data: {json}``
        line per change the caller may see, from the moment of the request. A stream
        whose token is revoked or expires meanwhile ends with ``event: unauthorized``
        before the next change (or keep-alive). At most
        $PULSE_MAX_WATCHERS (64) streams at once, $PULSE_MAX_WATCHERS_PER_TOKEN (16) of
        one token; past that, 503 with Retry-After."""
        principal = principal_of(request)
        holder = holder_of(principal)
        if not watching.take(holder):
            return too_many(watching, holder)
        try:
            with db.acting_as(principal):
                watch = db.watch_experiences()
        except BaseException:
            watching.give_back(holder)
            raise

        def refused() -> bytes | None:
            """The end of a stream whose token was revoked or expired since it began."""
            try:
                resolve(request.scope, secret, db)
            except Unauthorized as exc:
                return b"event: unauthorized\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
            return None

        async def events() -> AsyncIterator[bytes]:
            yield b": watching\n\n"
            iterator = aiter(watch)
            try:
                while not await request.is_disconnected():
                    try:
                        change = await asyncio.wait_for(anext(iterator), KEEP_ALIVE)
                    except TimeoutError:
                        change = None
                    except StopAsyncIteration:
                        return
                    except PulseError as exc:  # the reader fell too far behind
                        yield b"event: overflow\ndata: " + json.dumps(str(exc)).encode() + b"\n\n"
                        return
                    ended = refused()
                    if ended is not None:
                        yield ended
                        return
                    if change is None:
                        yield b": keep-alive\n\n"
                        continue
                    yield b"data: " + json.dumps(to_json(change)).encode() + b"\n\n"
            finally:
                watch.close()

        return CountedStream(events(), watching, holder, media_type="text/event-stream")

    return routes


def too_many(watching: Slots, holder: str) -> JSONResponse:
    """The 503 of a watch past a cap: the service's, or the token's."""
    mine = watching.refusal(holder) == "token"
    limit = watching.per_holder if mine else watching.limit
    return JSONResponse(
        {"error": "TooManyWatchers", "message": f"watch: {limit} watch streams are "
         + ("open for this token, its limit ($PULSE_MAX_WATCHERS_PER_TOKEN)" if mine
            else "open, the limit of this service ($PULSE_MAX_WATCHERS)")
         + f"; retry in {RETRY_AFTER} s"},
        status_code=503, headers={"Retry-After": str(RETRY_AFTER)},
    )  # fmt: skip


class CountedStream(StreamingResponse):
    """A streaming response holding one of the ``Slots`` of ``holder`` until it ends: the
    client went away, the stream ended, or it failed."""

    def __init__(
        self, content: AsyncIterator[bytes], slots: Slots, holder: str, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self.slots, self.holder = slots, holder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.give_back(self.holder)
