"""The one error body of ``pulse up``: every refusal and failure, whoever raises it (the
library, a route, the Guard, or Starlette itself for an unknown path or a wrong method),
answers ``{"error": <kind>, "message": <the field and the limit, or what to do>}`` with
``problems`` for a ValidationError and ``error_id`` for an unexpected error
(``ops.contract.ErrorBody``), so a client parses every error one way.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from eventlog.errors import (
    ConflictError,
    Forbidden,
    LogUnavailable,
    NotFoundError,
    PulseError,
    QueryCancelled,
    QueryOutOfMemory,
    QueryTimedOut,
    QueryTooLarge,
    Unauthorized,
    ValidationError,
)
from sync import models

log = logging.getLogger("pulse.service")

STATUS: dict[type[PulseError], int] = {
    Unauthorized: 401,  # no principal: no token, or an unknown, revoked or expired one
    Forbidden: 403,  # a principal that may not do this (its scope, or not a member)
    ValidationError: 422,
    NotFoundError: 404,
    ConflictError: 409,
    LogUnavailable: 503,
    QueryTimedOut: 408,  # /v1/sql past $PULSE_SQL_TIME_LIMIT
    QueryOutOfMemory: 413,  # /v1/sql past $PULSE_SQL_MEMORY_LIMIT (and the temp files')
    QueryTooLarge: 413,  # /v1/sql: a query longer than $PULSE_SQL_MAX_QUERY_BYTES
    QueryCancelled: 503,  # /v1/sql stopped for a rewrite of the files after a delete: retry
}


def error_response(exc: PulseError) -> JSONResponse:
    """The answer to one of Pulse's own errors: its status (``STATUS``) and the body."""
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    problems = getattr(exc, "problems", None)
    if problems:
        body["problems"] = problems
    return JSONResponse(body, status_code=status)


def internal_error(where: str, exc: BaseException, logger: logging.Logger = log) -> str:
    """Log an unexpected error under a short random id, in one line at ERROR (the id,
    where, the exception's type and the start of its message, newlines escaped) and its
    traceback once at DEBUG ($PULSE_LOG_LEVEL of `pulse up`): a stream of bad
    requests grows the log by a line each, not a traceback each. The id is all a caller
    gets (never the exception's type, message or traceback)."""
    error_id = secrets.token_hex(6)
    logger.error("internal error %s in %s: %s %.200r", error_id, where, type(exc).__name__,
                 str(exc))  # fmt: skip
    logger.debug("internal error %s in %s: the traceback", error_id, where, exc_info=exc)
    return error_id


def internal_message(error_id: str) -> str:
    return f"internal error {error_id}: the service log has the details under this id"


def internal_response(error_id: str) -> JSONResponse:
    """The answer to an unexpected error: its id, never its type, message or traceback."""
    return JSONResponse(
        {"error": "InternalError", "message": internal_message(error_id), "error_id": error_id},
        status_code=500,
    )


def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals in the one shape: an unknown path (404), a method the path
    does not take (405, with its Allow header), anything else it raises."""
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        kind = "NotFoundError"
        message = f"path: no route {path!r:.200}; the API is POST /v1/<operation>, see /docs"
    elif exc.status_code == 405:
        kind = "MethodNotAllowed"
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method: {method} is not allowed on {path!r:.200}; use {allowed or 'another'}"
    else:
        kind, message = "HTTPError", f"{path!r:.200}: {exc.detail}"
    return JSONResponse(
        {"error": kind, "message": message}, status_code=exc.status_code, headers=exc.headers
    )


def answer_errors(app: FastAPI) -> None:
    """Install the handlers that give every error of ``app`` the one body."""

    async def pulse_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, PulseError)
        return error_response(exc)

    async def gone(_: Request, __: Exception) -> Response:
        # a client that went away, or was dropped for its slowness (ops.serving): nothing
        # went wrong here, and nobody reads the answer
        return Response(status_code=499)

    async def invalid(_: Request, exc: Exception) -> Response:
        # (the query parameters: bodies are read by ops.http.api.read_body)
        assert isinstance(exc, RequestValidationError)
        return error_response(models.from_errors(list(exc.errors()), skip=("body", "query")))

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return http_error(request, exc)

    app.add_exception_handler(PulseError, pulse_error)
    app.add_exception_handler(ClientDisconnect, gone)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, refused)
