"""Benchmark: how fast the `pulse` command line answers, beside `python -c pass`.

    python -m ops.bench.cli_start [--runs 15]

Agent hosts run `pulse` once per action, so its start-up is paid every time. Starts
`pulse up` on a temporary data directory (a collective with the ``hash`` embedder and one
experience), then runs, ``runs`` times each and in turns (so that the load of a shared
machine falls on all of them alike): `python -c pass` (the interpreter alone, the peer),
`pulse --help` and some `pulse COMMAND --help`, and the commands that go through the
running service: record, search, get, reinforce and collective list. For those it also
makes the same API calls from a process that is already running (``ops.remote``, the
client the CLI uses): the service's own time, embedding included, which the CLI's figure
contains. Prints JSON lines: median and p90 in ms of each, its ratio to `python -c pass`,
and for the commands through the service, the CLI's own share (median minus the same
calls from the running process).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ops.bench import emitter
from ops.bench.service import start_service
from ops.remote import RemotePulseDB, running_service
from sync.pages import PAGE_MAX

HELP = (["--help"], ["record", "--help"], ["search", "--help"], ["collective", "list", "--help"])


emit = emitter("cli_start")


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"median_ms": round(ms[len(ms) // 2], 1),
            "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 1)}  # fmt: skip


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def main(runs: int) -> None:
    pulse = str(Path(sys.executable).parent / "pulse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-cli-") as tmp:
        data_dir = Path(tmp) / "data"
        process, _url = start_service(data_dir)  # (it leaves PULSE_* out, as env does)
        try:
            run = [pulse, "--data-dir", str(data_dir)]
            out = subprocess.run(
                [*run, "collective", "create", "bench", "--owner", "me", "--embedder", "hash"],
                env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            collective = out.stdout.strip()
            out = subprocess.run(
                [*run, "record", "-c", "bench", "Retry NATS publishes on timeout"],
                env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            experience = out.stdout.strip()
            commands: dict[str, list[str]] = {"python -c pass": [sys.executable, "-c", "pass"]}
            for argv in HELP:
                commands[f"pulse {' '.join(argv)}"] = [pulse, *argv]
            through = {
                "pulse record": ["record", "-c", "bench", "Pin nats-server in CI"],
                "pulse search": ["search", "-c", "bench", "nats timeout"],
                "pulse get": ["get", experience],
                "pulse reinforce": ["reinforce", experience],
                "pulse collective list": ["collective", "list"],
            }
            for name, argv in through.items():
                commands[name] = [*run, *argv]
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(runs):
                for name, argv in commands.items():
                    times[name].append(timed(argv, env))
            warm = asyncio.run(warm_calls(data_dir, collective, experience, runs))
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
    peer = summary(times["python -c pass"])
    emit("python -c pass", runs=runs, **peer)
    for name, seconds in times.items():
        if name == "python -c pass":
            continue
        figures = summary(seconds)
        ratio = round(figures["median_ms"] / peer["median_ms"], 1)
        extra: dict[str, Any] = {}
        if name in warm:
            service = summary(warm[name])
            own = round(figures["median_ms"] - service["median_ms"], 1)
            extra = {"service_median_ms": service["median_ms"], "cli_own_median_ms": own}
        emit(name, runs=runs, **figures, ratio_to_python=ratio, **extra)


async def warm_calls(
    data_dir: Path, collective: str, experience: str, runs: int
) -> dict[str, list[float]]:
    """The API calls each command makes, from this (running) process: the service's time."""
    service = running_service(data_dir)
    assert service is not None
    db = RemotePulseDB.from_data_dir(data_dir)

    async def by_name() -> Any:  # what `-c bench` costs: finding the collective by name
        return await db.find_collective("bench")

    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "pulse record": lambda: _both(by_name(), db.record_experience(collective, "Pin CI")),
        "pulse search": lambda: _both(by_name(), db.search_hybrid(collective, "nats timeout")),
        "pulse get": lambda: db.get_experience(experience),
        "pulse reinforce": lambda: db.reinforce_experience(experience),
        "pulse collective list": lambda: db.list_collectives(limit=PAGE_MAX),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for _ in range(runs):
            for name, call in calls.items():
                started = time.perf_counter()
                await call()
                times[name].append(time.perf_counter() - started)
    finally:
        await db.close()
    return times


async def _both(first: Awaitable[Any], second: Awaitable[Any]) -> None:
    await first
    await second


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (15)")
    options = parser.parse_args()
    main(options.runs)
