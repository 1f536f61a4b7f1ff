"""One host in the multi-process test: an instance process that reinforces experiences
and records every acknowledged call. Driven by tests/test_hosts.py.

    python -m tests.host_worker DATA_DIR URLS IDS_FILE ACKS_FILE OPS SEED

Prints "ready", then "acked N" after each acknowledged reinforcement. If the file
ACKS_FILE.hold holds a number N, after its N-th acknowledgement it prints "holding" and
waits (to be killed between calls, so every call it made is acknowledged or never made).
After OPS calls it prints "finished" and waits for a line on stdin, then syncs and
prints one JSON line: its digest and the totals it sees.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from uuid import UUID

from eventlog.errors import PulseError
from sync import PulseDB


async def main(
    data_dir: str, urls: str, ids_file: str, acks_file: str, ops: int, seed: int
) -> None:
    ids = [UUID(i) for i in json.loads(Path(ids_file).read_text())]
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
    print(json.dumps({"digest": await db.digest(), "totals": totals}), flush=True)
    await db.close()


if __name__ == "__main__":
    data_dir, urls, ids_file, acks_file, ops, seed = sys.argv[1:7]
    asyncio.run(main(data_dir, urls, ids_file, acks_file, int(ops), int(seed)))
