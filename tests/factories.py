"""Small builders of valid events for tests (ids fresh, HLC from the wall clock)."""

from __future__ import annotations

import itertools
import time
from uuid import UUID

from eventlog import events as ev
from eventlog.ids import uuid7

INSTANCE = uuid7()
_logical = itertools.count()


def _common() -> dict[str, object]:
    return {
        "event_id": uuid7(),
        "instance_id": INSTANCE,
        "hlc": ev.pack_hlc(time.time_ns() // 1_000_000, next(_logical) % 60000),
    }


def collective(collective_id: UUID | None = None, dim: int = 4) -> ev.CollectiveCreated:
    return ev.CollectiveCreated(
        **_common(),  # type: ignore[arg-type]
        collective_id=collective_id or uuid7(),
        owner_id="owner-1",
        name="test collective",
        embedding_dimension=dim,
    )


def experience(
    collective_id: UUID, content: str = "a lesson", dim: int = 4
) -> ev.ExperienceRecorded:
    return ev.ExperienceRecorded(
        **_common(),  # type: ignore[arg-type]
        experience_id=uuid7(),
        collective_id=collective_id,
        content=content,
        embedding=ev.pack_vector([0.5] * dim),
        experience_type=ev.Fact(statement=content, source="test"),
        importance=0.5,
        confidence=0.75,
        source_agent="agent-1",
        domain=("testing",),
    )


def activity(collective_id: UUID, agent_id: str, task: str = "working") -> ev.ActivityRegistered:
    return ev.ActivityRegistered(
        **_common(),  # type: ignore[arg-type]
        collective_id=collective_id,
        agent_id=agent_id,
        task_description=task,
    )


def wisdom() -> ev.WisdomStored:
    return ev.WisdomStored(
        **_common(),  # type: ignore[arg-type]
        wisdom_id=uuid7(),
        owner_id="owner-1",
        category="CodingStyle",
        pattern="small functions",
        confidence=0.9,
        embedding=ev.pack_vector([1.0, 0.0, 0.0, 0.0]),
    )


def common() -> dict[str, object]:
    """The fields every event carries, fresh (for events built in a test)."""
    return _common()


def token(owner_id: str = "owner-1", scope: str = "read") -> ev.TokenCreated:
    """An access token's create (its secret hash a fixed dummy: nothing resolves it)."""
    return ev.TokenCreated(
        **_common(), token_id=uuid7(), owner_id=owner_id, secret_sha256="0" * 64,
        scope=scope,  # type: ignore[arg-type]
    )  # type: ignore[arg-type]  # fmt: skip


def history(n: int) -> list[ev.Event]:
    """A realistic mix: experiences, updates, archives, deletes, relations, reinforcements."""
    cid = uuid7()
    events: list[ev.Event] = [collective(cid, dim=16)]
    recorded = [
        experience(cid, f"lesson {i} about retries and checkpoints", dim=16) for i in range(n)
    ]
    for i, rec in enumerate(recorded):
        events.append(rec)
        common = {"event_id": uuid7(), "instance_id": INSTANCE, "hlc": rec.hlc + 1}
        if i % 7 == 1:
            events.append(
                ev.ExperienceUpdated(
                    **common,
                    experience_id=rec.experience_id,  # type: ignore[arg-type]
                    collective_id=cid,
                    importance=0.9,
                )
            )
        elif i % 7 == 2:
            events.append(
                ev.ExperienceArchived(**common, experience_id=rec.experience_id, collective_id=cid)
            )  # type: ignore[arg-type]
        elif i % 7 == 3:
            events.append(
                ev.ExperienceDeleted(**common, experience_id=rec.experience_id, collective_id=cid)
            )  # type: ignore[arg-type]
        elif i % 7 == 4:
            events.append(
                ev.ExperienceReinforced(
                    **common,
                    experience_id=rec.experience_id,  # type: ignore[arg-type]
                    collective_id=cid,
                    applications=i % 5 + 1,
                )
            )
        elif i % 7 == 5 and i > 5:
            events.append(
                ev.RelationStored(
                    **common,
                    relation_id=uuid7(),
                    collective_id=cid,  # type: ignore[arg-type]
                    source_id=rec.experience_id,
                    target_id=recorded[i - 5].experience_id,
                    relation_type="Supports",
                    strength=0.5,
                )
            )
    return events
