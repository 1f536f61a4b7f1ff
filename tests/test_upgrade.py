"""Upgrading a deployment host by host, on real JetStream with real instances:

- every message on the streams says which schema version wrote its body;
- a host of a newer version upcasts what hosts of the older one wrote (before it opened
  and while it runs) into the state a host that got those events in the newer form has;
- a host of an older version keeps what it cannot read as dead letters naming the
  version, applies everything else and goes on replicating; once upgraded, it reads them.

The next release is stood in for by this process: ``codec.SCHEMA_VERSION`` and
``codec.UPCASTERS`` set for one test (``monkeypatch`` puts them back), which the real codec
reads at each call on the real read path (``eventlog.codec``); what a host of another
version wrote is published raw, with the headers and body that version writes.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import nats
import nats.js.errors
import pytest
from nats.js.api import RawStreamMsg

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings, codec
from eventlog import events as ev
from eventlog.codec import HDR_EVENT_TYPE, HDR_MSG_ID, HDR_SCHEMA, encode_body, encode_event
from eventlog.ids import uuid7
from eventlog.subjects import collective_subject, subject_for
from projections.projection import Projection, state_dir
from projections.rebuild import rebuild
from sync import PulseDB

OLD = codec.SCHEMA_VERSION  # the release this code is
NEW = OLD + 1  # the next one, stood in for by ``next_release``


def next_release(monkeypatch: pytest.MonkeyPatch, upcaster: codec.Upcaster) -> None:
    """From here to the end of the test this process is the next release: it writes
    ``NEW`` and reads ``OLD`` bodies through ``upcaster``."""
    monkeypatch.setattr(codec, "SCHEMA_VERSION", NEW)
    monkeypatch.setitem(codec.UPCASTERS, OLD, upcaster)


_logical = itertools.count(1)


def _common(instance: UUID) -> dict[str, Any]:
    """The fields every event has; its clock after every one stamped before (a
    millisecond ahead of the wall clock, and counting), so the last written wins."""
    return {
        "event_id": uuid7(),
        "instance_id": instance,
        "hlc": ev.pack_hlc(time.time_ns() // 1_000_000 + 1, next(_logical) % ev.HLC_LOGICAL_MAX),
    }


def _body(event: ev.Event) -> dict[str, Any]:
    """The wire body of an event as a plain map (UUIDs stay 16-byte strings)."""
    body: dict[str, Any] = msgspec.msgpack.decode(encode_body(event))
    return body


async def publish_raw(
    js: Any, subject: str, body: dict[str, Any], *, schema: int, msg_id: str | None = None
) -> int:
    """Publish what a host of release ``schema`` would have: its body, its headers."""
    headers = {
        HDR_MSG_ID: msg_id or str(uuid7()),
        HDR_EVENT_TYPE: str(body.get("type")),
        HDR_SCHEMA: str(schema),
    }
    ack = await js.publish(subject, msgspec.msgpack.encode(body), headers=headers)
    return int(ack.seq)


async def raw_messages(url: str, stream: str) -> list[RawStreamMsg]:
    """Every message a stream holds, as stored (a purged one is skipped)."""
    client = await nats.connect(url)
    try:
        jsm = client.jsm()
        state = (await jsm.stream_info(stream)).state
        found = []
        for seq in range(max(state.first_seq, 1), state.last_seq + 1):
            try:
                found.append(await jsm.get_msg(stream, seq))
            except nats.js.errors.NotFoundError:
                continue
        return found
    finally:
        await client.close()


async def messages_kept_aside(db: PulseDB) -> dict[int, Any]:
    return {d.seq: d for d in await db.dead_letters() if d.entity == "message"}


# -- every event carries its schema version ------------------------------------------------


async def test_every_message_on_the_streams_says_its_schema_version(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """Whatever path a write takes (one append, a keyed append, an atomic batch, the
    activity stream, a delete's tombstones), the stored message says the version, the
    event type of its body and (when it has one) its event id."""
    db = await PulseDB.open(tmp_path / "a", nats_server.url)
    try:
        cid = await db.create_collective("owner", "team", 3)
        first = await db.record_experience(cid, "one append", [1, 0, 0])
        keyed = await db.record_experience(cid, "keyed", [0, 1, 0], idempotency_key="k-1")
        batch = await db.record_experiences(
            cid, [{"content": f"batch {i}", "embedding": [0, i, 1]} for i in range(3)]
        )
        await db.update_experience(first, importance=0.9)
        await db.reinforce_experience(first)
        await db.archive_experience(keyed)
        await db.store_relation(first, batch[0], "Supports")
        await db.store_insight(cid, "distilled", [1, 1, 0], source_experiences=[first])
        await db.store_wisdom("owner", "CodingStyle", "small modules", [1.0, 0.0])
        await db.register_activity(cid, "agent-7", "upgrading")
        await db.delete_experience(batch[2])
        gone = await db.create_collective("owner", "gone", 2)
        await db.delete_collective(gone)
    finally:
        await db.close()

    durable = await raw_messages(nats_server.url, "PULSE")
    presence = await raw_messages(nats_server.url, "PULSE_ACTIVITY")
    assert presence, "the activity stream holds the agent's activity"
    seen = set()
    for msg in durable + presence:
        headers = msg.headers or {}
        body = msgspec.msgpack.decode(msg.data or b"")
        assert headers.get(HDR_SCHEMA) == str(OLD), (msg.seq, msg.subject, headers)
        assert headers.get(HDR_EVENT_TYPE) == body["type"]
        if HDR_MSG_ID in headers:  # (an atomic batch goes without: see JetStreamLog)
            assert headers[HDR_MSG_ID] == str(UUID(bytes=body["event_id"]))
        seen.add(body["type"] if body["type"] != "sealed" else f"sealed {body['kind']}")
    assert {
        "collective.created", "collective.deleted", "sealed experience.recorded",
        "sealed experience.updated", "experience.reinforced", "experience.archived",
        "experience.deleted", "sealed relation.stored", "sealed insight.stored",
        "sealed wisdom.stored", "activity.registered",
    } <= seen  # fmt: skip


# -- a host of a newer version upcasts what older hosts wrote ------------------------------

# What the older release wrote, in this story: a collective's dimension as ``dim``, and
# an experience's importance and confidence as whole percentages.


def as_written_by_the_old_release(event: ev.Event) -> dict[str, Any]:
    body = _body(event)
    if body["type"] == "collective.created":
        body["dim"] = body.pop("embedding_dimension")
    elif body["type"] == "experience.recorded":
        for name in ("importance", "confidence"):
            body[f"{name}_pct"] = round(body.pop(name) * 100)
    return body


def upcaster_counting(calls: list[str]) -> codec.Upcaster:
    """The upcaster the next release registers (counting the bodies it turns)."""

    def from_old(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(body["type"])
        if body["type"] == "collective.created":
            body["embedding_dimension"] = body.pop("dim")
        elif body["type"] == "experience.recorded":
            for name in ("importance", "confidence"):
                body[name] = body.pop(f"{name}_pct") / 100
        return body

    return from_old


async def test_a_newer_host_reads_older_events_as_if_they_came_in_its_own_form(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    jetstream_log: JetStreamLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_host = uuid7()
    cid, first, second = uuid7(), uuid7(), uuid7()
    before = [  # the older hosts' writes before the new host opens (its catch-up reads them)
        ev.CollectiveCreated(
            **_common(old_host), collective_id=cid, owner_id="owner", name="rollout",
            embedding_dimension=3,
        ),
        ev.ExperienceRecorded(
            **_common(old_host), experience_id=first, collective_id=cid,
            content="written by the older release", embedding=ev.pack_vector([1, 0, 0]),
            experience_type=ev.Fact(statement="old hosts still write", source="rollout"),
            importance=0.75, confidence=0.25, source_agent="old-agent", domain=("upgrade",),
        ),
        ev.ExperienceReinforced(
            **_common(old_host), experience_id=first, collective_id=cid, applications=1
        ),
    ]  # fmt: skip
    meanwhile = [  # ... and while it runs (its replication reads them)
        ev.ExperienceRecorded(
            **_common(old_host), experience_id=second, collective_id=cid,
            content="still written by the older release", embedding=ev.pack_vector([0, 1, 0]),
            experience_type=ev.Generic(), importance=0.5, confidence=1.0,
            source_agent="old-agent",
        ),
        ev.ExperienceUpdated(
            **_common(old_host), experience_id=first, collective_id=cid, importance=0.25
        ),
    ]  # fmt: skip
    truth = {str(e.event_id): e for e in before + meanwhile}  # what they mean, in any form

    async def publish_old(events: list[ev.Event]) -> None:
        for event in events:
            body = as_written_by_the_old_release(event)
            await publish_raw(
                jetstream_log.js, subject_for(event), body, schema=OLD, msg_id=str(event.event_id)
            )

    await publish_old(before)
    calls: list[str] = []
    next_release(monkeypatch, upcaster_counting(calls))
    new = await PulseDB.open(tmp_path / "new", nats_server.url)
    try:
        assert "collective.created" in calls  # its catch-up read them through the upcaster
        await publish_old(meanwhile)
        third = await new.record_experience(cid, "written by the new release", [0, 0, 1])
        assert await new.reinforce_experience(first) == 2  # the older host's entry and its own
        await new.sync()
        assert sorted(calls) == sorted(ev.event_type_name(e) for e in before + meanwhile)
        assert await messages_kept_aside(new) == {}
        got = await new.get_experience(first)
        assert got is not None and (got.importance, got.confidence) == (0.25, 0.25)
        assert got.applications == 2  # the older host's entry and the new host's
        got = await new.get_experience(second)
        assert got is not None and (got.importance, got.confidence) == (0.5, 1.0)
        collective = await new.get_collective(cid)
        assert collective is not None and collective.embedding_dimension == 3
        found = await new.search_similar(cid, [0, 1, 0], k=1)
        assert [r.experience.experience_id for r in found] == [second]
        upgraded = {e: await new.get_experience(e) for e in (first, second, third)}
        digest = await new.digest()
    finally:
        await new.close()

    stored = await raw_messages(nats_server.url, "PULSE")
    versions = {(msg.headers or {})[HDR_MSG_ID]: (msg.headers or {})[HDR_SCHEMA] for msg in stored}
    assert {versions[i] for i in truth} == {str(OLD)}  # as the older release wrote them
    assert {v for i, v in versions.items() if i not in truth} == {str(NEW)}  # its own writes

    # a host that got the same events, every one in the new release's form, from the start
    native_server = EmbeddedNats(tmp_path / "native")
    native_server.start()
    try:
        native_log = await JetStreamLog.connect(native_server.url, StreamSettings())
        try:  # the keys its own writes are sealed with, in the key store of that deployment
            for name, value in (await jetstream_log.key_store().items()).items():
                await native_log.key_store().create(name, value)
            for msg in stored:  # same order, so same sequences
                event = truth.get((msg.headers or {})[HDR_MSG_ID])
                if event is None:  # the new host's own: copied as they are
                    await native_log.js.publish(msg.subject, msg.data, headers=msg.headers)
                else:
                    wire = encode_event(event)
                    assert wire.headers[HDR_SCHEMA] == str(NEW)
                    await native_log.js.publish(wire.subject, wire.payload, headers=wire.headers)
        finally:
            await native_log.close()
        native = await PulseDB.open(tmp_path / "native-host", native_server.url)
        try:
            await native.sync()
            assert {e: await native.get_experience(e) for e in upgraded} == upgraded
            assert await native.digest() == digest
        finally:
            await native.close()
    finally:
        native_server.stop()


# -- a host of an older version keeps newer events aside, goes on, and reads them later ----


@pytest.mark.parametrize("upgrade", ["rebuild", "reopen"])
async def test_an_older_host_keeps_newer_events_aside_and_reads_them_once_upgraded(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    jetstream_log: JetStreamLog,
    monkeypatch: pytest.MonkeyPatch,
    upgrade: str,
) -> None:
    url = nats_server.url
    old = await PulseDB.open(tmp_path / "old", url)
    cid = await old.create_collective("owner", "team", 3)
    first = await old.record_experience(cid, "written by the older release", [1, 0, 0])

    # the next release added a field to experience.recorded and a new event type; its
    # hosts write them with its version (a new field is a new version: see eventlog.codec)
    newer_host = uuid7()
    second, hunch = uuid7(), uuid7()
    recorded = _body(
        ev.ExperienceRecorded(
            **_common(newer_host), experience_id=second, collective_id=cid,
            content="written by the newer release", embedding=ev.pack_vector([0, 1, 0]),
            experience_type=ev.Generic(), importance=0.5, confidence=0.5,
            source_agent="new-agent",
        )
    ) | {"pinned": True}  # fmt: skip
    reinforced = _body(
        ev.ExperienceReinforced(
            **_common(newer_host), experience_id=first, collective_id=cid, applications=1
        )
    )
    pinned = _body(
        ev.ExperienceArchived(**_common(newer_host), experience_id=first, collective_id=cid)
    ) | {"type": "experience.pinned"}
    # and one body of this version that names an experience type no release knows (a
    # host that bumped nothing, or not Pulse), and one with a field this one lacks
    unknown_kind = _body(
        ev.ExperienceRecorded(
            **_common(newer_host), experience_id=hunch, collective_id=cid, content="a hunch",
            embedding=ev.pack_vector([0, 0, 1]), experience_type=ev.Generic(),
            importance=0.5, confidence=0.5, source_agent="new-agent",
        )
    ) | {"experience_type": {"kind": "Hunch", "strength": 0.3}}  # fmt: skip
    updated = _body(
        ev.ExperienceUpdated(
            **_common(uuid7()), experience_id=first, collective_id=cid, importance=0.9
        )
    ) | {"pinned": True}
    experience_subject = collective_subject(cid, "experience", first)
    js = jetstream_log.js
    newer = {
        await publish_raw(js, collective_subject(cid, "experience", second), recorded, schema=NEW),
        await publish_raw(js, experience_subject, reinforced, schema=NEW),
        await publish_raw(js, experience_subject, pinned, schema=NEW),
    }
    unknown = await publish_raw(
        js, collective_subject(cid, "experience", hunch), unknown_kind, schema=OLD
    )
    await publish_raw(js, experience_subject, updated, schema=OLD)

    # the older host applies everything else, writes and replicates on
    third = await old.record_experience(cid, "after the newer events", [1, 1, 0])
    await old.sync()
    assert await old.get_experience(second) is None
    got = await old.get_experience(first)
    assert got is not None and got.applications == 0 and not got.archived
    assert got.importance == 0.9  # (its unknown field ignored: see test_codec)
    assert await old.get_experience(third) is not None
    aside = await messages_kept_aside(old)
    assert set(aside) == newer | {unknown}
    for seq in newer:
        assert f"written with schema {NEW}, this Pulse reads up to {OLD}: upgrade Pulse" in (
            aside[seq].reason
        )
        assert aside[seq].instance_id == newer_host
    assert aside[unknown].reason == (
        f"experience type 'Hunch' is unknown to this Pulse (schema {OLD}): "
        "upgrade Pulse if a newer one wrote it"
    )
    before_upgrade = await old.digest()
    await old.close()

    # ... and opens again; a second older host agrees with it
    again = await PulseDB.open(tmp_path / "old", url)
    other = await PulseDB.open(tmp_path / "other-old", url)
    try:
        await again.sync()
        await other.sync()
        assert set(await messages_kept_aside(again)) == newer | {unknown}
        assert await again.digest() == await other.digest() == before_upgrade
    finally:
        await again.close()
        await other.close()

    # the upgrade: the host's code is now the next release
    next_release(monkeypatch, lambda body: body)
    if upgrade == "rebuild":
        await rebuild(tmp_path / "old", jetstream_log)
    upgraded = await PulseDB.open(tmp_path / "old", url)
    fresh = await PulseDB.open(tmp_path / "fresh", url)  # a host of the next release
    try:
        await upgraded.sync()
        await fresh.sync()
        got = await upgraded.get_experience(second)
        assert got is not None and got.content == "written by the newer release"
        got = await upgraded.get_experience(first)
        assert got is not None and got.applications == 1 and got.importance == 0.9
        aside = await messages_kept_aside(upgraded)
        pinned_seq = next(s for s in newer if aside.get(s))  # still unknown to this code
        assert set(aside) == {pinned_seq, unknown}
        assert aside[pinned_seq].reason.startswith(
            f"event type 'experience.pinned' is unknown to this Pulse (schema {NEW})"
        )
        assert aside[unknown].reason.startswith(
            f"experience type 'Hunch' is unknown to this Pulse (schema {NEW})"
        )
        assert await upgraded.digest() == await fresh.digest()
    finally:
        await upgraded.close()
        await fresh.close()


async def test_an_upgraded_host_reads_its_dead_letters_once_and_drops_the_forgotten(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    jetstream_log: JetStreamLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dead letter whose message was forgotten since (purged with its experience) goes
    at the upgrade, as no host reading the log now sees it; and the dead letters are read
    again once, not at every open."""
    url = nats_server.url
    old = await PulseDB.open(tmp_path / "old", url)
    cid = await old.create_collective("owner", "team", 2)
    kept = await old.record_experience(cid, "kept", [1, 0])
    gone = await old.record_experience(cid, "forgotten", [0, 1])
    for eid in (kept, gone):
        reinforced = _body(
            ev.ExperienceReinforced(
                **_common(uuid7()), experience_id=eid, collective_id=cid, applications=3
            )
        )
        await publish_raw(
            jetstream_log.js, collective_subject(cid, "experience", eid), reinforced, schema=NEW
        )
    await old.sync()
    assert len(await messages_kept_aside(old)) == 2
    await old.delete_experience(gone)  # purges what its subject held, the newer event too
    await old.close()

    next_release(monkeypatch, lambda body: body)
    upgraded = await PulseDB.open(tmp_path / "old", url)
    fresh = await PulseDB.open(tmp_path / "fresh", url)
    try:
        await fresh.sync()
        assert await messages_kept_aside(upgraded) == {}
        got = await upgraded.get_experience(kept)
        assert got is not None and got.applications == 3
        assert await upgraded.digest() == await fresh.digest()
    finally:
        await upgraded.close()
        await fresh.close()
    projection = Projection(state_dir(tmp_path / "old"))
    try:
        assert projection.readmit_due() == []
    finally:
        projection.close()


async def test_a_host_on_partitions_reads_its_dead_letters_again_by_their_position(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a log in partitions a host's sequences are its own numbering: a message kept
    aside is found again by where the log holds it (its position), so an upgraded host
    applies it, and agrees with a host that read the log fresh."""
    from eventlog import StreamSettings
    from eventlog.partitioned import PartitionedLog
    from eventlog.subjects import with_bucket

    url, three = nats_server.url, StreamSettings(partitions=3)
    old = await PulseDB.open(tmp_path / "old", url, stream_settings=three)
    teams = [await old.create_collective("owner", f"team {i}", 2) for i in range(3)]
    lessons = [await old.record_experience(t, "a lesson", [1, 0]) for t in teams]
    log = await PartitionedLog.connect(url, three)
    try:
        for team, eid in zip(teams, lessons, strict=True):  # (a newer release's reinforcement)
            reinforced = _body(
                ev.ExperienceReinforced(
                    **_common(uuid7()), experience_id=eid, collective_id=team, applications=2
                )
            )
            subject = with_bucket(collective_subject(team, "experience", eid))
            await publish_raw(log.parts[0].js, subject, reinforced, schema=NEW)
    finally:
        await log.close()
    await old.sync()
    assert len(await messages_kept_aside(old)) == 3
    await old.close()

    next_release(monkeypatch, lambda body: body)
    upgraded = await PulseDB.open(tmp_path / "old", url, stream_settings=three)
    fresh = await PulseDB.open(tmp_path / "fresh", url, stream_settings=three)
    try:
        await fresh.sync()
        assert await messages_kept_aside(upgraded) == {}
        for eid in lessons:
            got = await upgraded.get_experience(eid)
            assert got is not None and got.applications == 2
        for team in teams:
            assert await upgraded.digest(team) == await fresh.digest(team)
    finally:
        await upgraded.close()
        await fresh.close()
