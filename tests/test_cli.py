"""The `pulse` command line, run as a user would run it (the installed console script)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb
import pytest

from eventlog import JetStreamLog
from eventlog.errors import LogUnavailable
from ops.cli import build_parser
from ops.cli.registry import COMMANDS
from ops.cluster import free_port
from tests import factories as f
from tests.harness import PULSE, Service, drain, pulse, start, stop
from tests.harness import cli_env as _env


@pytest.fixture
def running_pulse(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        [PULSE, "--data-dir", str(data_dir), "up", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(6)]
    match = re.search(r"NATS\s+(nats://127\.0\.0\.1:\d+)", "".join(lines))
    assert match, f"`pulse up` printed {lines!r}"
    logs = drain(process.stderr, [])  # (stdout is a few lines: the test reads its end)
    yield process, match.group(1), data_dir
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    logs.join(timeout=10)
    process.stdout.close()


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command of the parser, nested groups included."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield path, parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from _leaves(sub, (*path, name))


def test_every_command_has_help_with_an_example() -> None:
    leaves = dict(_leaves(build_parser()))
    expected = {cmd.path for cmd in COMMANDS}
    assert set(leaves) == expected
    for path in [
        ("collective", "create"), ("collective", "list"), ("collective", "stats"),
        ("collective", "delete"), ("record",), ("get",), ("update",), ("archive",),
        ("reinforce",), ("search",), ("context",), ("relate",), ("related",), ("sql",),
        ("rebuild",), ("digest",), ("tail",), ("export",), ("up",), ("demo",),
        ("insight", "add"), ("activity", "start"), ("activity", "list"), ("token", "create"),
        ("token", "list"), ("token", "revoke"), ("backup",), ("restore",), ("status",),
        ("nats-config",), ("catch-up",), ("import",), ("compact",), ("call",),
    ]:  # fmt: skip
        assert path in leaves, f"`pulse {' '.join(path)}` is missing"
    for path, sub in leaves.items():
        text = sub.format_help()
        command = " ".join(path)
        assert "example:" in text and f"pulse {command}" in text.split("example:")[1], (
            f"`pulse {command} --help` shows no example of itself"
        )
        assert sub.description and len(sub.description) > 60, f"`pulse {command}` undocumented"
        for action in sub._actions:
            assert action.help, f"`pulse {command}`: {action.dest} has no help text"
        if path[0] not in ("up", "demo", "tail", "mcp"):
            assert "--json" in text, f"`pulse {command}` has no --json"


def test_help_runs_from_the_installed_script(tmp_path: Path) -> None:
    result = pulse("--help", data_dir=tmp_path)
    assert result.returncode == 0 and "up" in result.stdout and "tail" in result.stdout
    result = pulse("tail", "--help", data_dir=tmp_path)
    assert result.returncode == 0 and "pulse tail --new --json" in result.stdout


async def test_up_serves_the_log_and_tail_prints_events(
    running_pulse: tuple[subprocess.Popen[str], str, Path],
) -> None:
    process, url, data_dir = running_pulse
    with pytest.raises(LogUnavailable, match="authorization"):  # the URL alone is refused
        await JetStreamLog.connect(url, connect_timeout=30)
    log = await JetStreamLog.connect(url, credentials=data_dir / "nats" / "credentials.json")
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
    process.wait(timeout=20)
    with process.stdout:  # type: ignore[union-attr]
        out = process.stdout.read()  # type: ignore[union-attr]
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


def test_every_operation_from_the_command_line(tmp_path: Path) -> None:
    """Each command as a user runs it: the first ones in a process of their own over the
    data directory (no service runs), the others through the `pulse up` that serves it
    (each then costs a quarter of the CPU: no instance to open)."""
    data = tmp_path / "data"
    served: list[Service] = []

    def ok(*args: str) -> str:
        result = pulse(*args, data_dir=data)
        assert result.returncode == 0, f"pulse {' '.join(args)}: {result.stderr}"
        return result.stdout.strip()

    def js(*args: str) -> object:
        return json.loads(ok(*args, "--json"))

    try:
        _every_operation(data, tmp_path, ok, js, served)
    finally:
        for service in served:
            if service.process.poll() is None:
                stop(service)


def _every_operation(
    data: Path, tmp_path: Path, ok: Callable[..., str], js: Callable[..., Any],
    served: list[Service],
) -> None:  # fmt: skip
    cid = ok("collective", "create", "team", "--owner", "ana", "--embedder", "hash")
    assert js("collective", "list", "--owner", "ana") == [
        {"collective_id": cid, "owner_id": "ana", "name": "team", "embedding_dimension": 384,
         "embedder": "hash", "created_ms": ANY_INT, "language": "auto",
         "on_duplicate": "keep", "duplicate_similarity": 0.95}
    ]  # fmt: skip
    a = ok(
        "record",
        "-c",
        "team",
        "Retry NATS publishes on timeout",
        "--domain",
        "nats",
        "--importance",
        "0.8",
        "--type",
        '{"kind": "Fact", "statement": "s", "source": "x"}',
    )
    b = ok("record", "-c", cid, "NATS timeouts come from slow fsync", "--file", "ops/nats.conf",
           "--task", "debug the timeouts")  # fmt: skip
    listed = js("list", "-c", "team", "--source-task", "debug the timeouts")
    assert [e["experience_id"] for e in listed] == [b]
    assert js("get", a)["experience_type"] == {"kind": "Fact", "statement": "s", "source": "x"}
    ok("export", str(tmp_path / "export"))  # (in a process of its own: never through one)
    exported = (
        duckdb.connect()
        .execute(f"SELECT count(*) FROM '{tmp_path / 'export' / 'experiences.parquet'}'")
        .fetchone()
    )
    assert exported == (2,)
    served.append(start(data))  # from here on, through the service (running_service)
    assert "url" in json.loads((data / "service.json").read_text())
    hits = js("search", "-c", "team", "nats timeout", "--mode", "text")
    assert {h["experience"]["experience_id"] for h in hits} == {a, b}
    assert js("search", "-c", "team", "slow fsync", "--mode", "similar", "-k", "1")[0][
        "experience"]["experience_id"] == b  # fmt: skip
    rid = ok("relate", a, "Supports", b, "--strength", "0.9")
    assert [r["relation"]["relation_id"] for r in js("related", b, "--direction", "incoming")] == [
        rid]  # fmt: skip
    iid = ok("insight", "add", "-c", "team", "timeouts: check the disks", "--source", a)
    assert js("insight", "search", "-c", "team", "disks")[0]["insight"]["insight_id"] == iid
    ok("activity", "start", "agent-7", "-c", "team", "--task", "debugging", "--on", "nats.py")
    ok("activity", "heartbeat", "agent-7", "-c", "team")
    assert [x["agent_id"] for x in js("activity", "list", "-c", "team")] == ["agent-7"]
    context = js("context", "-c", "team", "nats publish timeout")
    assert len(context["similar"]) == 2 and context["active_agents"][0]["agent_id"] == "agent-7"
    ok("activity", "end", "agent-7", "-c", "team")
    assert ok("activity", "list", "-c", "team") == "no active agents"
    assert ok("reinforce", a) == "1"
    ok("update", a, "--confidence", "0.9")
    ok("archive", b)
    assert [e["experience_id"] for e in js("list", "-c", "team")] == [a]
    ok("unarchive", b)
    assert js("stats", "team")["experiences"] == 2
    wid = ok(
        "wisdom",
        "add",
        "retry with backoff",
        "--owner",
        "ana",
        "--category",
        "CodingStyle",
        "--embedding",
        "[1, 0]",
        "--source",
        "team",
    )
    assert js("wisdom", "list", "--owner", "ana")[0]["wisdom"]["wisdom_id"] == wid
    rows = js("sql", "SELECT content, applications FROM experiences ORDER BY content")
    assert rows == [
        {"content": "NATS timeouts come from slow fsync", "applications": 0},
        {"content": "Retry NATS publishes on timeout", "applications": 1},
    ]
    assert js("cold", "-c", "team", "--threshold", "1") != []
    for removal in (("unrelate", rid), ("insight", "delete", iid), ("wisdom", "delete", wid),
                    ("delete", a)):  # fmt: skip
        ok(*removal)
    assert js("stats", "team")["experiences"] == 1
    ok("collective", "delete", "team")
    assert ok("collective", "list") == "no collectives"


def test_rebuild_refuses_while_another_process_holds_the_state(tmp_path: Path) -> None:
    data = tmp_path / "data"
    created = pulse("collective", "create", "team", "--owner", "o", "--embedder", "hash",
                    data_dir=data)  # fmt: skip
    assert created.returncode == 0, created.stderr
    state = (data / "state").resolve()
    # a service that crashed left its file behind: its pid is gone, so it is not running
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    (data / "service.json").write_text(
        json.dumps({"url": "http://127.0.0.1:1", "pid": dead.pid, "token": False})
    )
    holder = duckdb.connect(str(state / "state.duckdb"))  # as `pulse mcp` would, say
    try:
        before = sorted(p.name for p in state.iterdir())
        refused = pulse("rebuild", data_dir=data)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"pulse: error: rebuild: the state {state / 'state.duckdb'} is open in another "
            f"process (pid {os.getpid()}); stop it first (Ctrl-C on pulse up), then run "
            "pulse rebuild"
        )
        assert (data / "state").resolve() == state
        assert sorted(data.glob("state-*")) == [state]
        assert sorted(p.name for p in state.iterdir()) == before
        assert holder.execute("SELECT name FROM collective_rows").fetchall() == [("team",)]
    finally:
        holder.close()
    # once nothing holds it (and despite the stale service file), the rebuild goes ahead
    rebuilt = pulse("rebuild", "--json", data_dir=data)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (data / "state").resolve() != state and not state.exists()
    listed = pulse("collective", "list", "--json", data_dir=data)
    assert [c["name"] for c in json.loads(listed.stdout)] == ["team"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sql", "DELETE FROM experience_rows"),
         "query: only read-only queries are allowed (SELECT, EXPLAIN), got DELETE"),
        (("sql", "SELEC 1"), "query: Parser Error"),
        (("record", "-c", "nowhere", "text"), "collective: no collective named 'nowhere'"),
        (("collective", "create", "x", "--owner", "o", "--dim", "0"),
         "embedding_dimension: Input should be greater than or equal to 1"),
        (("get", "not-an-id"), "experience_id: not a UUID: 'not-an-id'"),
        (("search", "-c", "nowhere", "x"), "collective: no collective named 'nowhere'"),
    ],
)  # fmt: skip
def test_bad_input_on_the_command_line_is_one_clear_line(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = pulse(*args, data_dir=tmp_path / "data")
    assert result.returncode == 1
    assert result.stderr.startswith(f"pulse: error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


class _AnyInt:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int)


ANY_INT = _AnyInt()


def test_progress_lines_show_the_rate_and_the_time_left() -> None:
    import io

    from ops.progress import ProgressBar, _duration

    out = io.StringIO()
    bar = ProgressBar("rebuilding", out, unit="events")
    bar.started -= 10  # as if it began ten seconds ago
    bar(0, 1000)
    bar(500, 1000)
    bar(1000, 1000)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rebuilding 0/1,000 (0%") and "left" not in lines[0]
    assert lines[1].startswith("rebuilding 500/1,000 (50%, ") and " events/s, " in lines[1]
    assert lines[1].endswith(" left)")  # about 10 s more at this rate
    assert "left" not in lines[2]
    assert [_duration(s) for s in (9.6, 65, 7300)] == ["10s", "1m05s", "2h01m"]
