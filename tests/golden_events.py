"""Fixed sample events whose encodings are frozen in tests/golden/<name>.msgpack.

If test_codec fails on a golden vector, the wire format changed: old logs may no longer
decode. Restore compatibility (new fields need defaults) or bump SCHEMA_VERSION with an
upcaster. Only a brand-new sample gets its file written, by
``python -m tests.golden_events``; existing files are never overwritten.
"""

from __future__ import annotations

import sys
from pathlib import Path
from uuid import UUID

from eventlog import events as ev
from eventlog.codec import encode_body

GOLDEN_DIR = Path(__file__).parent / "golden"

EVENT = UUID("01930c4e-2b2a-7d40-8a11-000000000001")
INSTANCE = UUID("01930c4e-2b2a-7d40-8a11-0000000000aa")
COLLECTIVE = UUID("01930c4e-2b2a-7d40-8a11-0000000000c0")
EXPERIENCE = UUID("01930c4e-2b2a-7d40-8a11-0000000000e0")
OTHER = UUID("01930c4e-2b2a-7d40-8a11-0000000000e1")
RELATION = UUID("01930c4e-2b2a-7d40-8a11-0000000000f0")
INSIGHT = UUID("01930c4e-2b2a-7d40-8a11-0000000000d0")
WISDOM = UUID("01930c4e-2b2a-7d40-8a11-0000000000b0")
TOKEN = UUID("01930c4e-2b2a-7d40-8a11-0000000000a1")
SESSION = UUID("01930c4e-2b2a-7d40-8a11-0000000000a5")
THREAD = UUID("01930c4e-2b2a-7d40-8a11-0000000000a7")
HLC = ev.pack_hlc(1_732_000_000_000, 7)
VECTOR = ev.pack_vector([0.25, -1.5, 3.0, 0.0])

common = {"event_id": EVENT, "instance_id": INSTANCE, "hlc": HLC}
exp = {"experience_id": EXPERIENCE, "collective_id": COLLECTIVE}


def _recorded(kind: ev.ExperienceType) -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        **common,  # type: ignore[arg-type]
        **exp,
        content="Retry the append with the same event id; JetStream stores it once.",
        embedding=VECTOR,
        experience_type=kind,
        importance=0.75,
        confidence=0.5,
        source_agent="agent-7",
        domain=("nats", "idempotency"),
        related_files=("eventlog/jetstream.py",),
        source_task="task-42",
    )


SAMPLES: dict[str, ev.EventBase] = {
    "collective.created": ev.CollectiveCreated(
        **common,
        collective_id=COLLECTIVE,
        owner_id="owner-1",
        name="pulse-dev",  # type: ignore[arg-type]
        embedding_dimension=4,
        embedder="hash",
    ),
    "collective.deleted": ev.CollectiveDeleted(**common, collective_id=COLLECTIVE),  # type: ignore[arg-type]
    "experience.recorded.Difficulty": _recorded(
        ev.Difficulty(description="flaky ack", severity="High")
    ),
    "experience.recorded.Solution": _recorded(
        ev.Solution(approach="dedup by id", worked=True, problem_ref=OTHER)
    ),
    "experience.recorded.ErrorPattern": _recorded(
        ev.ErrorPattern(signature="wrong last sequence", fix="re-read", prevention="expected seq")
    ),
    "experience.recorded.SuccessPattern": _recorded(
        ev.SuccessPattern(task_type="replay", approach="pull consumer", quality=0.875)
    ),
    "experience.recorded.UserPreference": _recorded(
        ev.UserPreference(category="style", preference="small modules", strength=0.625)
    ),
    "experience.recorded.ArchitecturalDecision": _recorded(
        ev.ArchitecturalDecision(decision="event sourcing", rationale="rebuildable state")
    ),
    "experience.recorded.TechInsight": _recorded(
        ev.TechInsight(technology="JetStream", insight="dedup window is 2 minutes")
    ),
    "experience.recorded.Fact": _recorded(ev.Fact(statement="R3 survives one node", source="docs")),
    "experience.recorded.Generic": _recorded(ev.Generic(category="misc")),
    "experience.updated": ev.ExperienceUpdated(
        **common,
        **exp,
        importance=0.25,
        domain=("nats",),  # type: ignore[arg-type]
    ),
    "experience.archived": ev.ExperienceArchived(**common, **exp),  # type: ignore[arg-type]
    "experience.unarchived": ev.ExperienceUnarchived(**common, **exp),  # type: ignore[arg-type]
    "experience.deleted": ev.ExperienceDeleted(**common, **exp),  # type: ignore[arg-type]
    "experience.invalidated": ev.ExperienceInvalidated(
        **common,
        **exp,
        reason="superseded by v2",
        valid_to_ms=1_732_000_000_500,  # type: ignore[arg-type]
    ),
    "experience.reinforced": ev.ExperienceReinforced(**common, **exp, applications=3),  # type: ignore[arg-type]
    "relation.stored": ev.RelationStored(
        **common,
        relation_id=RELATION,
        collective_id=COLLECTIVE,
        source_id=EXPERIENCE,  # type: ignore[arg-type]
        target_id=OTHER,
        relation_type="Supports",
        strength=0.5,
        metadata='{"why": "same fix"}',
    ),
    "relation.deleted": ev.RelationDeleted(
        **common, relation_id=RELATION, collective_id=COLLECTIVE
    ),  # type: ignore[arg-type]
    "insight.stored": ev.InsightStored(
        **common,
        insight_id=INSIGHT,
        collective_id=COLLECTIVE,
        content="Idempotency beats atomicity.",  # type: ignore[arg-type]
        embedding=VECTOR,
        source_experiences=(EXPERIENCE, OTHER),
        confidence=0.5,
        domain=("nats",),
    ),
    "insight.deleted": ev.InsightDeleted(**common, insight_id=INSIGHT, collective_id=COLLECTIVE),  # type: ignore[arg-type]
    "activity.registered": ev.ActivityRegistered(
        **common,
        collective_id=COLLECTIVE,
        agent_id="agent-7",
        task_description="writing the codec",  # type: ignore[arg-type]
        working_on=("eventlog/codec.py",),
    ),
    "activity.heartbeat": ev.ActivityHeartbeat(
        **common,
        collective_id=COLLECTIVE,
        agent_id="agent-7",
        started_ms=1_732_000_000_000,  # type: ignore[arg-type]
        task_description="writing the codec",
        working_on=("eventlog/codec.py",),
    ),
    "activity.ended": ev.ActivityEnded(**common, collective_id=COLLECTIVE, agent_id="agent-7"),  # type: ignore[arg-type]
    "wisdom.stored": ev.WisdomStored(
        **common,
        wisdom_id=WISDOM,
        owner_id="owner-1",
        category="ArchitecturalPreference",  # type: ignore[arg-type]
        pattern="logs over mutable state",
        confidence=0.875,
        embedding=VECTOR,
        source_collectives=(COLLECTIVE,),
        source_experience_count=12,
        applicable_domains=("storage",),
    ),
    "wisdom.deleted": ev.WisdomDeleted(**common, wisdom_id=WISDOM, owner_id="owner-1"),  # type: ignore[arg-type]
    "token.created": ev.TokenCreated(
        **common,  # type: ignore[arg-type]
        author_owner="owner-1",
        token_id=TOKEN,
        owner_id="owner-2",
        secret_sha256="5e" * 32,
        scope="write",
        agent_id="agent-7",
        collectives=(COLLECTIVE,),
        expires_ms=1_760_000_000_000,
    ),
    "token.revoked": ev.TokenRevoked(**common, token_id=TOKEN, author_owner="owner-1"),  # type: ignore[arg-type]
    "session.started": ev.SessionStarted(
        **{**common, "author_owner": "owner-1", "author_agent": "agent-7"},  # type: ignore[arg-type]
        session_id=SESSION,
        collective_id=COLLECTIVE,
        agent_id="agent-7",
        summary="hardening the publisher",
    ),
    "session.updated": ev.SessionUpdated(
        **common,  # type: ignore[arg-type]
        session_id=SESSION,
        collective_id=COLLECTIVE,
        todo=(
            ev.TodoItem(task="retry on timeout", priority="high", note="same id", done=True),
            ev.TodoItem(task="dedup by message id"),
        ),
        changes=("eventlog/jetstream.py: retries",),
        bugs=("acks lost on failover",),
        architecture=(),
    ),
    "session.ended": ev.SessionEnded(**common, session_id=SESSION, collective_id=COLLECTIVE),  # type: ignore[arg-type]
    "session.deleted": ev.SessionDeleted(**common, session_id=SESSION, collective_id=COLLECTIVE),  # type: ignore[arg-type]
    # (schema 4) an agent framework's thread state
    "thread.checkpointed": ev.ThreadCheckpointed(
        **{**common, "author_owner": "owner-1", "author_agent": "agent-7"},  # type: ignore[arg-type]
        thread_id=THREAD,
        collective_id=COLLECTIVE,
        name="thread-1",
        checkpoint_ns="",
        checkpoint_id="1ef4f797-8335-6428-8001-8a1503f9b875",
        parent_checkpoint_id="1ef4f797-8335-6428-8000-8a1503f9b875",
        checkpoint_type="msgpack",
        checkpoint=b"\x85\xa1v\x04",
        metadata='{"source":"loop","step":1}',
        run_id="run-1",
    ),
    "thread.written": ev.ThreadWritten(
        **common,  # type: ignore[arg-type]
        thread_id=THREAD,
        collective_id=COLLECTIVE,
        checkpoint_ns="child:1",
        checkpoint_id="1ef4f797-8335-6428-8001-8a1503f9b875",
        task_id="task-1",
        task_path="~__pregel_pull, review",
        writes=(
            ev.PendingWrite(
                idx=-3, channel="__interrupt__", value_type="msgpack", value=b"\x91\xa3yes"
            ),
            ev.PendingWrite(idx=0, channel="approved", value_type="msgpack", value=b"\xc3"),
        ),
    ),
    "thread.checkpoint_deleted": ev.ThreadCheckpointDeleted(
        **common,  # type: ignore[arg-type]
        thread_id=THREAD,
        collective_id=COLLECTIVE,
        checkpoint_id="1ef4f797-8335-6428-8000-8a1503f9b875",
    ),
    "thread.deleted": ev.ThreadDeleted(**common, thread_id=THREAD, collective_id=COLLECTIVE),  # type: ignore[arg-type]
    # an event written by a principal, with a visibility other than the default
    "sealed": ev.Sealed(  # (schema 2) the box is opaque to the codec: any bytes past 28
        **common,  # type: ignore[arg-type]
        kind="experience.recorded",
        entity="experience",
        entity_id=EXPERIENCE,
        collective_id=COLLECTIVE,
        box=bytes(range(64)),
    ),  # fmt: skip
    "experience.recorded.authored": ev.ExperienceRecorded(
        **{**common, "author_owner": "owner-1", "author_agent": "agent-7"},  # type: ignore[arg-type]
        **exp,
        content="Private to its author.",
        embedding=VECTOR,
        experience_type=ev.Generic(),
        importance=0.5,
        confidence=0.5,
        source_agent="agent-7",
        visibility="private",
    ),
}


def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"{name}.msgpack"


def write_missing() -> list[str]:
    GOLDEN_DIR.mkdir(exist_ok=True)
    written = []
    for name, event in SAMPLES.items():
        path = golden_path(name)
        if not path.exists():
            path.write_bytes(encode_body(event))
            written.append(name)
    return written


if __name__ == "__main__":
    names = write_missing()
    print(f"wrote {len(names)} new golden vector(s): {', '.join(names) or 'none'}")
    sys.exit(0)
