"""Raw nats-py peers shared by the benchmarks: what Pulse is compared with."""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext, api


async def raw_drain(js: JetStreamContext, subject: str, total: int, timeout: float = 600) -> int:
    """Consume ``total`` messages of ``subject`` from the start with an ordered push
    consumer and a callback (nats-py's fastest path), counting them, decoding nothing."""
    done = asyncio.Event()
    count = 0

    async def on_message(msg: object) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    sub = await js.subscribe(
        subject, cb=on_message, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
    )
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await sub.unsubscribe()
    return count
