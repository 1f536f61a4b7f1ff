"""What every part of an instance stands on, wired together: replication
(``sync.replication``), reads as of a moment (``sync.reading``), the access gate
(``sync.gate``) and the write path (``sync.writer``), plus the instance's settings and
the checks the parts share.

``InstanceCore`` builds those objects for one instance and gives the parts (the mixins of
``sync.instance.PulseDB``) their helpers; each helper is the collaborator's own method.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import numpy as np
import numpy.typing as npt

from eventlog import EmbeddedNats
from eventlog import events as ev
from eventlog.errors import ValidationError
from eventlog.ids import uuid7
from eventlog.keys import Keyring
from eventlog.log import EventLog, LogEntry
from eventlog.sealing import Sealer
from projections import queries
from projections.engine import Engine
from projections.scope import Scope
from sync import access, embedders, models
from sync.access import Principal
from sync.gate import Acting, Gate, uuid_of
from sync.hlc import HybridClock
from sync.owed import OwedPurges
from sync.reading import Reader, as_of_read
from sync.replication import DELETES, Replication
from sync.watch import ExperienceWatch, change_of
from sync.writer import DELETES_OF, Writer

__all__ = ["DELETES", "DELETES_OF", "InstanceCore", "InstanceSettings", "as_of_read", "uuid_of"]

T = TypeVar("T")


log = logging.getLogger("pulse.instance")


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


class InstanceCore:
    """The collaborators of an instance's parts, wired (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        log_: EventLog,
        engine: Engine,
        server: EmbeddedNats | None,
        *,
        max_hlc: int,
        settings: InstanceSettings | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log = log_
        self.engine = engine
        # seals what this host writes and opens what it reads (eventlog.sealing): the one
        # its engine caught up with, holding the keys it read
        self.sealer = engine.sealer or Sealer(Keyring(log_.key_store()))
        engine.sealer = self.sealer
        self.server = server
        self.instance_id = uuid7()
        self.clock = HybridClock(state_file=data_dir / "clock.json")
        self.clock.observe(max_hlc)
        self.owed = OwedPurges(data_dir / "owed-purges.json")
        self.settings = settings or InstanceSettings()
        # what this host follows (None: every collective; ``sync.following``) and the
        # directory of collectives it resolves references with
        self.scope: Scope | None = None
        self._directory: Any = None  # a sync.following.Directory on a partial host
        self.acting = Acting()
        self.replication = Replication(
            log_, engine, self.sealer, self.clock, self.instance_id, self._filters
        )
        self.reads = Reader(
            engine, log_, self.replication, self.acting.me, self.sync,
            lambda: self.scope is not None,
        )  # fmt: skip
        self.gate = Gate(self.reads, self.acting, lambda: self.scope, self._known_collectives)
        self.writer = Writer(
            log_, engine, self.sealer, self.clock, self.instance_id, self.replication,
            self.reads, self.owed, self.acting.me,
        )  # fmt: skip
        self.replication.listen(self.gate.applied, self._tokens_after_batch)
        self.replication.listen(self._token_event)
        self.replication.listen(self._watched)
        self._watchers: set[ExperienceWatch] = set()
        # this incarnation's acknowledged totals of the experiences it reinforced last, least
        # recently first (at most ``sync.experiences.OWN_MAX``; a miss reads the projection)
        self._own: OrderedDict[UUID, int] = OrderedDict()
        # one announcement in flight per experience (two concurrent calls must not both
        # announce the same total); different experiences go in parallel. An entry is
        # (lock, calls holding or waiting for it) and goes when the last of them is done.
        self._reinforce_locks: dict[UUID, tuple[asyncio.Lock, int]] = {}
        self._owns_log = True
        # the access tokens known here (read again when a batch applies a token event)
        self.access = access.Registry()
        self._tokens_stale = False
        self._token_reader: asyncio.Task[None] | None = None
        self._directory_task: asyncio.Task[None] | None = None
        self._follow_lock = asyncio.Lock()
        self.backfilled = 0  # events of collectives followed later, read since open
        self._owed_lock = asyncio.Lock()  # one pass over the owed purges at a time
        (data_dir / "identity.json").write_text(
            json.dumps(
                {
                    "instance_id": str(self.instance_id),
                    "pid": os.getpid(),
                    "started_ms": int(time.time() * 1000),
                }
            )  # fmt: skip
        )

    @property
    def applied_seq(self) -> int:
        """The last stream sequence this instance has applied."""
        return self.replication.applied

    @property
    def events_applied(self) -> int:
        """Events the engine applied since open (a metric)."""
        return self.engine.events_applied

    @property
    def principal(self) -> Principal:
        """Who calls act for unless a call says otherwise (``acting_as``)."""
        return self.acting.principal

    @principal.setter
    def principal(self, who: Principal) -> None:
        self.acting.principal = who

    # -- replication ------------------------------------------------------------------------

    @property
    def _applied(self) -> int:
        return self.replication.applied

    @property
    def _failure(self) -> BaseException | None:
        return self.replication.failure

    @property
    def _closed(self) -> bool:
        return self.replication.closed

    @_closed.setter
    def _closed(self, closed: bool) -> None:
        self.replication.closed = closed

    @property
    def _submitted_seq(self) -> int:
        return self.replication.submitted

    def _filters(self) -> list[str] | None:
        """The subjects this host reads (None: all of them)."""
        return None if self.scope is None else self.scope.filters()

    def _known_collectives(self) -> dict[UUID, tuple[str, str]]:
        return {} if self._directory is None else self._directory.collectives

    def _start_replication(self, from_seq: int | None = None) -> None:
        self.replication.start(from_seq)

    async def _stop_replication(self) -> None:
        await self.replication.stop()

    def _wake_all(self) -> None:
        self.replication.wake_all()

    async def _wait_applied(self, seq: int, timeout: float = 60.0) -> None:
        await self.replication.wait_applied(seq, timeout)

    def _watched(self, entry: LogEntry) -> None:
        if self._watchers:
            change = change_of(entry)
            if change is not None:
                for watcher in list(self._watchers):
                    watcher.offer(change)

    def _token_event(self, entry: LogEntry) -> None:
        if isinstance(entry.event, (ev.TokenCreated, ev.TokenRevoked)):
            self._tokens_stale = True

    def _tokens_after_batch(self) -> None:
        if self._tokens_stale and self._token_reader is None:
            self._token_reader = asyncio.ensure_future(self._read_tokens())

    async def _read_tokens(self) -> None:
        """Read the tokens again until no token event applied meanwhile."""
        try:
            while self._tokens_stale and not self._closed:
                self._tokens_stale = False
                self.access.replace(await self.reads.read(queries.tokens))
        except Exception:  # the engine closed under it, or failed: its waiters will hear
            log.debug("reading the access tokens failed", exc_info=True)
        finally:
            self._token_reader = None

    async def _load_tokens(self) -> None:
        """Bring the registry up to what is applied now (the token writers wait on it)."""
        self._tokens_stale = False
        self.access.replace(await self.reads.read(queries.tokens))

    async def sync(self, timeout: float = 60.0) -> int:
        """Wait until the local state has applied everything the stream holds now (and
        the access tokens here are read again from it); returns that stream sequence to
        an admin, 0 to any other caller (a sequence counts every host's writes, those it
        may not see among them)."""
        target = await self.replication.caught_up(timeout)
        if self._token_reader is not None:
            await asyncio.shield(self._token_reader)
        if self._tokens_stale:
            await self._load_tokens()
        return target if self.acting.me().admin else 0

    # -- who acts, and the gate -------------------------------------------------------------

    def principal_of(self, token: str) -> Principal:
        """The principal of an access token (Unauthorized when it is not a live one)."""
        return self.access.resolve(token)

    async def _admit_collective(self, collective_id: UUID, owner_id: str, name: str) -> None:
        """Before this host creates a collective (``sync.following`` refuses one outside
        what it follows)."""

    # -- reads ------------------------------------------------------------------------------

    # -- the write path ---------------------------------------------------------------------

    def _check_open(self) -> None:
        self.replication.check_open()


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
