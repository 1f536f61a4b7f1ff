"""The parts' floor: what the components a recorded experience must pass through cost
alone, per event, with no Pulse code around them.

    python -m ops.bench.parts [--n 20000] [--rows 1000] [--round 8]

``floor_cpu_per_write`` (``ops.bench.quick``) is the log's share of a write: a raw
publish of the event's bytes and its consumption back. Every write of Pulse also goes
through parts that no design with Pulse's shape can skip, each measured here on the
same record events as the quick check's (content of ~200 characters, a 384-d vector):

- ``decode``: the event's msgspec body decoded and checked (``decode_event``), as every
  host but the writer does (the writer's own events are handed back as written, so
  ``write`` leaves it out);
- ``seal``: the content sealed with a fresh AES-256-GCM key and opened again (forgetting
  reaches the disk only if each entity's content is sealed under a key of its own);
- ``duckdb``: the experience's row (ids, content, type, importance, confidence, clock,
  vector) inserted into a DuckDB table from Arrow, ``rows`` a transaction (Pulse writes
  DuckDB at most once a second: a second's rows at the quick check's rates);
- ``tantivy``: one document (id, stemmed content) added, one commit per 1,000;
- ``faiss``: the normalized vector added to a flat inner-product index, ``round`` at a
  time (the events of one of the engine's rounds under 16 callers; below the HNSW
  threshold, as the quick check's collective is).

Each part is timed by the process's CPU clock (every thread: tantivy and DuckDB use
their own). The sum is a lower bound on what Pulse's own work can cost beyond the log,
the way Pulse is configured at its leanest: Pulse indexes each text three ways (stemmed,
words, grams), keeps a key store, a fold and the tables' other rows on top. Output: one
JSON line with each part's microseconds per event, ``write`` (the writer's parts: all
but ``decode``) and ``read`` (another host's: all five, ``seal`` standing for the open).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import faiss
import numpy as np
import pyarrow as pa
import tantivy
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from eventlog import events as ev
from eventlog.codec import WireMessage, decode_event
from eventlog.ids import uuid7
from ops.bench.engine import DIM, Material

PARTS = ("decode", "seal", "duckdb", "tantivy", "faiss")
WRITER = ("seal", "duckdb", "tantivy", "faiss")
TANTIVY_COMMIT = 1000


def _cpu_us(work: Callable[[], object], n: int) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) / n * 1e6


def parts_cpu_us(
    wires: Sequence[WireMessage], rows: int = 1000, round_: int = 8
) -> dict[str, float]:
    """Microseconds of process CPU per event of each part, over ``wires`` (encoded
    ``experience.recorded`` events)."""
    n = len(wires)
    events: list[Any] = []
    figures: dict[str, float] = {}

    def decode() -> None:
        events.extend(decode_event(w.payload, w.headers) for w in wires)

    figures["decode"] = _cpu_us(decode, n)
    recorded = [e for e in events if isinstance(e, ev.ExperienceRecorded)]
    assert len(recorded) == n, "parts: every wire must be an experience.recorded event"
    contents = [e.content.encode() for e in recorded]

    def seal() -> None:
        for content in contents:
            key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
            box = AESGCM(key).encrypt(nonce, content, None)
            AESGCM(key).decrypt(nonce, box, None)

    figures["seal"] = _cpu_us(seal, n)
    vectors = np.stack([np.frombuffer(e.embedding, dtype=np.float32) for e in recorded])
    with tempfile.TemporaryDirectory(prefix="pulse-bench-parts-") as work:
        con = duckdb.connect(os.path.join(work, "parts.duckdb"))
        con.execute(
            f"CREATE TABLE experiences (experience_id UUID PRIMARY KEY, collective_id UUID, "
            f"content VARCHAR, experience_type VARCHAR, importance DOUBLE, confidence DOUBLE, "
            f"created_hlc BIGINT, embedding FLOAT[{DIM}])"
        )

        def insert() -> None:
            for start in range(0, n, rows):
                part = recorded[start : start + rows]
                staged = pa.table({  # noqa: F841  (read by DuckDB by name)
                    "experience_id": [str(e.experience_id) for e in part],
                    "collective_id": [str(e.collective_id) for e in part],
                    "content": [e.content for e in part],
                    "experience_type": [type(e.experience_type).__name__ for e in part],
                    "importance": [e.importance for e in part],
                    "confidence": [e.confidence for e in part],
                    "created_hlc": [e.hlc for e in part],
                    "embedding": pa.FixedSizeListArray.from_arrays(
                        pa.array(vectors[start : start + rows].ravel()), DIM
                    ),
                })  # fmt: skip
                con.execute("BEGIN")
                con.execute(
                    "INSERT INTO experiences SELECT experience_id::UUID, collective_id::UUID, "
                    "content, experience_type, importance, confidence, created_hlc, "
                    f"embedding::FLOAT[{DIM}] FROM staged"
                )
                con.execute("COMMIT")

        figures["duckdb"] = _cpu_us(insert, n)
        con.close()

        builder = tantivy.SchemaBuilder()
        builder.add_text_field("id", stored=True, tokenizer_name="raw")
        builder.add_text_field("content", stored=False, tokenizer_name="en_stem")
        os.mkdir(os.path.join(work, "text"))
        index = tantivy.Index(builder.build(), path=os.path.join(work, "text"))
        writer = index.writer(heap_size=64_000_000, num_threads=1)

        def text() -> None:
            for i, e in enumerate(recorded, 1):
                writer.add_document(tantivy.Document(id=str(e.experience_id), content=e.content))
                if i % TANTIVY_COMMIT == 0 or i == n:
                    writer.commit()

        figures["tantivy"] = _cpu_us(text, n)

    flat = faiss.IndexIDMap(faiss.IndexFlatIP(DIM))

    def vectors_added() -> None:
        for start in range(0, n, round_):
            part = np.ascontiguousarray(vectors[start : start + round_])
            faiss.normalize_L2(part)
            flat.add_with_ids(part, np.arange(start, start + len(part), dtype=np.int64))

    figures["faiss"] = _cpu_us(vectors_added, n)
    figures["write"] = sum(figures[p] for p in WRITER)
    figures["read"] = sum(figures[p] for p in PARTS)
    return {k: round(v, 1) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="record events (20,000)")
    parser.add_argument("--rows", type=int, default=1000, help="DuckDB rows a transaction (1,000)")
    parser.add_argument("--round", type=int, default=8, help="vectors added at a time (8)")
    options = parser.parse_args()
    for name in ("n", "rows", "round"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}: at least 1")
    wires = Material().recorded(uuid7(), options.n)
    figures = parts_cpu_us(wires, options.rows, options.round)
    print(json.dumps({"figure": "parts_cpu_us", "n": options.n, **figures}))


if __name__ == "__main__":
    main()
