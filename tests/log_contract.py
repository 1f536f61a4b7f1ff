"""The EventLog contract: every backend's test module subclasses ``LogContract`` and
provides the ``log`` fixture and ``inject_raw`` (store foreign bytes on a subject)."""

from __future__ import annotations

import asyncio
from typing import Mapping

import pytest

from eventlog import ConflictError, DecodeError, EventLog, LogEntry, ValidationError
from eventlog import events as ev
from eventlog.codec import HDR_EVENT_TYPE, HDR_MSG_ID, HDR_SCHEMA, encode_event
from eventlog.ids import uuid7
from eventlog.subjects import collective_filter, subject_for
from tests import factories as f
from tests.harness import eventually


async def read_all(log: EventLog, from_seq: int = 1, **kwargs: object) -> list[LogEntry]:
    entries: list[LogEntry] = []
    async for batch in log.read(from_seq, **kwargs):  # type: ignore[arg-type]
        entries.extend(batch)
    return entries


class LogContract:
    async def inject_raw(
        self, log: EventLog, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> None:
        raise NotImplementedError

    # -- appending -------------------------------------------------------------------------

    async def test_append_returns_consecutive_sequences(self, log: EventLog) -> None:
        assert await log.last_seq() == 0
        cid = uuid7()
        seqs = [await log.append(f.collective(cid)), await log.append(f.experience(cid))]
        assert seqs == [1, 2]
        assert await log.last_seq() == 2

    async def test_events_read_back_equal_to_what_was_appended(self, log: EventLog) -> None:
        cid = uuid7()
        written = [f.collective(cid), f.experience(cid), f.experience(cid), f.wisdom()]
        for event in written:
            await log.append(event)
        entries = await read_all(log)
        assert [e.event for e in entries] == written
        assert [e.seq for e in entries] == [1, 2, 3, 4]
        assert [e.subject for e in entries] == [subject_for(e) for e in written]
        assert all(e.error is None for e in entries)

    async def test_retried_append_is_stored_once(self, log: EventLog) -> None:
        cid = uuid7()
        event = f.collective(cid)
        first = await log.append(event)
        again = await log.append(event)
        assert again == first
        assert await log.last_seq() == 1
        assert [e.event for e in await read_all(log)] == [event]

    async def test_append_batch_returns_sequences_in_order(self, log: EventLog) -> None:
        cid = uuid7()
        batch = [f.collective(cid)] + [f.experience(cid, f"lesson {i}") for i in range(50)]
        seqs = await log.append_batch(batch)
        assert seqs == list(range(1, 52))
        assert [e.event for e in await read_all(log)] == batch

    async def test_atomic_batch_returns_sequences_in_order(self, log: EventLog) -> None:
        cid = uuid7()
        batch = [f.collective(cid)] + [f.experience(cid, f"lesson {i}") for i in range(999)]
        await log.append(f.collective(uuid7()))
        seqs = await log.append_batch(batch, atomic=True)
        assert seqs == list(range(2, 1002))
        assert [e.event for e in await read_all(log)][1:] == batch

    async def test_retried_batch_is_stored_once(self, log: EventLog) -> None:
        cid = uuid7()
        batch = [f.experience(cid, f"lesson {i}") for i in range(20)]
        first = await log.append_batch(batch)
        again = await log.append_batch(batch[5:] + [f.experience(cid, "new")])
        assert again[:15] == first[5:]
        assert again[15] == 21
        assert await log.last_seq() == 21

    async def test_too_large_event_is_refused_and_nothing_is_stored(self, log: EventLog) -> None:
        cid = uuid7()
        huge = f.experience(cid, "x" * (2 * 1024 * 1024))
        with pytest.raises(ValidationError, match="too large|exceeds"):
            await log.append(huge)
        assert await log.last_seq() == 0

    async def test_largest_valid_experience_fits(self, log: EventLog) -> None:
        """100 KB of content and a 4096-dimension embedding stay within the message limit."""
        cid = uuid7()
        big = f.experience(cid, "y" * 100 * 1024, dim=4096)
        assert await log.append(big) == 1
        (entry,) = await read_all(log)
        assert entry.event == big

    # -- optimistic concurrency ------------------------------------------------------------

    async def test_expected_last_subject_seq_guards_a_subject(self, log: EventLog) -> None:
        cid = uuid7()
        created = f.collective(cid)
        subject = subject_for(created)
        assert await log.last_subject_seq(subject) == 0
        assert await log.append(created, expected_last_subject_seq=0) == 1
        await log.append(f.experience(cid))  # another subject moves the stream, not this one
        assert await log.last_subject_seq(subject) == 1
        stale = ev.CollectiveDeleted(
            event_id=uuid7(), instance_id=f.INSTANCE, hlc=created.hlc + 1, collective_id=cid
        )
        with pytest.raises(ConflictError) as info:
            await log.append(stale, expected_last_subject_seq=0)
        assert info.value.subject == subject
        assert await log.last_seq() == 2
        assert await log.append(stale, expected_last_subject_seq=1) == 3
        assert await log.last_subject_seq(subject) == 3

    async def test_conditional_retry_after_success_returns_first_sequence(
        self, log: EventLog
    ) -> None:
        cid = uuid7()
        created = f.collective(cid)
        assert await log.append(created, expected_last_subject_seq=0) == 1
        # the ack was lost; the writer retries with the same condition: a duplicate, no conflict
        assert await log.append(created, expected_last_subject_seq=0) == 1
        assert await log.last_seq() == 1

    # -- reading ---------------------------------------------------------------------------

    async def test_read_from_a_sequence_in_batches(self, log: EventLog) -> None:
        cid = uuid7()
        await log.append_batch([f.experience(cid, f"lesson {i}") for i in range(25)])
        batches = [b async for b in log.read(11, batch_size=4)]
        assert all(1 <= len(b) <= 4 for b in batches)
        assert [e.seq for b in batches for e in b] == list(range(11, 26))

    async def test_read_past_the_end_is_empty(self, log: EventLog) -> None:
        await log.append(f.collective())
        assert await read_all(log, 2) == []

    async def test_read_rejects_a_bad_batch_size(self, log: EventLog) -> None:
        with pytest.raises(ValidationError, match="batch_size"):
            await read_all(log, batch_size=0)

    async def test_subject_filter_selects_collectives(self, log: EventLog) -> None:
        mine, other = uuid7(), uuid7()
        wisdom = f.wisdom()
        await log.append_batch(
            [
                f.collective(mine),
                f.collective(other),
                f.experience(other),
                f.experience(mine),
                wisdom,
            ]
        )
        only_mine = await read_all(log, subjects=collective_filter([mine], wisdom=False))
        assert [e.seq for e in only_mine] == [1, 4]
        with_wisdom = await read_all(log, subjects=collective_filter([mine]))
        assert [e.seq for e in with_wisdom] == [1, 4, 5]
        assert await read_all(log, subjects=collective_filter([uuid7()], wisdom=False)) == []

    async def test_purge_forgets_a_subject_before_its_tombstone(self, log: EventLog) -> None:
        cid = uuid7()
        recorded, kept = f.experience(cid), f.experience(cid)
        common = {"instance_id": recorded.instance_id, "hlc": recorded.hlc + 1}
        tombstone = ev.ExperienceDeleted(
            event_id=uuid7(), experience_id=recorded.experience_id, collective_id=cid, **common
        )
        late = ev.ExperienceReinforced(
            event_id=uuid7(), experience_id=recorded.experience_id, collective_id=cid,
            applications=1, **common,
        )  # fmt: skip
        seqs = await log.append_batch([f.collective(cid), recorded, kept, tombstone, late])
        await log.purge(subject_for(recorded), before_seq=seqs[3])
        remaining = await read_all(log)
        assert [e.seq for e in remaining] == [seqs[0], seqs[2], seqs[3], seqs[4]]
        assert recorded.event_id not in {e.event.event_id for e in remaining if e.event}
        assert await log.last_subject_seq(subject_for(recorded)) == seqs[4]
        # a wildcard purge takes a whole collective, up to its tombstone
        await log.purge(f"pulse.c.{cid}.>", before_seq=seqs[3])
        assert [e.seq for e in await read_all(log)] == [seqs[3], seqs[4]]
        assert await log.last_seq() == seqs[4]

    async def test_tail_gives_stored_then_live_events(self, log: EventLog) -> None:
        cid = uuid7()
        await log.append_batch([f.collective(cid), f.experience(cid)])
        seen: list[LogEntry] = []

        async def follow() -> None:
            async for entry in log.tail(2):
                seen.append(entry)

        task = asyncio.create_task(follow())
        try:
            await eventually(lambda: len(seen) == 1, what="the stored event")
            live = f.experience(cid, "live")
            await log.append(live)
            await eventually(lambda: len(seen) == 2, what="the live event")
            assert [e.seq for e in seen] == [2, 3]
            assert seen[1].event == live
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def test_tail_with_a_filter(self, log: EventLog) -> None:
        mine, other = uuid7(), uuid7()
        seen: list[LogEntry] = []

        async def follow() -> None:
            async for entry in log.tail(1, subjects=collective_filter([mine], wisdom=False)):
                seen.append(entry)

        task = asyncio.create_task(follow())
        try:
            await log.append_batch([f.collective(other), f.collective(mine), f.experience(other)])
            await log.append(f.experience(mine))
            await eventually(lambda: len(seen) == 2, what="both events of the collective")
            assert [e.seq for e in seen] == [2, 4]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- bytes that are not events -----------------------------------------------------------

    async def test_corrupt_message_is_reported_not_raised(self, log: EventLog) -> None:
        cid = uuid7()
        good = f.experience(cid)
        subject = subject_for(good)
        await log.append(f.collective(cid))
        await self.inject_raw(
            log, subject, b"\xc1 not msgpack", {HDR_SCHEMA: "1", HDR_MSG_ID: "junk-1"}
        )
        await log.append(good)
        entries = await read_all(log)
        assert [e.seq for e in entries] == [1, 2, 3]
        bad = entries[1]
        assert bad.event is None and isinstance(bad.error, DecodeError)
        assert bad.error.seq == 2 and bad.error.subject == subject
        assert "stream sequence 2" in str(bad.error) and subject in str(bad.error)
        assert entries[2].event == good

    async def test_newer_schema_and_foreign_messages_are_reported(self, log: EventLog) -> None:
        cid = uuid7()
        wire = encode_event(f.collective(cid))
        await self.inject_raw(
            log, wire.subject, wire.payload, {**wire.headers, HDR_SCHEMA: "99", HDR_MSG_ID: "n1"}
        )
        await self.inject_raw(log, wire.subject, b"hello", {HDR_EVENT_TYPE: "x", HDR_MSG_ID: "n2"})
        newer, foreign = await read_all(log)
        assert newer.error is not None and "schema 99" in str(newer.error)
        assert foreign.error is not None and "Pulse-Schema" in str(foreign.error)

    # -- activities ------------------------------------------------------------------------

    async def test_the_last_sequence_on_some_subjects_and_the_stream_state(
        self, log: EventLog
    ) -> None:
        one, two = uuid7(), uuid7()
        await log.append(f.collective(one))
        await log.append(f.collective(two))
        await log.append(f.experience(one))
        await log.append(f.experience(two))
        assert await log.last_seq(collective_filter([one], wisdom=False)) == 3
        assert await log.last_seq(collective_filter([two], wisdom=False)) == 4
        assert await log.last_seq(["pulse.c.*.collective.*"]) == 2  # wildcards
        assert await log.last_seq(collective_filter([uuid7()])) == 0  # nothing there
        # a read on several filters gives each message once, in stream order (JetStream
        # merges one consumer per filter), overlapping filters included
        for filters in (
            [*collective_filter([two], wisdom=False), *collective_filter([one], wisdom=False)],
            [f"pulse.c.{one}.>", "pulse.c.*.collective.*", f"pulse.c.{two}.>"],
        ):
            read = [e.seq async for batch in log.read(1, batch_size=1, subjects=filters)
                    for e in batch]  # fmt: skip
            assert read == [1, 2, 3, 4], filters
        state = await log.stream_state()
        assert (state.messages, state.first_seq, state.last_seq) == (4, 1, 4)
        assert state.replicas == 1 and state.bytes > 0

    async def test_activities_keep_the_last_message_per_agent(self, log: EventLog) -> None:
        cid, other = uuid7(), uuid7()
        await log.append(f.collective(cid))
        await log.append(f.activity(cid, "agent a", "first task"))
        await log.append(f.activity(cid, "agent a", "second task"))
        await log.append(f.activity(cid, "agent.b*", "b's task"))
        await log.append(f.activity(other, "agent a", "elsewhere"))
        assert await log.last_seq() == 1  # presence is not history
        latest = await log.latest_activities(cid)
        tasks = sorted(e.event.task_description for e in latest)  # type: ignore[union-attr]
        assert tasks == ["b's task", "second task"]
        assert len(await log.latest_activities()) == 3
