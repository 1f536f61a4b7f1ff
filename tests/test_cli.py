"""The `pulse` command line, run as a user would run it (the installed console script)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from eventlog import JetStreamLog
from ops.cli import COMMANDS, build_parser
from ops.cluster import free_port
from tests import factories as f

PULSE = str(Path(sys.executable).parent / "pulse")


def pulse(*args: str, data_dir: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PULSE, "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PULSE_NATS_URL", None)
    env.pop("PULSE_DATA_DIR", None)
    return env


@pytest.fixture
def running_pulse(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        [PULSE, "--data-dir", str(data_dir), "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(4)]
    match = re.search(r"NATS\s+(nats://127\.0\.0\.1:\d+)", "".join(lines))
    assert match, f"`pulse up` printed {lines!r}"
    yield process, match.group(1), data_dir
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)


def test_every_command_has_help_with_an_example() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(subparsers.choices) == set(COMMANDS)  # type: ignore[arg-type]
    for name, sub in subparsers.choices.items():  # type: ignore[union-attr]
        text = sub.format_help()
        assert "example:" in text, f"`pulse {name} --help` shows no example"
        assert len(COMMANDS[name].__doc__ or "") > 80, f"`pulse {name}` is undocumented"


def test_help_runs_from_the_installed_script(tmp_path: Path) -> None:
    result = pulse("--help", data_dir=tmp_path)
    assert result.returncode == 0 and "up" in result.stdout and "tail" in result.stdout
    result = pulse("tail", "--help", data_dir=tmp_path)
    assert result.returncode == 0 and "pulse tail --new --json" in result.stdout


async def test_up_serves_the_log_and_tail_prints_events(
    running_pulse: tuple[subprocess.Popen[str], str, Path],
) -> None:
    process, url, data_dir = running_pulse
    log = await JetStreamLog.connect(url)
    cid = f.uuid7()
    written = [f.collective(cid), f.experience(cid, "tail shows me")]
    await log.append_batch(written)
    await log.close()

    result = pulse("tail", "--limit", "2", "--json", data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["seq"] for r in records] == [1, 2]
    assert records[0]["event"]["type"] == "collective.created"
    assert records[1]["event"]["content"] == "tail shows me"
    assert records[1]["event"]["embedding"] == [0.5, 0.5, 0.5, 0.5]

    plain = pulse("tail", "--limit", "1", "--from-seq", "2", data_dir=data_dir)
    assert re.search(
        r"^\s+2\s+experience\.recorded\s+pulse\.c\.\S+\s+content='tail shows me'", plain.stdout
    )

    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=20)
    assert process.returncode == 0 and "Pulse stopped." in out
    assert not (data_dir / "nats" / "server.json").exists()


def test_bad_arguments_get_one_line_errors(tmp_path: Path) -> None:
    result = pulse("tail", "--from-seq", "0", data_dir=tmp_path)
    assert result.returncode == 2 and "--from-seq: must be >= 1, got 0" in result.stderr
    result = pulse("--nats-url", f"nats://127.0.0.1:{free_port()}", "tail", data_dir=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("pulse: error: cannot reach NATS")
    assert len(result.stderr.strip().splitlines()) == 1


def test_demo_shows_three_hosts_agreeing(tmp_path: Path) -> None:
    result = pulse("demo", "--experiences", "3", "--reinforcements", "10", data_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("All three hosts agree.")
    digests = re.findall(r"^host-\d\s+\S+\s+\d+\s+([0-9a-f]{16})$", result.stdout, re.M)
    assert len(digests) == 3 and len(set(digests)) == 1
    rows = re.findall(r"^lesson \d\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", result.stdout, re.M)
    assert len(rows) == 3 and all(len(set(row)) == 1 for row in rows)
    assert sum(int(row[3]) for row in rows) == 30
