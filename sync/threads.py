"""Threads: an agent framework's thread state (LangGraph's checkpoints) in a collective.

A framework that runs an agent as a graph saves its state after each step (a
checkpoint) and the writes of tasks in progress (pending writes), per thread, so a run
can stop (an interrupt, a crash) and go on later, on another host. Pulse keeps them as
events of the collective's log, so every host of a deployment, and an edge host while
its link is down, reads the same threads.

- A thread is an entity like a session: Pulse's id of it (``thread_id``), its data key,
  its tombstone. The framework names it (``thread``: LangGraph's ``thread_id``); the
  first checkpoint under a name makes the thread, and later ones find it by the name.
  (Two hosts that begin one name at the same moment make two threads of that name: a
  read takes the checkpoints of both, the writes go to the one of smallest id.)
- Each checkpoint is whole: the framework's serialized state and its metadata (a JSON
  object), never a part that refers to another checkpoint, so pruning some or deleting
  the runs that made them leaves the others readable. Its bytes are what the
  framework's serializer made (``checkpoint_type`` names it); Pulse neither reads nor
  changes them. They travel sealed with the thread's data key, and ``delete_thread``
  forgets the thread as ``delete_session`` forgets a session: a tombstone, the key
  destroyed, the subject purged, its rows gone from every host's files.
- A pending write of a special channel (``idx`` below 0: an error, an interrupt, a
  resume) replaces the one before it; an ordinary one, once written, stays (a retried
  task writes the same again): the framework's own savers do the same.
- Threads are their writers': a member of the collective sees the threads of its owner,
  and a token of an agent those of its agent only; a caller that is not a member sees
  none. A thread one may not see is as one that does not exist: writing under its name
  makes another.

``put_checkpoint``, ``put_pending_writes``, ``get_checkpoint`` and ``list_checkpoints``
are what a checkpointer needs (``sync.langgraph.PulseSaver``, the LangGraph saver, uses
them and nothing else); ``copy_thread``, ``prune_threads``, ``delete_checkpoints_of_runs`` and
``delete_thread`` are its extended capabilities.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal
from uuid import UUID

from eventlog import events as ev
from eventlog.errors import ValidationError
from eventlog.log import LogEntry
from projections import queries
from sync import models
from sync.gate import Gate
from sync.idempotency import idempotent
from sync.models import validated
from sync.reading import Reader
from sync.writer import Writer

BATCH = 500  # events of one atomic write when a thread is copied or pruned
MADE_MAX = 10_000  # threads made here and not applied yet that a host remembers
RUN_IDS_MAX = models.THREAD_NAMES_MAX  # runs or threads one call takes


class Threads:
    """Threads' checkpoints and pending writes (see the module docstring)."""

    def __init__(self, reads: Reader, gate: Gate, writer: Writer) -> None:
        self.reads, self.gate, self.writer = reads, gate, writer
        # a name's thread as this host decides it: one decision at a time (a read of
        # memory), and the ids made here that the state does not show yet (a framework
        # writes a checkpoint and the writes after it at once: both go to one thread)
        self._deciding = asyncio.Lock()
        self._made: dict[tuple[UUID, str, str | None], UUID] = {}
        # ... and the ones found, until a tombstone of the thread or its collective is
        # applied (``applied``): a checkpoint's write then reads nothing first
        self._found: dict[tuple[UUID, str, str | None], UUID] = {}

    def applied(self, entry: LogEntry) -> None:
        """A replication listener: a deleted thread (or collective) is no longer found."""
        event = entry.event
        if not isinstance(event, (ev.ThreadDeleted, ev.CollectiveDeleted)):
            return
        for held in (self._found, self._made):  # (made here, deleted elsewhere meanwhile)
            if isinstance(event, ev.ThreadDeleted):
                gone = [k for k, t in held.items() if t == event.thread_id]
            else:
                gone = [k for k in held if k[0] == event.collective_id]
            for key in gone:
                del held[key]

    # -- writes ----------------------------------------------------------------------------

    @idempotent
    async def put_checkpoint(
        self,
        collective_id: UUID,
        thread: str,
        checkpoint_id: str,
        checkpoint_type: str,
        checkpoint: bytes,
        *,
        checkpoint_ns: str = "",
        parent_checkpoint_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> queries.ThreadKey:
        """Store a checkpoint of a thread (the thread is made by its first one): the
        framework's serialized state (``checkpoint``: its serializer's bytes, base64 in
        JSON, with ``checkpoint_type`` its serializer's tag), in namespace
        ``checkpoint_ns`` ("" for the root graph), after ``parent_checkpoint_id``, with its
        ``metadata`` (a JSON object; its ``run_id`` names the run that made it). The
        bytes and metadata together take at most 896 KB. Needs write access; a token of
        an agent writes that agent's threads. Returns where it was stored."""
        spec = validated(
            models.CheckpointIn, collective_id=collective_id, thread=thread,
            checkpoint_id=checkpoint_id, checkpoint_type=checkpoint_type,
            checkpoint=checkpoint, checkpoint_ns=checkpoint_ns,
            parent_checkpoint_id=parent_checkpoint_id,
            metadata=dict(metadata) if isinstance(metadata, Mapping) else metadata or {},
        )  # fmt: skip
        cid, agent = await self._writable(spec.collective_id)
        thread_id = await self._thread_for(cid, spec.thread, agent)
        run_id = spec.metadata.get("run_id")
        await self.writer.write(
            ev.ThreadCheckpointed(
                **self.writer.common(), thread_id=thread_id, collective_id=cid,
                name=spec.thread, checkpoint_ns=spec.checkpoint_ns,
                checkpoint_id=spec.checkpoint_id,
                parent_checkpoint_id=spec.parent_checkpoint_id,
                checkpoint_type=spec.checkpoint_type, checkpoint=spec.checkpoint,
                metadata=spec.metadata_json,
                run_id=None if run_id is None or str(run_id) == "" else str(run_id),
            )
        )  # fmt: skip
        return queries.ThreadKey(
            thread=spec.thread, thread_id=thread_id, collective_id=cid,
            checkpoint_ns=spec.checkpoint_ns, checkpoint_id=spec.checkpoint_id,
        )  # fmt: skip

    @idempotent
    async def put_pending_writes(
        self,
        collective_id: UUID,
        thread: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[models.PendingWriteIn | Mapping[str, Any]],
        *,
        checkpoint_ns: str = "",
        task_path: str = "",
        idempotency_key: str | None = None,
    ) -> None:
        """Store a task's pending writes after a checkpoint of a thread (1..1000 writes,
        each ``idx``, ``channel``, ``value_type`` and ``value``: its serializer's bytes,
        base64 in JSON; the values take at most 896 KB together), as one event: stored
        together or not at all. A write at a negative
        ``idx`` (a special channel's) replaces the one before it; an ordinary one, once
        written, stays. Writes may come before their checkpoint (a framework writes
        both at once); a thread the caller may not see is not theirs: the writes make
        another of that name."""
        spec = validated(
            models.PendingWritesIn, collective_id=collective_id, thread=thread,
            checkpoint_id=checkpoint_id, task_id=task_id,
            writes=list(writes) if isinstance(writes, Sequence) else writes,
            checkpoint_ns=checkpoint_ns, task_path=task_path,
        )  # fmt: skip
        cid, agent = await self._writable(spec.collective_id)
        thread_id = await self._thread_for(cid, spec.thread, agent)
        total = sum(len(w.value) for w in spec.writes)
        if total > models.THREAD_VALUE_MAX_BYTES:
            raise ValidationError(
                f"writes: their values must take at most {models.THREAD_VALUE_MAX_BYTES:,} "
                f"bytes together, got {total:,}"
            )
        await self.writer.write(  # (one event: the task's writes are stored together)
            ev.ThreadWritten(
                **self.writer.common(), thread_id=thread_id, collective_id=cid,
                checkpoint_ns=spec.checkpoint_ns, checkpoint_id=spec.checkpoint_id,
                task_id=spec.task_id, task_path=spec.task_path,
                writes=tuple(
                    ev.PendingWrite(idx=w.idx, channel=w.channel, value_type=w.value_type,
                                    value=w.value)
                    for w in spec.writes
                ),
            )
        )  # fmt: skip

    @idempotent
    async def delete_thread(
        self, collective_id: UUID, thread: str, *, idempotency_key: str | None = None
    ) -> None:
        """Delete a thread and forget it: every checkpoint and pending write of it leaves
        every host's state, files and the stream, where only the tombstone stays (its
        events were sealed with its data key, which the delete destroys). Every thread of
        that name the caller may see goes. A name with no thread is no error."""
        _text("thread", thread, models.THREAD_NAME_MAX_BYTES)
        cid, agent = await self._writable(collective_id)
        for thread_id in await self.reads.read(queries.thread_ids, cid, thread, None, agent):
            await self._forget(thread_id, cid)

    @idempotent
    async def copy_thread(
        self,
        collective_id: UUID,
        source: str,
        target: str,
        *,
        idempotency_key: str | None = None,
    ) -> int:
        """Copy every checkpoint and pending write of thread ``source`` (each namespace)
        into thread ``target``, which is made anew beside any thread of that name;
        ``source`` stays as it is. Returns how many checkpoints were copied (0: no thread
        ``source`` the caller may see)."""
        _text("source", source, models.THREAD_NAME_MAX_BYTES)
        _text("target", target, models.THREAD_NAME_MAX_BYTES)
        cid, agent = await self._writable(collective_id)
        rows = []
        for thread_id in await self.reads.read(queries.thread_ids, cid, source, None, agent):
            rows += await self.reads.read(queries.thread_parts, thread_id, cid)
        if not rows:
            return 0
        copy = await self.writer.entity_id("thread", cid)
        events: list[ev.Event] = []
        tasks: dict[tuple[str, str, str, str], list[ev.PendingWrite]] = {}
        for row in rows:
            if isinstance(row.key()[-1], int):  # a pending write: with its task's
                tasks.setdefault(
                    (row.checkpoint_ns, row.checkpoint_id, row.task_id, row.task_path or ""), []
                ).append(ev.PendingWrite(idx=row.idx, channel=row.channel or "",
                                         value_type=row.value_type or "",
                                         value=row.value or b""))  # fmt: skip
            else:
                events.append(ev.ThreadCheckpointed(
                    **self.writer.common(), thread_id=copy, collective_id=cid, name=target,
                    checkpoint_ns=row.checkpoint_ns, checkpoint_id=row.checkpoint_id,
                    parent_checkpoint_id=row.parent_checkpoint_id,
                    checkpoint_type=row.checkpoint_type or "", checkpoint=row.checkpoint or b"",
                    metadata=row.metadata or "{}", run_id=row.run_id,
                ))  # fmt: skip
        for (namespace, checkpoint_id, task_id, task_path), writes in tasks.items():
            for part in _parts(writes):
                events.append(ev.ThreadWritten(
                    **self.writer.common(), thread_id=copy, collective_id=cid,
                    checkpoint_ns=namespace, checkpoint_id=checkpoint_id, task_id=task_id,
                    task_path=task_path, writes=part,
                ))  # fmt: skip
        for start in range(0, len(events), BATCH):
            await self.writer.write_many(events[start : start + BATCH], atomic=True)
        return sum(isinstance(e, ev.ThreadCheckpointed) for e in events)

    @idempotent
    async def prune_threads(
        self,
        collective_id: UUID,
        threads: Sequence[str],
        *,
        strategy: Literal["keep_latest", "delete"] = "keep_latest",
        idempotency_key: str | None = None,
    ) -> int:
        """Prune threads (1..1000 names): ``keep_latest`` deletes every checkpoint but
        the latest of each namespace (with their pending writes), ``delete`` deletes the
        threads whole (``delete_thread``). Names with no thread are no error. Returns
        how many checkpoints were deleted."""
        names = _names("threads", threads)
        if strategy not in ("keep_latest", "delete"):
            raise ValidationError(
                f"strategy: must be 'keep_latest' or 'delete', got {strategy!r:.60}"
            )
        cid, agent = await self._writable(collective_id)
        gone: list[tuple[UUID, str, str]] = []
        for name in names:
            found = await self.reads.read(queries.thread_checkpoints, cid, None, agent, name=name)
            if strategy == "delete":
                gone += [(c.thread_id, c.checkpoint_ns, c.checkpoint_id) for c in found]
                for thread_id in {c.thread_id for c in found} | set(
                    await self.reads.read(queries.thread_ids, cid, name, None, agent)
                ):
                    await self._forget(thread_id, cid)
                continue
            latest: set[str] = set()  # namespaces whose latest is seen (newest come first)
            for c in found:
                if c.checkpoint_ns in latest:
                    gone.append((c.thread_id, c.checkpoint_ns, c.checkpoint_id))
                latest.add(c.checkpoint_ns)
        if strategy == "keep_latest":
            await self._delete_checkpoints(cid, gone)
        return len(gone)

    @idempotent
    async def delete_checkpoints_of_runs(
        self,
        collective_id: UUID,
        run_ids: Sequence[str],
        *,
        idempotency_key: str | None = None,
    ) -> int:
        """Delete the checkpoints that the runs ``run_ids`` made (1..1000; their metadata's
        ``run_id``), with their pending writes, in every thread of the collective the
        caller may see; the threads stay. Returns how many were deleted."""
        runs = set(_names("run_ids", run_ids))
        cid, agent = await self._writable(collective_id)
        gone = await self.reads.read(queries.thread_run_checkpoints, cid, None, agent, runs)
        await self._delete_checkpoints(cid, gone)
        return len(gone)

    # -- reads -----------------------------------------------------------------------------

    async def get_checkpoint(
        self,
        collective_id: UUID,
        thread: str,
        *,
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> queries.Checkpoint | None:
        """A checkpoint of a thread, with its pending writes: the one ``checkpoint_id``
        names, or the latest of namespace ``checkpoint_ns`` (the largest id). None when
        there is none the caller may see."""
        _text("thread", thread, models.THREAD_NAME_MAX_BYTES)
        _text("checkpoint_ns", checkpoint_ns, models.THREAD_KEY_MAX_BYTES, empty=True)
        if checkpoint_id is not None:
            _text("checkpoint_id", checkpoint_id, models.THREAD_KEY_MAX_BYTES)
        scope = await self._readable(collective_id)
        if scope is None:
            return None
        cid, agent = scope
        found = await self.reads.read(
            queries.thread_checkpoints, cid, None, agent, name=thread,
            checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id, limit=1,
        )  # fmt: skip
        return found[0] if found else None

    async def list_checkpoints(
        self,
        collective_id: UUID,
        *,
        thread: str | None = None,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        before: str | None = None,
        limit: int = models.PAGE_DEFAULT,
    ) -> list[queries.Checkpoint]:
        """The checkpoints of the collective's threads the caller may see, newest first
        (the largest id first), each with its pending writes: of thread ``thread`` (any
        thread), of namespace ``checkpoint_ns`` (any), the one ``checkpoint_id`` names,
        whose metadata holds every key and value of ``metadata``, with an id below
        ``before``; at most ``limit`` (1..1000, default 100: for more, call again with
        ``before`` the last id)."""
        models.check_page_limit(limit)
        if thread is not None:
            _text("thread", thread, models.THREAD_NAME_MAX_BYTES)
        if checkpoint_ns is not None:
            _text("checkpoint_ns", checkpoint_ns, models.THREAD_KEY_MAX_BYTES, empty=True)
        for name, value in (("checkpoint_id", checkpoint_id), ("before", before)):
            if value is not None:
                _text(name, value, models.THREAD_KEY_MAX_BYTES)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ValidationError(f"metadata: must be an object, got {type(metadata).__name__}")
        scope = await self._readable(collective_id)
        if scope is None:
            return []
        cid, agent = scope
        return await self.reads.read(
            queries.thread_checkpoints, cid, None, agent, name=thread,
            checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
            metadata=dict(metadata) if metadata else None, before=before, limit=limit,
        )  # fmt: skip

    async def list_threads(self, collective_id: UUID) -> list[str]:
        """The names of the collective's threads the caller may see."""
        scope = await self._readable(collective_id)
        if scope is None:
            return []
        return await self.reads.read(queries.thread_names, scope[0], None, scope[1])

    # -- helpers -----------------------------------------------------------------------------

    def _agent(self) -> str | None:
        """The agent whose threads the caller sees (None: every one)."""
        me = self.gate.me()
        return me.agent if me.agent is not None and not me.admin else None

    async def _thread_for(self, collective_id: UUID, name: str, agent: str | None) -> UUID:
        """The thread a write under ``name`` goes to: the one the caller sees (of
        smallest id), or one this host made for it and has not applied yet, or a new
        one."""
        key = (collective_id, name, agent)
        known = self._found.get(key)
        if known is not None:
            return known
        async with self._deciding:
            found = await self.reads.read(queries.thread_ids, collective_id, name, None, agent)
            if found:
                self._made.pop(key, None)
                while len(self._found) >= MADE_MAX:  # (the oldest)
                    self._found.pop(next(iter(self._found)))
                self._found[key] = found[0]
                return found[0]
            made = self._made.get(key)
            if made is None:
                while len(self._made) >= MADE_MAX:  # (the oldest: long applied)
                    self._made.pop(next(iter(self._made)))
                # (its data key stored already: the first checkpoint and writes made at
                # once both find it, where a key made as the first is sealed would be made
                # twice)
                made = self._made[key] = await self.writer.entity_id("thread", collective_id)
            return made

    async def _writable(self, collective_id: Any) -> tuple[UUID, str | None]:
        collective = await self.gate.writable(collective_id)
        self.gate.me().need_write()
        return collective.collective_id, self._agent()

    async def _readable(self, collective_id: Any) -> tuple[UUID, str | None] | None:
        """The collective and the agent whose threads the caller sees; None when it is
        not a member (threads are their writers': no visibility lets others see them)."""
        collective, viewer = await self.gate.readable(collective_id)
        if viewer is not None and not viewer.member:
            return None
        return collective.collective_id, self._agent()

    async def _forget(self, thread_id: UUID, collective_id: UUID) -> None:
        for held in (self._made, self._found):
            for key in [k for k, made in held.items() if made == thread_id]:
                del held[key]
        tombstone = ev.ThreadDeleted(
            **self.writer.common(), thread_id=thread_id, collective_id=collective_id
        )
        await self.writer.tombstone(tombstone, _subject(tombstone))

    async def _delete_checkpoints(
        self, collective_id: UUID, gone: Sequence[tuple[UUID, str, str]]
    ) -> None:
        events = [
            ev.ThreadCheckpointDeleted(
                **self.writer.common(), thread_id=thread_id, collective_id=collective_id,
                checkpoint_ns=namespace, checkpoint_id=checkpoint_id,
            )
            for thread_id, namespace, checkpoint_id in gone
        ]  # fmt: skip
        for start in range(0, len(events), BATCH):
            await self.writer.write_many(events[start : start + BATCH], atomic=True)


def _subject(event: ev.Event) -> str:
    from eventlog.subjects import subject_for

    return subject_for(event)


def _parts(writes: list[ev.PendingWrite]) -> Iterator[tuple[ev.PendingWrite, ...]]:
    """A task's writes in as few events as the limits of one allow."""
    part: list[ev.PendingWrite] = []
    size = 0
    for write in writes:
        if part and (
            size + len(write.value) > models.THREAD_VALUE_MAX_BYTES
            or len(part) == models.WRITES_MAX
        ):
            yield tuple(part)
            part, size = [], 0
        part.append(write)
        size += len(write.value)
    if part:
        yield tuple(part)


def _text(field: str, value: Any, limit: int, *, empty: bool = False) -> None:
    """A text of 1 (0 with ``empty``) to ``limit`` bytes of UTF-8."""
    if not isinstance(value, str):
        raise ValidationError(f"{field}: must be a text, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not (0 if empty else 1) <= size <= limit:
        low = 0 if empty else 1
        raise ValidationError(f"{field}: must be {low}..{limit} bytes of UTF-8, got {size}")


def _names(field: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValidationError(f"{field}: must be a list of texts")
    if not 1 <= len(values) <= RUN_IDS_MAX:
        raise ValidationError(f"{field}: must hold 1..{RUN_IDS_MAX} items, got {len(values)}")
    for i, value in enumerate(values):
        _text(f"{field}[{i}]", value, models.THREAD_KEY_MAX_BYTES)
    return list(dict.fromkeys(values))
