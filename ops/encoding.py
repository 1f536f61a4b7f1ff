"""Results as JSON for people and other languages: UUIDs as text, embeddings either left
out (replaced by their ``dimension``) or as lists of floats."""

from __future__ import annotations

from typing import Any

import msgspec

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
