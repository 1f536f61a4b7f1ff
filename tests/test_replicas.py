"""Three replicas under a model: real instances (``PulseDB`` on DuckDB, FAISS, tantivy)
each on its own in-memory log, joined by a network that delivers any subset of the
events, in any order, with duplicates, as sourced streams or leaf nodes would. Writes
and reinforcements happen at random replicas, which restart now and then. After full
delivery every replica has the same digest and every count equals the model's."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any, Coroutine, TypeVar
from uuid import UUID

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, rule

from eventlog import MemoryLog
from eventlog.codec import HDR_MSG_ID
from eventlog.keys import MemoryKeyStore
from projections.projection import ProjectionSettings
from sync import PulseDB
from tests.harness import by_profile

T = TypeVar("T")
REPLICAS = 3
# no analysts' snapshot: it copies each replica's state as it changes, and plays no part in
# what replicas converge to
QUIET = ProjectionSettings(snapshot_interval=None)
replica = st.integers(0, REPLICAS - 1)


class Replicas(RuleBasedStateMachine):
    experiences = Bundle("experiences")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="pulse-replicas-"))
        self.logs = [MemoryLog() for _ in range(REPLICAS)]
        keys = MemoryKeyStore()  # one key store every replica reads (as a KV bucket would be)
        for log in self.logs:
            log._key_store = keys
        self.dbs = [self.run(self.attach(i)) for i in range(REPLICAS)]
        self.sent = [0] * REPLICAS  # how much of each replica's own log went on the wire
        self.wire: list[tuple[str, bytes, dict[str, str]]] = []  # every event written
        self.applications: dict[UUID, int] = {}  # the model: acknowledged reinforcements
        self.collective: UUID | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, 60))

    async def attach(self, i: int) -> PulseDB:
        return await PulseDB.attach(
            self.dir / f"r{i}", self.logs[i], owns_log=False, projection_settings=QUIET
        )

    def publish(self, i: int) -> None:
        """Put what replica i wrote on the wire (its log holds its writes and deliveries)."""
        for stored in self.logs[i]._main.messages:
            if stored.seq > self.sent[i] and HDR_MSG_ID in stored.headers:  # its own writes
                self.wire.append((stored.subject, stored.payload, dict(stored.headers)))
        self.sent[i] = self.logs[i]._main.last_seq

    async def deliver_to(self, i: int, indices: list[int]) -> None:
        for index in indices:
            subject, payload, headers = self.wire[index]
            foreign = {k: v for k, v in headers.items() if k != HDR_MSG_ID}  # no dedup
            await self.logs[i].append_raw(subject, payload, foreign)
        await self.dbs[i].sync()

    @initialize()
    def create_collective(self) -> None:
        self.collective = self.run(self.dbs[0].create_collective("owner", "replicated", 2))
        self.publish(0)

    @rule(target=experiences, at=replica, x=st.floats(0, 1), y=st.floats(0, 1))
    def record(self, at: int, x: float, y: float) -> UUID:
        db = self.dbs[at]
        self.run(self.deliver_to(at, [0]))  # every replica learns of the collective first
        assert self.collective is not None
        eid = self.run(db.record_experience(self.collective, "learned", [x + 0.1, y]))
        self.publish(at)
        self.applications[eid] = 0
        return eid

    @rule(at=replica, experience=experiences)
    def reinforce(self, at: int, experience: UUID) -> None:
        db = self.dbs[at]
        if self.run(db.get_experience(experience)) is None:
            return  # not delivered here yet: a real caller would get NotFoundError
        total = self.run(db.reinforce_experience(experience))
        self.applications[experience] += 1
        self.publish(at)
        assert 1 <= total <= self.applications[experience]

    @rule(at=replica, experience=experiences, importance=st.sampled_from([0.0, 0.5, 1.0]))
    def update(self, at: int, experience: UUID, importance: float) -> None:
        if self.run(self.dbs[at].get_experience(experience)) is not None:
            self.run(self.dbs[at].update_experience(experience, importance=importance))
            self.publish(at)

    @rule(at=replica, experience=experiences, archive=st.booleans())
    def archive(self, at: int, experience: UUID, archive: bool) -> None:
        db = self.dbs[at]
        if self.run(db.get_experience(experience)) is not None:
            action = db.archive_experience if archive else db.unarchive_experience
            self.run(action(experience))
            self.publish(at)

    @rule(at=replica, data=st.data())
    def deliver(self, at: int, data: st.DataObject) -> None:
        """Some of the events, in any order, possibly again."""
        if self.wire:
            indices = data.draw(st.lists(st.integers(0, len(self.wire) - 1), max_size=8))
            self.run(self.deliver_to(at, indices))

    @rule(at=replica)
    def restart(self, at: int) -> None:
        before = self.dbs[at].instance_id
        self.run(self.dbs[at].close())
        self.dbs[at] = self.run(self.attach(at))
        assert self.dbs[at].instance_id != before

    def teardown(self) -> None:
        try:
            for i in range(REPLICAS):  # full delivery, in another order for each replica
                order = list(range(len(self.wire)))
                order = order[i:] + order[:i]
                self.run(self.deliver_to(i, order[::-1] if i % 2 else order))
            digests = {self.run(db.digest()) for db in self.dbs}
            assert len(digests) == 1, "replicas disagree after full delivery"
            for experience, expected in self.applications.items():
                for db in self.dbs:
                    got = self.run(db.get_experience(experience))
                    assert got is not None and got.applications == expected
        finally:
            for db in self.dbs:
                self.run(db.close())
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)


# each run: three replicas, 20 steps, about 2 CPU-seconds (six runs in `make test`)
Replicas.TestCase.settings = settings(
    max_examples=by_profile(ci=6, dev=24), stateful_step_count=20, deadline=None
)
test_replicas_converge_under_any_delivery = Replicas.TestCase
