"""A log in partitions (``eventlog.partitions``, ``eventlog.partitioned``): collectives
spread over N streams by a stable hash, positions that name a partition and a sequence,
and readers of partitions at different speeds folding to the same state."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncGenerator
from pathlib import Path
from uuid import UUID

import nats.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog import events as ev
from eventlog.codec import decode_event, encode_event
from eventlog.errors import ConflictError, DecodeError, LogUnavailable, ValidationError
from eventlog.log import LogEntry
from eventlog.partitioned import LocalLog, PartitionedLog, raise_partitions
from eventlog.partitions import (
    BUCKETS,
    MAX_PARTITIONS,
    Layout,
    bucket_of,
    part_of,
    position,
    resume_from,
    seq_of,
)
from eventlog.subjects import collective_filter, subject_for, subject_matches
from ops.cluster import LocalCluster
from projections import fold
from sync import PulseDB
from tests import factories as f
from tests.harness import eventually, pulse

UUIDS = st.uuids()


# -- the layout --------------------------------------------------------------------------


@given(st.integers(0, MAX_PARTITIONS), st.integers(0, 2**48 - 1))
def test_a_position_is_its_partition_and_its_sequence(part: int, seq: int) -> None:
    pos = position(part, seq)
    assert (part_of(pos), seq_of(pos)) == (part, seq)
    assert pos < 2**53  # (exact as a JSON number)
    if part == 0:
        assert pos == seq  # a log of one stream: positions are its sequences


def test_positions_out_of_range_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="partition: must be 0..31"):
        position(32, 1)
    with pytest.raises(ValidationError, match="sequence: must be"):
        position(1, 2**48)


def test_the_bucket_of_a_collective_is_stable() -> None:
    # pinned: a bucket that changed between versions would leave a collective's old
    # events in one partition and its new ones in another
    assert [bucket_of(UUID(int=n)) for n in range(6)] == [14, 2, 31, 22, 57, 47]


@given(st.integers(2, MAX_PARTITIONS), UUIDS, st.sampled_from(["experience", "relation"]), UUIDS)
def test_each_subject_lies_in_exactly_one_partition(
    partitions: int, collective: UUID, entity: str, entity_id: UUID
) -> None:
    layout = Layout(partitions)
    event_subject = f"pulse.c.{collective}.b{bucket_of(collective):02d}.{entity}.{entity_id}"
    holders = [
        p for p in layout.parts
        if any(subject_matches(s, event_subject) for s in layout.subjects(p))
    ]  # fmt: skip
    assert holders == [layout.part_of_collective(collective)]
    assert layout.part_of_subject(event_subject) == holders[0]
    assert layout.part_of_subject(f"pulse.c.{collective}.>") == holders[0]
    # wisdom and tokens: the first stream
    assert [p for p in layout.parts if subject_matches(layout.subjects(p)[0], "pulse.w.x")] == [0]


@given(st.integers(2, MAX_PARTITIONS))
def test_every_bucket_is_in_one_partition_and_every_partition_has_some(partitions: int) -> None:
    layout = Layout(partitions)
    held = [b for p in layout.parts[1:] for b in layout.buckets(p)]
    assert sorted(held) == list(range(BUCKETS))
    assert all(layout.buckets(p) for p in layout.parts[1:])


@given(st.integers(2, 8), st.lists(UUIDS, min_size=1, max_size=6))
def test_a_filter_reaches_only_the_partitions_of_its_collectives(
    partitions: int, collectives: list[UUID]
) -> None:
    layout = Layout(partitions)
    reach = layout.split(collective_filter(collectives))
    expected = {layout.part_of_collective(c) for c in collectives} | {0}
    assert set(reach) == expected
    for part, filters in reach.items():
        assert filters is not None
        for subject in filters:
            assert layout.part_of_subject(subject) == part
    every = layout.split(["pulse.c.*.*.collective.*"])  # (a wildcard collective: all)
    assert set(every) == set(layout.parts[1:])


def test_bad_layouts_and_starts_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="partitions: a log in partitions has 2..31"):
        Layout(1)
    with pytest.raises(ValidationError, match="partitions: must be 1..31"):
        StreamSettings(partitions=32)
    with pytest.raises(ValidationError, match="part: must be 0..4"):
        StreamSettings(partitions=4, part=5)
    with pytest.raises(ValidationError, match="part: must be 0..0"):
        StreamSettings(part=1)
    with pytest.raises(ValidationError, match="from: a log in partitions is read from 1"):
        resume_from(7, [0, 1])
    with pytest.raises(ValidationError, match="subject: 'nats.x' is not a Pulse subject"):
        Layout(2).part_of_subject("nats.x")


def test_an_event_on_another_buckets_subject_is_refused_on_decoding() -> None:
    """The bucket is checked as the rest of the subject: the body's collective fixes it."""
    event = f.experience(UUID(int=1))
    wire = encode_event(event, bucketed=True)
    assert wire.subject == subject_for(event, bucketed=True)
    assert f".b{bucket_of(event.collective_id):02d}.experience." in wire.subject
    assert decode_event(wire.payload, wire.headers, subject=wire.subject) == event
    other = wire.subject.replace(f".b{bucket_of(event.collective_id):02d}.", ".b99.")
    with pytest.raises(DecodeError, match="does not match the event's own subject"):
        decode_event(wire.payload, wire.headers, subject=other)
    # a log says which form it holds: one stream refuses the bucketed form (whose copy
    # an entity's purge of its own subject would miss), partitions the plain one
    with pytest.raises(DecodeError, match="does not match"):
        decode_event(wire.payload, wire.headers, subject=wire.subject, bucketed=False)
    with pytest.raises(DecodeError, match="does not match"):
        decode_event(wire.payload, wire.headers, subject=subject_for(event), bucketed=True)
    assert decode_event(wire.payload, wire.headers, subject=wire.subject, bucketed=True) == event


# -- readers at different speeds fold alike ----------------------------------------------


def _spread(events: list[ev.Event], partitions: int) -> dict[int, list[ev.Event]]:
    """Each partition's events in its own (stream) order, as the layout spreads them."""
    layout = Layout(partitions)
    held: dict[int, list[ev.Event]] = {p: [] for p in layout.parts}
    for event in events:
        held[layout.part_of_subject(subject_for(event)) or 0].append(event)
    return held


def _folded(events: list[ev.Event]) -> fold.FoldState:
    state = fold.FoldState()
    for event in events:
        state.apply(event)
    return state


# four collectives' histories (updates, deletes, relations, reinforcements), wisdom, a
# token: made once, so each example draws only the reading
_HISTORY: list[ev.Event] = [e for _ in range(4) for e in f.history(8)] + [f.wisdom(), f.token()]


@given(st.integers(2, 6), st.randoms(use_true_random=False), st.integers(1, 3))
def test_readers_of_partitions_at_any_speeds_fold_to_the_same_state(
    partitions: int, rnd: random.Random, repeats: int
) -> None:
    """A reader takes each partition in its order but the partitions at its own pace
    (any interleaving), and may see a batch again after a reconnect: the product's fold
    gives the state of the log read in one order."""
    events = _HISTORY
    held = _spread(events, partitions)
    readers = []
    for _ in range(2):
        queues = {p: list(es) for p, es in held.items()}
        seen: list[ev.Event] = []
        while any(queues.values()):
            part = rnd.choice([p for p, q in queues.items() if q])
            take = rnd.randint(1, 5)
            batch, queues[part] = queues[part][:take], queues[part][take:]
            seen += batch * rnd.randint(1, repeats)  # (delivered again after a reconnect)
        readers.append(_folded(seen))
    whole = _folded(events)
    assert readers[0].rows == readers[1].rows == whole.rows


# -- on a 3-node cluster -----------------------------------------------------------------


async def _read_all(log: PartitionedLog, **kwargs: object) -> list[LogEntry]:
    return [e async for batch in log.read(**kwargs) for e in batch]  # type: ignore[arg-type]


async def test_a_log_in_four_partitions_on_three_nodes_survives_a_node_and_reads_alike(
    cluster: LocalCluster,
) -> None:
    settings = StreamSettings(replicas=3, partitions=4)
    log = await PartitionedLog.connect(
        cluster.urls, settings, connect_timeout=30, append_timeout=20
    )
    try:
        histories = [f.history(10) for _ in range(8)]
        firsts = [h[0] for h in histories]  # (the collectives' creates)
        rest = [e for h in histories for e in h[1:]]
        shared = [f.wisdom(), f.token()]
        written = await log.append_batch([*firsts, *shared])
        assert [part_of(p) for p in written[-2:]] == [0, 0]  # wisdom, tokens: the first
        for event, pos in zip(firsts, written, strict=False):
            assert part_of(pos) == log.layout.part_of_collective(event.collective_id)

        # a reader that follows everything, live, from the start
        tailed: list[LogEntry] = []

        async def follow_all() -> None:
            async for batch in log.tail():
                tailed.extend(batch)

        follower = asyncio.create_task(follow_all())
        # one that follows two collectives only: it asks only their partitions
        two = [firsts[0].collective_id, firsts[1].collective_id]
        partial: list[LogEntry] = []

        async def follow_two() -> None:
            async for batch in log.tail(subjects=collective_filter(two)):
                partial.extend(batch)

        following_two = asyncio.create_task(follow_two())
        reached = {0} | {log.layout.part_of_collective(c) for c in two}

        async def consumers_made() -> bool:
            try:
                counts = [len(await p.admin.consumers_info(p.settings.name)) for p in log.parts]
            except (TimeoutError, nats.errors.Error):  # (a stream made a moment ago)
                return False
            return all(counts[p] == 1 + (p in reached) for p in log.layout.parts)

        await eventually(consumers_made, timeout=30, what="one consumer per partition reached")

        # half the writes, a node killed, the other half: every append is acknowledged
        half = len(rest) // 2
        positions = [await log.append(e) for e in rest[:half]]
        cluster.kill(1)
        positions += await log.append_batch(rest[half:])
        assert len(set(positions)) == len(rest)
        assert await log.append(rest[0]) == positions[0]  # a retry is stored once

        everything = [*firsts, *shared, *rest]
        await eventually(lambda: len(tailed) >= len(everything), timeout=60, what="the tail")
        # a second reader: after the fact, the partitions in reverse, one at a time
        late: list[LogEntry] = []
        for part in reversed(log.layout.parts):
            only = await _read_all(log, subjects=log.layout.subjects(part))
            assert {part_of(e.seq) for e in only} <= {part}
            late += only
        assert sorted(e.seq for e in late) == sorted(e.seq for e in tailed)
        whole = _folded(everything).rows
        assert _folded([e.event for e in tailed if e.event]).rows == whole
        assert _folded([e.event for e in late if e.event]).rows == whole

        # the reader of two collectives: their rows, equal to the whole log's
        def mine(rows: dict[type[fold.Row], dict[tuple[object, ...], fold.Row]]) -> list[fold.Row]:
            return sorted(
                (r for table in rows.values() for r in table.values()
                 if getattr(r, "collective_id", None) in two),
                key=repr,
            )  # fmt: skip

        wanted = sum(1 for e in everything if getattr(e, "collective_id", None) in two) + 2
        await eventually(lambda: len(partial) >= wanted, timeout=30, what="the partial tail")
        assert mine(_folded([e.event for e in partial if e.event]).rows) == mine(whole)
        assert mine(whole)
        follower.cancel()
        following_two.cancel()
        await asyncio.gather(follower, following_two, return_exceptions=True)

        # positions name a partition: a conditional write and a purge check it
        target = firsts[2].collective_id
        last = await log.last_subject_seq(subject_for(firsts[2], bucketed=True))
        assert part_of(last) == log.layout.part_of_collective(target)
        update = ev.CollectiveDeleted(**f.common(), collective_id=target)  # type: ignore[arg-type]
        with pytest.raises(ConflictError):
            await log.append(update, expected_last_subject_seq=last + 1)
        elsewhere = next(p for p in log.layout.parts[1:] if p != part_of(last))
        with pytest.raises(ValidationError, match="before_seq: position .* is in partition"):
            await log.purge(f"pulse.c.{target}.>", before_seq=position(elsewhere, 1))
        tombstone = await log.append(update, expected_last_subject_seq=last)
        await log.purge(f"pulse.c.{target}.>", before_seq=tombstone)
        left = await _read_all(log, subjects=[f"pulse.c.{target}.>"])
        assert [e.seq for e in left] == [tombstone]
        ends = await log.last_positions()
        assert set(ends) == set(log.layout.parts) and ends[part_of(tombstone)] == seq_of(tombstone)
        # resuming from the ends: nothing more; from one partition's start: its messages
        assert await _read_all(log, from_seq={p: s + 1 for p, s in ends.items()}) == []
    finally:
        await log.close()

    # another number of partitions, or one stream, is refused: nothing is changed
    with pytest.raises(ValidationError, match="is in 4 partition.s. and 8 were asked"):
        await PartitionedLog.connect(cluster.urls, StreamSettings(replicas=3, partitions=8),
                                     connect_timeout=30)  # fmt: skip
    with pytest.raises(ValidationError, match="is in 4 partition.s. and 1 were asked"):
        await JetStreamLog.connect(cluster.urls, StreamSettings(replicas=3), connect_timeout=30)


def test_a_log_of_one_stream_keeps_its_subjects() -> None:
    """One stream (the default) writes the subjects it always wrote: no bucket."""
    event = f.experience(UUID(int=3))
    assert subject_for(event) == f"pulse.c.{event.collective_id}.experience.{event.experience_id}"
    assert StreamSettings().main_config().subjects == ["pulse.c.>", "pulse.w.>", "pulse.t.>"]
    assert StreamSettings().main_config().metadata is None
    config = StreamSettings(partitions=3).partition(2).main_config()
    assert config.name == "PULSE_P2" and config.metadata == {"pulse.partitions": "3"}
    assert config.subjects == Layout(3).subjects(2)
    assert config.subjects[:2] == ["pulse.c.*.b01.>", "pulse.c.*.b04.>"]


# -- hosts on a log in partitions --------------------------------------------------------


async def test_hosts_on_four_partitions_converge_through_a_node_failure_and_resume(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Two hosts write into collectives of different partitions of a 3-node cluster while
    a node dies; both end with the same digest of every collective, as does a host that
    reads the whole log afterwards (every partition at once). A host that restarts goes
    on from where each partition stood in its state, reading only what came since."""
    settings = StreamSettings(replicas=3, partitions=4)
    a = await PulseDB.open(tmp_path / "a", cluster.urls, stream_settings=settings,
                           append_timeout=20)  # fmt: skip
    b = await PulseDB.open(tmp_path / "b", cluster.urls, stream_settings=settings,
                           append_timeout=20)  # fmt: skip
    opened = [a, b]
    try:
        layout = Layout(4)
        teams: list[UUID] = []
        while len(teams) < 8 or len({layout.part_of_collective(t) for t in teams}) < 3:
            # (eight, over three partitions at least: random ids land in two now and then)
            teams.append(await a.create_collective("o", f"team {len(teams)}", embedder="hash"))
        assert len({layout.part_of_collective(t) for t in teams}) >= 3  # (spread)
        await b.sync()

        async def writes(db: PulseDB, mine: list[UUID], n: int) -> list[UUID]:
            return [
                await db.record_experience(mine[i % len(mine)], f"lesson {i} on retries")
                for i in range(n)
            ]

        # a host that follows two collectives reads only their partitions (and the
        # directory of every partition): a consumer on each partition it reads
        d = await PulseDB.open(
            tmp_path / "d", cluster.urls, stream_settings=settings, append_timeout=20,
            collectives=[str(teams[0]), str(teams[5])],
        )  # fmt: skip
        opened.append(d)
        reached = {layout.part_of_collective(t) for t in (teams[0], teams[5])}
        mine = {f"pulse.c.{teams[0]}.>", f"pulse.c.{teams[5]}.>"}
        held = a.log.partitioned.parts  # type: ignore[attr-defined]

        async def d_reads_only_its_partitions() -> bool:
            try:
                for part in layout.parts[1:]:
                    infos = await held[part].admin.consumers_info(held[part].settings.name)
                    ours = [c for c in infos if mine & set(
                        c.config.filter_subjects or [c.config.filter_subject])]  # fmt: skip
                    if bool(ours) != (part in reached):
                        return False
            except (TimeoutError, nats.errors.Error):  # (streams made a moment ago)
                return False
            return True

        await eventually(d_reads_only_its_partitions, timeout=30, what="d's consumers")

        first = await asyncio.gather(writes(a, teams[:4], 20), writes(b, teams[4:], 20))
        cluster.kill(2)
        second = await asyncio.gather(writes(a, teams[:4], 20), writes(b, teams[4:], 20))
        await b.delete_experience(first[0][0])  # (a's, deleted by b: forgotten everywhere)
        await b.reinforce_experience(first[0][1])
        await a.sync()
        await b.sync()
        for team in teams:
            assert await a.digest(team) == await b.digest(team)
        assert await a.get_experience(first[0][0]) is None
        assert len(second[0]) == len(second[1]) == 20

        # a new host reads the whole log (the partitions at once): the same digests
        c = await PulseDB.open(tmp_path / "c", cluster.urls, stream_settings=settings,
                               append_timeout=20)  # fmt: skip
        opened.append(c)
        for team in teams:
            assert await c.digest(team) == await a.digest(team)

        # d lived through the node's death too; a collective it follows later is caught
        # up: one in a partition d reads has its past read from there, the rest by the
        # tail; one in a partition it did not read comes all by the tail
        await d.sync()
        for team in (teams[0], teams[5]):
            assert await d.digest(team) == await a.digest(team)
        beside = [t for t in teams[1:5] if layout.part_of_collective(t) in reached]
        elsewhere = [t for t in teams if layout.part_of_collective(t) not in reached]
        later = [*beside[:1], *elsewhere[:1]]
        assert later
        await d.follow([str(t) for t in later])
        for team in later:
            await a.record_experience(team, "after d followed it")
        await a.sync()
        await d.sync()
        for team in (teams[0], teams[5], *later):
            assert await d.digest(team) == await a.digest(team)
        assert (d.backfilled > 0) == bool(beside)

        # b restarts: it reads only what came since, per partition
        await b.close()
        opened.remove(b)
        more = await a.record_experience(teams[5], "written while b was away")
        b = await PulseDB.open(tmp_path / "b", cluster.urls, stream_settings=settings,
                               append_timeout=20)  # fmt: skip
        opened.append(b)
        await b.sync()
        assert (await b.get_experience(more)) is not None
        assert b.engine.events_applied <= 3  # (the one write, not the whole log again)
        for team in teams:
            assert await b.digest(team) == await a.digest(team)
    finally:
        for db in opened:
            await db.close()

    # the state of a host on partitions does not open on a log of one stream
    with pytest.raises(ValidationError, match="is in 4 partition"):
        await PulseDB.open(tmp_path / "a", cluster.urls, stream_settings=StreamSettings(replicas=3))


def test_the_command_line_runs_a_host_on_partitions_backs_it_up_and_restores_it(
    tmp_path: Path,
) -> None:
    """`pulse --partitions 3 ...` makes and uses a log in three partitions (the embedded
    server holds them); a command without it and a number out of range are refused,
    naming partitions. `pulse backup` takes every partition; `pulse restore` makes them
    all in a new data directory, whose rebuild has the same digest; a backup missing a
    partition's snapshot is refused whole."""
    data = tmp_path / "data"

    def ok(*args: str, where: Path = data) -> str:
        done = pulse("--partitions", "3", *args, data_dir=where)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ok("collective", "create", "team", "--owner", "o", "--embedder", "hash")
    ok("collective", "create", "crew", "--owner", "o", "--embedder", "hash")
    ok("record", "-c", "team", "Retry NATS publishes on timeout")
    ok("record", "-c", "crew", "Checkpoint the state before a deploy")
    found = ok("search", "-c", "team", "retry publishes", "--json")
    assert "Retry NATS publishes on timeout" in found
    one_stream = pulse("collective", "list", data_dir=data)
    assert one_stream.returncode == 1 and "partitions: " in one_stream.stderr, one_stream.stderr
    out_of_range = pulse("--partitions", "32", "collective", "list", data_dir=data)
    assert out_of_range.returncode == 2 and "--partitions: must be 1..31" in out_of_range.stderr

    manifest = json.loads(ok("backup", str(tmp_path / "b"), "--with-keys", "--json"))
    assert manifest["parts"] == ["PULSE_P1", "PULSE_P2", "PULSE_P3"]
    assert sum(manifest["part_messages"]) >= 4  # (two collectives, two experiences)
    restored = tmp_path / "restored"
    done = pulse("restore", str(tmp_path / "b"), "--json", data_dir=restored)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["messages"] >= 4 + manifest["messages"]
    ok("rebuild", where=restored)
    assert json.loads(ok("digest", "--json", where=restored)) == json.loads(ok("digest", "--json"))
    (tmp_path / "b" / "part-2.snapshot").unlink()
    damaged = pulse("restore", str(tmp_path / "b"), data_dir=tmp_path / "again")
    assert damaged.returncode == 1 and "part-2.snapshot is missing" in damaged.stderr


# -- raising the number of partitions ------------------------------------------------------


async def _where_each_message_is(log: PartitionedLog) -> list[tuple[int, str]]:
    """(partition, subject) of every message of every stream of the layout."""
    held = []
    for part in log.layout.parts:
        async for batch in log.parts[part].read(1):
            held += [(part, e.subject) for e in batch]
    return held


async def test_a_log_of_one_stream_is_spread_over_partitions_and_its_hosts_rebuilt(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """`pulse repartition --to 3` from one stream: every collective's events move to
    their partition (their subjects given their bucket), wisdom and tokens stay; a host's
    state built from one stream is refused on partitions until `pulse --partitions 3
    rebuild`, which gives the same digests; then it writes on."""
    data = tmp_path / "host"
    db = await PulseDB.open(data, nats_server.url)
    teams = [await db.create_collective("o", f"team {i}", embedder="hash") for i in range(6)]
    notes = [await db.record_experience(t, f"note on retries {i}") for i, t in enumerate(teams)]
    await db.delete_experience(notes[0])
    await db.reinforce_experience(notes[1])
    before = {t: await db.digest(t) for t in teams}
    await db.close()

    moved = pulse("--nats-url", nats_server.url, "repartition", "--to", "3", "--json",
                  data_dir=tmp_path / "operator")  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    report = json.loads(moved.stdout.splitlines()[-1])
    assert report["from"] == 1 and report["to"] == 3 and report["copied"] >= 12
    again = pulse("--nats-url", nats_server.url, "repartition", "--to", "3",
                  data_dir=tmp_path / "operator")  # fmt: skip
    assert again.returncode == 1 and "to: the log PULSE is in 3 partition(s)" in again.stderr

    log = await PartitionedLog.connect(nats_server.url, StreamSettings(partitions=3))
    try:
        where = await _where_each_message_is(log)
    finally:
        await log.close()
    assert where and all(
        part == (0 if not s.startswith("pulse.c.") else Layout(3).part_of_subject(s))
        for part, s in where
    )
    assert all(  # (each collective's subject carries its bucket now)
        s.split(".")[3] == f"b{bucket_of(UUID(s.split('.')[2])):02d}"
        for _, s in where if s.startswith("pulse.c.")
    )  # fmt: skip

    settings = StreamSettings(partitions=3)
    with pytest.raises(ValidationError, match="pulse --partitions N rebuild"):
        await PulseDB.open(data, nats_server.url, stream_settings=settings)
    rebuilt = pulse("--nats-url", nats_server.url, "--partitions", "3", "rebuild", data_dir=data)
    assert rebuilt.returncode == 0, rebuilt.stderr
    db = await PulseDB.open(data, nats_server.url, stream_settings=settings)
    try:
        assert {t: await db.digest(t) for t in teams} == before
        assert await db.get_experience(notes[0]) is None
        await db.record_experience(teams[2], "written on partitions")
    finally:
        await db.close()


async def test_partitions_raised_from_two_to_five_keep_every_host_going(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """From 2 partitions to 5: the buckets that move go to their new stream, the others
    keep their place; a host that was on 2 opens on 5 and reads on (what moved folds
    again to the same rows), and a new host agrees with it."""
    two, five = StreamSettings(partitions=2), StreamSettings(partitions=5)
    a = await PulseDB.open(tmp_path / "a", nats_server.url, stream_settings=two)
    teams = [await a.create_collective("o", f"team {i}", embedder="hash") for i in range(8)]
    for i, team in enumerate(teams):
        await a.record_experience(team, f"lesson {i}")
    log = await PartitionedLog.connect(nats_server.url, two)
    try:
        with pytest.raises(ValidationError, match="consumer.s. read the log PULSE: stop every"):
            await raise_partitions(log.parts[0], 5)  # (a is running)
        await a.close()
        done = await raise_partitions(log.parts[0], 5)
    finally:
        await log.close()
    assert done["from"] == 2 and done["to"] == 5 and done["copied"] > 0
    with pytest.raises(ValidationError, match="is in 5 partition.s. and 2 were asked"):
        await PulseDB.open(tmp_path / "a", nats_server.url, stream_settings=two)
    log = await PartitionedLog.connect(nats_server.url, five)
    try:
        where = await _where_each_message_is(log)
    finally:
        await log.close()
    assert all(part == (Layout(5).part_of_subject(s) or 0) for part, s in where)
    a = await PulseDB.open(tmp_path / "a", nats_server.url, stream_settings=five)
    b = await PulseDB.open(tmp_path / "b", nats_server.url, stream_settings=five)
    try:
        more = await b.record_experience(teams[3], "after the raise")
        await a.sync()
        assert await a.get_experience(more) is not None
        for team in teams:
            assert await a.digest(team) == await b.digest(team)
    finally:
        await a.close()
        await b.close()


async def test_a_host_on_partitions_resumes_from_its_positions_after_a_batch_of_sealed_writes(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A batch of records is one atomic batch of sealed events, handed back by the tail
    as written: each keeps its position, so the checkpoint holds every partition's place
    and a restart applies nothing twice (one history row per event)."""
    settings = StreamSettings(partitions=2)
    db = await PulseDB.open(tmp_path / "h", nats_server.url, stream_settings=settings)
    team = await db.create_collective("o", "team", embedder="hash")
    await db.record_experiences(team, [{"content": f"lesson {i}"} for i in range(3)])
    await db.close()
    db = await PulseDB.open(tmp_path / "h", nats_server.url, stream_settings=settings)
    try:
        await db.sync()
        assert db.engine.events_applied == 0
        rows = (await db.sql("SELECT count(*) FROM history WHERE event_type = "
                             "'experience.recorded'")).rows  # fmt: skip
        assert rows == [[3]]
        assert await db.engine.run(lambda p: p.positions) == {Layout(2).part_of_collective(team): 4}
    finally:
        await db.close()


async def test_a_purge_before_a_hosts_number_names_the_place_in_the_subjects_partition(
    nats_server: EmbeddedNats,
) -> None:
    """A host's numbers interleave partitions: "before number n" of a subject is n's
    position when n is in the subject's partition (a tombstone), else just after n - 1
    (a write, purged with it); kept as a position, it means the same after a restart."""
    layout = Layout(2)
    first, second = UUID(int=1), UUID(int=2)
    assert layout.part_of_collective(first) != layout.part_of_collective(second)
    log = LocalLog(await PartitionedLog.connect(nats_server.url, StreamSettings(partitions=2)))
    try:
        one = await log.partitioned.append(f.collective(first))
        two = await log.partitioned.append(f.collective(second))
        numbers = {e.position: e.seq for batch in [b async for b in log.read(1)] for e in batch}
        assert sorted(numbers.values()) == [1, 2] and set(numbers) == {one, two}
        n_one, n_two = numbers[one], numbers[two]
        subject = f"pulse.c.{first}.>"
        assert log.kept_before(subject, n_one) == one  # (its own: before it)
        if n_two == n_one + 1:  # (the next number is in the other partition)
            assert log.kept_before(subject, n_two) == one + 1  # (up to and including one)
        else:  # (one was numbered last: the number after it is not known yet)
            assert log.kept_before(subject, n_one + 1) == one + 1
        assert log.kept_before(subject, one + 1) == one + 1  # (a position is kept as it is)
        with pytest.raises(LogUnavailable, match="does not know where its message 99"):
            log.kept_before(subject, 99)
    finally:
        await log.close()


async def test_a_host_on_partitions_keeps_idempotent_calls_and_time_travel(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """Through the public API on partitions: a call repeated with its idempotency key
    records once, and `as_of` a time shows the collectives as they were then."""
    from tests.test_as_of import moment_now

    db = await PulseDB.open(
        tmp_path / "h", nats_server.url, stream_settings=StreamSettings(partitions=3)
    )
    try:
        team = await db.create_collective("o", "team", embedder="hash")
        crew = await db.create_collective("o", "crew", embedder="hash")
        first = await db.record_experience(team, "retry publishes", idempotency_key="k1")
        again = await db.record_experience(team, "retry publishes", idempotency_key="k1")
        assert again == first
        assert [e.experience_id for e in await db.list_experiences(team)] == [first]
        at = await moment_now()
        await db.record_experience(crew, "later, elsewhere")
        await db.update_experience(first, importance=0.9)
        then = await db.get_experience(first, as_of=at)
        assert then is not None and then.importance != 0.9
        assert await db.list_experiences(crew, as_of=at) == []
        assert len(await db.list_experiences(crew)) == 1
    finally:
        await db.close()


async def test_a_host_syncs_after_a_raise_moved_a_partitions_last_messages(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A raise purges what moved from its old stream, which may be that stream's last
    messages: a host on the new number still reaches the end of every partition (its
    last message, not the stream's last sequence)."""
    two, three = StreamSettings(partitions=2), StreamSettings(partitions=3)
    a = await PulseDB.open(tmp_path / "a", nats_server.url, stream_settings=two)
    try:
        moving = await a.create_collective("o", "moving", embedder="hash")
        while Layout(2).part_of_collective(moving) == Layout(3).part_of_collective(moving):
            moving = await a.create_collective("o", "moving", embedder="hash")
        await a.record_experience(moving, "the last message of its partition, moved")
    finally:
        await a.close()
    log = await PartitionedLog.connect(nats_server.url, two)
    try:
        await raise_partitions(log.parts[0], 3)
    finally:
        await log.close()
    b = await PulseDB.open(tmp_path / "b", nats_server.url, stream_settings=three)
    try:
        await b.sync(timeout=5)
        assert [e.content for e in await b.list_experiences(moving)] == [
            "the last message of its partition, moved"
        ]
    finally:
        await b.close()


async def test_the_status_of_a_host_on_partitions_shows_each_partition_and_its_true_lag(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    import argparse

    from ops.cli import observing

    db = await PulseDB.open(
        tmp_path / "h", nats_server.url, stream_settings=StreamSettings(partitions=3)
    )
    try:
        teams = [await db.create_collective("o", f"team {i}", embedder="hash") for i in range(4)]
        for team in teams:
            await db.record_experience(team, "a lesson")
        await db.sync()
        status = await db.status()
        assert [p.name for p in status.partitions] == ["PULSE_P1", "PULSE_P2", "PULSE_P3"]
        assert sum(p.messages for p in status.partitions) == 8  # (4 creates, 4 records)
        assert all(len(p.consumers) == 1 for p in status.partitions)  # (this host's tail)
        # the host's own numbering: what it applied of what it took, nothing behind
        assert status.last_seq == status.applied_seq == 8 and status.lag == 0
        _, shown = await observing.status(db, argparse.Namespace(json=False))
        assert "  part    PULSE_P2: " in shown and "applied 8 of 8 (lag 0" in shown
    finally:
        await db.close()


async def test_pulse_tail_new_on_partitions_shows_only_what_arrives(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """`pulse --partitions 2 tail --new` starts at every partition's end; --from-seq,
    which names no one place in partitions, is refused naming the field."""
    import asyncio
    import contextlib
    import time

    from tests.harness import PULSE, cli_env

    db = await PulseDB.open(
        tmp_path / "h", nats_server.url, stream_settings=StreamSettings(partitions=2)
    )
    try:
        teams = [await db.create_collective("o", f"team {i}", embedder="hash") for i in range(3)]
        old = {str(await db.record_experience(t, "before the tail")) for t in teams}
        connect = ("--data-dir", str(tmp_path / "cli"), "--nats-url", nats_server.url)
        tail = await asyncio.create_subprocess_exec(
            PULSE, *connect, "--partitions", "2", "tail", "--new", "--limit", "1", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=cli_env(),
        )  # fmt: skip
        new: set[str] = set()
        deadline = time.monotonic() + 30
        while tail.returncode is None and time.monotonic() < deadline:  # (until it read one)
            new.add(str(await db.record_experience(teams[len(new) % 3], "after")))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tail.wait(), 0.3)
        out, err = await tail.communicate()
        assert tail.returncode == 0, err.decode()
        (line,) = out.decode().splitlines()
        shown = json.loads(line)["event"]
        assert shown["experience_id"] in new and shown["experience_id"] not in old
    finally:
        await db.close()
    refused = pulse(*connect[2:], "--partitions", "2", "tail", "--from-seq", "5",
                    data_dir=tmp_path / "cli")  # fmt: skip
    assert refused.returncode == 1 and "from_seq: a log in partitions" in refused.stderr


async def test_a_partition_reader_that_swallows_a_cancellation_still_ends() -> None:
    """A host reading several partitions stops its readers when it stops. nats-py can
    swallow a cancellation (``Client._flush_pending`` catches ``CancelledError``), and a
    reader cancelled once then read on: closing the host's tail waited for it forever.
    Each reader is cancelled again until it ends (``eventlog.jetstream.cancelled``)."""
    from eventlog.partitioned import _fan_in

    swallowed: list[int] = []
    waiting: set[int] = set()
    both_wait = asyncio.Event()

    async def reader(part: int) -> AsyncGenerator[list[LogEntry], None]:
        waiting.add(part)
        if len(waiting) == 2:
            both_wait.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if part == 2 and not swallowed:  # (as nats-py can, once)
                    swallowed.append(part)
                    continue
                raise
        yield []  # (never reached: an async generator)

    async def tail() -> None:
        async for _ in _fan_in({1: reader(1), 2: reader(2)}):
            pass

    task = asyncio.create_task(tail())
    await asyncio.wait_for(both_wait.wait(), timeout=5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert swallowed == [2], "the reader never saw the first cancellation"
    assert done == {task}, "the tail did not end: a reader cancelled once read on"
