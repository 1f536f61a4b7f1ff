"""How a command runs: over the data directory's instance, or the `pulse up` that serves
it, as the access token in $PULSE_TOKEN or the local operator; and what its answer prints."""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

from ops.cli.declare import Command
from ops.operator_secret import read_secret
from ops.remote import RemotePulseDB, running_service
from sync import access


async def open_instance(args: argparse.Namespace) -> Any:
    """The running service of the data directory (through its API), or an instance of
    this process when none runs. Either way the command acts for the access token in
    $PULSE_TOKEN, if it holds one (``sync.access``), and as the local operator otherwise
    (with a service: by the data directory's operator secret, ``ops.operator_secret``)."""
    token = os.environ.get("PULSE_TOKEN") or None
    service = running_service(args.data_dir)
    if service is not None:
        return RemotePulseDB(service["url"], token or read_secret(args.data_dir))
    access_token = token if token and access.token_id_of(token) is not None else None
    from sync import PulseDB

    out_of_the_collectors_sight()
    from eventlog import StreamSettings

    partitions = getattr(args, "partitions", 1)
    return await PulseDB.open(
        args.data_dir, args.nats_url or None,
        nats_credentials=getattr(args, "nats_creds", None), nats_ca=getattr(args, "nats_ca", None),
        principal=access_token,
        stream_settings=StreamSettings(partitions=partitions) if partitions > 1 else None,
    )  # fmt: skip


def out_of_the_collectors_sight() -> None:
    """Once the modules a command needs are imported: what they built (classes,
    functions, schemas: about as many objects as a small state holds, and no garbage to
    speak of) lives as long as the process, so it is frozen out of the cyclic collector's
    sight (``gc.freeze``). Each full collection then walks only what the command makes:
    the engine's after catching up (``projections.engine``) is 1 ms rather than 40 to
    90, and so are the ones the allocations of opening set off. Only in a process where
    nothing is frozen yet (the command's own; a process that calls ``main`` again and
    again, as the tests do, may hold garbage by then, which would never be collected)."""
    import gc

    if gc.get_freeze_count() == 0:
        gc.freeze()


def execute(command: Command, args: argparse.Namespace) -> int:
    """Run a command over the instance: its answer as text, or with --json as JSON."""
    import asyncio

    act = command.act
    assert act is not None, command.name

    async def go() -> int:
        db = await open_instance(args)
        try:
            result, text = await act(db, args)
        finally:
            await db.close()
        print(json.dumps(result, default=str) if args.json else text, flush=True)
        return 0

    return asyncio.run(go())


def report(args: argparse.Namespace, record: dict[str, object], text: str) -> None:
    """What a command that runs by itself prints: ``text``, or with --json ``record``."""
    if getattr(args, "json", False):
        print(json.dumps(record), flush=True)
    else:
        print(text, flush=True)


async def wait_for_signal() -> None:
    """Until Ctrl-C (SIGINT) or SIGTERM."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
