"""NATS subjects of Pulse events. The subject names the aggregate an event belongs to:

    pulse.c.<collective_id>.collective.<collective_id>
    pulse.c.<collective_id>.experience.<experience_id>
    pulse.c.<collective_id>.relation.<relation_id>
    pulse.c.<collective_id>.insight.<insight_id>
    pulse.c.<collective_id>.session.<session_id>         (an agent's session)
    pulse.c.<collective_id>.thread.<thread_id>           (a framework's thread state)
    pulse.w.<wisdom_id>                                  (wisdom is per owner, not per collective)
    pulse.t.<token_id>                                   (access tokens: sync.access)
    pulse.a.<collective_id>.<agent token>                (activities: the PULSE_ACTIVITY stream)

so a host can replicate a subset of collectives with a filter (``collective_filter``)
and forget one aggregate by purging its subject. A log in partitions
(``eventlog.partitions``) puts the collective's bucket after its id
(``pulse.c.<collective_id>.b<bucket>.experience.<experience_id>``: ``with_bucket``), so each
partition's stream captures its buckets; ``pulse.c.<collective_id>.>`` matches both forms.
Agent ids are free text, which may hold characters a subject cannot (dots, spaces,
wildcards), so their token is a hash.
"""

from __future__ import annotations

import hashlib
from typing import Iterable
from uuid import UUID

from eventlog import events as ev
from eventlog.errors import ValidationError
from eventlog.partitions import bucket_of, bucket_token

PREFIX = "pulse"
DURABLE_SUBJECTS = (f"{PREFIX}.c.>", f"{PREFIX}.w.>", f"{PREFIX}.t.>")
ACTIVITY_SUBJECTS = (f"{PREFIX}.a.>",)


def collective_subject(collective_id: UUID, entity: str, entity_id: UUID) -> str:
    return f"{PREFIX}.c.{collective_id}.{entity}.{entity_id}"


def with_bucket(subject: str) -> str:
    """A collective's subject, or a filter of some, as a log in partitions stores it: its
    bucket after the collective's id (``*`` for any collective's). Other subjects, and
    those with their bucket already, come back as they are."""
    tokens = subject.split(".")
    if len(tokens) < 4 or tokens[1] != "c" or tokens[3] == ">" or _is_bucket(tokens[3]):
        return subject
    if tokens[2] == "*":
        bucket = "*"
    else:
        try:
            bucket = bucket_token(bucket_of(UUID(tokens[2])))
        except ValueError:
            raise ValidationError(f"subject: {subject!r} names no collective id") from None
    return ".".join([*tokens[:3], bucket, *tokens[3:]])


def _is_bucket(token: str) -> bool:
    return len(token) == 3 and token[0] == "b" and token[1:].isdigit()


def wisdom_subject(wisdom_id: UUID) -> str:
    return f"{PREFIX}.w.{wisdom_id}"


def token_subject(token_id: UUID) -> str:
    return f"{PREFIX}.t.{token_id}"


def agent_token(agent_id: str) -> str:
    """A subject-safe, fixed-length token for a free-text agent id."""
    return hashlib.sha256(agent_id.encode("utf-8")).hexdigest()[:32]


def activity_subject(collective_id: UUID, agent_id: str) -> str:
    return f"{PREFIX}.a.{collective_id}.{agent_token(agent_id)}"


def subject_for(event: ev.Event, *, bucketed: bool = False) -> str:
    """The subject an event is published on (``bucketed``: in a log in partitions)."""
    if bucketed:
        return with_bucket(subject_for(event))
    match event:
        case ev.Sealed():  # first: every record, update and invalidation is one
            if event.collective_id is None:
                return wisdom_subject(event.entity_id)
            return collective_subject(event.collective_id, event.entity, event.entity_id)
        case ev.CollectiveCreated() | ev.CollectiveDeleted():
            return collective_subject(event.collective_id, "collective", event.collective_id)
        case (
            ev.ExperienceRecorded()
            | ev.ExperienceUpdated()
            | ev.ExperienceArchived()
            | ev.ExperienceUnarchived()
            | ev.ExperienceInvalidated()
            | ev.ExperienceDeleted()
            | ev.ExperienceReinforced()
        ):
            return collective_subject(event.collective_id, "experience", event.experience_id)
        case ev.RelationStored() | ev.RelationDeleted():
            return collective_subject(event.collective_id, "relation", event.relation_id)
        case ev.InsightStored() | ev.InsightDeleted():
            return collective_subject(event.collective_id, "insight", event.insight_id)
        case ev.SessionStarted() | ev.SessionUpdated() | ev.SessionEnded() | ev.SessionDeleted():
            return collective_subject(event.collective_id, "session", event.session_id)
        case (
            ev.ThreadCheckpointed()
            | ev.ThreadWritten()
            | ev.ThreadCheckpointDeleted()
            | ev.ThreadDeleted()
        ):
            return collective_subject(event.collective_id, "thread", event.thread_id)
        case ev.ActivityRegistered() | ev.ActivityHeartbeat() | ev.ActivityEnded():
            return activity_subject(event.collective_id, event.agent_id)
        case ev.WisdomStored() | ev.WisdomDeleted():
            return wisdom_subject(event.wisdom_id)
        case ev.TokenCreated() | ev.TokenRevoked():
            return token_subject(event.token_id)
    raise TypeError(f"not a Pulse event: {type(event).__name__}")


def is_activity_subject(subject: str) -> bool:
    return subject.startswith(f"{PREFIX}.a.")


def collective_filter(collective_ids: Iterable[UUID], *, wisdom: bool = True) -> list[str]:
    """Subject filters for the events of some collectives (and, by default, all wisdom
    and all access tokens)."""
    subjects = [f"{PREFIX}.c.{cid}.>" for cid in collective_ids]
    if wisdom:
        subjects += [f"{PREFIX}.w.>", f"{PREFIX}.t.>"]
    return subjects


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a trailing ``>`` is one or more."""
    pattern_tokens = pattern.split(".")
    subject_tokens = subject.split(".")
    for i, token in enumerate(pattern_tokens):
        if token == ">":
            return len(subject_tokens) > i
        if i >= len(subject_tokens) or (token != "*" and token != subject_tokens[i]):
            return False
    return len(pattern_tokens) == len(subject_tokens)
