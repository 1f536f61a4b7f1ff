"""Rebuild and digest through the command line, on a real NATS server; and a catch-up
killed with SIGKILL mid-run that resumes from its checkpoint without applying an event
twice or skipping one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from eventlog import EmbeddedNats, JetStreamLog
from eventlog import events as ev
from projections.store import Store
from tests.factories import history

PULSE = str(Path(sys.executable).parent / "pulse")


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    server = EmbeddedNats(tmp_path / "data", sync_always=False)  # the CLI reuses this server
    server.start()
    yield tmp_path / "data"
    server.stop()


async def fill(data_dir: Path, events: list[ev.Event]) -> int:
    server = EmbeddedNats(data_dir)
    log = await JetStreamLog.connect(server.start(), append_timeout=30)
    for start in range(0, len(events), 1000):
        await log.append_batch(events[start : start + 1000])
    last = await log.last_seq()
    await log.close()
    return last


def pulse_json(data_dir: Path, *args: str) -> dict[str, object]:
    result = subprocess.run(
        [PULSE, "--data-dir", str(data_dir), *args, "--json"],
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


# a log of about 2,600 events, read in batches of 100, checkpointed every 200 events; a run
# is killed once it reports 400 events done (``tests/rebuild_worker.py``)
RECORDS, BATCH, EVERY, KILL_AFTER = 1500, 100, 200, 400
ROOT = Path(__file__).resolve().parent.parent


def killed_after_checkpoint(data_dir: Path, command: str, label: str) -> None:
    """Run ``pulse <command> --checkpoint-every EVERY`` over batches of BATCH events; it
    SIGKILLs itself once its progress reaches ``KILL_AFTER`` events done (the round that
    crossed that count wrote its checkpoint before reporting; the next batches are being
    applied)."""
    process = subprocess.run(
        [sys.executable, "-m", "tests.rebuild_worker", str(data_dir), command, str(EVERY),
         str(BATCH), str(KILL_AFTER)],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300,
    )  # fmt: skip
    *lines, last = process.stderr.splitlines() or [""]
    assert lines and all(line.startswith(label) for line in lines), process.stderr
    assert last.startswith("killed at ") and int(last.split()[-1]) >= KILL_AFTER, process.stderr
    assert process.returncode == -signal.SIGKILL, "killed mid-run, not finished"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PULSE_NATS_URL", "PULSE_DATA_DIR")}


async def test_digest_is_the_same_before_and_after_rebuild(data_dir: Path) -> None:
    last = await fill(data_dir, history(300))
    caught = pulse_json(data_dir, "catch-up")
    assert caught["applied"] == caught["seq"] == caught["applied_total"] == last
    before = pulse_json(data_dir, "digest")
    assert before["digest"] == caught["digest"] and before["seq"] == last
    old_state = (data_dir / "state").resolve()

    rebuilt = pulse_json(data_dir, "rebuild")
    assert rebuilt["digest"] == before["digest"]
    assert Path(str(rebuilt["state"])) == (data_dir / "state").resolve() != old_state
    assert not old_state.exists(), "the old state is removed after the swap"
    assert pulse_json(data_dir, "digest")["digest"] == before["digest"]


async def test_catch_up_killed_mid_batch_resumes_from_its_checkpoint(data_dir: Path) -> None:
    last = await fill(data_dir, history(RECORDS))
    for _ in range(2):  # kill it twice, at different points
        killed_after_checkpoint(data_dir, "catch-up", "applying ")
        store = Store((data_dir / "state").resolve() / "state.duckdb", read_only=True)
        seq, applied = store.checkpoint()
        store.close()
        assert 0 < seq < last, "killed mid-run: part of the log is applied"
        assert applied == seq, "no event applied twice (every sequence counted once)"

    resumed = pulse_json(data_dir, "catch-up")
    assert resumed["seq"] == resumed["applied_total"] == last
    assert 0 < int(str(resumed["applied"])) < last  # it went on from the checkpoint
    clean = pulse_json(data_dir, "rebuild")
    assert clean["digest"] == resumed["digest"]


async def test_rebuild_killed_midway_leaves_a_state_that_opens_and_converges(
    data_dir: Path,
) -> None:
    last = await fill(data_dir, history(RECORDS))
    caught = pulse_json(data_dir, "catch-up")
    current = (data_dir / "state").resolve()
    killed_after_checkpoint(data_dir, "rebuild", "rebuilding ")
    assert (data_dir / "state").resolve() == current, "the link moves only when it is done"
    left = [d for d in data_dir.glob("state-*") if d != current]
    assert left, "the killed rebuild left its half-built state"
    assert pulse_json(data_dir, "digest")["digest"] == caught["digest"]

    rebuilt = pulse_json(data_dir, "rebuild")
    assert rebuilt["digest"] == caught["digest"]
    assert sorted(data_dir.glob("state-*")) == [Path(str(rebuilt["state"]))]
    resumed = pulse_json(data_dir, "catch-up")
    assert resumed["seq"] == last and resumed["applied"] == 0


def test_the_state_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The state directory holds every memory in clear: mode 0700, also when an older
    version left it open."""
    import stat

    from projections.projection import state_dir

    made = state_dir(tmp_path / "data")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o755)
    assert stat.S_IMODE(state_dir(tmp_path / "data").stat().st_mode) == 0o700
