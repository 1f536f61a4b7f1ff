"""SQL run in a process of its own over the analysts' snapshot, within a memory limit of
that process and a wall-clock kill: every query of ``PulseDB.sql`` while the engine
keeps a snapshot (without one, the engine's own DuckDB answers, on a cursor).

Why a process, and not the engine's DuckDB with a timer:
measured with DuckDB 2.0 on this project's sandbox,

- ``interrupt()`` does not reach binding and planning. 6,000 ``SELECT 1`` joined by
  ``UNION ALL`` (114 KB of text), interrupted after 1 s, stopped after 10.8 s; planning
  grows about quadratically (1,000 terms: 0.35 s, 2,000: 1.0 s, 3,000: 1.7 s).
- The constant folding of the optimizer evaluates expressions while planning, outside
  ``memory_limit``: ``SELECT repeat('x', 1000000000)`` with a limit of 200 MB planned
  for 31 s and took the process to 4 GB (its high-water mark), before a row existed.
- Caps on the text and the parse tree (``SqlLimits.max_query_bytes``, ``max_nodes``,
  ``max_depth``, checked before DuckDB binds anything) bound the first shape, not the
  second: a 30-byte query is enough.

So only the operating system bounds every query: a worker process started with
``RLIMIT_AS`` (DuckDB's ``memory_limit`` plus ``HEADROOM`` for the interpreter, the
library and the rows converted; a worker that has answered a query has 690 MB of
address space reserved, 146 MB resident, with one BLAS thread and two malloc arenas)
answers one query at a time, and the service kills it at the time limit plus ``GRACE``
(counted from the moment the worker is ready: starting one is not the query's time)
whatever it is doing (its own timer interrupts execution at the
time limit, as in the engine's process). A killed worker takes its memory with it and is
replaced by the next query. Nothing in the worker can touch the service's memory: the
rows come back as msgpack (``_Reply``), decoded into plain values, never as pickles.

It reads the snapshot (``projections.snapshot``), the one file another process may open
while the engine writes the state. Before a query the engine brings the snapshot up to
what is flushed (``Engine.pin_snapshot``), so a principal reads its own writes as it did.
The worker opens the file read-only and keeps it open while the path names the same
file (opening costs ~50 ms, more than most queries). Forgetting does not wait for it:
when a whole copy replaces the snapshot (after a delete, and at a scrub) every worker
that may hold an older file, idle or running its query, is killed
(``SqlWorkers.replaced``), so no process keeps the unlinked file's blocks; its caller
gets QueryCancelled (retry). A query as of a moment takes the past tables the engine
computed for the same flushed state (``projections.past``), pickled to the worker (the
service trusts what it sends; it never unpickles what a worker sends).

Cost: one round trip through two pipes per query (the snapshot is opened again only
after it changed, ~50 ms), a refresh of the snapshot when the state changed since the
last one (a catch-up copy: tens of milliseconds on a small state, more on a busy host),
and a process start (~0.3 s) when no worker is idle (``SPARE`` stay idle for the next
queries). At most ``$PULSE_SQL_WORKERS`` (4) queries run at once (each may
take its memory limit); one more waits for a worker within its time limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

import msgspec

from eventlog.errors import (
    PulseError,
    QueryCancelled,
    QueryOutOfMemory,
    QueryTimedOut,
    ValidationError,
    told,
)
from projections.analytics import FORGETTING, SqlLimits, SqlResult

log = logging.getLogger("pulse.sql")

GRACE = 2.0  # seconds past the time limit before a worker is killed
START_TIMEOUT = 60.0  # seconds a worker may take to start (not the query's time)
READY = b"ready"  # a worker's first message
HEADROOM = 1536 * 1024 * 1024  # address space beyond DuckDB's memory limit, in bytes
SPARE = 2  # idle workers kept for the next queries
MOST = 4  # queries at once ($PULSE_SQL_WORKERS)
_HEADER = struct.Struct("!I")
_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}  # fmt: skip


class _Reply(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker answers: the result, or an error by its class's name."""

    result: SqlResult | None = None
    error: str | None = None
    message: str = ""
    limit: str | None = None
    setting: str | None = None


def size_in_bytes(size: str) -> int:
    """``"2GB"`` -> 2,000,000,000 (DuckDB's units: KB are 1000 bytes, KiB 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", size)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValidationError(f"not a size: {size!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


# -- the service's side ----------------------------------------------------------------------


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, limits: SqlLimits, temp_root: Path) -> None:
        temp_root.mkdir(parents=True, exist_ok=True)
        self.temp = Path(tempfile.mkdtemp(prefix="worker-", dir=temp_root))
        space = size_in_bytes(limits.memory_limit) + HEADROOM
        self.process = subprocess.Popen(
            [sys.executable, "-m", "projections.sqlworker", str(space), str(self.temp)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            env=_worker_environment(),
        )  # fmt: skip
        # the time limit is the query's: a worker is started, and says it is ready, first
        starting = threading.Timer(START_TIMEOUT, self.kill)
        starting.daemon = True
        starting.start()
        try:
            assert self.process.stdout is not None
            ready = _receive(self.process.stdout) == READY
        finally:
            starting.cancel()
        if not ready:
            self.reap()
            raise PulseError(f"query: a SQL worker did not start within {START_TIMEOUT:g} s")

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()

    def reap(self) -> None:
        """Wait for the process to end and remove its temp files."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        shutil.rmtree(self.temp, ignore_errors=True)


def _worker_environment() -> dict[str, str]:
    """The service's environment without its settings and secrets ($PULSE_*), and with
    one thread for numpy's BLAS and two malloc arenas: each thread and arena reserves
    address space that ``RLIMIT_AS`` counts (measured: 1.8 GB reserved, 146 MB resident,
    with the defaults on two cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env["MALLOC_ARENA_MAX"] = "2"
    return env


def workers_from_env() -> int:
    """``$PULSE_SQL_WORKERS``: how many queries run at once (``MOST`` unless set)."""
    text = os.environ.get("PULSE_SQL_WORKERS", "").strip()
    if not text:
        return MOST
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise ValidationError(f"$PULSE_SQL_WORKERS: must be an integer in 1..256, got {text!r}")
    return int(text)


class SqlWorkers:
    """The worker processes of one engine: ``query`` makes a ``WorkerQuery``;
    ``replaced`` kills the queries reading a snapshot file that is gone."""

    def __init__(self, snapshot: Path, temp_root: Path, most: int | None = None) -> None:
        most = most or workers_from_env()
        self.snapshot = snapshot
        self.temp_root = temp_root
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._running: dict[WorkerQuery, int] = {}  # -> the generation it started in
        self.generation = 0  # whole copies of the snapshot so far
        self._slots = threading.BoundedSemaphore(most)
        self._closed = False
        shutil.rmtree(temp_root, ignore_errors=True)  # a crash's leftovers

    def query(self, sql: str, activities: list[Any], limit: int, limits: SqlLimits,
              viewer: Any, past: Any = None, *, seq: int = 0) -> WorkerQuery:  # fmt: skip
        """A query of ``viewer`` (None: an admin, every row; else a ``Principal``), as
        of ``past`` (``projections.past.PastTables``; None: the present); ``seq``: the
        sequence its result reports."""
        return WorkerQuery(self, (sql, activities, limit, limits, viewer, past, seq), limits)

    def replaced(self) -> None:
        """A whole copy took the snapshot's place (after a delete, or at a scrub): kill
        every worker that may hold an older file open, the idle ones and those whose
        query started before."""
        with self._lock:
            self.generation += 1
            older = [q for q, g in self._running.items() if g < self.generation]
            idle, self._idle = self._idle, []
        for query in older:
            query.cancel("forgetting")
        for worker in idle:
            worker.reap()

    @property
    def running(self) -> int:
        return len(self._running)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            running = list(self._running)
        for query in running:
            query.cancel("cancelled")
        for worker in idle:
            worker.reap()
        shutil.rmtree(self.temp_root, ignore_errors=True)

    def _start(self, query: WorkerQuery) -> _Worker:
        with self._lock:
            if self._closed:
                raise PulseError("query: the service is stopping")
            self._running[query] = self.generation  # before the worker opens the file
            if self._idle:
                return self._idle.pop()
        return _Worker(query.limits, self.temp_root)

    def _end(self, query: WorkerQuery, worker: _Worker | None, reusable: bool) -> None:
        with self._lock:
            self._running.pop(query, None)
            keep = reusable and not self._closed and len(self._idle) < SPARE
            if keep and worker is not None:
                self._idle.append(worker)
        if worker is not None and not keep:
            worker.reap()


class WorkerQuery:
    """One query in a worker: ``run`` (blocking, on a thread of its own:
    ``analytics.run_async``), ``cancel`` from any thread (kills the worker), ``close``."""

    def __init__(self, pool: SqlWorkers, request: tuple[Any, ...], limits: SqlLimits) -> None:
        self._pool, self._request, self.limits = pool, request, limits
        self._lock = threading.Lock()
        self._worker: _Worker | None = None
        self._stopped: str | None = None  # "time", "forgetting" or "cancelled"

    def cancel(self, why: str = "cancelled") -> None:
        with self._lock:
            if self._stopped is None:
                self._stopped = why
            worker = self._worker
        if worker is not None:
            worker.kill()

    def close(self) -> None:
        """Nothing to do: ``run`` gives its worker back (a query never run holds none)."""

    def run(self) -> SqlResult:
        if not self._pool._slots.acquire(timeout=self.limits.time_limit):
            raise QueryTimedOut(
                f"query: every SQL worker was busy for the time limit, "
                f"{self.limits.time_limit:g} s ($PULSE_SQL_TIME_LIMIT); retry",
                limit="time", setting="PULSE_SQL_TIME_LIMIT",
            )  # fmt: skip
        worker: _Worker | None = None
        reusable = False
        timer = threading.Timer(self.limits.time_limit + GRACE, self.cancel, ("time",))
        timer.daemon = True
        try:
            worker = self._pool._start(self)
            with self._lock:
                self._worker = worker
                stopped = self._stopped
            if stopped is not None:
                raise self._stop_error(stopped)
            timer.start()
            reply = self._exchange(worker)
            reusable = True
            if reply.result is not None:
                return reply.result
            raise told(
                reply.error or "", reply.message, limit=reply.limit or "",
                setting=reply.setting or "",
            )  # fmt: skip
        finally:
            timer.cancel()
            self._pool._end(self, worker, reusable and self._stopped is None)
            self._pool._slots.release()

    def _exchange(self, worker: _Worker) -> _Reply:
        stdin, stdout = worker.process.stdin, worker.process.stdout
        assert stdin is not None and stdout is not None
        try:
            _send(stdin, pickle.dumps((str(self._pool.snapshot), *self._request)))
            body = _receive(stdout)
        except OSError:
            body = None
        if body is None:  # the process ended: killed by us, or by its memory limit
            worker.kill()
            stopped = self._stopped
            if stopped is not None:
                raise self._stop_error(stopped)
            raise QueryOutOfMemory(
                "query: its process ran out of memory (the SQL sandbox's "
                f"{self.limits.memory_limit}, $PULSE_SQL_MEMORY_LIMIT); aggregate or filter more",
                limit="memory", setting="PULSE_SQL_MEMORY_LIMIT",
            )  # fmt: skip
        return msgspec.msgpack.decode(body, type=_Reply)

    def _stop_error(self, why: str) -> PulseError:
        if why == "time":
            return QueryTimedOut(
                f"query: stopped at the time limit of the SQL sandbox, "
                f"{self.limits.time_limit:g} s ($PULSE_SQL_TIME_LIMIT); ask for less",
                limit="time", setting="PULSE_SQL_TIME_LIMIT",
            )  # fmt: skip
        if why == "forgetting":
            return QueryCancelled(FORGETTING)
        return PulseError("query: cancelled (the client went away)")


def _send(pipe: IO[bytes], body: bytes) -> None:
    pipe.write(_HEADER.pack(len(body)) + body)
    pipe.flush()


def _receive(pipe: IO[bytes]) -> bytes | None:
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    body = pipe.read(size)
    return body if len(body) == size else None


# -- the worker's side -----------------------------------------------------------------------


class _Open:
    """The snapshot file a worker has open, while no other took its path: opening it
    costs more than most queries (~50 ms), and the service kills a worker whose file
    was replaced by a whole copy (``SqlWorkers.replaced``), idle or not."""

    def __init__(self) -> None:
        self.con: Any = None
        self.file: tuple[int, int] | None = None  # (device, inode)
        self.limits: SqlLimits | None = None

    def connect(self, path: str, limits: SqlLimits, temp: str) -> Any:
        import duckdb

        from projections.analytics import sandbox

        found = os.stat(path)
        file = (found.st_dev, found.st_ino)
        if self.con is not None and file != self.file:
            self.close()  # a newer snapshot took the path
        if self.con is None:
            self.con = duckdb.connect(
                path,
                read_only=True,
                config={"memory_limit": limits.memory_limit, "temp_directory": temp,
                        "max_temp_directory_size": limits.temp_limit},
            )  # fmt: skip
            self.file, self.limits = file, None
        if self.limits != limits:
            sandbox(self.con, limits)
            self.limits = limits
        return self.con

    def close(self) -> None:
        if self.con is not None:
            with contextlib.suppress(Exception):
                self.con.close()
        self.con = self.file = self.limits = None


def _answer(request: bytes, temp: str, opened: _Open) -> _Reply:
    import duckdb

    from projections.analytics import SqlQuery

    path, sql, activities, limit, limits, viewer, past, seq = pickle.loads(request)
    try:
        con = opened.connect(path, limits, temp)
    except (duckdb.Error, OSError) as exc:
        opened.close()
        return _Reply(error="PulseError", message=f"query: the snapshot cannot be read: {exc}")
    query = SqlQuery(con.cursor(), sql, activities, limit, seq, limits, viewer=viewer, past=past)
    try:
        return _Reply(result=_plain(query.run()))
    except MemoryError:
        return _Reply(
            error="QueryOutOfMemory",
            message="query: needs more memory than the SQL sandbox allows "
            f"({limits.memory_limit}, $PULSE_SQL_MEMORY_LIMIT); aggregate or filter more",
            limit="memory", setting="PULSE_SQL_MEMORY_LIMIT",
        )  # fmt: skip
    except PulseError as exc:
        return _Reply(
            error=type(exc).__name__,
            message=str(exc),
            limit=getattr(exc, "limit", None),
            setting=getattr(exc, "setting", None),
        )


def _plain(result: SqlResult) -> SqlResult:
    """Integers msgpack cannot carry (past 64 bits: HUGEINT) as text."""

    def fit(value: Any) -> Any:
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            return str(value)
        if isinstance(value, list):
            return [fit(v) for v in value]
        if isinstance(value, dict):
            return {k: fit(v) for k, v in value.items()}
        return value

    return msgspec.structs.replace(result, rows=[[fit(v) for v in row] for row in result.rows])


def main() -> None:
    import resource

    space, temp = int(sys.argv[1]), sys.argv[2]
    resource.setrlimit(resource.RLIMIT_AS, (space, space))
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed may reach the replies' pipe
    import duckdb  # noqa: F401  (imported before the first query's clock starts)

    import projections.analytics  # noqa: F401

    _send(replies, READY)
    opened = _Open()
    while (request := _receive(requests)) is not None:
        try:
            reply = _answer(request, temp, opened)
        except MemoryError:
            return  # the service reports the process's end as out of memory
        except Exception as exc:  # a bug: say so in one line, answer, go on
            log.error("SQL worker: %s: %s", type(exc).__name__, exc)
            reply = _Reply(error="PulseError", message=f"query: failed ({type(exc).__name__})")
        _send(replies, msgspec.msgpack.encode(reply))


if __name__ == "__main__":
    main()
