"""The HTTP JSON API of an instance, served by ``pulse up``.

Every public method of ``PulseDB`` is ``POST /v1/<method>`` with its arguments as a JSON
object (the same names as in Python), e.g. ``POST /v1/record_experience {"collective_id":
..., "content": ...}``. One shape for every method keeps the API complete and the same as
the library by construction; the request bodies are the library's pydantic models (or
models derived from the method's signature), so the OpenAPI schema at ``/openapi.json``
carries the data-model limits, and a bad request gets the library's messages:

    422 {"error": "ValidationError", "message": "importance: Input should be ...",
         "problems": ["importance: ..."]}
    404 NotFoundError, 409 ConflictError, 503 LogUnavailable, 401 without a credential,
    403 Forbidden (also: an Origin not of this service), 415 UnsupportedMediaType (a body
    that is not Content-Type application/json), 413 PayloadTooLarge (a body over
    $PULSE_MAX_BODY_BYTES, 8 MiB), and for anything unexpected 500 {"error":
    "InternalError", "message": ..., "error_id": "..."}: one line in the service log
    under that id (its traceback at debug level), never the details in the response

Every request carries a credential (``Guard``): an access token, or the data
directory's operator secret (``ops.operator_secret``), as ``Authorization: Bearer``;
only ``/health`` (up or down), ``/openapi.json`` and ``/docs`` (its assets shipped in the
package) answer without one, and the last two can be made private too.

Listings (list_collectives, get_related_experiences, get_active_agents, list_sessions,
dead_letters) answer one page, ``{"items": [...], "next": cursor or null}``: ``limit``
1..1000 (default 100), and ``after`` the ``next`` of the page before.

Results are JSON with embeddings left out (their ``dimension`` instead), or as lists of
floats with ``?embeddings=true``; ``?format=msgspec`` is the exact typed form
``ops.remote.RemotePulseDB`` decodes; ``POST /v1/sql`` also answers Arrow IPC or Parquet
(``ops.tables``). Also: ``GET /v1/watch_experiences`` (server-sent events), ``GET
/health``, ``GET /metrics`` (Prometheus text, ``ops.metrics``; admins and the operator,
or anyone on an address of its own: ``metrics_app``), and the MCP server's
streamable-HTTP transport at ``/mcp``.

What the OpenAPI schema promises of every route (statuses, the error body, strict JSON
types, limits, examples) is stated in ``ops.contract``; bodies are read by ``read_body``.

(No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations.)
"""

import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Union

import numpy as np
import pydantic
from fastapi import FastAPI

from ops import contract
from ops.http import api, docs, health, metrics, watch
from ops.http.errors import answer_errors
from ops.http.guard import LOOPBACK, BodyLimit, Guard, origin_of
from ops.http.metrics import metrics_app
from ops.metrics import Metrics
from ops.remote import API_METHODS, optional_getter, return_type
from ops.serving import Limits, Slots, count_setting
from sync import models
from sync.instance import PulseDB

__all__ = ["LOOPBACK", "create_app", "metrics_app", "origin_of"]

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
    "start_session": models.SessionIn,
    "update_session": models.SessionChangeIn,
    "end_session": models.SessionChangeIn,
}

MAX_BODY_BYTES = 8 * 1024 * 1024  # $PULSE_MAX_BODY_BYTES: a request body, in bytes


def create_app(
    db: PulseDB,
    *,
    secret: str,
    host: str = "127.0.0.1",
    allow_origins: tuple[str, ...] = (),
    private_docs: bool = False,
    mcp_routes: list[Any] | None = None,
    lifespan: Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]] | None = None,
    max_body_bytes: int | None = None,
    max_watchers: int | None = None,
    max_watchers_per_token: int | None = None,
) -> FastAPI:
    """The app over ``db``: ``secret`` is the operator secret (``ops.operator_secret``),
    ``host`` the address it listens on (its origins are its own), ``allow_origins`` the
    web apps' origins that may call it (with CORS), ``private_docs`` makes /openapi.json
    and /docs want a credential too. ``max_body_bytes``, ``max_watchers`` and
    ``max_watchers_per_token`` default to $PULSE_MAX_BODY_BYTES (8 MiB),
    $PULSE_MAX_WATCHERS (64) and $PULSE_MAX_WATCHERS_PER_TOKEN (16)."""
    app = FastAPI(
        title="Pulse", version="1", summary="A shared memory for collectives of AI agents",
        description=__doc__, lifespan=lifespan,
        docs_url=None, redoc_url=None,  # (ops.http.docs serves /docs, from the package)
    )  # fmt: skip
    metrics_ = app.state.metrics = Metrics(db)
    watching = Slots(
        max_watchers or count_setting("PULSE_MAX_WATCHERS", Limits.max_watchers),
        max_watchers_per_token
        or count_setting("PULSE_MAX_WATCHERS_PER_TOKEN", Limits.max_watchers_per_token),
    )
    operations = declared()
    app.include_router(api.router(db, operations))
    app.include_router(watch.router(db, secret, watching))
    app.include_router(health.router(db))
    app.include_router(metrics.router(db, metrics_))
    app.include_router(docs.router())
    app.router.routes.extend([docs.assets(), *(mcp_routes or [])])
    answer_errors(app)
    app.openapi = functools.partial(contract.schema_of, app, operations)  # type: ignore[method-assign]
    app.add_middleware(
        BodyLimit, limit=max_body_bytes or count_setting("PULSE_MAX_BODY_BYTES", MAX_BODY_BYTES)
    )
    app.add_middleware(  # (outermost: sees the 413s)
        Guard, metrics=metrics_, secret=secret, db=db, host=host, allow_origins=allow_origins,
        private_docs=private_docs, routes=api.paths(operations) | {watch.PATH},
    )  # fmt: skip
    return app


# -- request models derived from signatures ------------------------------------------------


def _is_array(tp: Any) -> bool:
    return typing.get_origin(tp) is np.ndarray or tp is np.ndarray


def _schema_type(tp: Any) -> Any:
    """A JSON-friendly annotation for a parameter's annotation (numpy arrays become vectors,
    and so do the sequences of floats offered beside one; other sequences lists)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        vector = any(_is_array(arg) for arg in args)
        mapped: list[Any] = []
        for arg in args:
            floats = typing.get_origin(arg) in (collections.abc.Sequence, list, tuple) and (
                typing.get_args(arg) == (float,)
            )
            is_vector = _is_array(arg) or (vector and floats)
            item = models.VectorField if is_vector else _schema_type(arg)
            if item not in mapped:
                mapped.append(item)
        return mapped[0] if len(mapped) == 1 else Union[tuple(mapped)]  # noqa: UP007
    if origin in (collections.abc.Sequence, list, tuple):
        item_type = _schema_type(args[0]) if args else Any
        return list[item_type]  # type: ignore[valid-type]
    if _is_array(tp):
        return models.VectorField
    return tp


def derived_model(name: str, method: Callable[..., Any]) -> type[pydantic.BaseModel]:
    hints = typing.get_type_hints(method)
    fields: dict[str, Any] = {}
    for param in list(inspect.signature(method).parameters.values())[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        annotation = contract.parameter(name, param.name, _schema_type(hints.get(param.name, Any)))
        if param.name == "flt":
            annotation = models.FilterIn | None
        if param.name == "idempotency_key":
            annotation = contract.IdempotencyKey | None
        if param.name == "as_of":  # (get_type_hints drops its validator)
            annotation = models.AsOf
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    base = models.ExperienceUpdateIn if name == "update_experience" else models._Input
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_request", __base__=_based(name, base), **fields
    )
    return model


def _based(name: str, base: type[pydantic.BaseModel]) -> type[pydantic.BaseModel]:
    """``base``, or a subclass whose schema says more (an update's "at least one of")."""
    fields = contract.AT_LEAST_ONE.get(name)
    if fields is None:
        return base
    config = pydantic.ConfigDict(json_schema_extra=contract.at_least_one(fields))
    return type(base.__name__, (base,), {"model_config": config, "__module__": __name__})


def request_model(name: str) -> type[pydantic.BaseModel]:
    given = INPUT_MODELS.get(name)
    if given is None:
        return derived_model(name, API_METHODS[name])
    if "idempotency_key" in inspect.signature(API_METHODS[name]).parameters:
        # a write: its library model plus the key (sync.idempotency)
        keyed: type[pydantic.BaseModel] = pydantic.create_model(
            f"{name}_request", __base__=_based(name, given),
            idempotency_key=(contract.IdempotencyKey | None, None),
        )  # fmt: skip
        return keyed
    return given


@dataclasses.dataclass(frozen=True)
class _Operation:
    """An operation as the routes need it (until ``sync.api`` declares them)."""

    name: str
    summary: str
    description: str
    optional: bool
    request: type[pydantic.BaseModel]
    returns: Any


def declared() -> list[_Operation]:
    found = []
    for name, method in API_METHODS.items():
        doc = inspect.getdoc(method) or name
        found.append(
            _Operation(name, doc.split("\n")[0], doc, optional_getter(name), request_model(name),
                       return_type(name))
        )  # fmt: skip
    return found
