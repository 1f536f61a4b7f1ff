"""CPU time per test, servers included: a pytest plugin (`make test-cpu`).

The suite is CPU-bound, and its servers (`pulse up`, nats-server, SQL workers) do much
of the work in processes of their own, so wall-clock durations on a shared machine say
little: this counts, around each test (setup and teardown included), the CPU time of the
test process, of the children it reaped, and of its live descendants (read from /proc,
children they reaped included). It prints the costliest tests and files at the end.
Run it in one process (``-p no:xdist``), one file or a few at a time; or across the
whole suite under `make test` (``PYTEST_ARGS="-p tests.cpu_time"``): each test process
counts its own tests (the others' are not its descendants) and hands its figures to the
controlling process, which prints them all.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
_spent: Counter[str] = Counter()


def _descendants() -> float:
    """CPU seconds of this process's live descendants (and of the children they reaped)."""
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (ended meanwhile)
            continue
        parent[int(entry.name)] = int(fields[1])
        spent[int(entry.name)] = sum(int(x) for x in fields[11:15]) / _TICK
    me, total = os.getpid(), 0.0
    for pid, seconds in spent.items():
        up = parent.get(pid)
        while up and up != me:
            up = parent.get(up)
        if up == me:
            total += seconds
    return total


def cpu_seconds() -> float:
    """This process's CPU time, its reaped children's and its live descendants'."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + _descendants()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    before = cpu_seconds()
    yield
    _spent[item.nodeid] += cpu_seconds() - before


def _handed_over(controller: int) -> Path:
    """Where a pytest-xdist worker leaves its figures for ``controller`` (its parent)."""
    return Path(tempfile.gettempdir()) / f"pulse-cpu-time-{controller}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and _spent:
        folder = _handed_over(os.getppid())
        folder.mkdir(exist_ok=True)
        (folder / f"{worker}.json").write_text(json.dumps(_spent))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    folder = _handed_over(os.getpid())
    if folder.exists():  # (under xdist: the workers' figures)
        for handed in folder.glob("*.json"):
            _spent.update(json.loads(handed.read_text()))
            handed.unlink()
        folder.rmdir()
    if not _spent:
        return
    files: Counter[str] = Counter()
    for nodeid, seconds in _spent.items():
        files[nodeid.split("::")[0]] += seconds
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds (test process and its servers)")
    for name, seconds in files.most_common(int(os.environ.get("CPU_TIME_TOP", "15"))):
        write(f"{seconds:8.1f}  {name}")
    write(f"{sum(files.values()):8.1f}  in all ({len(_spent)} tests); the costliest tests:")
    for nodeid, seconds in _spent.most_common(int(os.environ.get("CPU_TIME_TOP", "15"))):
        write(f"{seconds:8.1f}  {nodeid}")
