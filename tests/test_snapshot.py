"""The analysts' snapshot (``projections.snapshot``): while Pulse runs and writes, a
separate, plain DuckDB process opens ``<data dir>/state/snapshot.duckdb`` read-only,
queries every documented view, and sees the writes within the bound Pulse states; a
delete leaves it within that bound, and ``pulse compact`` at once; a refresh happens only
when something changed; a crash's leftovers go when the engine opens."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections.analytics import VIEWS
from projections.engine import Engine
from projections.projection import ProjectionSettings
from projections.snapshot import SNAPSHOT_NAME
from tests import documented, factories
from tests.harness import PULSE, Service, by_profile, call, clean_env, eventually
from tests.histories import histories

# A plain DuckDB process, as an analyst's notebook would be: it knows nothing of Pulse
# but the path. Each round it opens the file read-only, counts every view named on its
# command line, reads the experiences' contents and the checkpoint, and closes it; it
# prints a line whenever what it read changed (or an error), with the wall time.
WATCHER = r"""
import json, sys, time
import duckdb
path, views = sys.argv[1], json.loads(sys.argv[2])
deadline = time.time() + float(sys.argv[3])
last = None
rounds = 0
while time.time() < deadline:
    try:
        con = duckdb.connect(path, read_only=True)
        try:
            counts = {v: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in views}
            rows = con.execute("SELECT content FROM experiences").fetchall()
            contents = sorted(r[0] for r in rows)
            seq = con.execute("SELECT seq FROM checkpoint").fetchone()[0]
        finally:
            con.close()
        now = {"seq": seq, "counts": counts, "contents": contents}
    except Exception as exc:
        now = {"error": f"{type(exc).__name__}: {exc}"}
    rounds += 1
    if now != last:
        print(json.dumps({"t": time.time(), "rounds": rounds, **now}), flush=True)
        last = now
"""


class Watcher:
    """The watcher's process and the lines it printed so far."""

    def __init__(self, path: Path, seconds: float = 120.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WATCHER, str(path), json.dumps(list(VIEWS)), str(seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[dict[str, Any]] = []
        self.errors = ""  # its standard error, once stopped
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def first(self, content: str) -> dict[str, Any] | None:
        """The first line whose experiences hold ``content``."""
        return next((x for x in list(self.lines) if content in x.get("contents", ())), None)

    def stop(self) -> str:
        if self.process.returncode is None:
            self.process.kill()
            _, self.errors = self.process.communicate(timeout=30)
            self._reader.join(timeout=10)
        return self.errors


async def test_a_plain_duckdb_process_reads_every_view_while_pulse_up_writes(
    service: Service,
) -> None:
    path = service.data_dir / "state" / SNAPSHOT_NAME  # the documented path
    watcher = Watcher(path)
    try:
        async with service.client() as client:
            team = await call(client, "create_collective", owner_id="ana", name="team",
                              embedding_dimension=2)  # fmt: skip
            acked: dict[str, float] = {}
            bounds: list[float] = []
            for i in range(12):  # writes go on while the watcher reads
                content = f"lesson {i}"
                await call(client, "record_experience", collective_id=team, content=content,
                           embedding=[1.0, i / 12])  # fmt: skip
                acked[content] = time.time()
                health = (await client.get("/health")).json()
                bounds.append(health["snapshot"]["bound"])
                await asyncio.sleep(0.15)  # a write every so often, not all at once
            await eventually(
                lambda: watcher.first("lesson 11") is not None, timeout=60,
                what="the last write in the snapshot",
            )  # fmt: skip
            health = (await client.get("/health")).json()
            # (the bound as stated once the last write is in: with the cost of the copy
            # that carried it, which a loaded machine can make longer than the one before)
            bounds.append(health["snapshot"]["bound"])
        watcher.stop()  # it has seen every write (and reads in a busy loop: stop it now)
        status = subprocess.run(
            [PULSE, "--data-dir", str(service.data_dir), "status", "--json"],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
        # the docs' example, as written, from a directory whose .pulse is this one
        (service.data_dir.parent / ".pulse").symlink_to(service.data_dir)
        example = subprocess.run(
            [sys.executable, "-c", docs_example()], cwd=service.data_dir.parent,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        errors = watcher.stop()
    assert example.returncode == 0, example.stderr
    assert example.stdout.startswith(f"{health['applied_seq']} [('lesson ")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)["snapshot"]
    assert Path(reported["path"]).resolve() == path.resolve()
    assert reported["seq"] == health["applied_seq"] and reported["age"] == 0.0
    assert health["snapshot"]["seq"] == health["applied_seq"]
    lines = watcher.lines
    read = [x for x in lines if "error" not in x]
    assert read, (lines, errors)
    # from its first read on, the analyst's process never failed to open or query it
    assert not [x for x in lines[lines.index(read[0]) :] if "error" in x], lines
    assert read[-1]["counts"]["experiences"] == 12
    assert set(read[-1]["counts"]) == set(VIEWS)  # every documented view answered
    # each write was in the snapshot within the bound Pulse stated (plus one round of
    # the watcher, which reads a file it just opened)
    round_time = (lines[-1]["t"] - lines[0]["t"]) / max(1, lines[-1]["rounds"] - 1)
    for content, at in acked.items():
        seen = watcher.first(content)
        assert seen is not None, content
        assert seen["t"] - at <= max(bounds) + round_time + 0.5, (content, seen["t"] - at, bounds)


def docs_example() -> str:
    """The docs' Python example of opening the snapshot (docs/analytics.md, "Analysts'
    own tools"), found by its name."""
    code = documented.example("snapshot-python").code
    assert "snapshot.duckdb" in code
    return code


def _entries(events: list[ev.Event], start: int) -> list[LogEntry]:
    return [LogEntry(start + i, "pulse.test", e) for i, e in enumerate(events)]


def _holds(path: Path, needle: bytes) -> bool:
    return path.exists() and needle in path.read_bytes()


def _read(path: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _delete(experience: ev.ExperienceRecorded) -> ev.ExperienceDeleted:
    return ev.ExperienceDeleted(
        **factories.common(),  # type: ignore[arg-type]
        experience_id=experience.experience_id,
        collective_id=experience.collective_id,
    )


async def test_a_delete_leaves_the_snapshot_within_its_bound(tmp_path: Path) -> None:
    settings = ProjectionSettings(snapshot_interval=0.2, scrub_after=3600)  # no scrub here
    engine = await Engine.start(tmp_path, settings)
    path = tmp_path / SNAPSHOT_NAME
    secret = f"sk-live-{uuid7().hex}"
    try:
        team = factories.collective()
        kept = factories.experience(team.collective_id, "a lesson that stays")
        told = factories.experience(team.collective_id, f"the key is {secret}")
        await engine.apply(_entries([team, kept, told], 1))
        await eventually(lambda: _holds(path, secret.encode()), what="the secret in the snapshot")
        await engine.apply(_entries([_delete(told)], 4))
        deleted = time.monotonic()
        bound = engine.snapshot_status().bound  # type: ignore[union-attr]
        await eventually(
            lambda: not _holds(path, secret.encode()), timeout=30,
            what="the secret gone from the snapshot",
        )  # fmt: skip
        assert time.monotonic() - deleted <= bound + 1.0
        assert _read(path, "SELECT content FROM experiences") == [("a lesson that stays",)]
        assert _read(path, "SELECT seq FROM checkpoint") == [(4,)]
    finally:
        await engine.close()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("snapshot")] == [
        SNAPSHOT_NAME
    ]  # no old copy, no temporary file


async def test_compact_puts_the_rewritten_state_in_the_snapshot_at_once(tmp_path: Path) -> None:
    # refreshes a minute apart: only the scrub can have removed the secret
    settings = ProjectionSettings(snapshot_interval=60, scrub_after=3600)
    engine = await Engine.start(tmp_path, settings)
    path = tmp_path / SNAPSHOT_NAME
    secret = f"sk-live-{uuid7().hex}"
    try:
        team = factories.collective()
        told = factories.experience(team.collective_id, f"the key is {secret}")
        await engine.apply(_entries([team, told], 1))
        await engine.run(lambda p: engine.snapshot.refresh(p).result())  # type: ignore[union-attr]
        assert _holds(path, secret.encode())
        await engine.apply(_entries([_delete(told)], 3))
        assert _holds(path, secret.encode())  # the next refresh is a minute away
        await engine.scrub()
        assert not _holds(path, secret.encode())
        assert _read(path, "SELECT seq FROM checkpoint") == [(3,)]
        assert engine.snapshot_status().seq == 3  # type: ignore[union-attr]
    finally:
        await engine.close()


async def test_a_refresh_only_when_the_state_changed(tmp_path: Path) -> None:
    engine = await Engine.start(tmp_path, ProjectionSettings(snapshot_interval=0.05))
    snapshot = engine.snapshot
    assert snapshot is not None
    try:
        team = factories.collective()
        await engine.apply(_entries([team], 1))
        await eventually(lambda: engine.snapshot_status().seq == 1)  # type: ignore[union-attr]
        await eventually(lambda: engine.snapshot_status().age == 0.0)  # type: ignore[union-attr]
        written = path_state(tmp_path / SNAPSHOT_NAME)
        # reads and flushes change nothing: no refresh is due, the file stays as it is
        await engine.checkpoint()
        await engine.digest()
        assert await engine.run(lambda p: (snapshot.stale(p), snapshot.due())) == (False, None)
        assert path_state(tmp_path / SNAPSHOT_NAME) == written
        await engine.apply(_entries([factories.experience(team.collective_id)], 2))
        await eventually(lambda: engine.snapshot_status().seq == 2)  # type: ignore[union-attr]
        assert path_state(tmp_path / SNAPSHOT_NAME) != written
    finally:
        await engine.close()


def path_state(path: Path) -> tuple[int, int]:
    found = path.stat()
    return found.st_ino, found.st_mtime_ns


async def test_a_stop_leaves_the_last_state_and_an_open_clears_what_a_crash_left(
    tmp_path: Path,
) -> None:
    settings = ProjectionSettings(snapshot_interval=3600)  # no refresh but at the stop
    engine = await Engine.start(tmp_path, settings)
    team = factories.collective()
    await engine.apply(_entries([team, factories.experience(team.collective_id)], 1))
    await engine.close()
    path = tmp_path / SNAPSHOT_NAME
    assert _read(path, "SELECT seq FROM checkpoint") == [(2,)]
    assert _read(path, "SELECT count(*) FROM experiences") == [(1,)]
    # a crash midway through a refresh left its temporary files; the snapshot is current
    leftovers = [tmp_path / f"{SNAPSHOT_NAME}.tmp", tmp_path / f"{SNAPSHOT_NAME}.tmp.wal"]
    for leftover in leftovers:
        leftover.write_bytes(b"half a copy")
    before = path_state(path)
    engine = await Engine.start(tmp_path, settings)
    try:
        assert not any(leftover.exists() for leftover in leftovers)
        status = engine.snapshot_status()
        assert status is not None and status.seq == 2 and status.age == 0.0
        assert path_state(path) == before  # current: not copied again
    finally:
        await engine.close()
    # a snapshot behind the state (a crash before its refresh) is refreshed at once
    behind = path.read_bytes()
    engine = await Engine.start(tmp_path, settings)
    await engine.apply(_entries([factories.experience(team.collective_id)], 3))
    await engine.close()
    path.write_bytes(behind)
    engine = await Engine.start(tmp_path, settings)
    try:
        await eventually(lambda: engine.snapshot_status().seq == 3)  # type: ignore[union-attr]
        assert _read(path, "SELECT count(*) FROM experiences") == [(2,)]
    finally:
        await engine.close()


_DELETED = (ev.CollectiveDeleted, ev.ExperienceDeleted, ev.RelationDeleted, ev.InsightDeleted,
            ev.WisdomDeleted, ev.SessionDeleted)  # fmt: skip


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, every column (the local ones too), in one order."""
    names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    found = {n: con.execute(f"SELECT * FROM {n} ORDER BY ALL").fetchall() for n in names}
    found["meta"] = [r for r in found["meta"] if r[0] != "snapshot_taken_at"]
    return found


@settings(max_examples=by_profile(ci=12, dev=50))  # each example ~0.7 CPU-s
@given(histories, st.integers(min_value=2, max_value=5))
def test_a_caught_up_snapshot_holds_every_row_of_the_state(
    events: list[ev.Event], parts: int
) -> None:
    """Refreshed after each part of a random history (caught up, or copied whole after a
    delete), the snapshot holds exactly the state's tables, row for row."""

    async def run(directory: Path) -> None:
        # refreshes when asked only, and no scrub (it would change meta after its copy)
        settings = ProjectionSettings(snapshot_interval=3600, scrub_after=3600)
        engine = await Engine.start(directory, settings)
        snapshot = engine.snapshot
        assert snapshot is not None
        try:
            size = -(-len(events) // parts)
            for at in range(0, len(events), size):
                part = events[at : at + size]
                await engine.apply(_entries(part, at + 1))
                await engine.run(lambda p: snapshot.refresh(p).result())
                if at > 0:  # (the first may follow the one the engine makes at open)
                    assert snapshot.whole == any(isinstance(e, _DELETED) for e in part)
                live = await engine.run(lambda p: _tables(p.store.con))
                con = duckdb.connect(str(directory / SNAPSHOT_NAME), read_only=True)
                try:
                    assert _tables(con) == live
                finally:
                    con.close()
        finally:
            await engine.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))
