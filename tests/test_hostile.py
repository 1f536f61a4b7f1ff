"""One bad event never stops a host: events a buggy host publishes raw to the stream
(a negative clock, a collective of dimension 0 or 2**40, a counter of 2**64-1) become
dead letters; later writes still apply, the instance reopens, a new host converges to
the same digest, and ``dead_letters()`` names each of them with its sequence, subject
and writer. The projection itself refuses such rows when handed them directly."""

from __future__ import annotations

from pathlib import Path

import nats
import numpy as np

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.codec import encode_event
from eventlog.ids import uuid7
from eventlog.log import LogEntry
from projections.engine import Engine
from sync import PulseDB


def _common(instance: object, hlc: int | None = None) -> dict[str, object]:
    return {
        "event_id": uuid7(),
        "instance_id": instance,
        "hlc": ev.pack_hlc(1_800_000_000_000) if hlc is None else hlc,
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


async def test_a_clock_far_ahead_does_not_drag_this_hosts_clock(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """A valid event stamped near the end of time (a buggy host's clock) is folded like
    any other, but this host's clock does not follow it: its own later writes keep
    ordinary stamps and apply."""
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        client = await nats.connect(nats_server.url)
        far = ev.CollectiveCreated(
            **_common(uuid7(), hlc=2**63 - 1), collective_id=uuid7(), owner_id="x",  # type: ignore[arg-type]
            name="from the future", embedding_dimension=3,
        )  # fmt: skip
        wire = encode_event(far)
        await client.jetstream().publish(wire.subject, wire.payload, headers=wire.headers)
        await client.close()
        await db.sync()
        assert ev.hlc_millis(db.clock.now()) < ev.hlc_millis(2**63 - 1) // 2
        cid = await db.create_collective("me", "today", 3)
        assert await db.record_experience(cid, "still applies", [1.0, 0.0, 0.0])
        assert [d for d in await db.dead_letters() if d.entity == "message"] == []
    finally:
        await db.close()
