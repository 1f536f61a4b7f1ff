"""Work on a data directory's state with no instance open: catch it up with the log,
rebuild it from the log, and read its digest. `pulse catch-up`, `pulse rebuild` and
`pulse digest` are these functions (``ops.cli.maintenance`` only opens the log for them
and prints what they return).

Each opens the state as its owner (one process at a time, ``projections.store``), and
a host that follows some collectives (``projections.scope``) folds only theirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eventlog.log import EventLog
from projections.engine import Engine
from projections.projection import ProjectionSettings, holding_state, state_dir
from projections.rebuild import rebuild as rebuild_state
from projections.scope import Scope

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class CaughtUp:
    """What a catch-up did: the events it applied now, the sequence the state is at, how
    many events the state has applied in all, and its digest."""

    applied: int
    seq: int
    applied_total: int
    digest: str


@dataclass(frozen=True)
class Rebuilt:
    """The new state directory, swapped in, and its digest."""

    state: Path
    digest: str


@dataclass(frozen=True)
class Digest:
    """A state's digest (``Engine.digest``) at its sequence, and its events applied."""

    digest: str
    seq: int
    applied: int


async def catch_up(
    data_dir: str | Path,
    log: EventLog,
    *,
    settings: ProjectionSettings | None = None,
    progress: Progress | None = None,
) -> CaughtUp:
    """Apply what the log holds past the state's checkpoint (of the followed collectives
    only, on a host that follows some), then checkpoint. Killed at any moment, the next
    catch-up resumes from the last checkpoint. No analysts' snapshot is made (a whole
    copy): the instance refreshes it when it opens."""
    quiet = dataclasses.replace(settings or ProjectionSettings(), snapshot_interval=None)
    state = await asyncio.to_thread(state_dir, data_dir)
    scope = await asyncio.to_thread(Scope.load, state)
    engine = await Engine.start(state, quiet)
    try:
        applied = await engine.catch_up(
            log, progress=progress, subjects=None if scope is None else scope.filters()
        )
        seq, total = await engine.checkpoint()
        digest = await engine.digest()
    finally:
        await engine.close()
    return CaughtUp(applied, seq, total, digest)


async def rebuild(
    data_dir: str | Path,
    log: EventLog,
    *,
    settings: ProjectionSettings | None = None,
    progress: Progress | None = None,
) -> Rebuilt:
    """Replay the whole log into a fresh state and swap it in atomically
    (``projections.rebuild``), holding the current state meanwhile
    (``holding_state``): refused (``StateInUse``, the state untouched) while another
    process has it open, and no process can open it until it has been swapped out."""
    with holding_state(data_dir, "rebuild"):
        directory, digest = await rebuild_state(data_dir, log, settings=settings, progress=progress)
    return Rebuilt(directory, digest)


async def digest(data_dir: str | Path) -> Digest:
    """The digest of a data directory's state as it is (it reads; nothing is applied)."""
    settings = ProjectionSettings(snapshot_interval=None)  # (nothing to copy)
    state = await asyncio.to_thread(state_dir, data_dir)
    engine = await Engine.start(state, settings)
    try:
        seq, applied = await engine.checkpoint()
        return Digest(await engine.digest(), seq, applied)
    finally:
        await engine.close()
