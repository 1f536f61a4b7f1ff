"""Benchmark: reads as of a moment (``projections.past``) beside the same reads now, and
beside replaying the history up to that moment (what a host without the history would do).

    python -m ops.bench.as_of [--n 100000] [--dim 128] [--reads 200]

One collective; ``--n`` experiences recorded (``--dim``-d vectors around 40 centers, a
line of content from a vocabulary of 5,000 words), and after each, three times in ten,
a change to an earlier one: an importance update, a reinforcement (4 in 10 each), an
invalidation or an archive (1 in 10 each). Applied straight to a ``Projection`` in
batches of 5,000 (the log is not what is measured here), which then holds the history.

Moments: ``recent`` (100 events before the end), ``middle`` (half way) and ``old``
(a tenth of the way: nearly every entity changed since). For each, one JSON line:

- ``build_ms``: the first read as of that moment makes the past state (the rows changed
  since, folded again from the history; kept, and brought up to the present as events
  apply: ``after_100_more_events_ms`` after 100 more importance updates), timed
  apart; ``replay_ms``: the peer, a fresh projection applying the events 1..S;
  ``ratio_build_to_replay`` = build / replay, target <= 1 ("any moment in at most the
  time of a rebuild"); for ``recent``, target build_ms <= 50 ("milliseconds").
- per read (get, recent 20, similar k=10, text k=10, stats, and in SQL (``SQL``) a
  count of the experiences view and one of the collectives view): p50 as of the moment
  once built, beside p50 of the same read now, in alternating blocks
  (``ops.bench.projection.alternate``); ratio = as of / now.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from eventlog.subjects import subject_for
from ops.bench import emitter
from ops.bench.projection import alternate, pct
from projections import past, queries
from projections.engine import sql_of_projection
from projections.projection import Projection, ProjectionSettings

BATCH = 5000
# SQL as of a moment makes the tables and views the query reads (and what they read): a
# view over most of the tables, and one over one table
SQL = {
    "sql_count": "SELECT count(*), sum(applications) FROM experiences",
    "sql_collectives": "SELECT count(*) FROM collectives",
}
VOCABULARY, CLUSTERS = 5000, 40


emit = emitter("as_of")


def history(n: int, dim: int, seed: int = 7) -> list[ev.Event]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(CLUSTERS, dim))
    cid, instance = uuid7(), uuid7()
    hlc = ev.pack_hlc(int(time.time() * 1000) - 10_000_000)
    common: dict[str, Any] = {"instance_id": instance, "author_owner": "bench"}
    out: list[ev.Event] = [
        ev.CollectiveCreated(
            event_id=uuid7(),
            hlc=hlc,
            collective_id=cid,
            owner_id="bench",
            name="bench",
            embedding_dimension=dim,
            **common,
        )  # fmt: skip
    ]
    ids: list[Any] = []
    counts: dict[int, int] = {}
    for i in range(n):
        hlc += 1 << 16
        label = int(rng.integers(CLUSTERS))
        vector = (centers[label] + 0.35 * rng.normal(size=dim)).astype("<f4")
        words = " ".join(f"w{w}" for w in rng.integers(0, VOCABULARY, 12).tolist())
        ids.append(uuid7())
        out.append(
            ev.ExperienceRecorded(
                event_id=uuid7(),
                hlc=hlc,
                experience_id=ids[-1],
                collective_id=cid,
                content=f"lesson {i}: {words}",
                embedding=vector.tobytes(),
                experience_type=ev.Generic(),
                importance=float(rng.uniform()),
                confidence=0.5,
                source_agent="bench",
                **common,
            )  # fmt: skip
        )
        if rng.uniform() < 0.3:
            hlc += 1 << 16
            j = int(rng.integers(len(ids)))
            kind = rng.uniform()
            base: dict[str, Any] = {
                "event_id": uuid7(), "hlc": hlc, "experience_id": ids[j], "collective_id": cid,
            }  # fmt: skip
            if kind < 0.4:
                out.append(ev.ExperienceUpdated(**base, importance=float(rng.uniform()), **common))
            elif kind < 0.8:
                counts[j] = counts.get(j, 0) + 1
                out.append(ev.ExperienceReinforced(**base, applications=counts[j], **common))
            elif kind < 0.9:
                out.append(
                    ev.ExperienceInvalidated(
                        **base, reason="stale", valid_to_ms=ev.hlc_millis(hlc), **common
                    )
                )
            else:
                out.append(ev.ExperienceArchived(**base, **common))
    return out


def entries(events: list[ev.Event], upto: int) -> Iterator[list[LogEntry]]:
    for start in range(0, upto, BATCH):
        yield [
            LogEntry(seq=i + 1, subject=subject_for(e), event=e)
            for i, e in enumerate(events[start : min(upto, start + BATCH)], start)
        ]


def fill(directory: Path, events: list[ev.Event], upto: int) -> tuple[Projection, float]:
    """A projection of events 1..upto, and the seconds applying them took."""
    started = time.perf_counter()
    p = Projection(directory, ProjectionSettings())
    for batch in entries(events, upto):
        p.apply(batch)
    p.sync_indexes()
    p.flush()
    return p, time.perf_counter() - started


def _beside(samples: list[list[float]]) -> dict[str, float]:
    """p50 of a read now and as of a moment (milliseconds), and their ratio."""
    now, then = pct(samples[0], 50), pct(samples[1], 50)
    return {"now_p50_ms": now, "as_of_p50_ms": then, "ratio": round(then / max(now, 1e-6), 2)}


def _getter(known: list[Any]) -> Callable[[Any, int], object]:
    return lambda q, i: queries.get_experience(q, known[i % len(known)])


def _now(p: Projection, read: Callable[[Any, int], object]) -> Callable[[int], object]:
    return lambda i: read(p, i)


def _then(p: Projection, seq: int, read: Callable[[Any, int], object]) -> Callable[[int], object]:
    return lambda i: read(past.past(p, seq), i)


def _sql(p: Projection, query: str, as_of: int | None) -> Callable[[int], object]:
    return lambda i: sql(p, query, as_of)


def sql(p: Projection, query: str, as_of: int | None) -> Any:
    return sql_of_projection(p, query, 10, as_of).rows


def main(options: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="pulse-bench-as-of-"))
    try:
        events = history(options.n, options.dim)
        total = len(events)
        p, _ = fill(work / "live", events, total)
        created = events[0]
        assert isinstance(created, ev.CollectiveCreated)
        cid = created.collective_id
        rng = np.random.default_rng(3)
        recorded = [e for e in events if isinstance(e, ev.ExperienceRecorded)]
        probes = [rng.normal(size=options.dim).astype(np.float32) for _ in range(options.reads)]
        words = [f"w{w}" for w in rng.integers(0, VOCABULARY, options.reads).tolist()]
        everything = queries.ExperienceFilter(include_invalid=True, include_archived=True)
        for moment, seq in (("recent", total - 100), ("middle", total // 2), ("old", total // 10)):
            p.caches.clear()
            started = time.perf_counter()
            then = past.past(p, seq)
            build_ms = (time.perf_counter() - started) * 1000
            changed = len(then.changed_experiences) if isinstance(then, past.Past) else 0
            shutil.rmtree(work / "replay", ignore_errors=True)
            replayed, replay_s = fill(work / "replay", events, seq)
            replayed.close()
            known = [e.experience_id for e in recorded[: max(1, (seq * 3) // 4)]]
            reads: dict[str, Callable[[Any, int], object]] = {
                "get": _getter(known),
                "recent_20": lambda q, i: queries.recent_experiences(q, cid, 20),
                "similar_10": lambda q, i: queries.similar_experiences(
                    q, cid, probes[i], 10, everything
                ),
                "text_10": lambda q, i: queries.search_text(q, cid, words[i], 10, everything),
                "stats": lambda q, i: queries.collective_stats(q, cid),
            }
            figures: dict[str, Any] = {}
            for name, read in reads.items():
                count = options.reads if name not in ("stats",) else 20
                figures[name] = _beside(alternate(count, [_now(p, read), _then(p, seq, read)]))
            for name, query in SQL.items():
                figures[name] = _beside(alternate(10, [_sql(p, query, None), _sql(p, query, seq)]))
            # the present moves on by 100 updates; the past state kept for the moment is
            # brought up to it (the entities they changed folded again), not made again
            extra = [
                ev.ExperienceUpdated(
                    event_id=uuid7(),
                    instance_id=created.instance_id,
                    hlc=created.hlc,
                    experience_id=recorded[int(i)].experience_id,
                    collective_id=cid,
                    importance=0.5,
                )  # fmt: skip
                for i in rng.integers(0, len(recorded), 100)
            ]
            p.apply(
                [LogEntry(seq=p.seq + 1 + i, subject=subject_for(e), event=e)
                 for i, e in enumerate(extra)]
            )  # fmt: skip
            started = time.perf_counter()
            past.past(p, seq)
            refresh_ms = (time.perf_counter() - started) * 1000
            ratio = build_ms / (replay_s * 1000)
            target = "build_ms <= 50" if moment == "recent" else "ratio_build_to_replay <= 1"
            met = build_ms <= 50 if moment == "recent" else ratio <= 1
            emit(
                moment, experiences=options.n, events=total, as_of=seq,
                changed_since=changed, build_ms=round(build_ms, 2),
                after_100_more_events_ms=round(refresh_ms, 2),
                replay_ms=round(replay_s * 1000, 1), ratio_build_to_replay=round(ratio, 4),
                target=target, met=met, reads=figures,
            )  # fmt: skip
        p.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.as_of", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--n", type=int, default=100_000, help="experiences (100000)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (128)")
    parser.add_argument("--reads", type=int, default=200, help="reads per side (200)")
    main(parser.parse_args())
