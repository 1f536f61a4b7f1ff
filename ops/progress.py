"""A progress line for long work: redrawn in place on a terminal, one line per tenth
otherwise (so logs and tests can follow it)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(
        self, label: str, stream: TextIO | None = None, width: int = 30, *, unit: str = ""
    ) -> None:
        self.label = label
        self.unit = f" {unit}" if unit else ""  # "1,234 experiences/s" rather than "1,234/s"
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last_tenth = -1

    def __call__(self, done: int, total: int) -> None:
        total = max(total, done, 1)
        fraction = done / total
        rate = done / max(time.monotonic() - self.started, 1e-9)
        left = f", {_duration((total - done) / rate)} left" if 0 < done < total else ""
        text = f"{self.label} {done:,}/{total:,} ({fraction:.0%}, {rate:,.0f}{self.unit}/s{left})"
        if self.tty:
            filled = int(self.width * fraction)
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(f"\r[{bar}] {text}")
            self.stream.flush()
        elif int(fraction * 10) > self._last_tenth:
            self._last_tenth = int(fraction * 10)
            self.stream.write(text + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h14m``: the time left at the current rate."""
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
