"""One bad event never stops a host: events a buggy host publishes raw to the stream
(a negative clock, a collective of dimension 0 or 2**40, a counter of 2**64-1) become
dead letters; later writes still apply, the instance reopens, a new host converges to
the same digest, and ``dead_letters()`` names each of them with its sequence, subject
and writer. The projection itself refuses such rows when handed them directly."""

from __future__ import annotations

import time
from pathlib import Path
from uuid import UUID

import nats
import numpy as np
import pytest

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.codec import encode_event
from eventlog.errors import PulseError
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections.engine import Engine
from sync import PulseDB


def _common(instance: object, hlc: int | None = None) -> dict[str, object]:
    return {
        "event_id": uuid7(),
        "instance_id": instance,
        "hlc": ev.pack_hlc(time.time_ns() // 1_000_000) if hlc is None else hlc,
    }


async def test_hostile_events_become_dead_letters_and_hosts_go_on(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    cid = await a.create_collective("me", "team", 3)
    lesson = await a.record_experience(cid, "before the bad events", [1.0, 0.0, 0.0])

    buggy = uuid7()
    hostile: list[tuple[ev.Event, str]] = [
        (
            ev.ExperienceUpdated(
                **_common(buggy, hlc=-5), experience_id=lesson, collective_id=cid,  # type: ignore[arg-type]
                importance=0.9,
            ),
            "hlc",
        ),
        (
            ev.CollectiveCreated(
                **_common(buggy), collective_id=uuid7(), owner_id="x", name="flat",  # type: ignore[arg-type]
                embedding_dimension=0,
            ),
            "embedding_dimension",
        ),
        (
            ev.CollectiveCreated(
                **_common(buggy), collective_id=uuid7(), owner_id="x", name="huge",  # type: ignore[arg-type]
                embedding_dimension=2**40,
            ),
            "embedding_dimension",
        ),
        (
            ev.ExperienceReinforced(
                **_common(buggy), experience_id=lesson, collective_id=cid,  # type: ignore[arg-type]
                applications=2**64 - 1,
            ),
            "applications",
        ),
    ]  # fmt: skip
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    published = {}
    for event, field in hostile:
        wire = encode_event(event)
        ack = await js.publish(wire.subject, wire.payload, headers=wire.headers)
        published[ack.seq] = (wire.subject, field)
    await client.close()

    # later writes still apply, on the host that saw the bad events
    after = await a.record_experience(cid, "after the bad events", [0.0, 1.0, 0.0])
    assert (await a.get_experience(after)) is not None
    assert await a.reinforce_experience(lesson) == 1  # the 2**64-1 entry counts nothing
    found = await a.get_experience(lesson)
    assert found is not None and found.importance == 0.5  # the update with a bad clock: no
    kept_aside = {d.seq: d for d in await a.dead_letters() if d.entity == "message"}
    assert set(kept_aside) == set(published)
    for seq, (subject, field) in published.items():
        letter = kept_aside[seq]
        assert letter.subject == subject
        assert field in letter.reason, letter.reason
        assert letter.instance_id == buggy
    digest = await a.digest()
    await a.close()

    # the instance opens again (it used to replay the bad event and stop)
    reopened = await PulseDB.open(tmp_path / "a", nats_server.url)
    await reopened.sync()
    assert await reopened.digest() == digest
    assert {d.seq for d in await reopened.dead_letters() if d.entity == "message"} == set(published)
    await reopened.close()

    # a new host converges to the same state, dead letters included
    fresh = await PulseDB.open(tmp_path / "b", nats_server.url)
    await fresh.sync()
    assert await fresh.digest() == digest
    assert (await fresh.get_experience(lesson)).applications == 1  # type: ignore[union-attr]
    await fresh.close()


async def test_the_engine_keeps_aside_what_it_cannot_store(tmp_path: Path) -> None:
    """Handed directly (no codec in between), rows DuckDB could not hold are kept aside
    one by one while the rest of the batch applies."""
    instance = uuid7()
    cid, eid = uuid7(), uuid7()
    good = [
        ev.CollectiveCreated(**_common(instance), collective_id=cid, owner_id="o", name="n",  # type: ignore[arg-type]
                             embedding_dimension=2),
        ev.ExperienceRecorded(
            **_common(instance), experience_id=eid, collective_id=cid, content="kept",  # type: ignore[arg-type]
            embedding=ev.pack_vector(np.ones(2)), experience_type=ev.Generic(),
            importance=0.5, confidence=0.5, source_agent="a",
        ),
    ]  # fmt: skip
    bad = [
        ev.ExperienceReinforced(**_common(instance), experience_id=eid, collective_id=cid,  # type: ignore[arg-type]
                                applications=2**64 - 1),
        ev.CollectiveCreated(**_common(instance, hlc=-1), collective_id=uuid7(), owner_id="o",  # type: ignore[arg-type]
                             name="m", embedding_dimension=2),
        ev.CollectiveCreated(**_common(instance), collective_id=uuid7(), owner_id="o",  # type: ignore[arg-type]
                             name="z", embedding_dimension=0),
    ]  # fmt: skip
    events = [good[0], bad[0], good[1], bad[1], bad[2]]
    engine = await Engine.start(tmp_path / "state")
    reached = await engine.apply([LogEntry(i, f"s.{i}", e) for i, e in enumerate(events, 1)])
    assert reached == len(events)

    def facts(p: object) -> tuple[object, ...]:
        from projections import queries

        letters = queries.dead_letters(p)  # type: ignore[arg-type]
        found = queries.get_experience(p, eid)  # type: ignore[arg-type]
        return (
            sorted(d.seq for d in letters if d.entity == "message"),
            found.applications if found else None,
            len(queries.list_collectives(p)),  # type: ignore[arg-type]
        )

    assert await engine.run(facts) == ([2, 4, 5], 0, 1)
    digest = await engine.digest()
    await engine.close()
    again = await Engine.start(tmp_path / "state")  # what was flushed reads back the same
    assert await again.digest() == digest
    assert await again.run(facts) == ([2, 4, 5], 0, 1)
    await again.close()


async def test_a_clock_far_ahead_is_a_dead_letter_and_does_not_drag_this_hosts_clock(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """An event stamped further ahead of the time the stream stored it than the bound
    (60 s) is a dead letter naming the bound, on this host and on one that replays the
    log later; it wins no last-writer-wins field, and this host's clock does not follow
    it: its own later writes keep ordinary stamps and apply."""
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("me", "today", 3)
        lesson = await db.record_experience(cid, "importance 0.5", [1.0, 0.0, 0.0])
        now = time.time_ns() // 1_000_000
        buggy = uuid7()
        hostile = [
            ev.CollectiveCreated(
                **_common(buggy, hlc=2**63 - 1), collective_id=uuid7(), owner_id="x",  # type: ignore[arg-type]
                name="from the future", embedding_dimension=3,
            ),
            ev.ExperienceUpdated(  # a year ahead: would win every later update
                **_common(buggy, hlc=ev.pack_hlc(now + 365 * 86_400_000)),  # type: ignore[arg-type]
                experience_id=lesson, collective_id=cid, importance=0.9,
            ),
        ]  # fmt: skip
        client = await nats.connect(nats_server.url)
        seqs = set()
        for event in hostile:
            wire = encode_event(event)
            ack = await client.jetstream().publish(wire.subject, wire.payload, headers=wire.headers)
            seqs.add(ack.seq)
        await client.close()
        await db.sync()
        assert ev.hlc_millis(db.clock.now()) < now + 60_000
        letters = {d.seq: d for d in await db.dead_letters() if d.entity == "message"}
        assert set(letters) == seqs
        assert all("ahead of the time the log stored" in d.reason for d in letters.values())
        await db.update_experience(lesson, importance=0.2)  # a later honest write wins
        found = await db.get_experience(lesson)
        assert found is not None and found.importance == 0.2
        assert all(c.name != "from the future" for c in await db.list_collectives())
        digest = await db.digest()
    finally:
        await db.close()
    fresh = await PulseDB.open(tmp_path / "b", nats_server.url)  # a replay decides the same
    try:
        await fresh.sync()
        assert await fresh.digest() == digest
        assert {d.seq for d in await fresh.dead_letters() if d.entity == "message"} == seqs
    finally:
        await fresh.close()


async def test_a_host_whose_clock_runs_fast_has_its_writes_refused_everywhere_alike(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A host whose wall clock is two minutes ahead of the stream's: its write is stored
    but kept aside by every host (itself included, which raises), so hosts still agree."""
    honest = await PulseDB.open(tmp_path / "a", nats_server.url)
    fast = await PulseDB.open(tmp_path / "b", nats_server.url)
    try:
        cid = await honest.create_collective("me", "shared", 3)
        lesson = await honest.record_experience(cid, "importance 0.5", [1.0, 0.0, 0.0])
        await fast.sync()
        fast.clock._wall = lambda: time.time_ns() // 1_000_000 + 120_000
        with pytest.raises(PulseError, match="ahead of the time the log stored"):
            await fast.update_experience(lesson, importance=0.9)
        await honest.update_experience(lesson, importance=0.2)
        await fast.sync()
        for db in (honest, fast):
            found = await db.get_experience(lesson)
            assert found is not None and found.importance == 0.2
        assert await honest.digest() == await fast.digest()
    finally:
        await fast.close()
        await honest.close()


async def test_an_event_naming_another_collective_moves_nothing(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A forged event may name another collective (one with a smaller id, which an
    anchor "smallest wins" would take) for an existing experience: a second create
    (with the smallest event id), update, archive, reinforce, delete. Each is a dead
    letter naming both collectives; the experience, its content, vector and counts stay
    in its own collective, where deleting the collective still forgets it, and a fresh
    host agrees."""
    a = await PulseDB.open(tmp_path / "a", nats_server.url)
    victim = await a.create_collective("victim", "private notes", 3)
    secret = await a.record_experience(victim, "the victim's secret", [1.0, 0.0, 0.0])
    attacker, buggy = UUID(int=1), uuid7()  # sorts below any uuid7
    aims = {"experience_id": secret, "collective_id": attacker}
    forged: list[ev.Event] = [
        ev.CollectiveCreated(
            **_common(buggy), collective_id=attacker, owner_id="attacker", name="mine",  # type: ignore[arg-type]
            embedding_dimension=3,
        ),
        ev.ExperienceRecorded(  # a second create, with the smallest event id there is
            **{**_common(buggy), "event_id": UUID(int=1)}, **aims,  # type: ignore[arg-type]
            content="the attacker's version", embedding=ev.pack_vector([1.0, 0.0, 0.0]),
            experience_type=ev.Generic(), importance=0.1, confidence=0.1,
            source_agent="attacker",
        ),
        ev.ExperienceUpdated(**_common(buggy), **aims, importance=0.9),  # type: ignore[arg-type]
        ev.ExperienceArchived(**_common(buggy), **aims),  # type: ignore[arg-type]
        ev.ExperienceReinforced(**_common(buggy), **aims, applications=7),  # type: ignore[arg-type]
        ev.ExperienceDeleted(**_common(buggy), **aims),  # type: ignore[arg-type]
    ]  # fmt: skip
    client = await nats.connect(nats_server.url)
    seqs = []
    for event in forged:
        wire = encode_event(event)
        seqs.append(
            (await client.jetstream().publish(wire.subject, wire.payload, headers=wire.headers)).seq
        )
    await client.close()
    await a.sync()

    found = await a.get_experience(secret)
    assert found is not None and found.collective_id == victim
    assert found.content == "the victim's secret"
    assert (found.importance, found.archived, found.applications) == (0.5, False, 0)
    assert await a.list_experiences(attacker) == []
    assert await a.search_similar(attacker, [1.0, 0.0, 0.0], k=5) == []
    assert [
        r.experience.experience_id for r in await a.search_similar(victim, [1.0, 0.0, 0.0])
    ] == [secret]
    letters = {d.seq: d.reason for d in await a.dead_letters() if d.entity == "message"}
    assert set(letters) == set(seqs[1:])
    for reason in letters.values():
        assert f"belongs to collective {victim}, the event names {attacker}" in reason
        assert reason.startswith("collective_id: not the collective of the entity")
    assert await a.digest() == await _fresh_digest(nats_server, tmp_path / "b")

    await a.delete_collective(victim)  # forgetting still reaches it
    assert await a.get_experience(secret) is None
    assert await a.list_experiences(attacker) == []
    fresh = await PulseDB.open(tmp_path / "c", nats_server.url)
    await fresh.sync()
    assert await fresh.get_experience(secret) is None
    assert await fresh.digest() == await a.digest()
    await fresh.close()
    await a.close()


async def _fresh_digest(nats_server: EmbeddedNats, path: Path) -> str:
    fresh = await PulseDB.open(path, nats_server.url)
    try:
        await fresh.sync()
        return await fresh.digest()
    finally:
        await fresh.close()
