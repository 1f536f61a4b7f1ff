"""The result of ``POST /v1/sql`` as a table in Arrow IPC (stream format) or Parquet, for
pandas, Polars or DuckDB to read without parsing text: ``pyarrow.ipc.open_stream(body)``,
``pandas.read_parquet(io.BytesIO(body))``.

The columns are typed from the values of the answer (``SqlResult``: UUIDs and times as
text, vectors as their sizes, as in its JSON); a column holding values of different
types is text. ``seq``, ``truncated`` and ``truncated_by`` travel in the schema's
metadata, as ``pulse.seq`` and so on.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from projections.analytics import SqlResult

if TYPE_CHECKING:
    import pyarrow as pa

MEDIA_TYPES = {
    "arrow": "application/vnd.apache.arrow.stream",
    "parquet": "application/vnd.apache.parquet",
}


def asked(accept: str) -> str:
    """The form an Accept header asks for: "arrow" or "parquet" when it names one of
    their media types (the first named wins), else "json"."""
    for part in accept.split(","):
        media_type = part.split(";")[0].strip().lower()
        for form, known in MEDIA_TYPES.items():
            if media_type == known:
                return form
    return "json"


def table(result: SqlResult) -> pa.Table:
    import pyarrow as pa  # (imported when a table is asked for: `pulse mcp` never needs it)

    arrays = []
    for i in range(len(result.columns)):
        values = [row[i] for row in result.rows]
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # (2**64: HUGEINT)
            arrays.append(pa.array([None if v is None else str(v) for v in values], pa.string()))
    metadata = {
        "pulse.seq": str(result.seq),
        "pulse.truncated": str(result.truncated).lower(),
        "pulse.truncated_by": result.truncated_by or "",
    }
    schema = pa.schema(
        [pa.field(name, array.type) for name, array in zip(result.columns, arrays, strict=True)],
        metadata=metadata,
    )
    return pa.Table.from_arrays(arrays, schema=schema)


def encode(result: Any, form: str) -> bytes:
    """``result`` (a ``SqlResult``) in ``form``: "arrow" or "parquet"."""
    import pyarrow.ipc
    import pyarrow.parquet

    found = table(result)
    sink = io.BytesIO()
    if form == "arrow":
        with pyarrow.ipc.new_stream(sink, found.schema) as writer:
            writer.write_table(found)
    else:
        pyarrow.parquet.write_table(found, sink)
    return sink.getvalue()
