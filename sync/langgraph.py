"""Pulse as LangGraph's memory: ``PulseSaver``, a checkpointer every host shares.

    pip install 'pulse-memory[langgraph]'

    db = await PulseDB.open("data")                      # or PulseDBSync, or a remote client
    saver = PulseSaver(db, collective_id)
    graph = builder.compile(checkpointer=saver)
    await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})

A graph's checkpoints and pending writes become events of the collective's log (Pulse's
threads: ``sync.threads``), so a run interrupted on one host goes on from another host of
the same deployment, and an edge host checkpoints while its link is down. The saver uses
Pulse's public API only (``put_checkpoint``, ``put_pending_writes``, ``get_checkpoint``,
``list_checkpoints``, ``delete_thread``, ``copy_thread``, ``prune_threads``,
``delete_checkpoints_of_runs``): any object that has them as coroutine methods will do,
``PulseDB`` in this process or ``ops.remote.RemotePulseDB`` for a ``pulse up``
elsewhere. What the caller may see and change is what its principal may: a token of an
agent sees the threads of that agent only.

LangGraph's ``thread_id`` is the thread's name in the collective; each checkpoint is
stored whole (its channel values in it, serialized by the saver's ``serde``), as
LangGraph's SQLite saver stores it, so pruning keeps every remaining checkpoint readable.

Sync and async: the async methods run on the loop the instance runs on (the caller's).
The sync ones, which ``graph.invoke`` calls, hand the call to that loop and wait, so they
must be called from another thread (LangGraph's own thread pool, or code that is not
async): with ``PulseDBSync`` the instance has a loop of its own and every thread may.
"""

from __future__ import annotations

import asyncio
import binascii
import random
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any, TypeVar
from uuid import UUID

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

T = TypeVar("T")
PAGE = 1000  # checkpoints one list_checkpoints call returns at most (the API's page bound)
NAMES = 1000  # threads or runs one prune or delete call takes at most


class PulseSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps threads in a Pulse collective (see the module
    docstring). ``db``: a ``PulseDB``, a ``PulseDBSync`` or a remote client;
    ``collective_id``: the collective the threads live in."""

    def __init__(
        self,
        db: Any,
        collective_id: UUID | str,
        *,
        serde: SerializerProtocol | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(serde=serde)
        instance, own_loop = _instance_of(db)
        self.db = instance
        self.collective_id = UUID(str(collective_id))
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        # the loop the instance runs on: its own (PulseDBSync), the one given, or the
        # caller's (a saver made in async code)
        self.loop = own_loop or loop or running

    # -- the async API (what the conformance suite and ``graph.ainvoke`` call) --------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config.get("configurable", {})
        thread = str(configurable["thread_id"])
        found = await self._call(
            self.db.get_checkpoint(
                self.collective_id, thread,
                checkpoint_ns=configurable.get("checkpoint_ns", ""),
                checkpoint_id=get_checkpoint_id(config),
            )
        )  # fmt: skip
        return None if found is None else self._tuple(found)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        configurable = (config or {}).get("configurable", {})
        thread = configurable.get("thread_id")
        asked: dict[str, Any] = {
            "thread": None if thread is None else str(thread),
            "checkpoint_ns": configurable.get("checkpoint_ns"),  # (absent: every namespace)
            "checkpoint_id": configurable.get("checkpoint_id"),
            "metadata": filter or None,
        }
        below = None if before is None else get_checkpoint_id(before)
        if before is not None and below is None:
            return  # (before a checkpoint that names none: there is nothing before it)
        left = limit
        seen: set[tuple[UUID, str, str]] = set()
        while left is None or left > 0:
            page = await self._call(
                self.db.list_checkpoints(
                    self.collective_id, **asked, before=below,
                    limit=PAGE if left is None else min(left, PAGE),
                )
            )  # fmt: skip
            if not page:
                return
            last = page[-1].checkpoint_id
            if len(page) == PAGE:  # ids two threads share may straddle the page's end
                page += await self._call(
                    self.db.list_checkpoints(
                        self.collective_id, **{**asked, "checkpoint_id": last}, limit=PAGE
                    )
                )
            for found in page:
                key = (found.thread_id, found.checkpoint_ns, found.checkpoint_id)
                if key in seen:
                    continue
                seen.add(key)
                yield self._tuple(found)
                if left is not None:
                    left -= 1
                    if left == 0:
                        return
            if len(page) < PAGE:
                return
            below = last

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread = str(configurable["thread_id"])
        namespace = configurable.get("checkpoint_ns", "")
        kind, data = self.serde.dumps_typed(checkpoint)
        await self._call(
            self.db.put_checkpoint(
                self.collective_id, thread, checkpoint["id"], kind, data,
                checkpoint_ns=namespace, parent_checkpoint_id=configurable.get("checkpoint_id"),
                metadata=get_checkpoint_metadata(config, metadata),
            )
        )  # fmt: skip
        return {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": namespace,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        configurable = config["configurable"]
        encoded = []
        for i, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            encoded.append({"idx": WRITES_IDX_MAP.get(channel, i), "channel": channel,
                            "value_type": kind, "value": data})  # fmt: skip
        await self._call(
            self.db.put_pending_writes(
                self.collective_id, str(configurable["thread_id"]),
                configurable["checkpoint_id"], task_id, encoded,
                checkpoint_ns=configurable.get("checkpoint_ns", ""), task_path=task_path,
            )
        )  # fmt: skip

    async def adelete_thread(self, thread_id: str) -> None:
        await self._call(self.db.delete_thread(self.collective_id, str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        names = [str(r) for r in run_ids]
        for start in range(0, len(names), NAMES):
            await self._call(
                self.db.delete_checkpoints_of_runs(self.collective_id, names[start : start + NAMES])
            )

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._call(
            self.db.copy_thread(self.collective_id, str(source_thread_id), str(target_thread_id))
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        names = [str(t) for t in thread_ids]
        for start in range(0, len(names), NAMES):
            await self._call(
                self.db.prune_threads(
                    self.collective_id, names[start : start + NAMES], strategy=strategy
                )
            )

    # -- the sync API (``graph.invoke``): the same calls, on the instance's loop ----------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._wait(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def gather() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._wait(gather())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._wait(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._wait(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._wait(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._wait(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._wait(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._wait(self.aprune(thread_ids, strategy=strategy))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version above ``current``: a zero-padded counter and a random fraction (the
        same form as LangGraph's own savers), so versions compare as text."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- helpers -----------------------------------------------------------------------------

    def _tuple(self, found: Any) -> CheckpointTuple:
        configurable = {"thread_id": found.thread, "checkpoint_ns": found.checkpoint_ns}
        parent = None
        if found.parent_checkpoint_id is not None:
            parent = {"configurable": {**configurable,
                                       "checkpoint_id": found.parent_checkpoint_id}}  # fmt: skip
        return CheckpointTuple(
            config={"configurable": {**configurable, "checkpoint_id": found.checkpoint_id}},
            checkpoint=self.serde.loads_typed((found.checkpoint_type, _bytes(found.checkpoint))),
            metadata=found.metadata,
            parent_config=parent,  # type: ignore[arg-type]
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.value_type, _bytes(w.value))))
                for w in found.pending_writes
            ],
        )

    async def _call(self, call: Awaitable[T]) -> T:
        """A call of the instance, on its loop: awaited here when this is that loop (or
        none is known: the caller's), else handed to it and awaited from this one."""
        if self.loop is None or _on(self.loop):
            return await call
        future = asyncio.run_coroutine_threadsafe(_awaited(call), self.loop)
        return await asyncio.wrap_future(future)

    def _wait(self, call: Awaitable[T]) -> T:
        """A coroutine of this saver run to its end on the instance's loop, from another
        thread (a sync method)."""
        loop = self.loop
        problem = None
        if loop is None:
            problem = (
                "its sync methods need the event loop the instance runs on: make the saver "
                "inside that loop, pass loop=, or give it a PulseDBSync"
            )
        elif _on(loop):
            problem = (
                "a sync method was called on the instance's event loop, which it would block; "
                "use the async one there (graph.ainvoke)"
            )
        if problem is not None:
            close = getattr(call, "close", None)
            if close is not None:
                close()  # (never awaited: no warning about it)
            raise RuntimeError(f"PulseSaver: {problem}")
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(_awaited(call), loop).result()


def _bytes(text: str) -> bytes:
    """The bytes of a base64 text (as Pulse answers a serializer's bytes)."""
    return binascii.a2b_base64(text)


async def _awaited(call: Awaitable[T]) -> T:
    return await call


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _instance_of(db: Any) -> tuple[Any, asyncio.AbstractEventLoop | None]:
    """The async instance behind ``db`` and the loop it runs on, when it has its own."""
    instance = getattr(db, "instance", None)
    loop = getattr(db, "loop", None)
    if instance is not None and isinstance(loop, asyncio.AbstractEventLoop):
        return instance, loop  # a PulseDBSync
    return db, None
