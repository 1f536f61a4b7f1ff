"""``sync.maintenance``: catch-up, rebuild and digest of a data directory's state, with
no instance open, on an in-memory log (the CLI's commands over a real NATS server are
tests/test_rebuild.py's): a catch-up applies only what is new, a rebuild reaches the
same digest in a fresh state, and a rebuild refuses while another process holds the
state, leaving it as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eventlog.memory import MemoryLog
from projections.store import StateInUse
from sync import maintenance
from tests.factories import history

# holds a DuckDB file open, as a running instance does, until its stdin closes
HOLDER = "import sys, duckdb; con = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"  # noqa: E501


async def test_catch_up_applies_what_is_new_and_rebuild_reaches_the_same_digest(
    tmp_path: Path,
) -> None:
    log = MemoryLog()
    events = history(30)
    await log.append_batch(events[:20])
    first = await maintenance.catch_up(tmp_path, log)
    assert (first.applied, first.seq) == (20, 20)
    await log.append_batch(events[20:])
    second = await maintenance.catch_up(tmp_path, log)
    assert second.applied == len(events) - 20 and second.seq == len(events)
    assert second.applied_total == len(events)
    assert (await maintenance.digest(tmp_path)).digest == second.digest != first.digest
    before = (tmp_path / "state").resolve()
    rebuilt = await maintenance.rebuild(tmp_path, log)
    assert rebuilt.digest == second.digest
    assert rebuilt.state == (tmp_path / "state").resolve() != before and not before.exists()


async def test_a_rebuild_refuses_while_another_process_holds_the_state(tmp_path: Path) -> None:
    log = MemoryLog()
    await log.append_batch(history(5))
    caught_up = await maintenance.catch_up(tmp_path, log)
    state = (tmp_path / "state").resolve()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state / "state.duckdb")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StateInUse) as refused:
            await maintenance.rebuild(tmp_path, log)
        assert str(refused.value) == (
            f"rebuild: the state {state / 'state.duckdb'} is open in another process (pid "
            f"{holder.pid}); stop it first (Ctrl-C on pulse up), then run pulse rebuild"
        )
        assert (tmp_path / "state").resolve() == state
        assert sorted(tmp_path.glob("state-*")) == [state]
    finally:
        holder.communicate(timeout=30)
    assert (await maintenance.digest(tmp_path)).digest == caught_up.digest
