"""`pulse catch-up`, `rebuild`, `digest`, `repartition`, `compact`, `export`, `backup` and
`restore`: looking after a data directory's state and its deployment's event stream.
The state's work is ``sync.maintenance``; the stream's, ``ops.backup``."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from eventlog.errors import ValidationError
from ops.cli.declare import Arg, Command, arg, positive
from ops.cli.output import plain
from ops.cli.running import report
from ops.progress import ProgressBar
from ops.remote import running_service

T = TypeVar("T")


def _checkpoint_interval() -> Mapping[str, Any]:
    from projections.projection import ProjectionSettings  # (its default, one place)

    return {"default": ProjectionSettings().checkpoint_events}


def _settings(args: argparse.Namespace) -> Any:
    from projections.projection import ProjectionSettings

    return ProjectionSettings(checkpoint_events=args.checkpoint_every)


def _over_the_log(args: argparse.Namespace, doing: str, work: Callable[..., Awaitable[T]]) -> T:
    """Run ``work`` (``sync.maintenance.catch_up`` or ``rebuild``) on the data directory
    over its log, with a progress line labelled ``doing``."""
    import asyncio

    from ops.connect import open_log

    async def run() -> T:
        async with open_log(args) as (log, _server):
            bar = ProgressBar(doing)
            done = await work(args.data_dir, log, settings=_settings(args), progress=bar)
            bar.finish()
            return done

    return asyncio.run(run())


def catch_up(args: argparse.Namespace) -> int:
    """Apply new events from the log to the data directory's projection.

    Folds everything past the projection's checkpoint into memory, FAISS and the
    full-text index, writes DuckDB in bulk, with a progress line. Safe to
    interrupt at any moment (even kill -9): the next run resumes from the checkpoint.

    example:
      pulse catch-up
      pulse --data-dir /srv/pulse catch-up --json
    """
    from sync import maintenance

    done = _over_the_log(args, "applying", maintenance.catch_up)
    report(
        args,
        {"applied": done.applied, "seq": done.seq, "applied_total": done.applied_total,
         "digest": done.digest},
        f"applied {done.applied:,} events; state at sequence {done.seq:,}; digest {done.digest}",
    )  # fmt: skip
    return 0


def rebuild(args: argparse.Namespace) -> int:
    """Replay the whole log into a fresh projection, then swap it in atomically.

    The current state stays intact until the new one is complete; then the data
    directory's `state` link is switched in one rename and the old state removed.
    Use it after a schema change, to compact indexes, or to prove the log is enough.

    It refuses (exit 1, the state untouched) while `pulse up` serves the data directory
    or another process has its state open: stop that first (Ctrl-C on pulse up), then
    run pulse rebuild.

    example:
      pulse rebuild
      pulse --data-dir /srv/pulse rebuild --json
    """
    from projections.store import StateInUse
    from sync import maintenance

    service = running_service(args.data_dir)
    if service is not None:
        raise StateInUse(
            f"rebuild: `pulse up` serves this data directory (pid {service.get('pid')}, "
            f"{service.get('url')}) and holds its state; stop it first (Ctrl-C on pulse up), "
            "then run pulse rebuild"
        )

    done = _over_the_log(args, "rebuilding", maintenance.rebuild)
    report(
        args,
        {"state": str(done.state), "digest": done.digest},
        f"rebuilt {done.state}; digest {done.digest}",
    )
    return 0


def digest(args: argparse.Namespace) -> int:
    """Print a hash of the projection's logical state.

    SHA-256 over every table's rows, sorted, without local-only columns: two hosts
    that applied the same events print the same digest, whatever the order, and so
    does a state before and after `pulse rebuild`. Reads the local state only.

    example:
      pulse digest
      pulse --data-dir /srv/pulse digest --json
    """
    import asyncio

    from sync import maintenance

    done = asyncio.run(maintenance.digest(args.data_dir))
    report(
        args,
        {"digest": done.digest, "seq": done.seq, "applied": done.applied},
        f"{done.digest}  (sequence {done.seq:,})",
    )
    return 0


async def compact(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Forget on this host's disk now, rather than within seconds of a delete.

    Once every delete in the log is applied here, the DuckDB file, the text index and
    the vector files are rewritten so that no deleted text or vector is left in them
    (a delete only marks rows and documents; the freed space keeps the bytes until it
    is rewritten). Pulse does this by itself within `scrub_after` seconds (5) of a
    delete (or ten times the last rewrite's duration, when longer); this is for when you
    need it done before you go on (say, before copying the data directory). The log and
    every backup taken without --with-keys hold deleted text only as ciphertext whose
    key the delete destroyed. Admins only. While `pulse up` serves the data directory,
    it does the work.

    example:
      pulse delete 01a22b60-9f07-75f6-ab51-e7ce5c2af5c1 && pulse compact
    """
    done = await db.compact()
    return plain(done), (
        f"rewrote the state's files at sequence {done.applied_seq:,}: DuckDB "
        f"{done.duckdb_seconds:.2f}s, text index {done.text_seconds:.2f}s, vectors "
        f"{done.vectors_seconds:.2f}s"
    )


async def export(db: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """Write every table of the current state as Parquet files, one per view.

    The views of `pulse sql`, plus activities (from the activity stream).

    example:
      pulse export ./pulse-export
      duckdb -c "SELECT * FROM './pulse-export/experiences.parquet' LIMIT 3"
    """
    from sync import PulseDB

    if not isinstance(db, PulseDB):
        raise ValidationError(
            "export: `pulse up` serves this data directory and holds its files; stop it to "
            "export, or query the running state with `pulse sql`"
        )
    directory: Path = args.directory
    written = await db.export(directory)
    text = "\n".join(f"{directory / (name + '.parquet')}  {n} rows" for name, n in written.items())
    return {"directory": str(directory), "rows": written}, text


def backup(args: argparse.Namespace) -> int:
    """Back up the event stream (a JetStream snapshot) and the NATS credentials.

    Takes a snapshot of the PULSE stream through the JetStream API while the deployment
    keeps running (`pulse up` need not stop), and writes it with the credentials NATS
    asks of clients (the embedded server's <data dir>/nats/credentials.json, or the
    --nats-creds file) and a manifest (stream, sequences, event count, time, schema
    versions, SHA-256 of every file) to DESTINATION: a new directory, or one .tar file
    if the name ends in .tar. Every file is mode 0600. Nothing is written unless the
    backup completes. The activity stream (presence, expiring within the hour) is left
    out. Restore it with `pulse restore`; the projections are not needed: a host
    rebuilds them from the stream.

    What entities say (text, vectors) is sealed in the stream with their data keys, which
    live in the key bucket PULSE_KEYS, not in the stream. By default the backup holds no
    key: it restores into a deployment whose key bucket still holds them (the stream
    lost, the keys replicated), and everything deleted since is forgotten in it too.
    With --with-keys it also holds the key bucket, so it restores into a new deployment;
    but what is deleted after it was taken can be read again from it as long as it
    exists: keep such backups few, and destroy them on the schedule you promise to
    forget by.

    example:
      pulse backup backups/2026-11-30
      pulse --data-dir /srv/pulse backup /backups/pulse-2026-11-30.tar --json
      pulse --nats-url tls://h1:4222 --nats-creds nats-conf/client-credentials.json \\
        --nats-ca nats-conf/ca.pem backup /backups/pulse.tar
    """
    from ops.backup import cmd_backup

    return cmd_backup(args)


def restore(args: argparse.Namespace) -> int:
    """Restore a backup of `pulse backup` into a deployment that has no event stream.

    Checks the whole backup first (manifest, sizes, SHA-256 of every file, schema
    versions) and refuses a damaged or truncated one, touching nothing. Then creates
    the stream from the snapshot through the JetStream API and checks it holds the
    backup's events; if anything fails, the stream is removed again. With the embedded
    server (no --nats-url), a data directory without NATS credentials gets the backup's
    (<data dir>/nats/credentials.json, 0600), so hosts that had a copy of them connect
    as before; one with credentials of its own keeps them. --replicas sets the restored
    stream's replicas (1 by default; 3 on a cluster), and --durability the servers it
    goes to (those tagged with it; without it, those the backup's stream asked for).

    The data keys: if the deployment has a key bucket, it keeps it (it knows the deletes
    made since the backup, which stay forgotten); if not, the backup's is restored (a
    backup taken with --with-keys), and a backup without keys is refused.

    It refuses if the stream exists, whatever it holds: a restore never overwrites or
    merges. Restore into a fresh data directory, or a NATS server without the stream
    (to replace one on purpose, delete it first: nats stream rm PULSE). Then run
    `pulse rebuild` (or `pulse up`) on the restored data directory: its state is built
    from the stream and reaches the digest the backed-up deployment had.

    example:
      pulse restore backups/2026-11-30 && pulse rebuild    # into ./.pulse, fresh
      pulse --data-dir /srv/pulse-restored restore /backups/pulse-2026-11-30.tar
      pulse --data-dir /srv/pulse-restored rebuild
      pulse --nats-url tls://h1:4222,tls://h2:4222,tls://h3:4222 --replicas 3 \\
        --nats-creds nats-conf/client-credentials.json --nats-ca nats-conf/ca.pem \\
        restore backups/2026-11-30 --json
    """
    from ops.backup import cmd_restore

    return cmd_restore(args)


def repartition(args: argparse.Namespace) -> int:
    """Spread the deployment's collectives over more partitions (streams).

    Stop every host first (`pulse up` and the rest): the collectives' subjects leave one
    stream before another takes them, and their messages are copied to their new
    partition, then purged from the old. From one stream, every collective moves. Run it
    again if it is interrupted: it goes on where it stopped. Then start the hosts with
    the new --partitions; rebuild each (`pulse --partitions N rebuild`): a state built
    from one stream does not open on partitions, and one built on fewer partitions
    would hold the moved events' history twice.

    Edge hosts (`pulse up --leaf-of`) go on through a raise from 2 or more partitions:
    the hub's sources of their events are set to the new partitions. From one stream
    they must be made again (their subjects change): the raise says so, and with
    --drop-edges stops taking their events.

    example:
      pulse repartition --to 4          # the embedded server of this data directory
      pulse --nats-url nats://a:4222,nats://b:4222 --partitions 4 repartition --to 8
    """
    import asyncio

    from eventlog.partitioned import raise_partitions
    from ops.connect import first_stream, open_log

    service = running_service(args.data_dir)
    if service is not None:
        raise ValidationError(
            f"repartition: `pulse up` serves this data directory (pid {service.get('pid')}); "
            "stop every host first"
        )

    async def run() -> dict[str, int]:
        async with open_log(args, create_streams=False) as (log, _server):
            bar = ProgressBar("copying")
            done = await raise_partitions(
                first_stream(log), args.to, progress=bar, drop_edges=args.drop_edges
            )
            bar.finish()
            return done

    done = asyncio.run(run())
    report(
        args, dict(done),
        f"the log is in {done['to']} partitions (it was in {done['from']}); "
        f"{done['copied']} events copied to their new partition"
        + (f"; {done['edges']} edge host(s) sending to it" if done["edges"] else ""),
    )  # fmt: skip
    return 0


_JSON_OBJECT = arg("--json", action="store_true", help="print one JSON object")
_CHECKPOINTS: tuple[Arg, ...] = (
    _JSON_OBJECT,
    arg("--checkpoint-every", type=positive, metavar="N", deferred=_checkpoint_interval,
        help="write the state's checkpoint every N events (default %(default)s); killed, "
        "it resumes from the last one"),
)  # fmt: skip

COMMANDS = (
    Command("catch-up", None, run=catch_up, arguments=_CHECKPOINTS),
    Command("rebuild", None, run=rebuild, arguments=_CHECKPOINTS),
    Command("digest", None, run=digest, arguments=(_JSON_OBJECT,)),
    Command(
        "repartition", None, run=repartition,
        arguments=(
            arg("--to", type=int, required=True, metavar="N",
                help="the partitions to spread the collectives over (more than now; 2..31)"),
            arg("--drop-edges", action="store_true",
                help="from one stream: stop taking the events of the edge hosts that send "
                "to the log (each has sent what it holds and stopped; make them again with "
                "the new --partitions)"),
            _JSON_OBJECT,
        ),
    ),  # fmt: skip
    Command("compact", None, compact, operations=("compact",)),
    Command(
        "export", None, export,
        arguments=(arg("directory", type=Path, help="where to write"),),
    ),
    Command(
        "backup", None, run=backup,
        arguments=(
            arg("destination", type=Path,
                help="where to write it: a new (or empty) directory, or a file ending in .tar"),
            arg("--with-keys", action="store_true",
                help="also back up the data keys (the key bucket): such a backup restores "
                "into a new deployment, but what is deleted after it was taken stays "
                "readable in it"),
            arg("--json", action="store_true", help="print the manifest as one JSON object"),
        ),
    ),
    Command(
        "restore", None, run=restore,
        arguments=(
            arg("backup", type=Path,
                help="what `pulse backup` wrote: its directory or its .tar file"),
            _JSON_OBJECT,
        ),
    ),
)  # fmt: skip
