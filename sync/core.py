"""What the domain services of an instance share besides their collaborators: the
instance's settings (``InstanceSettings``), the vectors a collective stores and searches
with (a caller's, checked, or its embedder's), and the checks of arguments.

The collaborators themselves are objects of their own: replication
(``sync.replication``), reads as of a moment (``sync.reading``), the access gate
(``sync.gate``) and the write path (``sync.writer``), wired in ``sync.instance``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from eventlog.errors import ValidationError
from eventlog.languages import AUTO
from projections import language, queries
from sync import embedders, models
from sync.gate import uuid_of
from sync.reading import as_of_read
from sync.replication import DELETES
from sync.writer import DELETES_OF

__all__ = ["DELETES", "DELETES_OF", "InstanceSettings", "as_of_read", "uuid_of"]


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """How an instance recalls: energy weighting of search results, and activity staleness."""

    energy_weight: float = 0.2  # 0: pure relevance; 1: relevance x energy
    half_life_days: float = 30.0  # energy halves this long after the last reinforcement
    boost_every: float = 5.0  # this many applications halve the distance of importance to 1
    stale_after: float = 300.0  # seconds without a heartbeat before an agent is not active
    # a search's score of an unstable experience (invalidated often) is multiplied by this
    unstable_weight: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.energy_weight) and 0 <= self.energy_weight <= 1):
            raise ValidationError(f"energy_weight: must be in [0, 1], got {self.energy_weight}")
        if not (math.isfinite(self.unstable_weight) and 0 <= self.unstable_weight <= 1):
            raise ValidationError(f"unstable_weight: must be in [0, 1], got {self.unstable_weight}")
        for name in ("half_life_days", "boost_every", "stale_after"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValidationError(f"{name}: must be a finite number > 0, got {value}")

    @property
    def energy(self) -> dict[str, float]:
        """The settings of ``projections.queries.energy``."""
        return {"half_life_days": self.half_life_days, "boost_every": self.boost_every}


DETECTED_INLINE = 8  # texts a write detects the language of on the event loop, at most


async def text_languages(collective: queries.Collective, texts: Sequence[str]) -> list[str]:
    """The language to record of each text written to ``collective``: in a collective
    of "auto", the one detected from the text (``projections.language.of_text``, judged
    once, by the writer); else "" (its collective's own). The detector is loaded, and a
    batch detected, on a thread, off the event loop."""
    if collective.language != AUTO:
        return [""] * len(texts)
    if len(texts) > DETECTED_INLINE:
        return await asyncio.to_thread(lambda: [language.of_text(t) for t in texts])
    if not language.detector_ready():  # (once: then every text is judged inline)
        await asyncio.to_thread(language.load_detector)
    return [language.of_text(t) for t in texts]


async def vector_for(
    collective: queries.Collective,
    text: str | None,
    given: npt.NDArray[np.float32] | None,
    embedder: str | None,
    *,
    field: str = "embedding",
    query: bool = False,
) -> npt.NDArray[np.float32]:
    """The vector to store or search with: the caller's, checked against the collective
    (dimension, embedder), or the collective's embedder applied to ``text``."""
    if given is None:
        if collective.embedder and not text:
            raise ValidationError(f"{field}: give a vector or a text to embed")
        return (await embed(collective, [text or ""], field=field, query=query))[0]
    check_vector(collective, given, embedder, field)
    return given


async def embed(
    collective: queries.Collective,
    texts: Sequence[str],
    *,
    field: str = "embedding",
    query: bool = False,
) -> list[npt.NDArray[np.float32]]:
    """The collective's embedder applied to texts, off the loop (one call for all)."""
    if not collective.embedder:
        raise ValidationError(
            f"{field}: required, collective {collective.name!r} has no embedder "
            "(create a collective with an embedder, e.g. 'hash', to send text only)"
        )
    model = embedders.embedder(collective.embedder, collective.embedding_dimension)
    inline = sum(map(len, texts)) <= getattr(model, "inline_chars", 0)
    if query:
        made = [
            model.embed_query(texts[0])
            if inline
            else await asyncio.to_thread(model.embed_query, texts[0])
        ]
    elif inline:
        made = list(model.embed_documents(list(texts)))
    else:
        made = list(await asyncio.to_thread(model.embed_documents, list(texts)))
    return [np.asarray(m, dtype=np.float32) for m in made]


def check_vector(
    collective: queries.Collective,
    given: npt.NDArray[np.float32],
    embedder: str | None,
    field: str = "embedding",
) -> None:
    """A caller's vector must come from the collective's embedder and fit its dimension."""
    if collective.embedder and embedder != collective.embedder:
        raise ValidationError(
            f"embedder: collective {collective.name!r} embeds with {collective.embedder!r}; "
            f"a vector from {repr(embedder) if embedder else 'an unnamed model'} is "
            f"refused (send text only, or a vector made with embedder="
            f"{collective.embedder!r})"
        )
    if len(given) != collective.embedding_dimension:
        raise ValidationError(
            f"{field}: {len(given)} values, collective {collective.name!r} has dimension "
            f"{collective.embedding_dimension} (fixed at creation)"
        )


def check_rows_limit(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValidationError(f"limit: must be an integer in 1..1000000, got {value!r}")


def check_limit(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= models.K_MAX:
        raise ValidationError(f"{field}: must be an integer in 1..{models.K_MAX}, got {value!r}")


def check_text(field: str, value: str, limit: int) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= limit:
        raise ValidationError(f"{field}: must be 1..{limit} characters, got {value!r:.60}")


K = TypeVar("K", bound=Hashable)


@contextlib.asynccontextmanager
async def holding(locks: dict[K, tuple[asyncio.Lock, int]], key: K) -> AsyncIterator[None]:
    """Hold the lock of ``key`` in ``locks``, one holder at a time. Its entry counts the
    calls that hold or wait for it and goes with the last of them (taken and counted with
    no await in between, so a waiter always finds the lock it waits for)."""
    lock, users = locks.get(key) or (asyncio.Lock(), 0)
    locks[key] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = locks[key]
        if users == 1:
            del locks[key]
        else:
            locks[key] = (lock, users - 1)
