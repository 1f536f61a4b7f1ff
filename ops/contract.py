"""The HTTP contract of ``pulse up`` as its OpenAPI schema states it: what each route
accepts (request models, with the limits of the data model), every status it can answer
with and the one error body they share, its media types and an example of each request.

``ops.http`` builds the routes; this module says what they promise, in one place for
every route, so a client generated from ``/openapi.json`` is right about what it will
get. ``tests/test_contract.py`` holds a live service to it with schemathesis.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol
from uuid import UUID

import msgspec
import pydantic
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import Field, WithJsonSchema
from pydantic.json_schema import models_json_schema

from eventlog.errors import ValidationError
from ops.remote import page_body
from projections.snapshot import SnapshotStatus
from sync import models
from sync.embedders import EMBEDDERS


class Declared(Protocol):
    """What the routes and their schema need of an operation of the declaration."""

    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def scope(self) -> str: ...
    @property
    def optional(self) -> bool: ...
    @property
    def request(self) -> type[pydantic.BaseModel]: ...
    @property
    def returns(self) -> Any: ...


# -- the error body and the statuses ------------------------------------------------------


class ErrorBody(pydantic.BaseModel):
    """What every refusal and failure answers: the error's type and a message naming the
    field and the limit (or what to do)."""

    error: str = Field(
        description="the kind of error: ValidationError, NotFoundError, ConflictError, "
        "Unauthorized, Forbidden, LogUnavailable, PayloadTooLarge, UnsupportedMediaType, "
        "InternalError, ..."
    )
    message: str
    problems: list[str] | None = Field(
        default=None, description="a ValidationError's problems, one per field"
    )
    error_id: str | None = Field(
        default=None, description="an InternalError's id: the service log has the details"
    )


# status -> what it means; every route can answer these (the guard and the body limit
# stand before every route; anything unexpected is a 500)
FOREIGN_ORIGIN = "an Origin header that is not this service's (see pulse up --allow-origin)"
EVERY_ROUTE = {
    403: f"Forbidden: {FOREIGN_ORIGIN}",
    413: "PayloadTooLarge: a body over the service's limit ($PULSE_MAX_BODY_BYTES, 8 MiB)",
    415: "UnsupportedMediaType: a body whose Content-Type is not application/json",
    500: "InternalError: the service log has the error under error_id",
}
UNAUTHORIZED = {
    401: "Unauthorized: no bearer token (an access token or the operator secret), or an "
    "unknown, revoked or expired one"
}
ADMINS_ONLY = f"Forbidden: not an admin token or the operator secret; or {FOREIGN_ORIGIN}"
# ... and every method of the API these
EVERY_METHOD = {
    403: f"Forbidden: the token's scope (or membership) does not allow this; or {FOREIGN_ORIGIN}",
    422: "ValidationError: the body breaks a limit of the data model (the message names "
    "the field and the limit), or what it names cannot be done now",
    503: "LogUnavailable: the event log (NATS JetStream) did not answer; a write may be "
    "retried (with the same idempotency_key)",
}
NOT_FOUND = {404: "NotFoundError: what an id names does not exist, or the caller may not see it"}
CONFLICT = {
    409: "ConflictError: the idempotency_key was used for other arguments, or what is "
    "changed moved on meanwhile (an ended session)"
}
SQL = {
    408: "QueryTimedOut: the query ran past $PULSE_SQL_TIME_LIMIT",
    413: "QueryOutOfMemory: the query needed more than $PULSE_SQL_MEMORY_LIMIT; or "
    "QueryTooLarge: its text is longer than $PULSE_SQL_MAX_QUERY_BYTES (or a body "
    "over $PULSE_MAX_BODY_BYTES: PayloadTooLarge)",
    422: "ValidationError: not a read-only query, or what it reads is not open; or "
    "QueryTooComplex: its parse tree has more nodes than $PULSE_SQL_MAX_NODES or more "
    "levels than $PULSE_SQL_MAX_DEPTH",
    499: "ClientClosedRequest: the client went away; the query was cancelled",
    503: "QueryCancelled: stopped so that the files could be rewritten after a delete "
    "(forgetting never waits for readers): retry; or LogUnavailable",
}


NAMES = ("find_collective",)  # what a name names may not exist either: 404


def _mentions_uuid(annotation: Any) -> bool:
    if annotation is UUID:
        return True
    return any(_mentions_uuid(arg) for arg in typing.get_args(annotation))


def errors_of(operation: Declared) -> dict[int, str]:
    """The error statuses ``POST /v1/<name>`` can answer with, and what each means."""
    name, model = operation.name, operation.request
    found = {**EVERY_ROUTE, **UNAUTHORIZED, **EVERY_METHOD}
    found[403] = (
        f"Forbidden: the token's scope (this needs {operation.scope} or more) or membership "
        f"does not allow this; or {FOREIGN_ORIGIN}"
    )
    if name in NAMES or any(_mentions_uuid(f.annotation) for f in model.model_fields.values()):
        found |= NOT_FOUND
    if "idempotency_key" in model.model_fields:
        found |= CONFLICT
    if name == "sql":
        found |= SQL
    return dict(sorted(found.items()))


def responses(errors: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """FastAPI's ``responses=`` for these error statuses (each with ``ErrorBody``)."""
    return {status: {"model": ErrorBody, "description": text} for status, text in errors.items()}


# (the request models and their limits are the declaration's: sync.requests, sync.api)


def flat(model: dict[str, Any]) -> None:
    """Say a request model's "at least one of these fields" (``sync.requests``: an
    ``anyOf`` of one required field each) in words and ``x-at-least-one`` instead: a
    body is one flat object, and generated clients make an ``anyOf`` at the top of an
    object a union of types, each without the fields the others have. (A body without
    any of them is a 422 naming them.)"""
    options = model.get("anyOf")
    if not options or not all(set(option.get("required", ())) for option in options):
        return
    del model["anyOf"]
    fields = [name for option in options for name in option["required"]]
    given = model.get("description")
    model["description"] = (given + " " if given else "") + (
        f"Give at least one of {', '.join(fields)} (422 otherwise)."
    )
    model["x-at-least-one"] = fields


def tagged(schema: dict[str, Any]) -> None:
    """Make the tag of every discriminated union required in the variants it maps to:
    the models give it a default for Python callers, but a JSON body must name it."""
    components = schema.get("components", {}).get("schemas", {})

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found = node.get("discriminator")
            if isinstance(found, dict):
                tag = found.get("propertyName")
                for ref in (found.get("mapping") or {}).values():
                    variant = components.get(str(ref).rsplit("/", 1)[-1])
                    if variant is not None and tag not in variant.setdefault("required", []):
                        variant["required"].append(tag)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)


# -- examples ---------------------------------------------------------------------------------

TEAM = "0b9f5e8e-1c55-4d0a-9f4e-3c1d2b7a6e01"
EXPERIENCE = "5a3c2e1f-7d4b-4c8a-9e6f-2b1d0c9a8e02"
OTHER = "8e7d6c5b-4a39-4281-b0f1-e2d3c4b5a603"

# an example value by parameter name (a method's own first); every example is checked
# against its request model when the app is built
EXAMPLES: dict[str | tuple[str, str], Any] = {
    "collective_id": TEAM,
    "experience_id": EXPERIENCE,
    "source_id": EXPERIENCE,
    "target_id": OTHER,
    "insight_id": "3f2e1d0c-9b8a-4765-8432-10fedcba9804",
    "relation_id": "7c6b5a49-3827-4165-9f4e-3d2c1b0a9805",
    "session_id": "1e2d3c4b-5a69-4788-9a6b-5c4d3e2f1a06",
    "wisdom_id": "9a8b7c6d-5e4f-4321-8fed-cba987654307",
    "token_id": "2b3c4d5e-6f70-4182-93a4-b5c6d7e8f908",
    "owner_id": "ana",
    "name": "payments-team",
    "embedder": "hash",
    "content": "Retry NATS publishes with the same message id: the stream drops duplicates",
    "domain": ["nats", "reliability"],
    "importance": 0.8,
    "items": [{"content": "Timeouts came from a slow fsync on the NATS store"}],
    "relation_type": "Supports",
    "source_experiences": [EXPERIENCE],
    "agent_id": "reviewer-1",
    "task_description": "reviewing the retry policy",
    "category": "WorkflowPreference",
    "pattern": "retry idempotent writes with a stable id",
    "text": "nats publish retry",
    "query": "SELECT name, count(*) FROM experiences JOIN collectives USING (collective_id) "
    "GROUP BY name",
    ("search_similar", "query"): "why do publishes time out",
    ("get_insights", "query"): "publish timeouts",
    ("get_wisdom", "query"): [0.12, -0.4, 0.33],
    ("store_wisdom", "embedding"): [0.12, -0.4, 0.33],
    "reason": "the fsync setting was changed; publishes no longer time out",
    "summary": "reviewing the retry policy of the publisher",
    "collectives": ["payments-team"],
    ("create_token", "collectives"): [TEAM],
    ("find_collective", "collective"): "ana/payments-team",
    "scope": "write",
    "k": 5,
    "timeout": 10.0,
    # threads: a LangGraph checkpointer's calls (bytes are its serializer's, in base64)
    "thread": "support-chat-42",
    "checkpoint_id": "1ef4f797-8335-6428-8001-8a1503f9b875",
    "checkpoint_type": "msgpack",
    "checkpoint": "haF2BKJpZNkkMWVmNGY3OTc=",
    "task_id": "6f1c2d3e-4b5a-4978-8c6d-5e4f3a2b1c0d",
    "writes": [{"idx": 0, "channel": "messages", "value_type": "msgpack", "value": "kaN5ZXM="}],
    ("copy_thread", "source"): "support-chat-42",
    ("copy_thread", "target"): "support-chat-42-replay",
    "threads": ["support-chat-42"],
    "run_ids": ["1ef4f797-0000-6000-8000-00000000a001"],
}


def example_of(method: str, model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """A request of ``method``: its required fields, and the optional ones with an
    example value, from ``EXAMPLES``."""
    example: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = EXAMPLES.get((method, name), EXAMPLES.get(name))
        if value is None and field.is_required():
            raise LookupError(f"{method}: no example of the required field {name!r}")
        if value is not None:
            example[name] = value
    return example


def check_example(model: type[pydantic.BaseModel], example: dict[str, Any]) -> None:
    """Raise unless ``example`` is a valid request of ``model`` (as the service reads it)."""
    model.model_validate_json(json.dumps(example), strict=True)


# -- the other answers ------------------------------------------------------------------------


def struct_schema(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema of a msgspec struct without nested structs, inline (no refs)."""
    (_ref,), components = msgspec.json.schema_components([struct])
    found: dict[str, Any] = components[struct.__name__]
    return found


class Health(pydantic.BaseModel):
    """``GET /health``: "up" or "down" to anyone; to an admin token or the operator, "ok"
    or "degraded" and the details."""

    status: Literal["ok", "degraded", "up", "down"]
    nats_connected: bool | None = None
    replicating: bool | None = None
    applied_seq: int | None = None
    stream_seq: int | None = None
    lag: int | None = None
    instance_id: str | None = None
    error: str | None = None
    duckdb_writer_error: str | None = None  # DuckDB refuses the state's writes: why
    snapshot: Annotated[
        dict[str, Any] | None,
        WithJsonSchema({"anyOf": [struct_schema(SnapshotStatus), {"type": "null"}]}),
    ] = None  # the analysts' snapshot (projections.snapshot)


BINARY = {"schema": {"type": "string", "format": "binary"}}
SQL_RESULTS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the columns and rows (JSON), or the table in Arrow IPC (stream "
        "format) or Parquet, asked for with format= or Accept",
        "content": {
            "application/json": {"schema": {}},
            "application/vnd.apache.arrow.stream": BINARY,
            "application/vnd.apache.parquet": BINARY,
        },
    }
}


def fixed_dimensions() -> dict[str, int]:
    """The embedders that make vectors of one size only, and that size (found by asking
    each for another size): such a collective takes that embedding_dimension or none."""
    fixed: dict[str, int] = {}
    for name, kind in EMBEDDERS.items():
        try:
            kind(kind.default_dimension + 1)
        except ValidationError:
            fixed[name] = kind.default_dimension
    return dict(sorted(fixed.items()))


def embedders_stated(collective: dict[str, Any]) -> None:
    """A collective's embedder is one this service has (``sync.embedders``), and some
    make vectors of one size only: said in words and ``x-fixed-dimensions`` (an
    ``allOf`` of shapes would make generated clients split the body into types)."""
    for option in collective["properties"]["embedder"].get("anyOf", []):
        if option.get("type") == "string":
            option["enum"] = sorted(EMBEDDERS)
    fixed = fixed_dimensions()
    sizes = ", ".join(f"{name} makes {size}-d vectors" for name, size in fixed.items())
    collective["description"] = (
        "Give embedding_dimension, or an embedder (then embedding_dimension is optional; "
        f"{sizes}: with it, give that size or none). 422 otherwise."
    )
    collective["x-fixed-dimensions"] = fixed


# -- what each method answers -------------------------------------------------------------------


def result_type(operation: Declared) -> Any:
    """The type of ``POST /v1/<name>``'s 200 body: the operation's return type, with a page
    as ``{"items", "next"}`` and an optional operation's None left out (that is a 404)."""
    returns = operation.returns
    if typing.get_origin(returns) is models.Page:
        return page_body()[typing.get_args(returns)[0]]
    if operation.optional:
        found = [arg for arg in typing.get_args(returns) if arg is not type(None)]
        return found[0] if len(found) == 1 else typing.Union[tuple(found)]  # noqa: UP007
    return returns


def _any_value(kind: Any) -> dict[str, Any]:
    if kind is object:
        return {"description": "any JSON value"}  # (free-form details of a status)
    raise NotImplementedError


VECTOR_FORMS = {
    "anyOf": [
        {"type": "array", "items": {"type": "number"}},
        {"type": "string", "contentEncoding": "base64"},
    ],
    "description": "only with ?embeddings=true (the floats) or ?format=msgspec (base64 of the "
    "float32 values); otherwise left out, and `dimension` says its size",
}


def _vectors_as_sent(schema: dict[str, Any]) -> None:
    """Results carry vectors as bytes; ``ops.encoding.to_json`` sends each as its
    ``dimension`` (or the floats), ``?format=msgspec`` as base64: say so."""
    properties = schema.get("properties", {})
    for key, value in list(properties.items()):
        if value == {"type": "string", "contentEncoding": "base64"}:
            properties[key] = VECTOR_FORMS
            if key in schema.get("required", []):
                schema["required"].remove(key)
            properties["dimension"] = {"type": "integer", "minimum": 0}


CELL = {"description": "a value of any JSON type (a column's value, as JSON)"}


def _cells_typed(components: dict[str, Any]) -> None:
    """Give every array of values of any type (``list[Any]``: a row of an SQL result) its
    ``items`` schema: "any JSON value", stated, where msgspec leaves ``items`` out (and
    generated clients refuse an array without one)."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "array" and "items" not in node:
                node["items"] = dict(CELL)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(components)


def results(
    operations: Sequence[Declared],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The 200 body schema of each operation, and the components they refer to."""
    types = [result_type(operation) for operation in operations]
    found, components = msgspec.json.schema_components(
        types, schema_hook=_any_value, ref_template="#/components/schemas/{name}"
    )
    for component in components.values():
        _vectors_as_sent(component)
    _cells_typed(components)
    names = [operation.name for operation in operations]
    return dict(zip(names, found, strict=True)), components


# The methods that make something, and where their answer holds its id: OpenAPI links
# from each to every method that takes that id (schemathesis' stateful phase follows them)
MADE: dict[str, tuple[str, str]] = {
    "create_collective": ("collective_id", "$response.body"),
    "record_experience": ("experience_id", "$response.body"),
    "store_insight": ("insight_id", "$response.body"),
    "store_relation": ("relation_id", "$response.body"),
    "store_wisdom": ("wisdom_id", "$response.body"),
    "start_session": ("session_id", "$response.body#/session_id"),
    "create_token": ("token_id", "$response.body#/token_id"),
    "put_checkpoint": ("thread", "$response.body#/thread"),  # (a thread: named by its caller)
}


def links(requests: dict[str, type[pydantic.BaseModel]]) -> dict[str, dict[str, Any]]:
    """The links of each making operation's 200 answer: to every operation with that id."""
    found: dict[str, dict[str, Any]] = {}
    for source, (field, expression) in MADE.items():
        for target, model in requests.items():
            if target != source and field in model.model_fields:
                found.setdefault(source, {})[target] = {
                    "operationId": target,
                    "requestBody": {field: expression},
                }
    return found


# -- the document -------------------------------------------------------------------------------

BEARER = "bearer"
SECURITY_SCHEMES = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": "an access token (pulse token create), or the operator secret in "
        "the data directory's operator-token file",
    }
}
PUBLIC: list[dict[str, list[str]]] = [{}, {BEARER: []}]  # a route that answers without one


def schema_of(app: FastAPI, operations: Sequence[Declared]) -> dict[str, Any]:
    """The OpenAPI schema of ``app`` (made on first use, then kept)."""
    if app.openapi_schema is None:
        app.openapi_schema = document(app, operations)
    return app.openapi_schema


def document(app: FastAPI, operations: Sequence[Declared]) -> dict[str, Any]:
    """The OpenAPI schema of ``app``, whose ``POST /v1/<name>`` routes read their bodies
    themselves (``ops.http.api.read_body``): each gets its request model, whether a body
    is required (when an argument has no default), and an example, checked here against
    the model as the service reads it."""
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    requests = {operation.name: operation.request for operation in operations}
    refs, found = models_json_schema(
        [(model, "validation") for model in requests.values()],
        ref_template="#/components/schemas/{model}",
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(found.get("$defs", {}))
    answers, answered = results(operations)
    made = links(requests)
    clashes = set(answered) & set(components)
    if clashes:
        raise RuntimeError(f"result and request schemas share names: {sorted(clashes)}")
    components.update(answered)
    for model in requests.values():
        flat(components[refs[(model, "validation")]["$ref"].rsplit("/", 1)[-1]])
    tagged(schema)
    embedders_stated(schema["components"]["schemas"]["create_collective_request"])
    for name, model in requests.items():
        example = example_of(name, model)
        check_example(model, example)
        operation = schema["paths"][f"/v1/{name}"]["post"]
        operation["responses"]["200"]["content"]["application/json"]["schema"] = answers[name]
        if name in made:
            operation["responses"]["200"]["links"] = made[name]
        operation["requestBody"] = {
            "required": any(field.is_required() for field in model.model_fields.values()),
            "content": {
                "application/json": {"schema": refs[(model, "validation")], "example": example}
            },
        }
    schema["components"]["securitySchemes"] = SECURITY_SCHEMES
    schema["security"] = [{BEARER: []}]
    return schema
