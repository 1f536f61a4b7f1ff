"""The API routes: ``POST /v1/<name>`` for each declared operation, its body the
operation's request model (one flat JSON object of its arguments), its answer the
operation's result as JSON (or ``?format=msgspec``, the exact typed form
``ops.remote.RemotePulseDB`` decodes; ``/v1/sql`` also Arrow IPC or Parquet).

Routes are made from the declaration alone (``Declared``): the operation's name, its
summary and description, its request model, its return type and whether it may answer
None (then the route answers 404). What the schema promises beyond that is
``ops.contract``'s.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import asyncio
import json
import time
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import msgspec
import numpy as np
import pydantic
from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from eventlog.errors import NotFoundError, PulseError, Unauthorized, ValidationError
from ops import contract, tables
from ops.contract import Declared
from ops.encoding import json_bytes, to_json
from ops.http.errors import error_response, internal_error, internal_response
from ops.http.guard import (
    PRINCIPAL,
    Guard,
    not_json,
    principal_of,
    resolve,
    too_large,
    unauthorized,
)
from sync import models
from sync.access import Principal
from sync.instance import PulseDB

# a direct call: (body, principal, format, embeddings) -> the answer's JSON
# a call's answer: its body, and the headers it adds (``outcome_headers``)
Headers = list[tuple[bytes, bytes]]
Call = Callable[[bytes, Principal, str, bool], Awaitable[tuple[bytes, Headers]]]
# what Front takes of a request: its call, format, embeddings, declared body length and
# Content-Type headers (None: no body)
Taken = tuple[Call, str, bool, int, list[str] | None]
# writes a call's answer (its JSON) as a 200 with Content-Length and Content-Type JSON
Answered = Callable[[bytes, Headers], Awaitable[None]]


def router(db: PulseDB, operations: Iterable[Declared]) -> APIRouter:
    """``POST /v1/<name>`` for each of ``operations``, acting on ``db`` for the principal
    of each request."""
    routes = APIRouter(prefix="/v1")
    for operation in operations:
        name = operation.name
        make = sql_endpoint if name == "sql" else endpoint
        routes.add_api_route(
            f"/{name}",
            make(db, operation),
            methods=["POST"],
            operation_id=name,
            summary=operation.summary,
            description=operation.description,
            name=name,
            tags=[tag_of(name)],
            # the least token scope that may call it (sync.api), for clients to read
            openapi_extra={"x-scope": operation.scope},
            responses={
                **contract.responses(contract.errors_of(operation)),
                **(contract.SQL_RESULTS if name == "sql" else {}),
                **RECORDED.get(name, {}),
            },
        )
    return routes


class Direct:
    """``POST /v1/<name>`` (but ``sql``) straight to its call: one dict lookup, past the
    route list, FastAPI's dependency solving for the two query options and its exception
    layers, which cost a request about as much as its encoding. What the fast way cannot
    answer exactly as the routes would (a query string of other parameters or values
    than ``format=json|msgspec`` and ``embeddings=true|false``, each at most once;
    another method; a root path) goes on to the app, whose routes (and OpenAPI schema)
    stay the declaration's. Plain ASGI, inside ``BodyLimit`` and the ``Guard``: a Pulse
    error is answered by ``error_response`` and anything else raised on to the Guard, as
    from the routes."""

    def __init__(self, app: ASGIApp, db: PulseDB, operations: Iterable[Declared]) -> None:
        self.app = app
        self.calls = {
            f"/v1/{operation.name}": direct(db, operation)
            for operation in operations
            if operation.name != "sql"
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            call = self.calls.get(scope["path"])
            options = _options(scope.get("query_string", b"")) if call else None
            if call is not None and options is not None:
                try:
                    request = Request(scope, receive, send)
                    raw = await request.body()
                    answer, extra = await call(raw, principal_of(request), *options)
                    response = Response(answer, media_type="application/json")
                    response.raw_headers += extra
                except PulseError as exc:
                    response = error_response(exc)
                except ClientDisconnect:  # (as errors.answer_errors answers it)
                    response = Response(status_code=499)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Front:
    """``POST /v1/<name>`` (but ``sql``) from the server straight to its call, past every
    layer of the web framework (its error, telemetry and body-limit middlewares, the
    ``Guard``, ``BodyLimit`` and ``Direct`` each a coroutine frame and a wrapped
    ``send``): the Guard's checks and request metrics, BodyLimit's bound and Direct's
    call in one coroutine, the answer written as its two messages. A request it cannot
    answer exactly as that stack would (an ``Origin`` header, a body without a
    Content-Length, any other query than Direct's options) is not taken (``takes``):
    the app's stack answers it. ``guard`` and ``limit`` are the stack's own."""

    def __init__(
        self, db: PulseDB, operations: Iterable[Declared], guard: Guard, limit: int
    ) -> None:
        self.calls = {
            f"/v1/{operation.name}": direct(db, operation)
            for operation in operations
            if operation.name != "sql"
        }
        self.guard, self.limit = guard, limit
        self._counted: dict[tuple[str, int], tuple[Any, Any]] = {}

    def takes(self, scope: Scope) -> Taken | None:
        """What a request this answers asks for (``Taken``), or None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        call = self.calls.get(scope["path"])
        if call is None:
            return None
        options = _options(scope.get("query_string", b""))
        if options is None:
            return None
        length = -1
        body = False
        types: list[str] = []
        for key, value in scope["headers"]:
            if key == b"content-length":
                if length >= 0:
                    return None
                body = value.strip() not in (b"", b"0")  # (as the Guard's has_body)
                try:
                    length = int(value)
                except ValueError:
                    length = 0  # (as BodyLimit reads it)
            elif key == b"content-type":
                types.append(value.decode("latin-1"))
            elif key in _STACK_ONLY:
                return None
        if length < 0:  # (no body, or a chunked one: BodyLimit counts it)
            return None
        return call, *options, length, types if body else None

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, taken: Taken,
        answered: Answered | None = None,
    ) -> None:  # fmt: skip
        """Answer a request ``takes`` took, as the Guard would: an unexpected error is
        logged under an id and answered 500 with it, and the request is counted.
        ``answered``, if given, writes a call's answer (200, JSON) itself, as ``send``
        would write its two messages (``ops.serving.EdgeProtocol``)."""
        started = time.perf_counter()
        status = [0]  # (what is answered, once it begins)
        try:
            await self._answer(scope, receive, send, taken, status, answered)
        except Exception as exc:
            error_id = internal_error(f"POST {scope['path']}", exc)
            if not status[0]:  # (an answer that already began just ends)
                status[0] = 500
                await internal_response(error_id)(scope, receive, send)
        finally:
            self._count(scope["path"], status[0] or 500, time.perf_counter() - started)

    def _count(self, path: str, status: int, seconds: float) -> None:
        """``Metrics.observe`` of a request, its labelled metrics looked up once."""
        key = (path, status)
        counted = self._counted.get(key)
        if counted is None:
            metrics = self.guard.metrics
            counted = self._counted[key] = (
                metrics.requests.labels(path, "POST", str(status)),
                metrics.latency.labels(path),
            )
        counted[0].inc()
        counted[1].observe(seconds)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send,
        taken: Taken, status: list[int], answered: Answered | None,
    ) -> None:  # fmt: skip
        call, format, embeddings, length, types = taken
        guard = self.guard
        # (the Guard's refusals: no Origin here, so only a body that is not JSON)
        response: Response | None = None if types is None else not_json(types)
        if response is None:
            try:
                principal = resolve(scope, guard.secret, guard.db)
            except Unauthorized as exc:
                response = unauthorized(exc)
        if response is None and length > self.limit:
            response = too_large(self.limit)
        if response is None:
            scope[PRINCIPAL] = principal
            try:
                raw = await _body(receive)
                answer, extra = await call(raw, principal, format, embeddings)
            except PulseError as exc:
                response = error_response(exc)
            except ClientDisconnect:  # (as errors.answer_errors answers it)
                response = Response(status_code=499)
            else:
                status[0] = 200
                if answered is not None:
                    await answered(answer, extra)
                    return
                await send({"type": "http.response.start", "status": 200, "headers": [
                    (b"content-length", str(len(answer)).encode()), _JSON, *extra]})  # fmt: skip
                await send({"type": "http.response.body", "body": answer})
                return
        status[0] = response.status_code
        await response(scope, receive, send)


_STACK_ONLY = (b"origin", b"transfer-encoding")  # (CORS, and BodyLimit's counting)
_JSON = (b"content-type", b"application/json")


async def _body(receive: Receive) -> bytes:
    """A request's whole body, or ClientDisconnect (as Starlette's ``Request.body``)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_FORMATS = {b"json": "json", b"msgspec": "msgspec"}
_BOOLS = {b"true": True, b"false": False}


def _options(query: bytes) -> tuple[str, bool] | None:
    """(format, embeddings) of a query string of only those, each at most once with a
    plain value; None for anything else (the route reads it, and refuses what is bad)."""
    format, embeddings = "json", False
    if not query:
        return format, embeddings
    seen: set[bytes] = set()
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        if key in seen:
            return None
        seen.add(key)
        if key == b"format" and value in _FORMATS:
            format = _FORMATS[value]
        elif key == b"embeddings" and value in _BOOLS:
            embeddings = _BOOLS[value]
        else:
            return None
    return format, embeddings


def paths(operations: Iterable[Declared]) -> set[str]:
    """The paths of the routes of ``operations``."""
    return {f"/v1/{operation.name}" for operation in operations}


TAGS = (
    ("session", "sessions"), ("collective", "collectives"), ("relation", "relations"),
    ("related", "relations"),
    ("insight", "insights"), ("activit", "activities"), ("heartbeat", "activities"),
    ("agent", "activities"), ("wisdom", "wisdom"), ("search", "search"),
    ("context", "search"), ("sql", "analytics"), ("experience", "experiences"),
)  # fmt: skip


def tag_of(name: str) -> str:
    """The OpenAPI group of an operation."""
    return next((tag for word, tag in TAGS if word in name), "state")


# -- bodies -----------------------------------------------------------------------------------

M = typing.TypeVar("M", bound=pydantic.BaseModel)


def _integral(value: Any) -> bool:
    return isinstance(value, float) and value.is_integer()


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def parse_body(raw: bytes, model: type[M]) -> M:
    """A request's body as ``model``: a JSON object of the method's arguments, with the
    JSON types the schema states (strict: no ``false`` for an integer, no ``"1"`` for a
    number); no body at all stands for ``{}`` where every argument has a default. (JSON
    by its Content-Type: the Guard refused any other.)"""
    try:
        if not raw.strip():
            if any(field.is_required() for field in model.model_fields.values()):
                raise ValidationError(
                    "body: required, a JSON object of the method's arguments "
                    "(Content-Type: application/json)"
                )
            return model.model_validate({}, strict=True)
        try:
            return model.model_validate_json(raw, strict=True)
        except pydantic.ValidationError as exc:
            if not any(_integral(error.get("input")) for error in exc.errors()):
                raise
            # JSON Schema counts 3.0 as an integer: read integral numbers as integers
            data = json.loads(raw, parse_float=_number)
            return model.model_validate_json(json.dumps(data), strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            if error["type"] == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "not valid JSON")
                raise ValidationError(f"body: not valid JSON ({reason})") from None
        if any(not error["loc"] and error["type"] == "model_type" for error in errors):
            raise ValidationError(
                "body: must be a JSON object of the method's arguments "
                "(Content-Type: application/json)"
            ) from None
        raise models.translate(exc) from None


def arguments(body: pydantic.BaseModel) -> dict[str, Any]:
    """The arguments a request body gives (``model_dump(exclude_unset=True)``), its
    vectors (arrays already checked) passed as they are instead of copied by pydantic."""
    given = body.model_fields_set
    vectors = {name for name in given if isinstance(getattr(body, name), np.ndarray)}
    if not vectors:
        return body.model_dump(exclude_unset=True)
    out = body.model_dump(exclude_unset=True, exclude=vectors)
    for name in vectors:
        out[name] = getattr(body, name)
    return out


# -- answers ----------------------------------------------------------------------------------

FORMAT = Query(
    "json",
    description="json: plain JSON; msgspec: the exact typed form ops.remote decodes",
)
EMBEDDINGS = Query(False, description="embeddings as lists of floats")


def answering(db: PulseDB, operation: Declared) -> Callable[[bytes, Principal], Awaitable[Any]]:
    """The call of ``operation`` a request body asks for, for a principal: its result, a
    page as ``{"items", "next"}``, and an operation's "there is none" as a 404."""
    method = getattr(db, operation.name)
    model, optional = operation.request, operation.optional
    takes_model = operation.name == "get_context_candidates"  # (its argument is the model)

    async def answer(raw: bytes, principal: Principal) -> Any:
        body = parse_body(raw, model)
        with db.acting_as(principal):
            if takes_model:
                result = await method(body)
            else:
                result = await method(**arguments(body))
        if result is None and optional:  # a getter's "there is none" (or none it may see)
            raise NotFoundError(f"{_subject(operation.name)}: none with that id")
        if isinstance(result, models.Page):  # a page of a listing, and where the rest is
            result = {"items": result, "next": result.next}
        return result

    return answer


def endpoint(db: PulseDB, operation: Declared) -> Callable[..., Awaitable[Response]]:
    """The route of ``operation``: its answer in JSON, or msgspec's typed JSON."""
    answer = answering(db, operation)

    async def call(
        request: Request,
        format: Literal["json", "msgspec"] = FORMAT,
        embeddings: bool = EMBEDDINGS,
    ) -> Response:
        raw = await request.body()
        result = await answer(raw, principal_of(request))
        response = await respond(result, format, embeddings)
        response.raw_headers += outcome_headers(result)
        return response

    call.__name__ = operation.name
    return call


def direct(db: PulseDB, operation: Declared) -> Call:
    """``endpoint``'s call of ``operation`` for ``Direct`` and ``Front``: the same answer
    (its JSON), given the body, the principal and the two options (``format``,
    ``embeddings``) already read."""
    answer = answering(db, operation)

    async def call(
        raw: bytes, principal: Principal, format: str, embeddings: bool
    ) -> tuple[bytes, Headers]:
        result = await answer(raw, principal)
        return await content(result, format, embeddings), outcome_headers(result)

    return call


OUTCOME = "Pulse-Outcome"  # what record_experience did: recorded, reinforced or linked
DUPLICATE_OF = "Pulse-Duplicate-Of"  # the experience it duplicates (reinforced, linked)
OUTCOMES = "Pulse-Outcomes"  # record_experiences: each item's outcome, in order, by commas


def _header(description: str, **schema: Any) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string", **schema}}


_SAID = ("what the call did: recorded (a new experience), reinforced (it duplicated a live "
         "one, which counted one more application; the id answered is that one's) or "
         "linked (a new experience, related to the one it duplicates)")  # fmt: skip
# the headers of a record's answer, for the schema (``outcome_headers`` writes them)
RECORDED: dict[str, dict[int | str, dict[str, Any]]] = {
    "record_experience": {200: {"description": "Successful Response", "headers": {
        OUTCOME: _header(_SAID, enum=["recorded", "reinforced", "linked"]),
        DUPLICATE_OF: _header("the live experience it duplicates (reinforced, linked)",
                              format="uuid"),
    }}},
    "record_experiences": {200: {"description": "Successful Response", "headers": {
        OUTCOMES: _header("each item's outcome, in the order of the items, by commas: "
                          + _SAID),
    }}},
}  # fmt: skip


def outcome_headers(result: Any) -> Headers:
    """The headers that say what a record did (``models.Recorded``): its outcome and
    what it duplicates, or a batch's outcomes; none for any other result."""
    if isinstance(result, models.Recorded):
        headers = [(OUTCOME.lower().encode(), result.outcome.encode())]
        if result.duplicate_of is not None:
            headers.append((DUPLICATE_OF.lower().encode(), str(result.duplicate_of).encode()))
        return headers
    if isinstance(result, list) and result and isinstance(result[0], models.Recorded):
        said = ",".join(r.outcome for r in result)
        return [(OUTCOMES.lower().encode(), said.encode())]
    return []


# items: a result of at most this many is encoded on the event loop (an item's embedding
# as a list of floats costs about as much as ten items without)
SMALL = 100


async def respond(result: Any, format: str, embeddings: bool) -> Response:
    """The answer of ``result`` (``content``)."""
    return Response(await content(result, format, embeddings), media_type="application/json")


async def content(result: Any, format: str, embeddings: bool) -> bytes:
    """``result`` encoded once by msgspec: on the event loop when small (tens of
    microseconds), on a worker thread when it can be large."""
    if _items(result) <= (SMALL // 10 if embeddings else SMALL):
        return encode(result, format, embeddings)
    return await asyncio.to_thread(encode, result, format, embeddings)


def encode(result: Any, format: str, embeddings: bool) -> bytes:
    """``result`` as plain JSON (``ops.encoding``), or msgspec's typed JSON."""
    if format == "msgspec":
        return msgspec.json.encode(result)
    return json_bytes(result, embeddings=embeddings)


def _items(result: Any) -> int:
    """About how many items ``result`` holds: a list's length, a page's, or the sum of
    the lists of a struct (``Context``); 1 for anything else."""
    if isinstance(result, (list, tuple)):
        return len(result)
    if isinstance(result, dict):
        return sum(len(v) for v in result.values() if isinstance(v, (list, tuple))) or 1
    if isinstance(result, msgspec.Struct):
        values = msgspec.structs.astuple(result)
        return sum(len(v) for v in values if isinstance(v, (list, tuple))) or 1
    return 1


SQL_FORMAT = Query(
    "json",
    description="json, msgspec, arrow (Arrow IPC stream) or parquet; without it, an "
    "Accept of " + " or ".join(tables.MEDIA_TYPES.values()) + " asks for that one",
)


def sql_endpoint(db: PulseDB, operation: Declared) -> Callable[..., Awaitable[Response]]:
    """``POST /v1/sql``: the route of ``endpoint``, but a client that goes away cancels
    its query (interrupted in DuckDB: ``analytics.run_async``) instead of leaving it to
    run to its time limit for nobody; what little is sent then is a 499. The result is
    JSON, or Arrow IPC or Parquet when asked (``format=``, or ``Accept``). In JSON a
    float that is NaN, Infinity or -Infinity is null (JSON has no such numbers;
    ``SqlResult``); Arrow and Parquet keep the IEEE value."""
    answer = answering(db, operation)

    async def sql(
        request: Request,
        format: Literal["json", "msgspec", "arrow", "parquet"] = SQL_FORMAT,
        embeddings: bool = EMBEDDINGS,
    ) -> Response:
        given = "format" in request.query_params
        form = format if given else tables.asked(request.headers.get("accept", ""))
        raw = await request.body()  # read before waiting for the client to go (one receiver)
        running = asyncio.ensure_future(answer(raw, principal_of(request)))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({running, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not running.done():
                running.cancel()
                await asyncio.wait({running})
        if running.cancelled():
            return JSONResponse(
                {
                    "error": "ClientClosedRequest",
                    "message": "query: cancelled, the client went away",
                },
                status_code=499,
            )
        result = running.result()
        if form in tables.MEDIA_TYPES:
            media_type = tables.MEDIA_TYPES[form]
            content = await asyncio.to_thread(tables.encode, result, form)
            return Response(content, media_type=media_type)
        if form == "msgspec":
            return Response(msgspec.json.encode(result), media_type="application/json")
        # (msgspec writes a float JSON cannot carry as null, where json.dumps would raise)
        content = msgspec.json.encode(to_json(result, embeddings=embeddings))
        return Response(content, media_type="application/json")

    return sql


async def _client_gone(request: Request) -> None:
    """Return once the client of ``request`` (whose body was read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _subject(name: str) -> str:
    """The id argument of a getter, e.g. ``experience_id`` of ``get_experience``."""
    return f"{name.removeprefix('get_')}_id"
