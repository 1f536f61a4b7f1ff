"""The wire format: golden vectors, round trips of every event type, decode errors, upcasting."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.codec import (
    HDR_EVENT_TYPE,
    HDR_MSG_ID,
    HDR_SCHEMA,
    SCHEMA_VERSION,
    UPCASTERS,
    decode_event,
    encode_body,
    encode_event,
    register_upcaster,
)
from eventlog.errors import DecodeError
from eventlog.languages import LANGUAGES
from eventlog.sealing import SEALED_ENTITY, seal_with, sealed_name
from eventlog.subjects import subject_for
from tests.golden_events import SAMPLES, golden_path

HEADERS = {HDR_SCHEMA: str(SCHEMA_VERSION)}

# -- golden vectors -------------------------------------------------------------------------


def test_every_event_type_and_experience_variant_has_a_golden_vector() -> None:
    types = {type(e) for e in SAMPLES.values()}
    assert types == set(ev.EVENT_TYPES)
    kinds = {
        type(e.experience_type) for e in SAMPLES.values() if isinstance(e, ev.ExperienceRecorded)
    }
    assert kinds == set(ev.EXPERIENCE_TYPES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_vector_is_unchanged(name: str) -> None:
    """The frozen bytes decode to the sample, and the sample encodes to the same map: the
    same keys in the same order with the same values. (Only the width of the map's header
    may differ: msgspec sizes it by the fields a type declares, and an event type that
    passes 15 fields with a defaulted one added writes a 16-bit header where it wrote a
    one-byte one. Every msgpack reader reads both.)"""
    frozen = golden_path(name).read_bytes()
    encoded = encode_body(SAMPLES[name])
    assert _map_items(encoded) == _map_items(frozen), f"the wire format of {name} changed"
    assert decode_event(frozen, HEADERS) == SAMPLES[name]
    if encoded != frozen:  # then the header alone differs
        assert encoded[0] == 0xDE and frozen[0] & 0xF0 == 0x80
        assert encoded[3:] == frozen[1:]


def _map_items(body: bytes) -> list[tuple[Any, Any]]:
    return list(msgspec.msgpack.decode(body).items())


def test_embeddings_travel_as_little_endian_float32() -> None:
    sample = SAMPLES["insight.stored"]
    assert isinstance(sample, ev.InsightStored)
    raw = msgspec.msgpack.decode(golden_path("insight.stored").read_bytes())
    assert raw["embedding"] == b"\x00\x00\x80>\x00\x00\xc0\xbf\x00\x00@@\x00\x00\x00\x00"
    assert sample.vector.tolist() == [0.25, -1.5, 3.0, 0.0]


def test_headers_carry_id_type_and_schema() -> None:
    event = SAMPLES["experience.reinforced"]
    wire = encode_event(event)
    assert wire.headers == {
        HDR_MSG_ID: str(event.event_id),
        HDR_EVENT_TYPE: "experience.reinforced",
        HDR_SCHEMA: str(SCHEMA_VERSION),
    }
    assert wire.subject == subject_for(event)  # type: ignore[arg-type]
    assert wire.subject.startswith("pulse.c.01930c4e-2b2a-7d40-8a11-0000000000c0.experience.")


# -- round trips of every event type (strategies derived from the struct definitions) ------

# What a valid event may hold, written from the data model (docs/architecture.md) and the wire's own
# ranges, not read from eventlog.limits: the codec refuses anything outside these.
INT_RANGES = {
    "hlc": (0, 2**63 - 1),  # a signed 64-bit integer
    "embedding_dimension": (1, 4096),
    "applications": (0, 2**32),  # one G-counter entry
    "started_ms": (0, 2**47 - 1),  # the milliseconds part of a valid HLC
    "source_experience_count": (0, 2**32),
    "expires_ms": (0, 2**47 - 1),  # a token's expiry, Unix ms
    "valid_from_ms": (0, 2**47 - 1),  # when an experience became true, Unix ms
    "valid_to_ms": (0, 2**47 - 1),  # when it stopped being true
    "idx": (-16, 2**31 - 1),  # a pending write's place (negative: a special channel's)
}
SCORES = ("importance", "confidence", "strength", "quality", "duplicate_similarity")  # [0, 1]
NON_EMPTY_TEXTS = (  # at least one character (list fields: each item)
    "owner_id", "name", "content", "source_agent", "source_task", "agent_id", "pattern",
    "domain", "related_files", "working_on", "applicable_domains", "author_owner",
    "author_agent", "task", "changes", "bugs", "architecture", "reason",
    "checkpoint_id", "parent_checkpoint_id", "checkpoint_type", "run_id", "task_id", "channel",
    "value_type",
)  # fmt: skip
HEX_64 = ("secret_sha256",)  # the SHA-256 of a token, 64 lowercase hex digits
NON_EMPTY_LISTS = ("source_experiences", "writes")  # from 1..100 experiences; 1.. writes


def strategy_for(info: mi.Type, name: str = "") -> st.SearchStrategy[Any]:
    """Valid values of a msgspec type, for the field ``name`` (list items share it)."""
    if isinstance(info, mi.StructType):
        fields = {
            f.name: strategy_for(f.type, f.name)
            if f.required
            else st.one_of(st.just(f.default), strategy_for(f.type, f.name))
            for f in info.fields
        }
        return st.fixed_dictionaries(fields).map(lambda kw: info.cls(**kw))
    if isinstance(info, mi.UnionType):
        return st.one_of(*(strategy_for(t, name) for t in info.types))
    if isinstance(info, mi.UUIDType):
        return st.uuids()
    if isinstance(info, mi.StrType):
        if name in HEX_64:
            return st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
        if name == "language":  # a collective's analyzer: one Pulse knows ("" = English)
            return st.sampled_from(("", "auto", *LANGUAGES))
        if name == "on_duplicate":  # what a collective does with a duplicate ("" = keep)
            return st.sampled_from(("", "keep", "reinforce", "link"))
        return st.text(min_size=1 if name in NON_EMPTY_TEXTS else 0, max_size=40)
    if isinstance(info, mi.IntType):
        low, high = INT_RANGES[name]  # a KeyError: a new int field needs its range here
        return st.integers(min_value=low, max_value=high)
    if isinstance(info, mi.FloatType):
        assert name in SCORES, f"a new float field needs its range here: {name}"
        return st.floats(min_value=0.0, max_value=1.0)
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.BytesType):  # embeddings: 1..4096 finite float32 values
        finite = st.floats(width=32, allow_nan=False, allow_infinity=False)
        return st.lists(finite, min_size=1, max_size=16).map(ev.pack_vector)
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(info.values)
    if isinstance(info, mi.VarTupleType):
        items = strategy_for(info.item_type, name)
        return st.lists(items, min_size=1 if name in NON_EMPTY_LISTS else 0, max_size=5).map(tuple)
    raise TypeError(f"no strategy for {info!r} ({name})")


def valid_events(event_type: type[ev.EventBase]) -> st.SearchStrategy[ev.Event]:
    if event_type is ev.Sealed:  # a valid sealed event is a valid event, sealed
        return sealed_events()
    return strategy_for(mi.type_info(event_type))


SEALABLE = sorted(
    (t for t in ev.EVENT_TYPES if ev.event_type_name_of(t) in SEALED_ENTITY),
    key=ev.event_type_name_of,
)


def sealed_events() -> st.SearchStrategy[ev.Event]:
    """Events of every sealable type, sealed with a key of their own."""

    def seal(event: ev.Event, key: bytes) -> ev.Event:
        name = sealed_name(event)
        assert name is not None
        return seal_with(event, key, name)

    inner = st.sampled_from(SEALABLE).flatmap(lambda t: strategy_for(mi.type_info(t)))
    return st.builds(seal, inner, st.binary(min_size=32, max_size=32))


@pytest.mark.parametrize("event_type", ev.EVENT_TYPES, ids=lambda t: t.__name__)
@given(data=st.data())
def test_every_event_type_round_trips(event_type: type[ev.EventBase], data: st.DataObject) -> None:
    event = data.draw(valid_events(event_type))
    wire = encode_event(event)
    decoded = decode_event(wire.payload, wire.headers, subject=wire.subject, seq=1)
    assert decoded == event
    assert type(decoded) is event_type
    assert encode_body(decoded) == wire.payload


@given(st.lists(st.floats(width=32, allow_nan=False), max_size=64))
def test_vectors_round_trip_bit_for_bit(values: list[float]) -> None:
    packed = ev.pack_vector(values)
    assert len(packed) == 4 * len(values)
    assert ev.unpack_vector(packed).tolist() == values


# -- bytes that are not events ----------------------------------------------------------------


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_error(payload: bytes) -> None:
    try:
        decode_event(payload, HEADERS, subject="pulse.c.x.experience.y", seq=9)
    except DecodeError as exc:
        assert exc.subject == "pulse.c.x.experience.y" and exc.seq == 9
        assert "subject pulse.c.x.experience.y, stream sequence 9" in str(exc)


def _with_kind(kind: str) -> bytes:
    """A recorded experience whose experience type is the variant ``kind``."""
    body = msgspec.msgpack.decode(golden_path("experience.recorded.Fact").read_bytes())
    body["experience_type"] = {"kind": kind, "hunch": "maybe"}
    return msgspec.msgpack.encode(body)


@pytest.mark.parametrize(
    ("payload", "headers", "reason"),
    [
        (b"\xc1", HEADERS, "malformed"),
        (golden_path("relation.stored").read_bytes()[:-7], HEADERS, "truncated|malformed"),
        (
            msgspec.msgpack.encode({"type": "experience.teleported"}),
            HEADERS,
            "event type 'experience.teleported' is unknown to this Pulse "
            rf"\(schema {SCHEMA_VERSION}\): upgrade Pulse",
        ),
        (_with_kind("Hunch"), HEADERS, "experience type 'Hunch' is unknown to this Pulse"),
        (msgspec.msgpack.encode({"type": "collective.deleted"}), HEADERS, "missing required field"),
        (golden_path("collective.deleted").read_bytes(), {}, "no Pulse-Schema header"),
        (golden_path("collective.deleted").read_bytes(), {HDR_SCHEMA: "v1"}, "not a number"),
        (
            golden_path("collective.deleted").read_bytes(),
            {HDR_SCHEMA: str(SCHEMA_VERSION + 1)},
            "upgrade Pulse",
        ),
    ],
    ids=[
        "garbage",
        "truncated",
        "unknown-type",
        "unknown-experience-type",
        "missing-field",
        "no-header",
        "bad-header",
        "newer",
    ],
)
def test_unreadable_messages_raise_decode_error(
    payload: bytes, headers: dict[str, str], reason: str
) -> None:
    with pytest.raises(DecodeError, match=reason) as info:
        decode_event(payload, headers, subject="pulse.c.a.b.c", seq=42)
    assert "subject pulse.c.a.b.c, stream sequence 42" in str(info.value)


def test_embedding_of_partial_floats_is_refused() -> None:
    body = msgspec.msgpack.decode(golden_path("insight.stored").read_bytes())
    body["embedding"] = b"\x00\x00\x80"
    with pytest.raises(DecodeError, match="whole number of float32"):
        decode_event(msgspec.msgpack.encode(body), HEADERS)


def test_older_schema_is_upcast_on_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version-0 body (say, one that named the dimension ``dim``) reads as today's event."""
    # (a language other than the one its name's script chose: the upcaster of schema 4
    # reads that one as "auto", test_a_collective_that_chose_by_its_name_reads_as_auto)
    current = msgspec.structs.replace(SAMPLES["collective.created"], language="german")
    old_body = msgspec.msgpack.decode(encode_body(current))
    old_body["dim"] = old_body.pop("embedding_dimension")
    old = msgspec.msgpack.encode(old_body)
    old_headers = {HDR_SCHEMA: "0"}

    with pytest.raises(DecodeError, match="schema 0 has no upcaster"):
        decode_event(old, old_headers)

    def rename_dim(body: dict[str, Any]) -> dict[str, Any]:
        body["embedding_dimension"] = body.pop("dim")
        return body

    monkeypatch.setitem(UPCASTERS, 0, rename_dim)  # restored (removed) after the test
    assert decode_event(old, old_headers) == current

    def broken(body: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("dim")

    register_upcaster(0, broken)
    with pytest.raises(DecodeError, match="upcasting failed"):
        decode_event(old, old_headers, subject="s", seq=1)


@pytest.mark.parametrize(
    ("schema", "name", "language", "reads_as"),
    [
        (4, "notes", "english", "auto"),  # auto chose English for an ASCII name
        (4, "вікі", "ukrainian", "auto"),  # ... Ukrainian for і
        (4, "notes", "german", "german"),  # named on purpose: fixed
        (4, "вікі", "english", "english"),  # not what the script chose: fixed
        (2, "notes", None, "auto"),  # before languages (English), an ASCII name
        (2, "вікі", None, ""),  # before languages: English ("") whatever the name
    ],
)
def test_a_collective_that_chose_by_its_name_reads_as_auto(
    schema: int, name: str, language: str | None, reads_as: str
) -> None:
    """Before schema 5, "auto" recorded the language the name's script chose; such a
    created event reads as "auto" (each text in its own language), any other as fixed."""
    body = msgspec.msgpack.decode(encode_body(SAMPLES["collective.created"]))
    body["name"] = name
    body.pop("language", None)
    if language is not None:
        body["language"] = language
    read = decode_event(msgspec.msgpack.encode(body), {HDR_SCHEMA: str(schema)})
    assert isinstance(read, ev.CollectiveCreated)
    assert read.language == reads_as
    current = decode_event(msgspec.msgpack.encode(body), HEADERS)  # today's: as written
    assert isinstance(current, ev.CollectiveCreated)
    assert current.language == (language or "")


def test_upcasters_are_only_for_older_versions() -> None:
    with pytest.raises(ValueError, match="below"):
        register_upcaster(SCHEMA_VERSION, lambda body: body)


def test_adding_a_defaulted_field_leaves_old_bytes_readable() -> None:
    """The schema-evolution rule: omit_defaults keeps bytes of default values identical."""

    class CollectiveCreatedV2(ev.EventBase, tag="collective.created"):
        collective_id: UUID
        owner_id: str
        name: str
        embedding_dimension: int
        embedder: str = ""
        language: str = ""
        on_duplicate: str = ""
        duplicate_similarity: float = 0.0
        retention_days: int = 0  # a field added later, with a default

    old = SAMPLES["collective.created"]
    assert isinstance(old, ev.CollectiveCreated)
    written = msgspec.msgpack.decode(encode_body(old))  # (msgspec omits a float default
    # by identity: a 0.0 passed on is written; the fields the old body holds are passed)
    new = CollectiveCreatedV2(**{k: v for k, v in msgspec.structs.asdict(old).items()
                                 if k in written or k.startswith("author")})  # fmt: skip
    assert msgspec.msgpack.Encoder(uuid_format="bytes").encode(new) == encode_body(old)
    as_new = msgspec.msgpack.decode(encode_body(old), type=CollectiveCreatedV2)
    assert as_new.retention_days == 0 and as_new.embedding_dimension == 4


# -- versions: what an older and a newer Pulse make of each other's bodies -------------------

GOLDEN_SCHEMA = 1  # the version that wrote the vectors in tests/golden


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_golden_vectors_read_as_the_version_that_wrote_them(name: str) -> None:
    """The vectors say the version they were written with, as a message on the log does:
    whatever ``SCHEMA_VERSION`` is now, they read (through the upcasters) as their sample."""
    frozen = golden_path(name).read_bytes()
    meant = msgspec.structs.replace(SAMPLES[name], **UPCAST_SINCE.get(name, {}))
    assert decode_event(frozen, {HDR_SCHEMA: str(GOLDEN_SCHEMA)}) == meant


# what a golden vector means since a later schema read it otherwise: schema 5 reads a
# collective whose language its name's script chose (an ASCII name, no language: English)
# as "auto" (test_a_collective_that_chose_by_its_name_reads_as_auto)
UPCAST_SINCE: dict[str, dict[str, Any]] = {"collective.created": {"language": "auto"}}


def test_every_older_version_has_an_upcaster() -> None:
    """A release that bumps the version registers the step from the one before (at import
    of the codec, so every process has it)."""
    assert [v for v in range(GOLDEN_SCHEMA, SCHEMA_VERSION) if v not in UPCASTERS] == []


def test_a_field_this_pulse_does_not_know_is_ignored() -> None:
    """msgspec skips fields it does not know: an older Pulse would fold a newer body
    without its new field, which is why a new field needs a new schema version."""
    body = msgspec.msgpack.decode(golden_path("collective.created").read_bytes())
    body["retention_days"] = 30
    assert decode_event(msgspec.msgpack.encode(body), HEADERS) == SAMPLES["collective.created"]


def test_an_unknown_type_is_named_after_upcasting_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(UPCASTERS, 0, lambda body: body)
    with pytest.raises(DecodeError, match="experience type 'Hunch' is unknown"):
        decode_event(_with_kind("Hunch"), {HDR_SCHEMA: "0"})


@pytest.mark.parametrize(
    "made",
    [{"type": "collective.deleted", "hlc": 2**70}, {"a": object()}, {"a": 1j}, None, []],
    ids=["overflow", "object", "complex", "none", "list"],
)
def test_an_upcaster_that_makes_no_body_is_a_decode_error(
    monkeypatch: pytest.MonkeyPatch, made: Any
) -> None:
    """Even a broken upcaster never makes decoding raise anything but DecodeError (a
    consumer sets the message aside and goes on)."""
    monkeypatch.setitem(UPCASTERS, 0, lambda body: made)
    old = golden_path("collective.deleted").read_bytes()
    with pytest.raises(DecodeError, match="stream sequence 3"):
        decode_event(old, {HDR_SCHEMA: "0"}, subject="pulse.c.x", seq=3)
