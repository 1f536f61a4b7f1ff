"""An event from the log is input from another host (docs/architecture.md, "Trust boundaries"): the
codec refuses values outside the data model's limits and a subject that is not the
event's own, with a ``DecodeError`` naming the field, the limit and the writer, and the
log turns such a message into an entry without an event (a dead letter downstream)."""

# ruff: noqa: E501  (tables of test data read better one row a line)

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import MemoryLog
from eventlog import events as ev
from eventlog.codec import HDR_SCHEMA, SCHEMA_VERSION, decode_event, encode_body, encode_event
from eventlog.errors import DecodeError
from eventlog.subjects import activity_subject, collective_subject, subject_for, wisdom_subject
from tests import factories as f
from tests import histories
from tests.golden_events import COLLECTIVE, INSTANCE, SAMPLES, golden_path
from tests.test_codec import INT_RANGES, valid_events

HEADERS = {HDR_SCHEMA: str(SCHEMA_VERSION)}
KB = 1024


def sample(name: str, /, **changes: Any) -> ev.Event:
    event = SAMPLES[name]
    return msgspec.structs.replace(event, **changes)  # type: ignore[return-value]


def decode(event: ev.Event) -> ev.Event:
    """Through the wire and back, on the event's own subject."""
    wire = encode_event(event)
    return decode_event(wire.payload, wire.headers, subject=wire.subject, seq=7)


def refusal(event: ev.Event) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(event)
    return info.value


def floats(*values: float) -> bytes:
    return ev.pack_vector(values)


def ids(n: int) -> tuple[UUID, ...]:
    return tuple(UUID(int=i + 1) for i in range(n))


# -- one explicit case per limit: refused, with a message naming the field and the limit ---

RECORDED = "experience.recorded.Fact"
OUT_OF_RANGE: list[tuple[str, dict[str, Any], str]] = [
    # every event: the clock
    ("collective.deleted", {"hlc": -5}, "hlc: must be in 0..2**63-1, got -5"),
    ("experience.reinforced", {"hlc": 2**63}, "hlc: must be in 0..2**63-1, got 9223372036854775808"),
    ("wisdom.deleted", {"hlc": 2**64 - 1}, "hlc: must be in 0..2**63-1, got 18446744073709551615"),
    # collectives
    ("collective.created", {"embedding_dimension": 0}, "embedding_dimension: must be in 1..4096, got 0"),
    ("collective.created", {"embedding_dimension": -1}, "embedding_dimension: must be in 1..4096, got -1"),
    ("collective.created", {"embedding_dimension": 4097}, "embedding_dimension: must be in 1..4096, got 4097"),
    ("collective.created", {"embedding_dimension": 2**40}, "embedding_dimension: must be in 1..4096, got 1099511627776"),
    ("collective.created", {"owner_id": ""}, "owner_id: must be 1..256 characters, got 0"),
    ("collective.created", {"owner_id": "o" * 257}, "owner_id: must be 1..256 characters, got 257"),
    ("collective.created", {"name": ""}, "name: must be 1..256 characters, got 0"),
    ("collective.created", {"name": "n" * 257}, "name: must be 1..256 characters, got 257"),
    ("collective.created", {"embedder": "e" * 65}, "embedder: must be 0..64 characters, got 65"),
    ("collective.created", {"language": "l" * 65}, "language: must be 0..64 characters, got 65"),
    # experiences
    (RECORDED, {"content": ""}, "content: must be 1..102400 bytes of UTF-8, got 0"),
    (RECORDED, {"content": "c" * (100 * KB + 1)}, "content: must be 1..102400 bytes of UTF-8, got 102401"),
    (RECORDED, {"content": "é" * (50 * KB + 1)}, "content: must be 1..102400 bytes of UTF-8, got 102402"),
    (RECORDED, {"embedding": b""}, "embedding: must hold 1..4096 float32 values (4 bytes each), got 0 bytes"),
    (RECORDED, {"embedding": floats(*[0.5] * 4097)}, "embedding: must hold 1..4096 float32 values (4 bytes each), got 16388 bytes"),
    (RECORDED, {"embedding": floats(1.0, float("nan"))}, "embedding[1]: must be a finite number, got nan"),
    (RECORDED, {"embedding": floats(float("-inf"))}, "embedding[0]: must be a finite number, got -inf"),
    (RECORDED, {"importance": 1.5}, "importance: must be a finite number in [0, 1], got 1.5"),
    (RECORDED, {"importance": -0.25}, "importance: must be a finite number in [0, 1], got -0.25"),
    (RECORDED, {"importance": float("nan")}, "importance: must be a finite number in [0, 1], got nan"),
    (RECORDED, {"confidence": float("inf")}, "confidence: must be a finite number in [0, 1], got inf"),
    (RECORDED, {"source_agent": ""}, "source_agent: must be 1..256 characters, got 0"),
    (RECORDED, {"source_agent": "a" * 257}, "source_agent: must be 1..256 characters, got 257"),
    (RECORDED, {"domain": ("d",) * 51}, "domain: must hold 0..50 items, got 51"),
    (RECORDED, {"domain": ("ok", "")}, "domain[1]: must be 1..100 characters, got 0"),
    (RECORDED, {"domain": ("d" * 101,)}, "domain[0]: must be 1..100 characters, got 101"),
    (RECORDED, {"related_files": ("f",) * 101}, "related_files: must hold 0..100 items, got 101"),
    (RECORDED, {"related_files": ("f" * 501,)}, "related_files[0]: must be 1..500 characters, got 501"),
    (RECORDED, {"source_task": ""}, "source_task: must be 1..1024 characters, got 0"),
    (RECORDED, {"source_task": "t" * 1025}, "source_task: must be 1..1024 characters, got 1025"),
    (RECORDED, {"experience_type": ev.Fact(statement="s" * (100 * KB + 1), source="x")}, "experience_type.statement: must be 0..102400 bytes of UTF-8, got 102401"),
    (RECORDED, {"experience_type": ev.SuccessPattern(task_type="t", approach="a", quality=1.5)}, "experience_type.quality: must be a finite number in [0, 1], got 1.5"),
    (RECORDED, {"experience_type": ev.UserPreference(category="c", preference="p", strength=float("nan"))}, "experience_type.strength: must be a finite number in [0, 1], got nan"),
    ("experience.updated", {"importance": 2.0}, "importance: must be a finite number in [0, 1], got 2.0"),
    ("experience.updated", {"confidence": -1.0}, "confidence: must be a finite number in [0, 1], got -1.0"),
    ("experience.updated", {"domain": ("d",) * 51}, "domain: must hold 0..50 items, got 51"),
    ("experience.updated", {"related_files": ("",)}, "related_files[0]: must be 1..500 characters, got 0"),
    ("experience.reinforced", {"applications": -1}, "applications: must be in 0..2**32, got -1"),
    ("experience.reinforced", {"applications": 2**32 + 1}, "applications: must be in 0..2**32, got 4294967297"),
    ("experience.reinforced", {"applications": 2**64 - 1}, "applications: must be in 0..2**32, got 18446744073709551615"),
    # relations
    ("relation.stored", {"strength": 1.0000001}, "strength: must be a finite number in [0, 1], got 1.0000001"),
    ("relation.stored", {"metadata": "m" * (10 * KB + 1)}, "metadata: must be 0..10240 bytes of UTF-8, got 10241"),
    # insights
    ("insight.stored", {"content": ""}, "content: must be 1..51200 bytes of UTF-8, got 0"),
    ("insight.stored", {"content": "i" * (50 * KB + 1)}, "content: must be 1..51200 bytes of UTF-8, got 51201"),
    ("insight.stored", {"source_experiences": ()}, "source_experiences: must hold 1..100 items, got 0"),
    ("insight.stored", {"source_experiences": ids(101)}, "source_experiences: must hold 1..100 items, got 101"),
    ("insight.stored", {"confidence": float("nan")}, "confidence: must be a finite number in [0, 1], got nan"),
    ("insight.stored", {"domain": ("d" * 101,)}, "domain[0]: must be 1..100 characters, got 101"),
    ("insight.stored", {"embedding": floats(float("inf"))}, "embedding[0]: must be a finite number, got inf"),
    # activities
    ("activity.registered", {"agent_id": ""}, "agent_id: must be 1..256 characters, got 0"),
    ("activity.registered", {"agent_id": "a" * 257}, "agent_id: must be 1..256 characters, got 257"),
    ("activity.registered", {"task_description": "t" * 1025}, "task_description: must be 0..1024 bytes of UTF-8, got 1025"),
    ("activity.registered", {"task_description": "€" * 342}, "task_description: must be 0..1024 bytes of UTF-8, got 1026"),
    ("activity.registered", {"working_on": ("w",) * 101}, "working_on: must hold 0..100 items, got 101"),
    ("activity.registered", {"working_on": ("",)}, "working_on[0]: must be 1..500 characters, got 0"),
    ("activity.heartbeat", {"working_on": ("w" * 501,)}, "working_on[0]: must be 1..500 characters, got 501"),
    ("activity.heartbeat", {"started_ms": -1}, "started_ms: must be in 0..2**47-1, got -1"),
    ("activity.heartbeat", {"started_ms": 2**47}, "started_ms: must be in 0..2**47-1, got 140737488355328"),
    ("activity.ended", {"agent_id": ""}, "agent_id: must be 1..256 characters, got 0"),
    # wisdom
    ("wisdom.stored", {"owner_id": ""}, "owner_id: must be 1..256 characters, got 0"),
    ("wisdom.stored", {"pattern": ""}, "pattern: must be 1..10000 characters, got 0"),
    ("wisdom.stored", {"pattern": "p" * 10_001}, "pattern: must be 1..10000 characters, got 10001"),
    ("wisdom.stored", {"confidence": 1.5}, "confidence: must be a finite number in [0, 1], got 1.5"),
    ("wisdom.stored", {"embedding": floats(float("nan"))}, "embedding[0]: must be a finite number, got nan"),
    ("wisdom.stored", {"source_collectives": ids(101)}, "source_collectives: must hold 0..100 items, got 101"),
    ("wisdom.stored", {"source_experience_count": -1}, "source_experience_count: must be in 0..2**32, got -1"),
    ("wisdom.stored", {"source_experience_count": 2**32 + 1}, "source_experience_count: must be in 0..2**32, got 4294967297"),
    ("wisdom.stored", {"applicable_domains": ("d",) * 51}, "applicable_domains: must hold 0..50 items, got 51"),
    ("wisdom.deleted", {"owner_id": ""}, "owner_id: must be 1..256 characters, got 0"),
    # sessions
    ("session.started", {"agent_id": ""}, "agent_id: must be 1..256 characters, got 0"),
    ("session.started", {"agent_id": "a" * 257}, "agent_id: must be 1..256 characters, got 257"),
    ("session.started", {"summary": "s" * (8 * KB + 1)}, "summary: must be 0..8192 bytes of UTF-8, got 8193"),
    ("session.updated", {"summary": "€" * 2731}, "summary: must be 0..8192 bytes of UTF-8, got 8193"),
    ("session.updated", {"todo": (ev.TodoItem(task="t"),) * 101}, "todo: must hold 0..100 items, got 101"),
    ("session.updated", {"todo": (ev.TodoItem(task=""),)}, "todo[0].task: must be 1..1024 bytes of UTF-8, got 0"),
    ("session.updated", {"todo": (ev.TodoItem(task="t" * 1025),)}, "todo[0].task: must be 1..1024 bytes of UTF-8, got 1025"),
    ("session.updated", {"todo": (ev.TodoItem(task="t", note="n" * 1025),)}, "todo[0].note: must be 0..1024 bytes of UTF-8, got 1025"),
    ("session.updated", {"changes": ("c",) * 101}, "changes: must hold 0..100 items, got 101"),
    ("session.updated", {"bugs": ("ok", "")}, "bugs[1]: must be 1..1024 bytes of UTF-8, got 0"),
    ("session.updated", {"architecture": ("a" * 1025,)}, "architecture[0]: must be 1..1024 bytes of UTF-8, got 1025"),
    # threads (an agent framework's checkpoints)
    ("thread.checkpointed", {"name": ""}, "name: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.checkpointed", {"name": "n" * 1025}, "name: must be 1..1024 bytes of UTF-8, got 1025"),
    ("thread.checkpointed", {"checkpoint_id": ""}, "checkpoint_id: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.checkpointed", {"checkpoint_ns": "n" * 1025}, "checkpoint_ns: must be 0..1024 bytes of UTF-8, got 1025"),
    ("thread.checkpointed", {"parent_checkpoint_id": ""}, "parent_checkpoint_id: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.checkpointed", {"checkpoint_type": ""}, "checkpoint_type: must be 1..64 characters, got 0"),
    ("thread.checkpointed", {"metadata": "m" * (64 * KB + 1)}, "metadata: must be 0..65536 bytes of UTF-8, got 65537"),
    ("thread.checkpointed", {"checkpoint": bytes(896 * KB), "metadata": "{}"}, "checkpoint and metadata: must be 0..917504 bytes, got 917506"),
    ("thread.checkpointed", {"run_id": ""}, "run_id: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.written", {"task_id": ""}, "task_id: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.written", {"task_path": "p" * 1025}, "task_path: must be 0..1024 bytes of UTF-8, got 1025"),
    ("thread.written", {"writes": ()}, "writes: must hold 1..1000 items, got 0"),
    ("thread.written", {"writes": (ev.PendingWrite(idx=0, channel="c", value_type="t"),) * 1001}, "writes: must hold 1..1000 items, got 1001"),
    ("thread.written", {"writes": (ev.PendingWrite(idx=-17, channel="c", value_type="t"),)}, "writes[0].idx: must be in -16..2**31-1, got -17"),
    ("thread.written", {"writes": (ev.PendingWrite(idx=0, channel="", value_type="t"),)}, "writes[0].channel: must be 1..1024 bytes of UTF-8, got 0"),
    ("thread.written", {"writes": (ev.PendingWrite(idx=0, channel="c", value_type="t" * 65),)}, "writes[0].value_type: must be 1..64 characters, got 65"),
    ("thread.written", {"writes": (ev.PendingWrite(idx=0, channel="c", value_type="t", value=bytes(896 * KB)), ev.PendingWrite(idx=1, channel="c", value_type="t", value=b"x"))}, "writes' values: must be 0..917504 bytes, got 917505"),
    ("thread.checkpoint_deleted", {"checkpoint_id": ""}, "checkpoint_id: must be 1..1024 bytes of UTF-8, got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "changes", "reason"), OUT_OF_RANGE, ids=lambda p: str(p)[:40])
def test_out_of_range_value_is_refused_naming_field_and_limit(
    name: str, changes: dict[str, Any], reason: str
) -> None:
    event = sample(name, **changes)
    error = refusal(event)
    assert error.reason == reason
    assert error.seq == 7 and error.subject == subject_for(event)
    assert error.instance_id == INSTANCE
    assert str(error).endswith(f"written by instance {INSTANCE}: {reason}")


AT_THE_LIMIT: list[tuple[str, dict[str, Any]]] = [
    ("collective.deleted", {"hlc": 0}),
    ("collective.deleted", {"hlc": 2**63 - 1}),
    ("collective.created", {"embedding_dimension": 1, "embedder": ""}),
    ("collective.created", {"embedding_dimension": 4096, "embedder": "e" * 64}),
    ("collective.created", {"owner_id": "o" * 256, "name": "n"}),
    (RECORDED, {"content": "c"}),
    (RECORDED, {"content": "é" * (50 * KB)}),  # 102400 bytes
    (RECORDED, {"content": "😀" * (25 * KB)}),  # 102400 bytes
    (RECORDED, {"embedding": floats(*[0.5] * 4096)}),
    (RECORDED, {"importance": 0.0, "confidence": 1.0}),
    (RECORDED, {"source_agent": "a" * 256, "source_task": "t" * 1024}),
    (RECORDED, {"domain": ("d" * 100,) * 50, "related_files": ("f" * 500,) * 100}),
    (RECORDED, {"experience_type": ev.Fact(statement="s" * (100 * KB), source="")}),
    (RECORDED, {"experience_type": ev.SuccessPattern(task_type="", approach="", quality=1.0)}),
    ("experience.updated", {"importance": 1.0, "confidence": 0.0, "domain": (), "related_files": ()}),
    ("experience.reinforced", {"applications": 0}),
    ("experience.reinforced", {"applications": 2**32}),
    ("relation.stored", {"strength": 0.0, "metadata": ""}),
    ("relation.stored", {"strength": 1.0, "metadata": "m" * (10 * KB)}),
    ("insight.stored", {"content": "i" * (50 * KB), "source_experiences": ids(100)}),
    ("activity.registered", {"task_description": "€" * 341, "working_on": ("w" * 500,) * 100}),
    ("activity.heartbeat", {"started_ms": 0, "task_description": ""}),
    ("activity.heartbeat", {"started_ms": 2**47 - 1, "agent_id": "a" * 256}),
    ("wisdom.stored", {"pattern": "p" * 10_000, "source_collectives": ids(100)}),
    ("wisdom.stored", {"source_experience_count": 2**32, "applicable_domains": ("d",) * 50}),
    ("session.started", {"agent_id": "a" * 256, "summary": "s" * (8 * KB)}),
    ("session.updated", {"summary": "", "todo": (ev.TodoItem(task="t" * KB, note="n" * KB),) * 100, "changes": ("c" * KB,) * 100, "bugs": (), "architecture": ("😀" * 256,) * 100}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "changes"), AT_THE_LIMIT, ids=lambda p: str(p)[:40])
def test_values_at_the_limit_are_read(name: str, changes: dict[str, Any]) -> None:
    event = sample(name, **changes)
    assert decode(event) == event


def test_events_pulse_writes_are_read() -> None:
    for name, event in SAMPLES.items():
        assert decode(event) == event, name  # type: ignore[arg-type]


# -- properties: accepted exactly when in range ---------------------------------------------

# (a sample that has the field, the field) for every bounded integer of the wire
INT_FIELDS = [
    ("collective.created", "hlc"),
    ("collective.created", "embedding_dimension"),
    ("experience.reinforced", "applications"),
    ("activity.heartbeat", "started_ms"),
    ("wisdom.stored", "source_experience_count"),
    ("token.created", "expires_ms"),
    (RECORDED, "valid_from_ms"),
    ("experience.invalidated", "valid_to_ms"),
]
SCORE_FIELDS = [
    (RECORDED, "importance"),
    (RECORDED, "confidence"),
    ("experience.updated", "importance"),
    ("relation.stored", "strength"),
    ("insight.stored", "confidence"),
    ("wisdom.stored", "confidence"),
]


def test_every_bounded_field_has_a_property() -> None:
    nested = {"idx"}  # (a pending write's, in thread.written: the property below)
    assert {field for _, field in INT_FIELDS} | nested == set(INT_RANGES)


@given(value=st.integers(min_value=-(2**63), max_value=2**64 - 1))
def test_a_pending_writes_place_is_read_exactly_when_in_range(value: int) -> None:
    low, high = INT_RANGES["idx"]
    write = ev.PendingWrite(idx=value, channel="c", value_type="t")
    event = sample("thread.written", writes=(write,))
    if low <= value <= high:
        assert decode(event) == event
    else:
        assert refusal(event).reason.startswith(f"writes[0].idx: must be in {low}..")


@pytest.mark.parametrize(("name", "field"), INT_FIELDS)
@given(value=st.integers(min_value=-(2**63), max_value=2**64 - 1))
def test_integer_is_read_exactly_when_in_range(name: str, field: str, value: int) -> None:
    low, high = INT_RANGES[field]
    event = sample(name, **{field: value})
    if low <= value <= high:
        assert decode(event) == event
    else:
        assert refusal(event).reason.startswith(f"{field}: must be in {low}..")


@pytest.mark.parametrize(("name", "field"), SCORE_FIELDS)
@given(value=st.floats())
def test_score_is_read_exactly_when_finite_and_in_0_1(name: str, field: str, value: float) -> None:
    event = sample(name, **{field: value})
    if 0.0 <= value <= 1.0:
        assert decode(event) == event
    else:
        assert refusal(event).reason.startswith(f"{field}: must be a finite number in [0, 1]")


@given(st.integers(0, 4 * KB), st.integers(0, 40 * KB), st.integers(0, 20 * KB), st.integers(0, 3))
def test_content_counts_bytes_of_utf8(ones: int, twos: int, threes: int, fours: int) -> None:
    content = "a" * ones + "é" * twos + "€" * threes + "😀" * fours
    size = ones + 2 * twos + 3 * threes + 4 * fours
    event = sample(RECORDED, content=content)
    if 1 <= size <= 100 * KB:
        assert decode(event) == event
    else:
        assert refusal(event).reason == f"content: must be 1..102400 bytes of UTF-8, got {size}"


@given(count=st.integers(0, 60), longest=st.integers(1, 110))
def test_domain_tags_are_counted_and_measured(count: int, longest: int) -> None:
    event = sample(RECORDED, domain=("d",) * max(count - 1, 0) + ("x" * longest,) * min(count, 1))
    if count <= 50 and (count == 0 or longest <= 100):
        assert decode(event) == event
    else:
        assert refusal(event).reason.startswith("domain")


@pytest.mark.parametrize("event_type", ev.EVENT_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_a_valid_event_with_one_value_out_of_range_is_refused_naming_it(
    event_type: type[ev.EventBase], data: st.DataObject
) -> None:
    event = data.draw(valid_events(event_type))
    assert decode(event) == event
    bounded = [name for name in event.__struct_fields__ if name in INT_RANGES]
    field = data.draw(st.sampled_from(bounded))
    low, high = INT_RANGES[field]
    bad = data.draw(st.integers(-(2**63), low - 1) | st.integers(high + 1, 2**64 - 1))
    error = refusal(msgspec.structs.replace(event, **{field: bad}))
    assert error.reason == f"{field}: must be in {low}..{_limit(high)}, got {bad}"
    assert error.instance_id == event.instance_id


def _limit(high: int) -> str:
    known = {2**63 - 1: "2**63-1", 2**47 - 1: "2**47-1", 2**32: "2**32", 2**31 - 1: "2**31-1"}
    return known.get(high, str(high))


# -- the subject must be the event's own ----------------------------------------------------


def test_event_on_another_aggregates_subject_is_refused() -> None:
    event = SAMPLES["experience.reinforced"]
    wire = encode_event(event)
    elsewhere = collective_subject(COLLECTIVE, "experience", UUID(int=99))
    with pytest.raises(DecodeError) as info:
        decode_event(wire.payload, wire.headers, subject=elsewhere, seq=3)
    assert info.value.reason == (
        f"subject {elsewhere} does not match the event's own subject {wire.subject}"
    )
    assert info.value.instance_id == INSTANCE and info.value.subject == elsewhere


@pytest.mark.parametrize(
    ("name", "subject"),
    [
        ("collective.created", collective_subject(UUID(int=5), "collective", UUID(int=5))),
        ("collective.created", collective_subject(COLLECTIVE, "experience", COLLECTIVE)),
        ("experience.recorded.Fact", wisdom_subject(UUID(int=7))),
        ("relation.stored", collective_subject(UUID(int=5), "relation", UUID(int=6))),
        ("wisdom.stored", wisdom_subject(UUID(int=7))),
        ("activity.registered", activity_subject(COLLECTIVE, "someone else")),
        ("activity.heartbeat", activity_subject(UUID(int=5), "agent-7")),
        ("insight.stored", "pulse.c.anything"),
    ],
)
def test_subject_that_disagrees_with_the_body_is_refused(name: str, subject: str) -> None:
    wire = encode_event(SAMPLES[name])
    with pytest.raises(DecodeError, match="does not match the event's own subject"):
        decode_event(wire.payload, wire.headers, subject=subject, seq=1)


@pytest.mark.parametrize("subject", ["", "tests.elsewhere", "pulse"])
def test_subject_outside_pulse_is_not_checked(subject: str) -> None:
    wire = encode_event(SAMPLES["activity.ended"])
    assert decode_event(wire.payload, wire.headers, subject=subject) == SAMPLES["activity.ended"]


# -- the writer of a refused message ---------------------------------------------------------


def test_writer_is_named_when_the_body_says() -> None:
    body = msgspec.msgpack.decode(golden_path("collective.created").read_bytes())
    del body["embedding_dimension"]
    payload = msgspec.msgpack.encode(body)
    with pytest.raises(DecodeError, match="missing required field") as info:
        decode_event(payload, HEADERS, subject="pulse.c.x", seq=2)
    assert info.value.instance_id == INSTANCE
    assert f"stream sequence 2, written by instance {INSTANCE}: " in str(info.value)

    with pytest.raises(DecodeError, match="upgrade Pulse") as info:
        decode_event(encode_body(SAMPLES["collective.deleted"]), {HDR_SCHEMA: "99"})
    assert info.value.instance_id == INSTANCE


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode({"type": "collective.deleted", "instance_id": "x"})],
    ids=["garbage", "no-uuid"],
)
def test_writer_is_none_when_the_body_does_not_say(payload: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_event(payload, HEADERS, subject="pulse.c.x", seq=2)
    assert info.value.instance_id is None
    assert "written by" not in str(info.value)


def test_decode_error_keeps_its_constructor() -> None:
    error = DecodeError("garbage", subject="pulse.c.x.experience.y", seq=4)
    assert error.instance_id is None and error.reason == "garbage"
    assert str(error) == (
        "cannot decode event at subject pulse.c.x.experience.y, stream sequence 4: garbage"
    )
    assert str(DecodeError("x")) == "cannot decode event at subject ?, stream sequence ?: x"


def test_deeply_nested_old_body_is_a_decode_error() -> None:
    """An old body is read as a plain dict first, where nesting has no type to stop it."""
    payload = b"\x81\xa1a" + b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(DecodeError) as info:
        decode_event(payload, {HDR_SCHEMA: "0"}, subject="pulse.c.x", seq=1)
    assert info.value.instance_id is None


# -- the log hands such messages over as entries without an event ---------------------------


async def test_log_reports_out_of_range_events_and_goes_on() -> None:
    log = MemoryLog()
    good = SAMPLES["experience.reinforced"]
    bad = sample("experience.reinforced", applications=2**64 - 1, event_id=UUID(int=2))
    skewed = sample("collective.deleted", hlc=-5, event_id=UUID(int=3))
    assert await log.append_batch([bad, good, skewed]) == [1, 2, 3]  # type: ignore[list-item]
    entries = [entry async for batch in log.read() for entry in batch]
    assert [e.event for e in entries] == [None, good, None]
    first, _, third = (e.error for e in entries)
    assert first is not None and first.reason.startswith("applications: must be in 0..2**32")
    assert first.instance_id == INSTANCE and first.seq == 1
    assert third is not None and third.reason == "hlc: must be in 0..2**63-1, got -5"
    await log.close()


# -- what Pulse's own writers and tests build is in range ----------------------------------


@given(histories.EVENTS)
def test_events_of_the_fold_histories_are_read(event: ev.Event) -> None:
    assert decode(event) == event


def test_events_of_the_factories_are_read() -> None:
    cid = COLLECTIVE
    for event in (
        f.collective(cid, dim=4096),
        f.experience(cid, "y" * 100 * KB, dim=4096),  # the largest valid experience
        f.activity(cid, "agent.b*", "a task"),
        f.wisdom(),
    ):
        assert decode(event) == event
