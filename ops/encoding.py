"""Results as JSON for people and other languages: UUIDs as text, embeddings either left
out (replaced by their ``dimension``) or as lists of floats.

``to_json`` makes the JSON-ready builtins of a result; ``json_bytes`` writes the same JSON
in one pass with msgspec (what ``pulse up`` answers): only the structs that can hold an
embedding are converted in Python, each into a view struct of the same fields
(``_view``) or else a dict; everything else is encoded as it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import msgspec
import msgspec.inspect as mi

from eventlog.events import unpack_vector


def to_json(value: Any, *, embeddings: bool = False) -> Any:
    """JSON-ready builtins of any API result."""
    return _strip(msgspec.to_builtins(value, builtin_types=(bytes,)), embeddings)


def _strip(data: Any, embeddings: bool) -> Any:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, item in data.items():
            if isinstance(item, bytes):
                if embeddings:
                    out[key] = [float(x) for x in unpack_vector(item)]
                else:
                    out["dimension"] = len(item) // 4
            else:
                out[key] = _strip(item, embeddings)
        return out
    if isinstance(data, list):
        return [_strip(x, embeddings) for x in data]
    return data


_encoder = msgspec.json.Encoder()


def json_bytes(value: Any, *, embeddings: bool = False) -> bytes:
    """The JSON of ``to_json(value, embeddings=...)`` as UTF-8, written by msgspec without
    the builtins in between (a float JSON cannot carry, NaN or infinite, is null)."""
    return _encoder.encode(_ready(value, embeddings))


# -- what of a result must be taken apart before msgspec encodes it ---------------------------

_PLAIN = (str, int, float, bool, type(None), UUID)
_SAFE_LEAVES = (
    mi.StrType, mi.IntType, mi.FloatType, mi.BoolType, mi.NoneType, mi.UUIDType,
    mi.DateTimeType, mi.DateType, mi.TimeType, mi.TimeDeltaType, mi.DecimalType,
    mi.LiteralType, mi.EnumType,
)  # fmt: skip

# a struct type's plan: None (nothing in it can be an embedding: encoded as it is), or its
# tag (field, value; or None) and its fields (encoded name, index, whether its type says it
# cannot hold bytes); _WHOLE: to_builtins and _strip (a layout this does not take apart)
_WHOLE = object()
_plans: dict[type, Any] = {}


def _safe(kind: mi.Type, seen: set[type]) -> bool:
    """Whether a value of this (msgspec.inspect) type can never hold bytes."""
    if isinstance(kind, _SAFE_LEAVES):
        return True
    if isinstance(kind, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        return _safe(kind.item_type, seen)
    if isinstance(kind, mi.TupleType):
        return all(_safe(item, seen) for item in kind.item_types)
    if isinstance(kind, mi.DictType):
        return _safe(kind.key_type, seen) and _safe(kind.value_type, seen)
    if isinstance(kind, mi.UnionType):
        return all(_safe(item, seen) for item in kind.types)
    if isinstance(kind, mi.StructType):
        if kind.cls in seen:
            return True  # (a recursive type: decided where it began)
        seen.add(kind.cls)
        return all(_safe(field.type, seen) for field in kind.fields)
    return False  # bytes, Any, and anything this does not know


def _plan(cls: type) -> Any:
    try:
        info = mi.type_info(cls)
    except Exception:  # (a type msgspec cannot inspect: take it apart at run time)
        info = None
    if isinstance(info, mi.StructType):
        if _safe(info, set()):
            return None
        if info.array_like or _omits(cls):
            return _WHOLE
        fields = tuple(
            (field.encode_name, index, _safe(field.type, set()))
            for index, field in enumerate(info.fields)
        )
        # (msgspec.inspect orders fields as the struct does; astuple too)
        return ((info.tag_field, info.tag) if info.tag_field else None), fields
    return _WHOLE


def _omits(cls: type) -> bool:
    """Whether a struct type leaves out fields at their defaults (``omit_defaults``)."""
    return bool(getattr(cls, "__struct_config__").omit_defaults)  # noqa: B009


def _ready(value: Any, embeddings: bool) -> Any:
    """``value`` with every embedding (bytes in a struct's field or a dict's value) made
    what ``to_json`` makes of it, ready for msgspec."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, msgspec.Struct):
        cls = type(value)
        try:
            plan = _plans[cls]
        except KeyError:
            plan = _plans[cls] = _plan(cls)
        if plan is None:
            return value
        if plan is _WHOLE:
            return _strip(msgspec.to_builtins(value, builtin_types=(bytes,)), embeddings)
        view = _views.get((cls, embeddings), _UNMADE)
        if view is _UNMADE:
            view = _views[cls, embeddings] = None  # (a recursive type: taken apart below)
            view = _views[cls, embeddings] = _view(cls, embeddings)
        if view is not None:
            made = view(value)
            if made is not None:
                return made
        tag, fields = plan
        out: dict[str, Any] = {tag[0]: tag[1]} if tag else {}
        items = msgspec.structs.astuple(value)
        for name, index, safe in fields:
            item = items[index]
            if safe:
                out[name] = item
            else:
                _put(out, name, item, embeddings)
        return out
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            _put(out, key, item, embeddings)
        return out
    if isinstance(value, (list, tuple)):
        return [_ready(item, embeddings) for item in value]
    return value


# -- views: a struct with an embedding written as a struct of its own -------------------------

# (struct type, embeddings) -> its view (``_view``), or None: taken apart into a dict
_views: dict[tuple[type, bool], Any] = {}
_UNMADE = object()


def _view(cls: type, embeddings: bool) -> Callable[[Any], Any] | None:
    """How to write a plain struct type (untagged, all fields written) that holds an
    embedding in C rather than a dict made field by field: a struct type of the same
    fields in the same order, the embedding's as ``_put`` writes it (``dimension``, or the
    list of floats), filled from the original's values with only the fields that hold an
    embedding (bytes, a struct or a list of structs that do) converted. The view of a
    value returns None where a value is not of its type's declared shape (then the
    struct is taken apart as before); None for a type this does not cover."""
    info = mi.type_info(cls)
    if not isinstance(info, mi.StructType) or info.array_like or info.tag_field or _omits(cls):
        return None
    names: list[str] = []
    bytes_at: list[int] = []
    steps: list[tuple[int, type, Callable[[Any], Any]]] = []
    for index, field in enumerate(info.fields):
        kind, name = field.type, field.encode_name
        if isinstance(kind, mi.BytesType):
            bytes_at.append(index)
            if not embeddings:
                name = "dimension"
        elif isinstance(kind, mi.StructType):
            sub = _views.get((kind.cls, embeddings), _UNMADE)
            if sub is _UNMADE:
                _views[kind.cls, embeddings] = None  # (a recursive type: not a view)
                sub = _views[kind.cls, embeddings] = _view(kind.cls, embeddings)
            if sub is None:
                if not _safe(kind, set()):
                    return None
            else:
                steps.append((index, kind.cls, sub))
        elif not _safe(kind, set()):
            return None
        names.append(name)
    if len(set(names)) != len(names) or not (bytes_at or steps):
        return None
    view = msgspec.defstruct(
        f"{cls.__name__}View", [f"f{i}" for i in range(len(names))],
        rename=dict(zip([f"f{i}" for i in range(len(names))], names, strict=True)),
    )  # fmt: skip

    def write(value: Any) -> Any:
        values = list(msgspec.structs.astuple(value))
        for index in bytes_at:
            item = values[index]
            if type(item) is not bytes:
                return None
            values[index] = unpack_vector(item).tolist() if embeddings else len(item) // 4
        for index, kind, sub in steps:
            item = values[index]
            if type(item) is not kind:
                return None
            made = sub(item)
            if made is None:
                return None
            values[index] = made
        return view(*values)

    return write


def _put(out: dict[Any, Any], key: Any, item: Any, embeddings: bool) -> None:
    if isinstance(item, bytes):  # an embedding: as _strip makes it
        if embeddings:
            out[key] = unpack_vector(item).tolist()
        else:
            out["dimension"] = len(item) // 4
    else:
        out[key] = _ready(item, embeddings)
