"""The request models of the API: each operation's arguments as one flat pydantic object
model, with the limits of the data model, as the HTTP service reads a request body and
as its OpenAPI schema states it (``sync.api`` holds one per operation).

Most operations take exactly one of the library's input models (``INPUT_MODELS``, plus
``idempotency_key`` for a write); the others get a model derived from the signature of
their implementation (``derived_model``), each parameter annotated with the constraints
the library checks (``PARAMETERS``, ``METHOD_PARAMETERS``), since a signature says
``int`` where the library takes 1..1000. The constraints live here, below the service,
so that the declaration of the API (``sync.api``) is complete without ``ops/``.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Union
from uuid import UUID

import numpy as np
import pydantic
from pydantic import Field, StringConstraints, WithJsonSchema

from eventlog import events as ev
from eventlog.limits import (
    EMBEDDER_NAME_MAX,
    REASON_MAX_BYTES,
    TASK_MAX_BYTES,
    TOKEN_COLLECTIVES_MAX,
)
from projections import naming
from sync import models
from sync.tokens import EXPIRES_MAX_S

# Text with something in it besides white space, in the exact sense of str.strip (spelled
# out: "\S" means other characters in Python, JavaScript and the Rust regex pydantic uses)
_SPACES = "".join(f"\\u{ord(c):04x}" for c in map(chr, range(0x3001)) if c.isspace())
NON_BLANK = f"[^{_SPACES}]"


def stated(base: Any, schema: dict[str, Any]) -> Any:
    """``base`` (a strict JSON type at the edge) whose limits the library checks itself,
    with its own message (``limit: must be an integer in 1..1000 (items per page)``):
    the schema states them, and the contract test holds the two to each other."""
    return Annotated[base, WithJsonSchema(schema)]


def _integer(low: int, high: int | None = None) -> Any:
    schema: dict[str, Any] = {"type": "integer", "minimum": low}
    if high is not None:
        schema["maximum"] = high
    return stated(int, schema)


NAME = stated(str, {"type": "string", "minLength": 1, "maxLength": models.NAME_MAX})
FRACTION = stated(float, {"type": "number", "minimum": 0, "maximum": 1})
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Weight = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Query = Annotated[str, StringConstraints(min_length=1, max_length=10_000)]

# a parameter's annotation by name, where the signature's says less than the library checks
PARAMETERS: dict[str, Any] = {
    "owner_id": NAME,
    "agent_id": NAME,
    "k": _integer(1, models.K_MAX),
    "limit": _integer(1, models.PAGE_MAX),
    "offset": _integer(0),
    "after": stated(
        str,
        {
            "type": "string",
            "minLength": 1,
            "maxLength": 1000,
            "description": "the `next` of the page before (a cursor of this listing; 422 "
            "otherwise)",
        },
    ),
    "text": stated(str, {"type": "string", "maxLength": 10_000, "pattern": NON_BLANK}),
    "threshold": FRACTION,
    "min_strength": FRACTION,
    "stale_after": stated(float, {"type": "number", "exclusiveMinimum": 0}),
    "expires_in": stated(
        float, {"type": "number", "exclusiveMinimum": 0, "maximum": EXPIRES_MAX_S}
    ),
    "relation_types": stated(
        list[str],
        {"type": "array", "items": {"enum": list(typing.get_args(ev.RelationType))}},
    ),
    # ... and where the library has no check of its own, or the same pydantic one
    "reason": Annotated[str, models._utf8_limit(REASON_MAX_BYTES)],
    "energy_weight": models.Score,
    "vector_weight": Weight,
    "text_weight": Weight,
    "timeout": Seconds,
    "task_description": Annotated[str, models._utf8_limit(TASK_MAX_BYTES, allow_empty=True)],
    "working_on": Annotated[
        list[
            Annotated[str, StringConstraints(min_length=1, max_length=models.WORKING_ON_ITEM_MAX)]
        ],
        Field(max_length=models.WORKING_ON_MAX),
    ],
    "embedder": Annotated[str, StringConstraints(min_length=1, max_length=EMBEDDER_NAME_MAX)],
    "at": models.Moment,
    # threads (sync.threads): a framework's names, ids and tasks, as bytes of UTF-8
    "thread": models.ThreadName,
    "source": models.ThreadName,
    "target": models.ThreadName,
    "checkpoint_id": models.ThreadPart,
    "before": models.ThreadPart,
    "checkpoint_ns": models.Namespace,
    "threads": Annotated[
        list[models.ThreadName], Field(min_length=1, max_length=models.THREAD_NAMES_MAX)
    ],
    "run_ids": Annotated[
        list[models.ThreadPart], Field(min_length=1, max_length=models.THREAD_NAMES_MAX)
    ],
}
# ... and where one method's parameter differs from the others of its name
METHOD_PARAMETERS: dict[tuple[str, str], Any] = {
    # a listing's filter: any text (one no owner has matches nothing)
    ("list_collectives", "owner_id"): str,
    ("list_tokens", "owner_id"): str,
    # where an owner or a collective name is made: without "/" (projections.naming)
    ("create_collective", "owner_id"): stated(str, models.OWN_NAME_SCHEMA),
    ("create_collective", "name"): stated(str, models.OWN_NAME_SCHEMA),
    ("create_token", "owner_id"): stated(str, models.OWN_NAME_SCHEMA),
    ("store_wisdom", "owner_id"): stated(str, models.OWN_NAME_SCHEMA),
    ("find_collective", "collective"): stated(
        str,
        {
            "type": "string",
            "minLength": 1,
            "maxLength": naming.REFERENCE_MAX,
            "pattern": naming.REFERENCE_PATTERN,
            "description": "a collective id, a name of the caller's owner, or owner/name",
        },
    ),
    ("sql", "query"): stated(str, {"type": "string", "pattern": NON_BLANK}),
    ("sql", "limit"): _integer(1, 1_000_000),
    ("search_similar", "query"): Query | models.VectorField,
    ("get_insights", "query"): Query | models.VectorField,
    ("get_wisdom", "query"): models.VectorField,
    ("create_token", "collectives"): stated(
        list[UUID],
        {
            "type": "array",
            "items": {"type": "string", "format": "uuid"},
            "maxItems": TOKEN_COLLECTIVES_MAX,
        },
    ),
    ("follow", "collectives"): stated(
        list[str],
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "string",
                "minLength": 1,
                "maxLength": models.NAME_MAX,
                "pattern": NON_BLANK,
                "x-max-bytes": models.NAME_MAX,
                "description": "a collective id, name or owner:<owner id> (at most 256 "
                "bytes of UTF-8)",
            },
        },
    ),
}


def parameter(method: str, name: str, annotation: Any) -> Any:
    """The annotation of ``method``'s parameter ``name`` in its request model: the
    constrained one of the tables above, optional where the signature's is."""
    given = METHOD_PARAMETERS.get((method, name), PARAMETERS.get(name))
    if given is None:
        return annotation
    optional = type(None) in typing.get_args(annotation)
    return given | None if optional else given


# "at least one of": an update must change something (the library refuses an empty one)
AT_LEAST_ONE: dict[str, tuple[str, ...]] = {
    "update_experience": ("importance", "confidence", "domain", "related_files"),
    "update_session": models.SESSION_FIELDS,
}


def at_least_one(fields: tuple[str, ...]) -> dict[str, Any]:
    """The JSON Schema of "one of ``fields`` is given, and not null"."""
    return {
        "anyOf": [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in fields
        ]
    }


# The idempotency key over HTTP: printable ASCII, a pattern every JSON Schema validator
# reads alike (the library takes any printable text, a test no regex dialect shares)
IdempotencyKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=models.IDEMPOTENCY_KEY_MAX, pattern=r"^[ -~]*$"),
    Field(
        description="makes the call idempotent: a retry with the same key and arguments "
        "returns the first call's result and stores nothing new; the same key with other "
        "arguments is a ConflictError (409). Printable ASCII, e.g. a UUID made per call."
    ),
]


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
    "put_checkpoint": models.CheckpointIn,
    "put_pending_writes": models.PendingWritesIn,
}


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
        annotation = parameter(name, param.name, _schema_type(hints.get(param.name, Any)))
        if param.name == "flt":
            annotation = models.FilterIn | None
        if param.name == "idempotency_key":
            annotation = IdempotencyKey | None
        if param.name == "as_of":  # (get_type_hints drops its validator)
            annotation = models.AsOf
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    base = models.ExperienceUpdateIn if name == "update_experience" else models._Input
    model: type[pydantic.BaseModel] = pydantic.create_model(
        f"{name}_request", __base__=_based(name, base), **fields
    )
    return model


# What one field requires of another, as a condition (``if``/``then``), not as shapes of
# the body: a generated client reads an object whose schema is an anyOf of shapes as a
# union, and loses its fields. A collective without an embedder needs its dimension
# (``models.CollectiveIn``'s validator says so to a caller).
CONDITIONS: dict[str, dict[str, Any]] = {
    "create_collective": {
        "if": {"properties": {"embedder": {"type": "null"}}},
        "then": {
            "required": ["embedding_dimension"],
            "properties": {"embedding_dimension": {"type": "integer"}},
        },
    },
}


def _based(name: str, base: type[pydantic.BaseModel]) -> type[pydantic.BaseModel]:
    """``base``, or a subclass whose schema says more (an update's "at least one of", a
    condition between fields)."""
    fields, condition = AT_LEAST_ONE.get(name), CONDITIONS.get(name)
    if fields is None and condition is None:
        return base
    extra = {**(at_least_one(fields) if fields else {}), **(condition or {})}
    config = pydantic.ConfigDict(json_schema_extra=extra)
    return type(base.__name__, (base,), {"model_config": config, "__module__": __name__})


def request_model(name: str, implementation: Callable[..., Any]) -> type[pydantic.BaseModel]:
    """The request model of operation ``name`` implemented by ``implementation`` (a
    method: its first parameter is its object's)."""
    given = INPUT_MODELS.get(name)
    if given is None:
        return derived_model(name, implementation)
    if "idempotency_key" in inspect.signature(implementation).parameters:
        # a write: its library model plus the key (sync.idempotency)
        keyed: type[pydantic.BaseModel] = pydantic.create_model(
            f"{name}_request", __base__=_based(name, given),
            idempotency_key=(IdempotencyKey | None, None),
        )  # fmt: skip
        return keyed
    return given
