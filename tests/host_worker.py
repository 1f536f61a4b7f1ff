"""One host in the multi-process test: an instance process that reinforces experiences
and records every acknowledged call. Driven by tests/test_hosts.py.

    python -m tests.host_worker DATA_DIR URLS IDS_FILE ACKS_FILE OPS SEED

Prints "ready", then "acked N" after each acknowledged reinforcement. If the file
ACKS_FILE.hold holds a number N, after its N-th acknowledgement it prints "holding" and
waits (to be killed between calls, so every call it made is acknowledged or never made).
After OPS calls it prints "finished" and waits for a line on stdin, then syncs and
prints one JSON line: its digest and the totals it sees, and what explains a digest
that differs (``explain``): the applied sequence, each digested table's rows (DuckDB's),
and the G-counter entries memory holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
from pathlib import Path
from uuid import UUID

from eventlog.errors import PulseError
from projections import schema
from projections.projection import Projection
from sync import PulseDB

ROWS_SHOWN = 500  # a table with more rows is shown by its count only


async def main(
    data_dir: str, urls: str, ids_file: str, acks_file: str, ops: int, seed: int
) -> None:
    ids = [UUID(i) for i in json.loads(Path(ids_file).read_text())]
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    logging.basicConfig(  # (what the test shows when the hosts disagree)
        filename=Path(data_dir) / "pulse.log", level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )  # fmt: skip
    db = await PulseDB.open(data_dir, urls, append_timeout=30)
    await db.sync()
    print("ready", flush=True)
    rng = random.Random(seed)
    hold = Path(acks_file + ".hold")
    with open(acks_file, "a") as acks:
        done = 0
        while done < ops:
            experience = rng.choice(ids)
            try:
                await db.reinforce_experience(experience)
            except PulseError as exc:  # not acknowledged: not counted; the next call re-announces
                print(f"retry {exc!r}", flush=True)
                continue
            acks.write(f"{experience}\n")
            acks.flush()
            os.fsync(acks.fileno())
            done += 1
            print(f"acked {done}", flush=True)
            if hold.exists() and int(hold.read_text()) == done:
                print("holding", flush=True)
                await asyncio.Event().wait()
    print("finished", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await db.sync()
    totals = {}
    for experience in ids:
        got = await db.get_experience(experience)
        totals[str(experience)] = got.applications if got else -1
    digest = await db.digest()
    explained = await db.engine.run(explain)
    print(json.dumps({"digest": digest, "totals": totals, "explain": explained}), flush=True)
    await db.close()


def explain(p: Projection) -> dict[str, object]:
    """What the digest hashes, table by table (each row as text), and the G-counter entries
    in memory; on the engine thread, DuckDB flushed first."""
    p.flush()
    tables: dict[str, object] = {}
    for name, query in schema.DIGEST_QUERIES.items():
        rows = [repr(row) for row in p.store.con.execute(query).fetchall()]
        tables[name] = rows if len(rows) <= ROWS_SHOWN else f"{len(rows)} rows"
    memory = sorted(
        f"{row.experience_id} {row.instance_id} {row.collective_id}: "
        f"{row.applications} @ {row.last_hlc}"
        for row in p.memory.applications.values()
    )
    # the sequences this host applied (a reinforcement's in the counts' history, any other
    # event's in the audit, a dead letter's in undecodable): an event one host never
    # applied is told apart from one applied into a different state
    applied = sorted(
        {
            int(seq)
            for table in ("count_history", "audit_rows", "undecodable")
            for (seq,) in p.store.con.execute(f"SELECT DISTINCT seq FROM {table}").fetchall()
        }
    )
    return {
        "seq": p.seq, "flushed_seq": p.flushed_seq, "tables": tables, "memory": memory,
        "rejected": sorted(f"{r.seq} {r.subject}: {r.reason}" for r in p.memory.rejected.values()),
        "applied": applied,
    }  # fmt: skip


if __name__ == "__main__":
    data_dir, urls, ids_file, acks_file, ops, seed = sys.argv[1:7]
    asyncio.run(main(data_dir, urls, ids_file, acks_file, int(ops), int(seed)))
