"""`pulse demo`: three instances on one embedded NATS server, writing and reinforcing the
same experiences at once, then showing that they agree (digests and counts)."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from pathlib import Path
from uuid import UUID

from eventlog import EmbeddedNats
from sync import PulseDB

HOSTS = 3


async def run_demo(directory: Path | None, experiences: int, reinforcements: int) -> bool:
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="pulse-demo-"))
    server = EmbeddedNats(root / "nats-host", sync_always=False)
    url = server.start()
    hosts: list[PulseDB] = []
    try:
        print(
            f"NATS at {server.plain_url}; three hosts with their own data directories under {root}"
        )
        hosts = [await PulseDB.open(root / f"host-{i + 1}", url) for i in range(HOSTS)]
        collective = await hosts[0].create_collective("demo-owner", "demo", 8)
        await asyncio.gather(*(h.sync() for h in hosts))
        rng = random.Random(7)
        ids: list[UUID] = []
        for n in range(experiences):
            host = hosts[n % HOSTS]
            vector = [rng.random() for _ in range(8)]
            ids.append(await host.record_experience(collective, f"lesson {n + 1}", vector))
        await asyncio.gather(*(h.sync() for h in hosts))

        calls: dict[UUID, int] = dict.fromkeys(ids, 0)

        async def reinforce(host: PulseDB, seed: int) -> None:
            picker = random.Random(seed)
            for _ in range(reinforcements):
                experience = picker.choice(ids)
                await host.reinforce_experience(experience)
                calls[experience] += 1

        print(
            f"{HOSTS} hosts reinforce {len(ids)} experiences, {reinforcements} times each, at once"
        )
        await asyncio.gather(*(reinforce(h, i) for i, h in enumerate(hosts)))
        await asyncio.gather(*(h.sync() for h in hosts))

        digests = [await h.digest() for h in hosts]
        print()
        print(f"{'host':<8} {'instance':<38} {'applied':>8}  digest")
        for i, host in enumerate(hosts):
            seq = host.applied_seq
            print(f"host-{i + 1:<3} {host.instance_id!s:<38} {seq:>8}  {digests[i][:16]}")
        print()
        header = "".join(f"{'host-' + str(i + 1):>8}" for i in range(HOSTS))
        print(f"{'experience':<12}{header}{'calls':>8}")
        agree = len(set(digests)) == 1
        for n, experience in enumerate(ids):
            totals = []
            for host in hosts:
                got = await host.get_experience(experience)
                totals.append(got.applications if got else -1)
            agree &= all(t == calls[experience] for t in totals)
            row = "".join(f"{t:>8}" for t in totals)
            print(f"{'lesson ' + str(n + 1):<12}{row}{calls[experience]:>8}")
        print()
        print("All three hosts agree." if agree else "The hosts DISAGREE.")
        return agree
    finally:
        for host in hosts:
            await host.close()
        server.stop()
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)
