"""The layout of a log in partitions: which stream holds which events, and positions.

One JetStream stream is one RAFT group led by one server: every write of a deployment
goes through that server, and its ceiling is the deployment's. A deployment made with
``partitions`` N >= 2 spreads collectives over N streams instead, each its own RAFT
group, which JetStream places (and leads) on different servers:

    PULSE       pulse.w.>  pulse.t.>          wisdom and access tokens (every host reads
                                              them: a small stream of their own)
    PULSE_P1    pulse.c.*.b00.>  pulse.c.*.b02.>  ...   the collectives of its buckets
    ...
    PULSE_PN    ...

A collective's events all go to one partition, chosen by a stable hash of its id: the
id falls in one of ``BUCKETS`` (64) buckets, and bucket b in partition ``1 + b % N``.
The bucket is a token of the subject, after the collective's id:

    pulse.c.<collective_id>.b<bucket>.<entity>.<entity_id>

so a stream captures its buckets by subject (JetStream routes each publish to the one
stream whose subjects match: the writer names no stream), ``pulse.c.<id>.>`` still
filters a collective, and the bucket, being a function of the id in the body, is
checked on decoding like the rest of the subject (``eventlog.codec``). A deployment of
one stream keeps the subjects without a bucket (``pulse.c.<id>.<entity>.<id>``).

Buckets, not partitions, are in the subject so that raising N changes no subject: a
bucket moves from one stream to another (its messages copied, then purged from the
first) and every event keeps its subject and body. N is kept in ``PULSE``'s metadata
(``pulse.partitions``), so a host asking for another N is refused rather than moving
buckets behind the operator's back.

Positions. Each stream numbers its messages 1, 2, 3, ...; an event's place in the whole
log is its partition and that sequence, packed in one integer:
``position = partition << 48 | sequence`` (``PULSE`` is partition 0, so in a log of
one stream a position is the stream sequence). Positions identify a message (a purge's
``before``, a dead letter, a write a caller waits for) and order the messages of one
partition; they do not order messages of different partitions, which no one can. Where
a reader resumes is a vector: per partition, the next sequence (``Resume``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from eventlog.errors import ValidationError

BUCKETS = 64
SEQ_BITS = 48  # a stream sequence below 2**48 (281 trillion messages a partition)
MAX_PARTITIONS = 31  # (positions stay below 2**53: exact as JSON numbers everywhere)
METADATA_KEY = "pulse.partitions"  # in PULSE's stream metadata: how many partitions
TARGET_KEY = "pulse.partitions.target"  # in PULSE's metadata while a repartition runs
_PREFIX = "pulse"

# per partition, the sequence a reader goes on from (a partition absent: from 1)
Resume = Mapping[int, int]


def check_partitions(partitions: int, field: str = "partitions") -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValidationError(f"{field}: must be 1..{MAX_PARTITIONS}, got {partitions}")


def partitions_in(metadata: Mapping[str, str] | None) -> int:
    """How many partitions a log's first stream says it has (its metadata; a stream made
    before partitions, or of one, says none: 1)."""
    said = (metadata or {}).get(METADATA_KEY, "1")
    return int(said) if said.isdigit() and int(said) >= 1 else 1


def bucket_of(collective_id: UUID) -> int:
    """The bucket of a collective: a stable hash of its id (the same on every host and
    in every version), so a collective's events stay in one partition."""
    digest = hashlib.blake2b(collective_id.bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def bucket_token(bucket: int) -> str:
    return f"b{bucket:02d}"


def position(part: int, seq: int) -> int:
    """One integer for a message: its partition and its sequence in that stream."""
    if not 0 <= part <= MAX_PARTITIONS:
        raise ValidationError(f"partition: must be 0..{MAX_PARTITIONS}, got {part}")
    if not 0 <= seq < 1 << SEQ_BITS:
        raise ValidationError(f"sequence: must be 0..2**{SEQ_BITS}-1, got {seq}")
    return part << SEQ_BITS | seq


def part_of(pos: int) -> int:
    return pos >> SEQ_BITS


def seq_of(pos: int) -> int:
    return pos & ((1 << SEQ_BITS) - 1)


@dataclass(frozen=True, slots=True)
class Layout:
    """Which stream of a deployment of ``partitions`` (>= 2) holds what. ``base`` is the
    name of the stream of wisdom and tokens (``PULSE``); the others are named after it."""

    partitions: int
    base: str = "PULSE"

    def __post_init__(self) -> None:
        if not 2 <= self.partitions <= MAX_PARTITIONS:
            raise ValidationError(
                f"partitions: a log in partitions has 2..{MAX_PARTITIONS}, got "
                f"{self.partitions} (1 is the log of one stream)"
            )

    @property
    def parts(self) -> range:
        """Every partition: 0 (wisdom and tokens), then 1..N (collectives)."""
        return range(self.partitions + 1)

    def stream(self, part: int) -> str:
        return self.base if part == 0 else f"{self.base}_P{part}"

    def part_of_bucket(self, bucket: int) -> int:
        return 1 + bucket % self.partitions

    def part_of_collective(self, collective_id: UUID) -> int:
        return self.part_of_bucket(bucket_of(collective_id))

    def buckets(self, part: int) -> list[int]:
        return [b for b in range(BUCKETS) if self.part_of_bucket(b) == part]

    def subjects(self, part: int) -> list[str]:
        """What stream ``part`` captures."""
        if part == 0:
            return [f"{_PREFIX}.w.>", f"{_PREFIX}.t.>"]
        return [f"{_PREFIX}.c.*.{bucket_token(b)}.>" for b in self.buckets(part)]

    def part_of_subject(self, subject: str) -> int | None:
        """The one partition a subject (or a filter) lies in; None when it may lie in
        several (a wildcard in place of the collective, ``pulse.>``)."""
        tokens = subject.split(".")
        if len(tokens) < 2 or tokens[0] != _PREFIX:
            raise ValidationError(f"subject: {subject!r} is not a Pulse subject")
        if tokens[1] in ("w", "t"):
            return 0
        if tokens[1] != "c" or len(tokens) < 3 or tokens[2] in ("*", ">"):
            return None
        try:
            collective = UUID(tokens[2])
        except ValueError:
            raise ValidationError(f"subject: {subject!r} names no collective id") from None
        return self.part_of_collective(collective)

    def split(self, filters: Sequence[str] | None) -> dict[int, list[str] | None]:
        """Per partition that holds any of ``filters``, the filters that reach into it
        (None: all of its messages). ``filters`` None: every partition, all of it."""
        if filters is None:
            return {part: None for part in self.parts}
        out: dict[int, list[str] | None] = {}
        for subject in dict.fromkeys(filters):
            part = self.part_of_subject(subject)
            for p in self.parts if part is None else (part,):
                if part is None and p == 0 and subject.split(".")[1:2] == ["c"]:
                    continue  # (a collective wildcard: not in the stream of wisdom)
                held = out.setdefault(p, [])
                assert held is not None
                held.append(subject)
        return out


def resume_from(start: int | Resume, parts: Iterable[int]) -> dict[int, int]:
    """Per partition, the sequence to read from: ``start`` is 1 (everything) or a
    ``Resume`` (a partition absent from it: from 1)."""
    if isinstance(start, int):
        if start != 1:
            raise ValidationError(
                f"from: a log in partitions is read from 1 or from a sequence per "
                f"partition (a mapping), got {start}"
            )
        return {p: 1 for p in parts}
    out: dict[int, int] = {}
    for p in parts:
        seq = int(start.get(p, 1))
        if seq < 1:
            raise ValidationError(f"from: partition {p}'s sequence must be >= 1, got {seq}")
        out[p] = seq
    return out
