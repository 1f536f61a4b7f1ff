"""Benchmark: many hosts following one cluster, a restart storm at each step.

    python -m ops.bench.hosts [--steps 100,300,1000] [--collectives 200] [--rate 200]

Three local nats-server processes (``ops.cluster``), one stream of 3 replicas (or
``--partitions`` P: a log in partitions, ``eventlog.partitioned``, where a host makes a
consumer on each partition holding what it follows, and on the first for wisdom and
tokens), and a writer recording events into ``--collectives`` collectives at ``--rate``
a second, the collective drawn from a Zipf distribution (a few busy, many quiet).
Simulated hosts, spread over ``--processes`` worker processes, each follow 1 to 3
collectives (drawn from the same distribution) with Pulse's own consumer set-up: a
``JetStreamLog`` connection of their own and a live tail filtered to their collectives,
wisdom and tokens (``eventlog.subjects.collective_filter``), as ``pulse up --follow``
reads. They are light: each takes every event as one it knows (``tail``'s ``own``), so
none is decoded. On real machines each host decodes on its own cores; here every host
shares this machine's two, and decoding would make the knee the simulation's, not the
cluster's.

At each step the hosts are brought up to the step's count, the writer writes for
``--seconds``, then the server leading the stream is killed and started again (every
host whose consumer it held makes it again), and the writer writes for ``--seconds``
more; then every host is stopped and started again at once (a deploy, a power cut: the
restart storm) while the writer writes. Each step prints:

- consumer creates after the kill and after the restart: how many, their p99 (the
  ``add_consumer`` round trip), the creates that failed (refused or unanswered: asked
  again after a back-off) and what they raised, and the hosts left waiting (their last
  create failed: they read nothing);
- delivery lag p50 and p99 (the time a host read an event after the stream stored it,
  over every delivery), before the kill, after it and after the restart;
- the hosts that did not stop within 30 s when the restart stopped them (where they
  wait goes to standard error), and the connects and first reads that went unanswered
  and were asked again after a back-off, as a supervised host would (at the ramp, the
  kill and the restart);
- API requests the servers dropped (their logs' "dropping" lines) and their memory;
- the cores the servers and the simulated hosts kept busy while the writer wrote (this
  machine has 2: a step near 2 ran out of them, and says so);
- the knee: the first step where a create p99 or a lag p99 passes 1 s, a request is
  dropped, a host is left waiting or does not stop, or the servers' memory passes half
  of RAM.

``kill -USR1`` on a worker process prints where its tasks wait.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from uuid import UUID

from eventlog import JetStreamLog, StreamSettings
from eventlog import events as ev
from eventlog.errors import LogUnavailable
from eventlog.ids import uuid7
from eventlog.jetstream import backoff, cancelled
from eventlog.partitioned import PartitionedLog
from eventlog.partitions import Layout
from eventlog.subjects import collective_filter
from ops.bench.durability import cpu_seconds
from ops.cluster import LocalCluster

RAM = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
Log = JetStreamLog | PartitionedLog
INSTANCE = uuid7()
DIM = 8
VECTOR = ev.pack_vector([0.5] * DIM)


def _common(hlc: int | None = None) -> dict[str, Any]:
    now = ev.pack_hlc(time.time_ns() // 1_000_000, 0) if hlc is None else hlc
    return {"event_id": uuid7(), "instance_id": INSTANCE, "hlc": now}


def _collective(collective_id: UUID) -> ev.CollectiveCreated:
    return ev.CollectiveCreated(**_common(), collective_id=collective_id, owner_id="bench",
                                name="hosts bench", embedding_dimension=DIM)  # fmt: skip


def _lesson(collective_id: UUID, hlc: int | None = None) -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        **_common(hlc), experience_id=uuid7(), collective_id=collective_id,
        content="a lesson on the hosts' bench", embedding=VECTOR,
        experience_type=ev.Fact(statement="a lesson", source="ops.bench.hosts"),
        importance=0.5, confidence=0.5, source_agent="bench",
    )  # fmt: skip


def zipf_choice(rng: random.Random, n: int, s: float = 1.1) -> int:
    """An index 0..n-1, the first ones far more often (weights 1/k^s)."""
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights)[0]


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# -- a worker process: its share of the hosts --------------------------------------------


def _settings(partitions: int) -> StreamSettings:
    return StreamSettings(replicas=3, partitions=partitions)


async def _connect(urls: list[str], partitions: int, *, create: bool) -> Log:
    if partitions > 1:
        return await PartitionedLog.connect(urls, _settings(partitions), create_streams=create)
    return await JetStreamLog.connect(urls, _settings(partitions), create_streams=create)


async def _worker(urls: list[str], collectives: list[str], commands: Any, results: Any,
                  seed: int, partitions: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    ids = [UUID(c) for c in collectives]
    hosts: list[tuple[Log, asyncio.Task[None]]] = []
    consumers = 0  # the consumers every host's tail makes (one per partition it reads)
    creates: list[float] = []
    failed = 0
    errors: dict[str, int] = {}  # what failed creates raised, by kind
    waiting: set[int] = set()  # hosts whose last create failed: reading nothing
    made: set[int] = set()  # hosts that made a consumer since the restart
    all_made = asyncio.Event()
    cpu_since = time.process_time()
    lags: list[float] = []
    retried = 0  # connects and first reads a host asked again (unanswered in time)
    stuck = 0  # hosts that did not stop within STOP_WAIT when the restart stopped them

    async def again(ask: Any) -> Any:
        """``ask()`` until it answers, after a back-off that doubles up to 5 s, as a host
        under a supervisor would (``pulse up`` restarted; a tail asking again): what a
        host starting in a storm meets is counted (``retried``), not fatal."""
        nonlocal retried
        failures = 0
        while True:
            try:
                return await ask()
            except LogUnavailable as exc:
                failures += 1
                retried += 1
                kind = f"{type(exc).__name__} (connect or first read)"
                errors[kind] = errors.get(kind, 0) + 1
                await asyncio.sleep(backoff(failures))

    def timed(log: JetStreamLog) -> None:
        """Time each consumer create of a host's stream (what its tail asks JetStream)."""
        admin = log.admin
        make = admin.add_consumer

        async def add_consumer(*args: Any, **kwargs: Any) -> Any:
            nonlocal failed
            started = time.perf_counter()
            try:
                found = await make(*args, **kwargs)
            except asyncio.CancelledError:
                raise  # (the host was stopped: the create did not fail)
            except BaseException as exc:
                failed += 1
                kind = type(exc).__name__
                if getattr(exc, "description", None):  # (JetStream's own words)
                    kind += f": {exc.description}"  # type: ignore[attr-defined]
                errors[kind] = errors.get(kind, 0) + 1
                waiting.add(id(log))
                raise
            creates.append(time.perf_counter() - started)
            waiting.discard(id(log))
            made.add(id(log))
            if len(made) >= consumers:
                all_made.set()
            return found

        admin.add_consumer = add_consumer  # type: ignore[method-assign]

    known = _lesson(ids[0], hlc=0)  # (never ahead of the log's clock)

    async def host(log: Log, follows: list[UUID]) -> None:
        # (from the end, as a host caught up: what it reads is live, its lag the log's)
        subjects = collective_filter(follows)
        if isinstance(log, PartitionedLog):  # (a consumer on each partition it reads)
            ends = await again(lambda: log.last_positions(subjects))
            batches = log.tail({p: s + 1 for p, s in ends.items()}, subjects=subjects,
                               own=lambda *_: known)  # fmt: skip
        else:
            start = await again(log.last_seq) + 1
            batches = log.tail_batches(start, subjects=subjects, own=lambda *_: known)
        async for batch in batches:
            now = time.time()
            lags.extend(now - e.stored_ms / 1000 for e in batch if e.stored_ms is not None)

    async def start(follows: list[UUID]) -> tuple[Log, asyncio.Task[None]]:
        nonlocal consumers
        log = await again(lambda: _connect(urls, partitions, create=False))
        if isinstance(log, PartitionedLog):
            reached = log.layout.split(collective_filter(follows))
            for part in reached:
                timed(log.parts[part])
            consumers += len(reached)
        else:
            timed(log)
            consumers += 1
        return log, asyncio.create_task(host(log, follows))

    following: list[list[UUID]] = []  # what each host follows (kept across a restart)

    async def add(count: int) -> None:
        for _ in range(count):
            follows = {ids[zipf_choice(rng, len(ids))] for _ in range(rng.randint(1, 3))}
            following.append(sorted(follows, key=str))
            hosts.append(await start(following[-1]))

    async def restart() -> None:
        """Every host stopped, then started again at once (a deploy, a power cut)."""
        nonlocal consumers, stuck
        stuck += len(await _stopped(hosts))
        waiting.clear()
        made.clear()
        all_made.clear()
        consumers = 0
        hosts[:] = await asyncio.gather(*(start(f) for f in following))
        with contextlib.suppress(TimeoutError):  # (the storm is over when every host has
            async with asyncio.timeout(120):  # its consumer, or after two minutes)
                await all_made.wait()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, _print_tasks)  # (kill -USR1: what it awaits)
    while True:
        command, value = await loop.run_in_executor(None, commands.get)
        if command == "grow":
            await add(value - len(hosts))
            results.put(("grown", len(hosts)))
        elif command == "restart":
            started = time.perf_counter()
            await restart()
            results.put(("restarted", time.perf_counter() - started))
        elif command == "take":  # what was measured since the last take
            cpu = time.process_time()
            results.put(("taken", {"creates": creates, "failed": failed, "lags": lags,
                                   "cpu": cpu - cpu_since, "errors": errors,
                                   "waiting": len(waiting), "retried": retried,
                                   "stuck": stuck}))  # fmt: skip
            creates, lags, failed, cpu_since, errors = [], [], 0, cpu, {}
            retried = stuck = 0
        elif command == "stop":
            await _stopped(hosts)
            results.put(("stopped", None))
            return


STOP_WAIT = 30.0  # seconds a stopped host's tail and connection are given to end


async def _stopped(hosts: list[tuple[Log, asyncio.Task[None]]]) -> set[asyncio.Future[Any]]:
    """Every host's tail cancelled and its connection closed; returns the tails that did
    not end within ``STOP_WAIT`` (where they wait is printed: ``_print_tasks``). A tail
    is cancelled again until it ends (``eventlog.jetstream.cancelled``), as
    ``sync.replication`` stops a host's."""
    pending = await cancelled((task for _, task in hosts), within=STOP_WAIT)
    if pending:
        print(f"{len(pending)} hosts' tails did not end when cancelled", file=sys.stderr)
        _print_tasks()
    closing = [asyncio.ensure_future(log.close()) for log, _ in hosts]
    if closing:
        await asyncio.wait(closing, timeout=STOP_WAIT)
    return pending


def _print_tasks() -> None:
    """Where a worker's tasks and generators wait (``kill -USR1``), on its standard
    error: each distinct chain of awaits once, with how many wait there. (A task's own
    stack stops at an ``async for``; the generators it drives are found apart.)"""
    chains: dict[str, int] = {}

    def chain(awaiting: Any) -> str:
        where = []
        while awaiting is not None:
            frame = getattr(awaiting, "cr_frame", None) or getattr(awaiting, "ag_frame", None)
            frame = frame or getattr(awaiting, "gi_frame", None)
            if frame is not None:
                code = frame.f_code
                where.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
            awaiting = (getattr(awaiting, "cr_await", None) or getattr(awaiting, "ag_await", None)
                        or getattr(awaiting, "gi_yieldfrom", None))  # fmt: skip
        return " > ".join(where)

    def count(key: str) -> None:
        chains[key] = chains.get(key, 0) + 1

    tasks = asyncio.all_tasks()
    for task in tasks:
        count(("cancelling " if task.cancelling() else "") + "task " + chain(task.get_coro()))
    for thing in gc.get_objects():
        if inspect.isasyncgen(thing) and thing.ag_frame is not None:
            count(("running " if thing.ag_running else "") + "generator " + chain(thing))
    print(f"worker {os.getpid()}: {len(tasks)} tasks", file=sys.stderr)
    for key, n in sorted(chains.items(), key=lambda item: -item[1]):
        print(f"{n:6} {key}", file=sys.stderr)
    sys.stderr.flush()


def _run_worker(*args: Any) -> None:
    asyncio.run(_worker(*args))


# -- the run ---------------------------------------------------------------------------------


class Workers:
    def __init__(
        self, count: int, urls: list[str], collectives: list[str], partitions: int
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes = [(context.Queue(), context.Queue()) for _ in range(count)]
        self.processes = [
            context.Process(target=_run_worker, args=(urls, collectives, c, r, n, partitions),
                            daemon=True)
            for n, (c, r) in enumerate(self.pipes)
        ]  # fmt: skip
        for process in self.processes:
            process.start()

    def ask(self, command: str, values: list[Any]) -> list[Any]:
        for (commands, _), value in zip(self.pipes, values, strict=True):
            commands.put((command, value))
        return [results.get(timeout=900)[1] for _, results in self.pipes]

    def stop(self) -> None:
        try:
            self.ask("stop", [None] * len(self.pipes))
        finally:
            for process in self.processes:
                process.join(10)
                if process.is_alive():
                    process.kill()


async def _write(log: Log, collectives: list[str], rate: float, seconds: float,
                 rng: random.Random) -> int:  # fmt: skip
    """Events to Zipf-drawn collectives at ``rate`` a second (those refused while a
    leader is elected are not counted)."""
    written, started = 0, time.perf_counter()
    while (now := time.perf_counter() - started) < seconds:
        due = int(now * rate) + 1
        while written < due:
            cid = UUID(collectives[zipf_choice(rng, len(collectives))])
            try:
                await log.append(_lesson(cid))
                written += 1
            except Exception:
                await asyncio.sleep(0.05)
                break
        await asyncio.sleep(max(0.0, (written / rate) - (time.perf_counter() - started)))
    return written


def _dropped(cluster: LocalCluster) -> int:
    """API requests the servers logged dropping (their queue was full)."""
    count = 0
    for i in range(cluster.size):
        logfile = cluster.root / f"n{i}" / "nats.log"
        if logfile.exists():
            for line in logfile.read_text(errors="replace").splitlines():
                match = re.search(r"[Dd]ropp(?:ing|ed) (\d+)", line)
                if match and "API" in line:
                    count += int(match.group(1))
    return count


def _memory(cluster: LocalCluster) -> int:
    total = 0
    for port in cluster.monitor_ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=5) as r:
                total += int(json.load(r).get("mem", 0))
        except OSError:
            pass
    return total


async def main(steps: list[int], collectives: int, rate: float, seconds: float,
               processes: int, partitions: int = 1) -> None:  # fmt: skip
    rng = random.Random(29)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", 3)
        urls = cluster.start()
        writer = await _connect(urls, partitions, create=True)
        admin = writer.parts[0].admin if isinstance(writer, PartitionedLog) else writer.admin
        led = Layout(partitions).stream(1) if partitions > 1 else "PULSE"  # (one a host reads)
        ids = [uuid7() for _ in range(collectives)]
        for cid in ids:
            await writer.append(_collective(cid))
        workers = Workers(processes, urls, [str(c) for c in ids], partitions)
        try:
            for step in steps:
                share = [step // processes + (1 if n < step % processes else 0)
                         for n in range(processes)]  # fmt: skip
                started = time.perf_counter()
                workers.ask("grow", share)
                ramp = time.perf_counter() - started
                ramped = workers.ask("take", [None] * processes)  # (the ramp's creates apart)
                servers = _servers_cpu(cluster)
                writing = time.perf_counter()
                written = await _write(writer, [str(c) for c in ids], rate, seconds, rng)
                before = workers.ask("take", [None] * processes)
                wall = time.perf_counter() - writing
                server_cores = (_servers_cpu(cluster) - servers) / wall
                host_cores = sum(w["cpu"] for w in before) / wall
                dropped_before = _dropped(cluster)
                info = await admin.stream_info(led)
                leader = int(str(info.cluster.leader).removeprefix("n"))  # type: ignore[union-attr]
                cluster.kill(leader)
                cluster.start_node(leader)
                written += await _write(writer, [str(c) for c in ids], rate, seconds, rng)
                after = workers.ask("take", [None] * processes)
                dropped_storm = _dropped(cluster) - dropped_before
                # every host restarted at once, while the writer writes
                dropped_before_restart = _dropped(cluster)
                restarting = asyncio.create_task(
                    _write(writer, [str(c) for c in ids], rate, seconds, rng)
                )
                await asyncio.to_thread(workers.ask, "restart", [None] * processes)
                written += await restarting
                restarted = workers.ask("take", [None] * processes)
                memory = _memory(cluster)
                row = {
                    "hosts": step, "partitions": partitions, "ramp_s": round(ramp, 1),
                    "written": written,
                    "lag_p50_ms": _ms(_p(_all(before, "lags"), 50)),
                    "lag_p99_ms": _ms(_p(_all(before, "lags"), 99)),
                    "storm_creates": len(_all(after, "creates")),
                    "storm_create_p99_ms": _ms(_p(_all(after, "creates"), 99)),
                    "storm_failed_creates": sum(w["failed"] for w in after),
                    "storm_lag_p99_ms": _ms(_p(_all(after, "lags"), 99)),
                    "dropped_api_requests": dropped_storm,
                    "server_memory_mb": round(memory / 2**20),
                    "server_cores": round(server_cores, 2), "host_cores": round(host_cores, 2),
                    "storm_errors": _merged(after, "errors"),
                    "storm_hosts_waiting": sum(w["waiting"] for w in after),
                    "restart_creates": len(_all(restarted, "creates")),
                    "restart_create_p99_ms": _ms(_p(_all(restarted, "creates"), 99)),
                    "restart_failed_creates": sum(w["failed"] for w in restarted),
                    "restart_lag_p99_ms": _ms(_p(_all(restarted, "lags"), 99)),
                    "restart_dropped_api_requests": _dropped(cluster) - dropped_before_restart,
                    "restart_hosts_waiting": sum(w["waiting"] for w in restarted),
                    "restart_hosts_stuck": sum(w["stuck"] for w in restarted),
                    "restart_errors": _merged(restarted, "errors"),
                    # connects and first reads asked again, at the ramp, the kill, the restart
                    "retried": sum(w["retried"] for w in (*ramped, *before, *after, *restarted)),
                }  # fmt: skip
                rows.append(row)
                print(json.dumps({"bench": "hosts", **row}), flush=True)
        finally:
            workers.stop()
            await writer.close()
            cluster.stop()
    knee = next((r["hosts"] for r in rows if _past_knee(r)), None)
    columns = [("hosts", "hosts"), ("lag p50", "lag_p50_ms"), ("lag p99", "lag_p99_ms"),
               ("kill: creates", "storm_creates"), ("p99", "storm_create_p99_ms"),
               ("failed", "storm_failed_creates"), ("lag p99", "storm_lag_p99_ms"),
               ("dropped", "dropped_api_requests"),
               ("restart: creates", "restart_creates"), ("p99", "restart_create_p99_ms"),
               ("failed", "restart_failed_creates"), ("lag p99", "restart_lag_p99_ms"),
               ("dropped", "restart_dropped_api_requests"),
               ("waiting", "restart_hosts_waiting"), ("stuck", "restart_hosts_stuck"),
               ("retried", "retried"), ("mem MB", "server_memory_mb"),
               ("cores: servers", "server_cores"), ("hosts", "host_cores")]  # fmt: skip
    print(" ".join(f"{name:>{max(len(name), 7)}}" for name, _ in columns))
    for r in rows:
        print(" ".join(f"{r[key]!s:>{max(len(name), 7)}}" for name, key in columns))
    print(
        f"knee: {'none up to ' + str(steps[-1]) + ' hosts' if knee is None else knee} "
        "(lag or create p99 over 1 s, a dropped request, a host left waiting or stuck, or the "
        "servers' memory past half of RAM)"
    )


def _servers_cpu(cluster: LocalCluster) -> float:
    return sum(cpu_seconds(p.pid) for p in cluster.processes if p is not None)


def _merged(taken: list[dict[str, Any]], key: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for w in taken:
        for kind, n in w[key].items():
            found[kind] = found.get(kind, 0) + n
    return found


def _all(taken: list[dict[str, Any]], key: str) -> list[float]:
    return [v for w in taken for v in w[key]]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _past_knee(row: dict[str, Any]) -> bool:
    def over(key: str) -> bool:
        return row[key] is not None and row[key] > 1000

    return (any(over(k) for k in ("lag_p99_ms", "storm_create_p99_ms", "storm_lag_p99_ms",
                                  "restart_create_p99_ms", "restart_lag_p99_ms"))
            or row["dropped_api_requests"] > 0 or row["restart_dropped_api_requests"] > 0
            or row["storm_hosts_waiting"] > 0 or row["restart_hosts_waiting"] > 0
            or row["restart_hosts_stuck"] > 0
            or row["server_memory_mb"] * 2**20 > RAM / 2)  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="100,300,1000", help="hosts at each step")
    parser.add_argument("--collectives", type=int, default=200, help="default 200")
    parser.add_argument("--rate", type=float, default=200.0, help="events a second (200)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="writing before and after each restart (10)")  # fmt: skip
    parser.add_argument("--processes", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--partitions", type=int, default=1,
                        help="streams holding the collectives (1: one stream)")  # fmt: skip
    args = parser.parse_args()
    counts = [int(s) for s in args.steps.split(",") if s.strip()]
    asyncio.run(main(counts, args.collectives, args.rate, args.seconds, args.processes,
                     args.partitions))  # fmt: skip
