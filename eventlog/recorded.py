"""What ``record_experience`` returns: the id of the experience that holds the lesson,
saying what the call did, and what a collective may do with a duplicate. A module of its
own, without the data model's imports, so the command line's client can make one
(``ops.remote``) and start fast."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

ON_DUPLICATE = ("keep", "reinforce", "link")  # what a collective does with a duplicate
DUPLICATE_SIMILARITY = 0.95  # cosine similarity from which a new experience is a duplicate
Outcome = Literal["recorded", "reinforced", "linked"]


class Recorded(UUID):
    """What ``record_experience`` returns: the id of the experience that holds the lesson
    (a UUID like any other), and what the call did, ``outcome``: "recorded" (a new
    experience), "reinforced" (it duplicated a live one, which counted one more
    application instead: this is that one's id) or "linked" (a new experience, related
    to the live one it duplicates). ``duplicate_of``: that one (None when recorded)."""

    __slots__ = ("outcome", "duplicate_of")
    outcome: Outcome
    duplicate_of: UUID | None

    def __init__(
        self, value: UUID, outcome: Outcome = "recorded", duplicate_of: UUID | None = None
    ) -> None:
        super().__init__(int=value.int)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "duplicate_of", duplicate_of)

    def __repr__(self) -> str:
        return f"Recorded({str(self)!r}, {self.outcome!r})"
