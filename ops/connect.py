"""How a `pulse` command reaches the log: the servers of --nats-url, or the embedded
server of --data-dir (an edge host's as a leaf node)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog.embedded import NatsCredentials
from eventlog.errors import ValidationError
from eventlog.leaf import LeafLog
from eventlog.log import EventLog
from eventlog.partitioned import LocalLog


@contextlib.asynccontextmanager
async def open_log(
    args: argparse.Namespace, *, create_streams: bool = True
) -> AsyncIterator[tuple[EventLog, EmbeddedNats | None]]:
    """The log named by --nats-url, or the embedded server of --data-dir (reused if
    running; an edge host's: its leaf log). ``create_streams``: create the streams when
    missing (`pulse backup` and `restore` create none)."""
    durability = getattr(args, "durability", None)
    partitions = getattr(args, "partitions", 1)
    settings = StreamSettings(replicas=args.replicas, durability=durability, partitions=partitions)
    if not args.nats_url and durability == "replicated":
        raise ValidationError(
            "durability: replicated needs a cluster (--nats-url): an embedded server is one "
            "node, which replicates nothing and syncs every write (fsync)"
        )
    if not args.nats_url and durability == "fsync" and getattr(args, "no_sync", False):
        raise ValidationError(
            "durability: fsync contradicts --no-sync (the embedded server would sync on its "
            "interval, not every write)"
        )
    server: EmbeddedNats | None = None
    credentials = tls_ca = None
    if args.nats_url:
        urls = [u.strip() for u in args.nats_url.split(",") if u.strip()]
        credentials, tls_ca = args.nats_creds, args.nats_ca
    else:
        leaf_of = getattr(args, "leaf_of", None)
        remembered = EmbeddedNats.remembered_leaf(args.data_dir)
        if leaf_of is None and remembered is not None:  # a leaf's data directory stays one
            leaf_of = str(remembered["leaf_of"])
        leaf_ca = getattr(args, "leaf_ca", None) or (remembered or {}).get("leaf_ca")
        listen = getattr(args, "leaf_listen", None)
        server = EmbeddedNats(
            args.data_dir, sync_always=not getattr(args, "no_sync", False),
            leaf_of=leaf_of, leaf_ca=leaf_ca, leaf_listen=listen,
            leaf_credentials=None if listen is None else _leaf_credentials(args.data_dir),
        )  # fmt: skip
        urls = [await asyncio.to_thread(server.start)]  # waits for readiness: off the loop
        if leaf_of is not None:
            try:
                leaf = await LeafLog.open_leaf(
                    server, settings, hub_domain=getattr(args, "hub_domain", None) or "hub"
                )
            except BaseException:
                await asyncio.to_thread(server.stop)
                raise
            try:
                yield leaf, server
            finally:
                await leaf.close()
                await asyncio.to_thread(server.stop)
            return
    try:
        # only `pulse up`, the operator's command, may reconfigure existing streams
        connect = LocalLog.connect if partitions > 1 else JetStreamLog.connect
        log = await connect(
            urls, settings, update_streams=args.command == "up", credentials=credentials,
            tls_ca=tls_ca, create_streams=create_streams,
        )  # fmt: skip
        try:
            yield log, server
        finally:
            await log.close()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


def _leaf_credentials(data_dir: str | os.PathLike[str]) -> NatsCredentials:
    """The user and password leaf nodes present to this hub (``nats/leaf-credentials.json``,
    0600, generated on first use)."""
    path = Path(data_dir) / "nats" / "leaf-credentials.json"
    if path.exists():
        return NatsCredentials.load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    credentials = NatsCredentials.generate("leaf")
    credentials.save(path)
    return credentials


def first_stream(log: EventLog) -> JetStreamLog:
    """The log of the deployment's first stream (``PULSE``), of ``open_log``'s log: what
    the commands that work on the streams themselves use (backup, repartition)."""
    first = log.partitioned.parts[0] if isinstance(log, LocalLog) else log
    assert isinstance(first, JetStreamLog)
    return first
