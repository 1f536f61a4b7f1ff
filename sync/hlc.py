"""The hybrid logical clock: timestamps that follow the wall clock but never go back,
whatever the wall clock does, and that move past every timestamp the host has seen.

A value is ``pack_hlc(wall_ms, logical)`` (see ``eventlog.events``): one sortable int.
``now()`` issues a value greater than every value issued or observed before;
``observe(value)`` takes in a remote one. With a state file, the clock also stays
monotonic across restarts (a restarted host whose wall clock went back still issues
greater values than its previous incarnation did). The file holds a ceiling a few
seconds ahead of what was issued, rewritten only when the clock reaches it, so issuing
a timestamp rarely touches the disk; a restart after a crash starts from the ceiling, one
after a clean stop (``close``) from the last value issued.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from eventlog.events import HLC_LOGICAL_MAX, hlc_logical, hlc_millis, pack_hlc
from eventlog.limits import CLOCK_AHEAD_MS

log = logging.getLogger(__name__)

LEASE_MS = 2_000  # how far ahead of the issued values the saved ceiling lies
# a remote timestamp further ahead of the wall clock is not taken in (the same bound as
# the log's: an event further ahead of the time the stream stored it is a dead letter)
MAX_AHEAD_MS = CLOCK_AHEAD_MS


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class HybridClock:
    def __init__(
        self,
        *,
        wall: Callable[[], int] = wall_ms,
        state_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._wall = wall
        self._lock = threading.Lock()
        self._file = Path(state_file) if state_file is not None else None
        self._last = 0
        self._ceiling = 0  # nothing at or above this has been issued by any incarnation
        if self._file is not None:
            try:
                self._last = self._ceiling = int(json.loads(self._file.read_text())["hlc"])
            except (OSError, ValueError, KeyError):
                self._last = 0
            trusted = pack_hlc(self._wall() + MAX_AHEAD_MS + LEASE_MS, 0)
            if self._last > trusted:  # poisoned by a clock from the future (older versions
                # took in any remote value) or a wall clock set back by a lot: a clock that
                # kept it would stamp every write too far ahead for any host to accept
                log.warning(
                    "the saved clock %s is ahead of the wall clock by more than %d ms; "
                    "starting from the wall clock",
                    self._file, MAX_AHEAD_MS + LEASE_MS,
                )  # fmt: skip
                self._last = self._ceiling = 0

    @property
    def last(self) -> int:
        return self._last

    def now(self) -> int:
        """A new timestamp, greater than every one issued or observed so far."""
        with self._lock:
            wall = self._wall()
            millis, logical = hlc_millis(self._last), hlc_logical(self._last)
            if wall > millis:
                self._last = pack_hlc(wall, 0)
            elif logical < HLC_LOGICAL_MAX:
                self._last = pack_hlc(millis, logical + 1)
            else:  # the logical counter is full: borrow the next millisecond
                self._last = pack_hlc(millis + 1, 0)
            self._save()
            return self._last

    def observe(self, remote: int) -> bool:
        """Take in a timestamp seen on the log, so later ones are issued after it; one
        more than ``MAX_AHEAD_MS`` ahead of this host's wall clock is not trusted (a
        host with a skewed or buggy clock must not drag every other host's clock, and
        so every later write, along with it). Returns whether it was taken in."""
        with self._lock:
            if hlc_millis(remote) > self._wall() + MAX_AHEAD_MS:
                return False
            if remote > self._last:
                self._last = remote
                self._save()
            return True

    def close(self) -> None:
        """Save the last value issued or observed as the ceiling, so a restart after a
        clean stop starts from it rather than from the lease ahead of it (restarts in
        quick succession, as a script of CLI commands makes, would otherwise push the
        clock a lease ahead of the wall clock each time)."""
        with self._lock:
            if self._file is not None and self._last:
                self._ceiling = self._last
                self._write(self._ceiling)

    def _save(self) -> None:
        if self._file is not None and self._last >= self._ceiling:
            self._ceiling = pack_hlc(hlc_millis(self._last) + LEASE_MS, 0)
            self._write(self._ceiling)

    def _write(self, value: int) -> None:
        assert self._file is not None
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"hlc": value}))
        os.replace(tmp, self._file)
