"""Rebuilding a data directory's state from the log: a fresh state directory replayed
by an engine of its own, then swapped in atomically (``pulse rebuild``).

A module of its own, above ``projections.engine`` (which folds the log into the fresh
state): the projection, which the engine runs, does not import the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from eventlog.log import EventLog
from projections.engine import Engine
from projections.projection import (
    Progress,
    ProjectionSettings,
    fresh_state_dir,
    point_state,
    state_link,
)
from projections.scope import Scope
from projections.store import StateInUse


async def rebuild(
    data_dir: str | Path,
    log: EventLog,
    *,
    settings: ProjectionSettings | None = None,
    progress: Progress | None = None,
) -> tuple[Path, str]:
    """Replay the whole log into a fresh state directory, then swap it in atomically.

    The current state is untouched until the swap; afterwards it is removed, and so is
    what an earlier rebuild that was killed left behind. Returns the new directory and
    its digest. Nothing may have the current state open (``pulse rebuild`` checks).
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(data_dir / "rebuild.lock"):
        return await _rebuild(data_dir, log, settings, progress)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """One rebuild at a time per data directory (a second one refuses at once)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateInUse(f"another rebuild of {path.parent} is running") from None
        yield
    finally:
        os.close(fd)


async def _rebuild(
    data_dir: Path, log: EventLog, settings: ProjectionSettings | None, progress: Progress | None
) -> tuple[Path, str]:
    link = state_link(data_dir)
    old = link.resolve() if link.exists() else None
    for orphan in list(data_dir.glob("state-*")):  # noqa: ASYNC240 (a few names) -- left by a rebuild that was killed
        if orphan != old and orphan.is_dir():
            shutil.rmtree(orphan, ignore_errors=True)
    target = fresh_state_dir(data_dir)
    try:
        # a host that follows some collectives rebuilds those (projections.scope)
        scope = Scope.load(old) if old is not None else None
        if scope is not None:
            scope.collectives = dict.fromkeys(scope.collectives, 0)
            scope.save(target)
        # (no analysts' snapshot while it is built: the instance that opens it makes one)
        quiet = dataclasses.replace(settings or ProjectionSettings(), snapshot_interval=None)
        engine = await Engine.start(target, quiet)
        try:
            await engine.catch_up(
                log, progress=progress, subjects=None if scope is None else scope.filters()
            )
            digest = await engine.digest()
        finally:
            await engine.close()
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    point_state(link, target)
    if old is not None and old != target:
        shutil.rmtree(old, ignore_errors=True)
    return target, digest
