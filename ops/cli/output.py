"""How commands print what they get: JSON-ready builtins for --json, and the text lines of
experiences, hits, contexts, sessions and tables otherwise."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projections import queries


def plain(value: Any) -> Any:
    """JSON-ready builtins: UUIDs as strings, embeddings left out (``dimension`` instead)."""
    from ops.encoding import to_json

    return to_json(value)


def when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def clip(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def kind_of(e: queries.Experience) -> str:
    return str(type(e.experience_type).__struct_config__.tag)


def experience_lines(e: queries.Experience) -> str:
    tags = f"  [{', '.join(e.domain)}]" if e.domain else ""
    return (
        f"{e.experience_id}  {kind_of(e)}  importance {e.importance:.2f}  "
        f"confidence {e.confidence:.2f}  applications {e.applications}"
        f"{'  archived' if e.archived else ''}{'  unstable' if e.unstable else ''}"
        f"{tags}\n  {clip(e.content)}"
        + (
            f"\n  no longer true since {when(e.valid_to_ms)}: {clip(e.invalid_reason or '', 60)}"
            if e.valid_to_ms is not None
            else ""
        )
    )


def hit_lines(hits: list[queries.ScoredExperience]) -> str:
    if not hits:
        return "no matches"
    return "\n".join(
        f"{h.score:.4f}  {h.experience.experience_id}  {clip(h.experience.content, 60)}"
        for h in hits
    )


def context_text(found: Any) -> str:
    """A context (``get_context_candidates``) as the sections `pulse context` prints."""
    sections = {
        "similar": hit_lines(found.similar),
        "recent": "\n".join(f"{e.experience_id}  {clip(e.content, 60)}" for e in found.recent),
        "insights": "\n".join(
            f"{s.score:.4f}  {clip(s.insight.content, 60)}" for s in found.insights
        ),
        "relations": "\n".join(
            f"{r.source_id} {r.relation_type} {r.target_id}" for r in found.relations
        ),
        "active agents": "\n".join(
            f"{a.agent_id}: {clip(a.task_description, 60)}" for a in found.active_agents
        ),
    }
    parts = [f"{name}:\n{indent(body or 'none')}" for name, body in sections.items()]
    return "\n".join(parts)


def session_text(s: queries.Session) -> str:
    state = f"ended {when(s.ended_ms)}" if s.ended else "open"
    lines = [
        f"{s.session_id}  {s.agent_id}  {state}  (started {when(s.started_ms)}, "
        f"updated {when(s.updated_ms)})",
        f"  summary: {clip(s.summary, 200) or '-'}",
    ]
    if s.todo:
        lines.append("  todo:")
        lines += [
            f"    [{'x' if t.done else ' '}] {t.priority:<6}  {clip(t.task, 60)}"
            + (f"  ({clip(t.note, 40)})" if t.note else "")
            for t in s.todo
        ]
    for name, notes in (("changes", s.changes), ("bugs", s.bugs),
                        ("architecture", s.architecture)):  # fmt: skip
        if notes:
            lines.append(f"  {name}:")
            lines += [f"    - {clip(note, 70)}" for note in notes]
    return "\n".join(lines)


def table(columns: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(v) if v is not None else "NULL" for v in row] for row in rows]
    widths = [max([len(c)] + [min(len(r[i]), 60) for r in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        cells_text = (clip(v, w).ljust(w) for v, w in zip(row, widths, strict=True))
        out.append("  ".join(cells_text).rstrip())
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)
