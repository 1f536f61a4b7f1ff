"""Benchmark: no silent regressions (issue 28, target 5). The key ratios of the write
tail, the HTTP tax and the writes against the raw log, at small sizes (well under 45 s
on a 2-core machine), each beside its peer in the same run, compared with a committed
baseline.

    python -m ops.bench.quick [--baseline PATH] [--write-baseline] [--strict]
                              [--size X] [--from OUTPUT ...]

Two phases, each reusing the code of a full benchmark:

- writes (``ops.bench.engine``): one embedded NATS server (``sync_interval: always``)
  serves an instance A and the raw nats-py peer, which publishes the same kind of
  encoded events on a stream of its own. ``record_experience`` calls with content and a
  384-d vector from one caller (latency of each: p50, p99 and p99/p50, beside the raw
  publishes' latencies; and the rate), then from 16 callers (the rate and the process
  CPU per write), ``reinforce_experience`` from 16 callers (the same), rounds of Pulse
  and peer alternating; then the convergence lag A -> B beside publish -> consumer.
  First, the floor of any design fed by the log (``floor_cpu_per_write``): the raw
  peer's acknowledged publishes of record events, each also consumed back through a
  JetStream consumer on the same connection (what every projection of the log pays),
  CPU per message over a raw publish's alone: the share of ``cpu_per_record``'s bound
  the log itself takes. Then ``parts_cpu_per_write``: that floor plus what the parts a
  record must pass through cost alone (``ops.bench.parts``: sealing, a DuckDB row, a
  tantivy document, a vector added), over a raw publish: the least any design with
  Pulse's parts could reach.
- HTTP (``ops.bench.service``): a collective of ``hash``-embedder experiences, ``pulse
  up`` on it in its own process, sequential calls over ONE keep-alive connection
  (``http.client``): ``record_experience`` with a 384-d vector, ``search_similar`` with a
  vector and ``search_text`` with three words (k=10); then the service is stopped, the
  same data directory opened in this process and the same calls made in-process.

Every figure is a single number and says which way is better (``better``: ``higher``
for a rate ratio, ``lower`` for a latency ratio, a CPU ratio or milliseconds) and, where
issue 28 sets one, its ``target``. Output: one JSON line per figure (its value, the
details it comes from, the baseline's value and ``worse_by``), then a ``summary`` line,
and a readable summary on stderr listing every figure more than 15% worse than the
baseline. ``worse_by`` is the change from the baseline as a fraction of it, signed so
that positive is worse: 0.2 is a latency 1.2x the baseline's or a rate 0.8x of it.

The exit status is 0 either way, unless ``--strict``: then 1 when a figure is more than
15% worse or a baseline figure was not measured. ``--write-baseline`` writes the figures
to the baseline file (after comparing them with the old one); ``--from`` takes the
figures from earlier outputs of this command (saved JSON lines), the median of each
figure over them, instead of measuring: three saved runs and ``--from run1 run2 run3
--write-baseline`` make a baseline from their medians. Update the baseline on purpose
only, and say why in the commit that changes it.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit
from uuid import UUID

import numpy as np
from nats.js import JetStreamContext, api

from eventlog import EmbeddedNats
from eventlog.codec import WireMessage
from eventlog.ids import uuid7
from ops.bench import emitter
from ops.bench.engine import (
    CALLERS,
    DIM,
    RAW_PREFIX,
    Material,
    Rates,
    Vectors,
    beside_raw,
    convergence_lags,
    hot_experiences,
    measure_rates,
    publish_all,
    pulse_records,
    pulse_reinforcements,
    raw_records,
    raw_reinforcements,
    sig,
    split,
)
from ops.bench.parts import parts_cpu_us
from ops.bench.service import OPERATOR, append, corpus, start_service, stop_service, words
from sync import PulseDB

BASELINE = Path(__file__).with_name("baseline.json")
TOLERANCE = 0.15  # a figure this much worse than the baseline is reported

Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class Spec:
    """What a figure means: which way is better, and issue 28's bound for it if any (a
    ceiling when lower is better, a floor when higher is)."""

    better: Better
    target: float | None
    what: str


SPECS: dict[str, Spec] = {
    "floor_cpu_per_write": Spec(
        "lower",
        None,
        "CPU per raw publish of a record's bytes consumed back through a JetStream "
        "consumer on the same connection (16 callers) / per raw publish",
    ),
    "parts_cpu_per_write": Spec(
        "lower",
        None,
        "floor_cpu_per_write's CPU plus that of the parts a record must pass through alone "
        "(a content sealed, a DuckDB row, a tantivy document, a vector added: "
        "ops.bench.parts) / per raw publish",
    ),
    "record_p50_vs_raw": Spec(
        "lower", None, "in-process record_experience (384-d), 1 caller: p50 / raw publish p50"
    ),
    "record_p99_vs_raw": Spec(
        "lower", None, "in-process record_experience (384-d), 1 caller: p99 / raw publish p99"
    ),
    "record_p99_over_p50": Spec(
        "lower", 3.0, "in-process record_experience (384-d), 1 caller: its p99 / its p50"
    ),
    "writes_1_caller_record": Spec(
        "higher", 0.6, "acknowledged record_experience/s, 1 caller / raw publishes/s"
    ),
    "writes_16_callers_record": Spec(
        "higher", 0.7, "acknowledged record_experience/s, 16 callers / raw publishes/s"
    ),
    "cpu_per_record": Spec(
        "lower", 2.5, "process CPU per record_experience (16 callers) / per raw publish"
    ),
    "writes_16_callers_reinforce": Spec(
        "higher", 0.7, "acknowledged reinforce_experience/s, 16 callers / raw publishes/s"
    ),
    "cpu_per_reinforce": Spec(
        "lower", 2.5, "process CPU per reinforce_experience (16 callers) / per raw publish"
    ),
    "convergence_p50_vs_raw": Spec(
        "lower", 3.0, "A's write until B's watch yields it, p50 / publish -> consumer p50"
    ),
    "convergence_p99_ms": Spec("lower", 10.0, "A's write until B's watch yields it, p99 (ms)"),
    "http_record_p50_vs_in_process": Spec(
        "lower", 1.3, "record_experience (384-d) over HTTP, p50 / in-process p50"
    ),
    "http_record_p99_vs_in_process": Spec(
        "lower", None, "record_experience (384-d) over HTTP, p99 / in-process p99"
    ),
    "http_record_p99_over_p50": Spec(
        "lower", 3.0, "record_experience (384-d) over HTTP: its p99 / its p50"
    ),
    "http_similar_p50_vs_in_process": Spec(
        "lower", 1.3, "search_similar (384-d vector, k=10) over HTTP, p50 / in-process p50"
    ),
    "http_text_p50_vs_in_process": Spec(
        "lower", 1.3, "search_text (three words, k=10) over HTTP, p50 / in-process p50"
    ),
}


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    better: Better
    target: float | None = None
    detail: Mapping[str, object] = field(default_factory=dict)

    @property
    def met(self) -> bool | None:
        """Whether the figure meets its target (None: it has none)."""
        if self.target is None:
            return None
        return self.value <= self.target if self.better == "lower" else self.value >= self.target


def figure(name: str, value: float, **detail: object) -> Figure:
    """A measured figure, its direction and target from ``SPECS``."""
    spec = SPECS[name]
    return Figure(name, sig(value), spec.better, spec.target, detail)


# -- the comparison ----------------------------------------------------------------------------


def worse_by(value: float, baseline: float, better: Better) -> float:
    """How much worse ``value`` is than ``baseline``, as a fraction of the baseline:
    0.2 is 20% worse (a lower-is-better figure 1.2x the baseline's, a higher-is-better
    one 0.8x of it); negative is better."""
    if baseline == 0:
        if value == 0:
            return 0.0
        return math.inf if (value > 0) == (better == "lower") else -math.inf
    change = (value - baseline) / abs(baseline)
    return change if better == "lower" else -change


@dataclass(frozen=True)
class Change:
    name: str
    value: float
    baseline: float
    better: Better
    worse_by: float

    def as_dict(self) -> dict[str, object]:
        return {"figure": self.name, "value": self.value, "baseline": self.baseline,
                "better": self.better, "worse_by": round(self.worse_by, 3)}  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    worse: list[Change]  # more than the tolerance worse than the baseline
    better: list[Change]  # more than the tolerance better: the baseline may be updated
    missing: list[str]  # in the baseline, not among the figures
    new: list[str]  # among the figures, not in the baseline
    tolerance: float

    @property
    def failed(self) -> bool:
        """What ``--strict`` refuses: a figure worse than the tolerance, or one gone."""
        return bool(self.worse or self.missing)


def compare(
    figures: Iterable[Figure], baseline: Mapping[str, float], tolerance: float = TOLERANCE
) -> Comparison:
    """``figures`` against the ``baseline``'s values by name, each in its own direction."""
    worse: list[Change] = []
    better: list[Change] = []
    new: list[str] = []
    seen: set[str] = set()
    for f in figures:
        seen.add(f.name)
        if f.name not in baseline:
            new.append(f.name)
            continue
        change = Change(f.name, f.value, baseline[f.name], f.better,
                        worse_by(f.value, baseline[f.name], f.better))  # fmt: skip
        if change.worse_by > tolerance:
            worse.append(change)
        elif change.worse_by < -tolerance:
            better.append(change)
    missing = [name for name in baseline if name not in seen]
    return Comparison(worse, better, missing, new, tolerance)


class BaselineError(ValueError):
    """A baseline file that cannot be read as one."""


def read_baseline(path: Path) -> dict[str, float]:
    """The figures' values of a baseline file (``{"figures": {name: {"value": x}}}``)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: cannot read a baseline ({exc})") from exc
    figures = document.get("figures") if isinstance(document, dict) else None
    if not isinstance(figures, dict):
        raise BaselineError(f'{path}: no "figures" object')
    values: dict[str, float] = {}
    for name, entry in figures.items():
        value: object = entry.get("value") if isinstance(entry, dict) else None
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise BaselineError(f"{path}: figure {name!r} has no finite value")
        values[name] = float(value)
    return values


def baseline_document(figures: Sequence[Figure], runs: int) -> dict[str, Any]:
    """What ``--write-baseline`` writes: each figure's value, direction and meaning."""
    return {
        "about": "python -m ops.bench.quick compares its figures with these; update on "
        "purpose only, with the reason in the commit that changes this file",
        "measured": {
            "runs": runs,
            "at": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
            "cpus": os.cpu_count(),
        },
        "tolerance": TOLERANCE,
        "figures": {
            f.name: {
                "value": f.value,
                "better": f.better,
                "target": f.target,
                "what": SPECS[f.name].what if f.name in SPECS else "",
            }
            for f in figures
        },
    }


def medians(lines: Iterable[str]) -> list[Figure]:
    """The figures of earlier outputs of this command (JSON lines; other lines are
    skipped), each the median of its values, in the order first seen. A figure this
    module measures takes its direction and target from ``SPECS``, any other from its
    line."""
    values: dict[str, list[float]] = {}
    first: dict[str, Figure] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("bench") != "quick":
            continue
        name, value, better = record.get("figure"), record.get("value"), record.get("better")
        if not isinstance(name, str) or not isinstance(value, (int, float)):
            continue
        if better not in ("higher", "lower"):
            continue
        values.setdefault(name, []).append(float(value))
        if name not in first:
            spec = SPECS.get(name)
            target = record.get("target") if spec is None else spec.target
            first[name] = Figure(name, float(value), better if spec is None else spec.better,
                                 target if isinstance(target, (int, float)) else None)  # fmt: skip
    return [replace(f, value=sig(float(np.median(values[f.name])))) for f in first.values()]


# -- the output --------------------------------------------------------------------------------

emit = emitter("quick")


def report(f: Figure, baseline: Mapping[str, float]) -> None:
    """One JSON line: the figure, where it stands against its target and the baseline."""
    base = baseline.get(f.name)
    emit(f.name, value=f.value, better=f.better, target=f.target, met=f.met, baseline=base,
         worse_by=None if base is None else round(worse_by(f.value, base, f.better), 3),
         **f.detail)  # fmt: skip


def summarize(comparison: Comparison, source: str) -> str:
    """The readable summary: each figure more than the tolerance worse, and what did not
    compare."""
    percent = f"{comparison.tolerance:.0%}"
    lines = []
    if comparison.worse:
        lines.append(f"{len(comparison.worse)} figure(s) more than {percent} worse than {source}:")
        for c in comparison.worse:
            lines.append(f"  {c.name}: {c.value} (baseline {c.baseline}, {c.better} is better): "
                         f"{c.worse_by:.0%} worse")  # fmt: skip
    else:
        lines.append(f"no figure more than {percent} worse than {source}")
    if comparison.missing:
        lines.append("in the baseline but not measured: " + ", ".join(comparison.missing))
    if comparison.new:
        lines.append("not in the baseline: " + ", ".join(comparison.new))
    if comparison.better:
        names = ", ".join(f"{c.name} ({-c.worse_by:.0%})" for c in comparison.better)
        lines.append(f"more than {percent} better: {names}")
    return "\n".join(lines)


# -- the measurements --------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    single: int = 150  # record_experience calls a round from one caller
    single_rounds: int = 4
    per_caller: int = 20  # calls of each of the 16 callers a round
    rounds: int = 3
    lags: int = 200  # writes of each side for the convergence lag
    experiences: int = 2000  # in the service's data directory
    http_calls: int = 300  # calls of each kind, on each side
    warm_up: int = 20

    def scaled(self, size: float) -> Sizes:
        def n(count: int, least: int = 1) -> int:
            return max(least, round(count * size))

        return Sizes(n(self.single, 5), self.single_rounds, n(self.per_caller), self.rounds,
                     n(self.lags, 5), n(self.experiences, 50), n(self.http_calls, 5),
                     n(self.warm_up, 2))  # fmt: skip


def ms(samples: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of latencies in seconds, in ms."""
    return float(np.percentile(np.asarray(samples) * 1000, p))


def latency_detail(prefix: str, samples: Sequence[float]) -> dict[str, float]:
    return {f"{prefix}_p50_ms": round(ms(samples, 50), 3),
            f"{prefix}_p99_ms": round(ms(samples, 99), 3)}  # fmt: skip


async def write_figures(sizes: Sizes, out: Callable[[Figure], None]) -> None:
    async with beside_raw("quick") as pair:
        a, js = pair.a, pair.js
        cid = await a.create_collective("bench", "quick", DIM)
        data = Material()
        await pulse_records(a, cid, data, sizes.warm_up)()()
        await raw_records(js, cid, data, sizes.warm_up)()()
        await floor_figure(js, cid, data, sizes, out)

        mine: list[float] = []
        theirs: list[float] = []
        one = await measure_rates(
            sizes.single, sizes.single_rounds,
            pulse_records(a, cid, data, sizes.single, latencies=mine),
            raw_records(js, cid, data, sizes.single, latencies=theirs),
        )  # fmt: skip
        single = {**latency_detail("pulse", mine), **latency_detail("raw", theirs),
                  "writes": len(mine)}  # fmt: skip
        out(figure("record_p50_vs_raw", ms(mine, 50) / ms(theirs, 50), **single))
        out(figure("record_p99_vs_raw", ms(mine, 99) / ms(theirs, 99), **single))
        out(figure("record_p99_over_p50", ms(mine, 99) / ms(mine, 50), **single))
        out(figure("writes_1_caller_record", one.ratio, **rate_detail(one)))

        total = sizes.per_caller * CALLERS
        records = await measure_rates(
            total, sizes.rounds, pulse_records(a, cid, data, total, CALLERS),
            raw_records(js, cid, data, total, CALLERS),
        )  # fmt: skip
        out(figure("writes_16_callers_record", records.ratio, **rate_detail(records)))
        out(figure("cpu_per_record", records.cpu_ratio, **rate_detail(records)))

        hot = await hot_experiences(a, cid, data, CALLERS)
        reinforcements = await measure_rates(
            total, sizes.rounds, pulse_reinforcements(a, hot, sizes.per_caller),
            raw_reinforcements(js, cid, data, {uuid7(): 0 for _ in hot}, sizes.per_caller),
        )  # fmt: skip
        detail = rate_detail(reinforcements)
        out(figure("writes_16_callers_reinforce", reinforcements.ratio, **detail))
        out(figure("cpu_per_reinforce", reinforcements.cpu_ratio, **detail))

        b = await PulseDB.open(pair.tmp / "b", pair.url)
        try:
            await b.sync()
            pulse_ms, raw_ms = await convergence_lags(a, b, pair.url, js, cid, data, sizes.lags)
        finally:
            await b.close()
        lags = {"pulse_p50_ms": round(float(np.median(pulse_ms)), 3),
                "pulse_p99_ms": round(float(np.percentile(pulse_ms, 99)), 3),
                "raw_p50_ms": round(float(np.median(raw_ms)), 3),
                "raw_p99_ms": round(float(np.percentile(raw_ms, 99)), 3),
                "writes": len(pulse_ms)}  # fmt: skip
        ratio = float(np.median(pulse_ms) / np.median(raw_ms))
        out(figure("convergence_p50_vs_raw", ratio, **lags))
        out(figure("convergence_p99_ms", float(np.percentile(pulse_ms, 99)), **lags))


FLOOR_PREFIX = f"{RAW_PREFIX}.floor"  # (on the raw stream: its rounds' subjects only)


async def floor_figure(
    js: JetStreamContext, cid: UUID, data: Material, sizes: Sizes,
    out: Callable[[Figure], None],
) -> None:  # fmt: skip
    """``floor_cpu_per_write``: rounds of 16 callers' acknowledged raw publishes of
    record events, each consumed back by an ordered push consumer on the publishing
    connection (a round ends when every message is acknowledged and delivered), beside
    rounds of the raw publishes alone, alternating. All of it runs on the event loop's
    thread; the figure is the first's CPU per message over the second's."""
    total = sizes.per_caller * CALLERS
    delivered = 0
    expected = 0
    arrived = asyncio.Event()

    async def on_message(msg: object) -> None:
        nonlocal delivered
        delivered += 1
        if delivered >= expected:
            arrived.set()

    sub = await js.subscribe(
        f"{FLOOR_PREFIX}.>", cb=on_message, ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.NEW,
    )  # fmt: skip

    def floor() -> Callable[[], Awaitable[None]]:
        wires = [WireMessage(f"{FLOOR_PREFIX}.{w.subject}", w.headers, w.payload)
                 for w in data.recorded(cid, total)]  # fmt: skip

        async def run() -> None:
            nonlocal expected
            expected = delivered + total
            arrived.clear()
            await asyncio.gather(*(publish_all(js, share) for share in split(wires, CALLERS)))
            async with asyncio.timeout(30):
                await arrived.wait()

        return run

    try:
        rates = await measure_rates(
            total, sizes.rounds, floor, raw_records(js, cid, data, total, CALLERS)
        )
    finally:
        await sub.unsubscribe()
    out(figure("floor_cpu_per_write", rates.cpu_ratio, **rate_detail(rates)))
    parts = parts_cpu_us(data.recorded(cid, total))
    out(figure("parts_cpu_per_write", (rates.pulse_cpu_us + parts["write"]) / rates.raw_cpu_us,
               floor_cpu_us=round(rates.pulse_cpu_us), raw_cpu_us=round(rates.raw_cpu_us),
               parts_cpu_us=parts))  # fmt: skip


def rate_detail(r: Rates) -> dict[str, object]:
    return {"calls": r.calls, "rounds": r.rounds, "pulse_per_s": round(r.pulse_per_s, 1),
            "raw_per_s": round(r.raw_per_s, 1), "pulse_cpu_us": round(r.pulse_cpu_us),
            "raw_cpu_us": round(r.raw_cpu_us)}  # fmt: skip


@dataclass(frozen=True)
class Calls:
    """The three kinds of call of the HTTP phase, ``n`` of each (plus the warm-up's)."""

    cid: str
    contents: list[str]
    vectors: Vectors
    queries: Vectors
    texts: list[str]

    @classmethod
    def make(cls, cid: str, n: int, rng: np.random.Generator) -> Calls:
        def unit(count: int) -> Vectors:
            v = rng.normal(size=(count, DIM))
            return np.asarray(v / np.linalg.norm(v, axis=1, keepdims=True), dtype=np.float32)

        return cls(cid, [words(rng, 12) for _ in range(n)], unit(n), unit(n),
                   [words(rng, 3) for _ in range(n)])  # fmt: skip

    def bodies(self) -> dict[str, list[bytes]]:
        """The JSON bodies of each route, encoded before any clock starts."""
        cid = self.cid
        return {
            "/v1/search_similar": [
                json.dumps(
                    {"collective_id": cid, "query": q.tolist(), "k": 10, "embedder": "hash"}
                ).encode()
                for q in self.queries
            ],
            "/v1/search_text": [
                json.dumps({"collective_id": cid, "text": t, "k": 10}).encode() for t in self.texts
            ],
            "/v1/record_experience": [
                json.dumps(
                    {
                        "collective_id": cid,
                        "content": c,
                        "embedding": v.tolist(),
                        "embedder": "hash",
                    }
                ).encode()
                for c, v in zip(self.contents, self.vectors, strict=True)
            ],
        }


KINDS = ("similar", "text", "record")  # the searches first, before any write of this phase
BLOCK = 25  # calls of one kind on one side before the other side's turn


class Connection:
    """One keep-alive HTTP/1.1 connection to the service (``http.client``: the least
    client time per call), used from one thread at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.http = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        self.headers = {**OPERATOR, "Content-Type": "application/json"}

    def calls(self, route: str, bodies: Sequence[bytes]) -> list[float]:
        """``bodies`` posted to ``route`` one after the other; each call's latency (s)."""
        latencies = []
        for body in bodies:
            started = time.perf_counter()
            self.http.request("POST", route, body=body, headers=self.headers)
            response = self.http.getresponse()
            answer = response.read()
            latencies.append(time.perf_counter() - started)
            if response.status != 200:
                raise RuntimeError(f"{route}: {response.status} {answer[:300]!r}")
        return latencies


ROUTES = {"similar": "/v1/search_similar", "text": "/v1/search_text",
          "record": "/v1/record_experience"}  # fmt: skip


async def alternate_http(
    connection: Connection, db: PulseDB, remote: Calls, local: Calls, warm_up: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each kind of call over HTTP and in-process, in alternating blocks of ``BLOCK``
    calls (HTTP first in every other block): the latencies (s) of each kind and side
    after the first ``warm_up`` calls. The HTTP calls run on a worker thread, so this
    process's instance keeps folding (the service's writes too) meanwhile, as the
    service folds this instance's."""
    cid = UUID(local.cid)
    bodies = remote.bodies()
    local_calls: dict[str, Callable[[int], Awaitable[object]]] = {
        "similar": lambda i: db.search_similar(cid, local.queries[i], k=10, embedder="hash"),
        "text": lambda i: db.search_text(cid, local.texts[i], k=10),
        "record": lambda i: db.record_experience(
            cid, local.contents[i], local.vectors[i], embedder="hash"
        ),
    }
    http_ms: dict[str, list[float]] = {}
    local_ms: dict[str, list[float]] = {}
    n = len(local.texts)
    for kind in KINDS:
        route, call = ROUTES[kind], local_calls[kind]
        remote_latencies: list[float] = []
        local_latencies: list[float] = []
        for block, start in enumerate(range(0, n, BLOCK)):
            end = min(n, start + BLOCK)
            for side in ("http", "local") if block % 2 == 0 else ("local", "http"):
                if side == "http":
                    remote_latencies += await asyncio.to_thread(
                        connection.calls, route, bodies[route][start:end]
                    )
                    continue
                for i in range(start, end):
                    started = time.perf_counter()
                    await call(i)
                    local_latencies.append(time.perf_counter() - started)
        http_ms[kind], local_ms[kind] = remote_latencies[warm_up:], local_latencies[warm_up:]
    return http_ms, local_ms


async def http_phase(sizes: Sizes) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``pulse up`` and an instance in this process on one NATS server holding a corpus
    of ``hash``-embedder experiences, each with a data directory of its own; the calls
    of ``alternate_http``."""
    rng = np.random.default_rng(28)
    with (
        tempfile.TemporaryDirectory(prefix="pulse-bench-quick-http-") as tmp,
        EmbeddedNats(Path(tmp) / "nats") as server,
    ):
        collective, events = corpus(sizes.experiences, rng)
        await append(server.url, events)
        del events
        n = sizes.warm_up + sizes.http_calls
        remote, local = Calls.make(str(collective), n, rng), Calls.make(str(collective), n, rng)
        async with AsyncExitStack() as stack:
            # the service starts (and catches up) while this instance opens
            starting = asyncio.create_task(
                asyncio.to_thread(start_service, Path(tmp) / "service", server.url)
            )
            stack.push_async_callback(stop_when_started, starting)
            db = await PulseDB.open(Path(tmp) / "local", server.url)
            stack.push_async_callback(db.close)
            process, url = await starting
            connection = Connection(url)
            stack.callback(connection.http.close)
            await db.sync()
            return await alternate_http(connection, db, remote, local, sizes.warm_up)


async def stop_when_started(starting: asyncio.Task[tuple[subprocess.Popen[str], str]]) -> None:
    try:
        process, _ = await starting
    except Exception:  # it did not start: nothing to stop (its error is raised elsewhere)
        return
    await asyncio.to_thread(stop_service, process)


def http_figures(sizes: Sizes, out: Callable[[Figure], None]) -> None:
    http, mine = asyncio.run(http_phase(sizes))
    record = {**latency_detail("http", http["record"]),
              **latency_detail("in_process", mine["record"]),
              "calls": len(http["record"]), "experiences": sizes.experiences}  # fmt: skip
    out(figure("http_record_p50_vs_in_process",
               ms(http["record"], 50) / ms(mine["record"], 50), **record))  # fmt: skip
    out(figure("http_record_p99_vs_in_process",
               ms(http["record"], 99) / ms(mine["record"], 99), **record))  # fmt: skip
    out(figure("http_record_p99_over_p50",
               ms(http["record"], 99) / ms(http["record"], 50), **record))  # fmt: skip
    for kind in ("similar", "text"):
        detail = {**latency_detail("http", http[kind]), **latency_detail("in_process", mine[kind]),
                  "calls": len(http[kind])}  # fmt: skip
        out(figure(f"http_{kind}_p50_vs_in_process",
                   ms(http[kind], 50) / ms(mine[kind], 50), **detail))  # fmt: skip


def measure(sizes: Sizes, out: Callable[[Figure], None]) -> None:
    asyncio.run(write_figures(sizes, out))
    http_figures(sizes, out)


# -- the command -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.quick", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--baseline", type=Path, default=BASELINE,
                        help="the baseline file (ops/bench/baseline.json)")  # fmt: skip
    parser.add_argument("--write-baseline", action="store_true",
                        help="write the figures to the baseline file")  # fmt: skip
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if a figure is over 15%% worse, or missing")  # fmt: skip
    parser.add_argument("--size", type=float, default=1.0,
                        help="scale the numbers of calls (1.0; less: quicker)")  # fmt: skip
    parser.add_argument("--from", dest="sources", type=Path, nargs="+", metavar="OUTPUT",
                        help="take the figures from saved outputs of this command (the "
                        "median of each) instead of measuring")  # fmt: skip
    options = parser.parse_args(argv)
    if options.size <= 0:
        parser.error("--size must be positive")
    started = time.perf_counter()
    baseline: dict[str, float] = {}
    source = str(options.baseline)
    try:
        baseline = read_baseline(options.baseline)
    except BaselineError as exc:
        if not (options.write_baseline and not options.baseline.exists()):
            print(f"quick: {exc}", file=sys.stderr)
            return 2
        source = "no baseline"

    figures: list[Figure] = []

    def out(f: Figure) -> None:
        figures.append(f)
        report(f, baseline)

    if options.sources:
        try:
            lines = [line for path in options.sources for line in path.read_text().splitlines()]
        except OSError as exc:
            parser.error(str(exc))
        for f in medians(lines):
            out(f)
    else:
        measure(Sizes().scaled(options.size), out)
    comparison = compare(figures, baseline)
    load = round(os.getloadavg()[0], 2)  # the machine's business: its figures move with it
    emit("summary", seconds=round(time.perf_counter() - started, 1), baseline=source,
         tolerance=TOLERANCE, worse=[c.as_dict() for c in comparison.worse],
         missing=comparison.missing, new=comparison.new,
         better=[c.as_dict() for c in comparison.better], load_average=load)  # fmt: skip
    print(summarize(comparison, source), file=sys.stderr)
    if not options.sources and comparison.worse and load > (os.cpu_count() or 1):
        busy = (f"(load average {load} on {os.cpu_count()} cores: a busy machine makes "
                "figures worse; measure again when it is quiet before believing them)")  # fmt: skip
        print(busy, file=sys.stderr)
    if options.write_baseline:
        runs = len(options.sources) if options.sources else 1
        text = json.dumps(baseline_document(figures, runs), indent=2) + "\n"
        options.baseline.write_text(text)
        print(f"quick: wrote {len(figures)} figures to {options.baseline}", file=sys.stderr)
    return 1 if options.strict and comparison.failed else 0


if __name__ == "__main__":
    sys.exit(main())
