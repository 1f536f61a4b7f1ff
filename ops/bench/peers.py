"""Raw nats-py peers shared by the benchmarks: what Pulse is compared with."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js import JetStreamContext, api


async def raw_drain(
    js: JetStreamContext,
    subject: str | Sequence[str],
    total: int,
    timeout: float = 600,
    *,
    stream: str | None = None,
) -> int:
    """Consume ``total`` messages of ``subject`` (or of several filters, one consumer
    holding them all) from the start with an ordered push consumer and a callback
    (nats-py's fastest path), counting them, decoding nothing."""
    subjects = [subject] if isinstance(subject, str) else list(subject)
    if total == 0:
        return 0
    done = asyncio.Event()
    count = 0

    async def on_message(msg: object) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    config = api.ConsumerConfig(filter_subjects=subjects) if len(subjects) > 1 else None
    sub = await js.subscribe(
        subjects[0], stream=stream, cb=on_message, ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.ALL, config=config,
    )  # fmt: skip
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await sub.unsubscribe()
    return count
