"""A host killed between a delete's tombstone and its purge. Driven by
tests/test_forgetting.py.

    python -m tests.forget_worker DATA_DIR NATS_URL experience|collective SECRET

Records SECRET in a new collective, prints the ids as one JSON line, then deletes the
experience (or the whole collective) with the stream's purge replaced by SIGKILL: the
tombstone is appended and applied, and the process dies before anything is purged.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from sync import PulseDB


async def main(data_dir: str, url: str, what: str, secret: str) -> None:
    db = await PulseDB.open(data_dir, url)
    cid = await db.create_collective("me", "doomed", 3)
    eid = await db.record_experience(cid, secret, [1.0, 0.0, 0.0])
    print(json.dumps({"collective": str(cid), "experience": str(eid)}), flush=True)

    async def die(*_: Any, **__: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    db.log.purge = die  # type: ignore[method-assign]
    if what == "collective":
        await db.delete_collective(cid)
    else:
        await db.delete_experience(eid)
    raise SystemExit("the purge did not run")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
