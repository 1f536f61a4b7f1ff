"""Pulse as LangGraph's memory: ``PulseSaver``, a checkpointer every host shares, and
``PulseStore``, LangGraph's long-term store over a collective's experiences.

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

``PulseStore`` uses ``record_experience``, ``delete_experience``,
``get_recent_experiences``, ``list_experiences`` and ``search_hybrid`` (its class
docstring says how an item is an experience).

LangGraph's ``thread_id`` is the thread's name in the collective; each checkpoint is
stored whole (its channel values in it, serialized by the saver's ``serde``), as
LangGraph's SQLite saver stores it, so pruning keeps every remaining checkpoint readable.

Sync and async: the async methods run on the loop the instance runs on (the caller's).
The sync ones, which ``graph.invoke`` calls (and a node's ``store.put``), hand the call
to that loop and wait, so they must be called from another thread (LangGraph's own
thread pool, or code that is not async): with ``PulseDBSync`` the instance has a loop of
its own and every thread may.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import json
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
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
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from eventlog.errors import NotFoundError
from eventlog.limits import CONTENT_MAX_BYTES, DOMAIN_MAX, DOMAIN_TAG_MAX, SOURCE_TASK_MAX
from sync.core import holding
from sync.models import K_MAX

T = TypeVar("T")
PAGE = 1000  # checkpoints one list_checkpoints call returns at most (the API's page bound)
NAMES = 1000  # threads or runs one prune or delete call takes at most


class _OnLoop:
    """Calls of a Pulse instance from a LangGraph saver or store: on the instance's loop,
    awaited there or handed to it from another thread."""

    loop: asyncio.AbstractEventLoop | None

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
                "its sync methods need the event loop the instance runs on: make it "
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
            raise RuntimeError(f"{type(self).__name__}: {problem}")
        assert loop is not None
        return asyncio.run_coroutine_threadsafe(_awaited(call), loop).result()


class PulseSaver(_OnLoop, BaseCheckpointSaver[str]):
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
        self.db, self.loop = _bound(db, loop)
        self.collective_id = UUID(str(collective_id))

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


def _bound(
    db: Any, loop: asyncio.AbstractEventLoop | None
) -> tuple[Any, asyncio.AbstractEventLoop | None]:
    """The async instance behind ``db`` and the loop it runs on: its own (PulseDBSync),
    the one given, or the caller's (a saver or store made in async code)."""
    instance, own_loop = _instance_of(db)
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    return instance, own_loop or loop or running


def _instance_of(db: Any) -> tuple[Any, asyncio.AbstractEventLoop | None]:
    """The async instance behind ``db`` and the loop it runs on, when it has its own."""
    instance = getattr(db, "instance", None)
    loop = getattr(db, "loop", None)
    if instance is not None and isinstance(loop, asyncio.AbstractEventLoop):
        return instance, loop  # a PulseDBSync
    return db, None


# -- the store: LangGraph's long-term memory as experiences of a collective ----------------

STORE_CATEGORY = "langgraph.store"  # the Generic experience type's category of an item
ITEM_TAG = "langgraph.store"  # a domain tag every item carries
UNINDEXED_TAG = "langgraph.unindexed"  # an item put with index=False: no query finds it
NAMESPACE_TAG = "ns:"  # + a namespace's labels joined by "." (no label holds a ".")
HASHED_TAG = "ns#"  # + the sha256 of that, when the tag would be longer than a tag may be
POOL = K_MAX  # the most candidates one search of the collective ranks
AT_ONCE = 16  # calls of one batch in flight at once
# the puts and deletes in flight per instance, by address: (lock, holders)
_WRITING: weakref.WeakKeyDictionary[Any, dict[str, tuple[asyncio.Lock, int]]] = (
    weakref.WeakKeyDictionary()
)


class PulseStore(_OnLoop, BaseStore):
    """LangGraph's long-term memory (``BaseStore``) kept as experiences of a Pulse
    collective, so the memories a graph stores are the collective's own: recalled by
    Pulse's hybrid search (the collective's embedder and BM25), and seen by its API, CLI,
    SQL and MCP like any other experience.

        store = PulseStore(db, collective_id)          # a collective with an embedder
        graph = builder.compile(checkpointer=saver, store=store)

    An item is one experience: its content is the item's value as JSON, its type
    ``Generic`` with the category ``"langgraph.store"``, its ``source_task`` the item's
    address (``[namespace, key]`` as JSON, 1,024 characters at most), its domain tags
    ``"langgraph.store"`` and one per level of its namespace (``"ns:users.u1"``), its
    ``valid_from`` the time the item was first put. A put records the new value and then
    deletes the experience it replaces (forgotten as any deleted experience is), so
    ``updated_at`` is the new record's time and ``created_at`` stays the first put's.

    Differences from LangGraph's own stores, each for a reason of Pulse's:
    - a search with a query ranks by meaning and words together (Reciprocal Rank Fusion
      of the collective's vector and BM25 rankings; ``score`` is the fused score,
      weighted by energy if ``energy_weight`` is given), over the whole value: the
      collective embeds an experience's content, so the ``index`` fields of a put are not
      embedded apart; ``index=False`` keeps an item out of searches with a query. It
      ranks the best 1,000 candidates of the prefix: an offset past them finds nothing;
    - a search without a query lists the newest first (by last put);
    - a comparison filter (``$gt`` ...) on a field an item lacks, or holds no number in,
      does not match (LangGraph's memory store raises);
    - no TTL (``supports_ttl`` is False, as for LangGraph's memory store): an item lasts
      until it is deleted;
    - two hosts that put the same key at once may both keep their value for a while: a
      get answers the newest, and the next put or delete of the key removes them all.
    """

    supports_ttl = False

    def __init__(
        self,
        db: Any,
        collective_id: UUID | str,
        *,
        agent: str = "langgraph",
        energy_weight: float = 0.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.db, self.loop = _bound(db, loop)
        self.collective_id = UUID(str(collective_id))
        self.agent = agent
        self.energy_weight = energy_weight
        # one put or delete of an address at a time from every store of this instance
        # (another host's may still race it: see the class docstring); an entry goes
        # with its last holder
        self._writing = _WRITING.setdefault(self.db, {})

    # -- LangGraph's interface ------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._wait(self._batch(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._call(self._batch(list(ops)))

    async def _batch(self, ops: list[Op]) -> list[Result]:
        """Every read of the batch first, then its puts (the last of one address wins),
        as LangGraph's memory store does: a read sees the state before the batch."""
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = [None] * len(ops)
        reads: list[tuple[int, Awaitable[Result]]] = []
        puts: dict[tuple[tuple[str, ...], str], tuple[PutOp, str | None]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                reads.append((i, self._get(op)))
            elif isinstance(op, SearchOp):
                reads.append((i, self._search(op)))
            elif isinstance(op, ListNamespacesOp):
                reads.append((i, self._namespaces(op)))
            elif isinstance(op, PutOp):
                _check_put(op)  # (every put checked before anything is written)
                content = None if op.value is None else _content(op.value)
                puts[(tuple(op.namespace), op.key)] = (op, content)
            else:
                raise TypeError(f"PulseStore: unknown operation {type(op).__name__}")
        answers = await _bounded([call for _, call in reads])
        for (i, _), answer in zip(reads, answers, strict=True):
            results[i] = answer
        await _bounded([self._put(op, content) for op, content in puts.values()])
        return results

    # -- the operations --------------------------------------------------------------------

    async def _get(self, op: GetOp) -> Item | None:
        for found in await self._at(tuple(op.namespace), op.key):
            item = _item(found)
            if item is not None:
                return item
        return None

    async def _put(self, op: PutOp, content: str | None) -> None:
        namespace = tuple(op.namespace)
        address = _address(namespace, op.key)
        async with holding(self._writing, address):
            old = await self._at(namespace, op.key)
            if content is not None:
                tags = [ITEM_TAG, *(_tag(namespace[:n]) for n in range(1, len(namespace) + 1))]
                if op.index is False:
                    tags.append(UNINDEXED_TAG)
                await self.db.record_experience(
                    self.collective_id, content,
                    experience_type={"kind": "Generic", "category": STORE_CATEGORY},
                    domain=tags, source_agent=self.agent, source_task=address,
                    valid_from=min((e.valid_from_ms for e in old), default=None),
                )  # fmt: skip
            await _bounded([self._forget(e.experience_id) for e in old])

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        if op.limit <= 0 or op.offset < 0:
            return []
        flt = {"domains": [_tag(prefix) if prefix else ITEM_TAG], "experience_types": ["Generic"]}
        wanted = op.offset + op.limit
        found: dict[str, tuple[int, SearchItem | None]] = {}  # by address (``_collect``)
        if op.query:
            pool = min(POOL, max(2 * wanted, wanted + 10))
            while True:
                hits = await self.db.search_hybrid(
                    self.collective_id, op.query, k=pool, flt=flt,
                    energy_weight=self.energy_weight,
                )  # fmt: skip
                found.clear()
                for hit in hits:
                    if UNINDEXED_TAG in hit.experience.domain:
                        continue
                    self._collect(found, hit.experience, prefix, op.filter, hit.score)
                if _count(found) >= wanted or len(hits) < pool or pool >= POOL:
                    break
                pool = min(POOL, 4 * pool)
        else:
            offset = 0
            while _count(found) < wanted:
                page = await self.db.get_recent_experiences(
                    self.collective_id, K_MAX, flt, offset=offset
                )
                for experience in page:
                    self._collect(found, experience, prefix, op.filter, None)
                if len(page) < K_MAX:
                    break
                offset += len(page)
        ranked = [item for _, item in found.values() if item is not None]
        return ranked[op.offset : wanted]

    async def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        seen: set[tuple[str, ...]] = set()
        offset = 0
        while True:
            page = await self.db.list_experiences(
                self.collective_id, limit=K_MAX, offset=offset,
                flt={"domains": [ITEM_TAG], "experience_types": ["Generic"]},
            )  # fmt: skip
            for experience in page:
                address = _parsed(experience)
                if address is not None:
                    seen.add(address[0])
            if len(page) < K_MAX:
                break
            offset += len(page)
        chosen = [ns for ns in seen if all(_matches(c, ns) for c in op.match_conditions or ())]
        if op.max_depth is not None:
            chosen = list({ns[: op.max_depth] for ns in chosen})
        return sorted(chosen)[op.offset : op.offset + op.limit]

    # -- helpers -----------------------------------------------------------------------------

    async def _at(self, namespace: tuple[str, ...], key: str) -> list[Any]:
        """The live experiences of an item's address, newest first (one, unless two hosts
        put the key at once)."""
        address = _address(namespace, key)
        page = await self.db.get_recent_experiences(
            self.collective_id, 100,
            {"source_task": address, "experience_types": ["Generic"], "domains": [ITEM_TAG],
             "include_archived": True, "include_invalid": True},
        )  # fmt: skip
        return [e for e in page if _parsed(e) == (namespace, key)]

    def _collect(
        self,
        found: dict[str, tuple[int, SearchItem | None]],
        experience: Any,
        prefix: tuple[str, ...],
        flt: dict[str, Any] | None,
        score: float | None,
    ) -> None:
        """Add an experience's item to ``found`` (by address: its time, and the item or
        None when it does not pass ``flt``) if it is an item under ``prefix``. Of two
        values of one address (two hosts' puts at once), the newer is the item's, in the
        place the first one seen took."""
        address = _parsed(experience)
        if address is None or address[0][: len(prefix)] != prefix:
            return
        key, when = experience.source_task, experience.timestamp_ms
        if key in found and found[key][0] >= when:
            return  # (a newer value of this address was seen)
        item = _scored(experience, score)
        found[key] = (when, item if item is not None and _passes(item.value, flt) else None)

    async def _forget(self, experience_id: UUID) -> None:
        try:
            await self.db.delete_experience(experience_id)
        except NotFoundError:
            pass  # (already deleted: by another host's put or delete of the same key)


def _count(found: dict[str, tuple[int, SearchItem | None]]) -> int:
    return sum(1 for _, item in found.values() if item is not None)


def _check_put(op: PutOp) -> None:
    """A put LangGraph's own ``put`` would refuse, refused here too (a batch skips it)."""
    if not op.namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    if op.namespace[0] == "langgraph":
        raise InvalidNamespaceError(
            f'Root label for namespace cannot be "langgraph". Got: {op.namespace}'
        )
    if op.ttl is not None:
        raise NotImplementedError("PulseStore: TTL is not supported (an item lasts until deleted)")
    if not isinstance(op.key, str) or not op.key:
        raise ValueError(f"key: must be a non-empty string, got {op.key!r:.60}")
    if len(op.namespace) > DOMAIN_MAX - 2:
        raise ValueError(
            f"namespace: at most {DOMAIN_MAX - 2} labels (one domain tag each), "
            f"got {len(op.namespace)}"
        )
    _address(tuple(op.namespace), op.key)
    if op.value is not None and not isinstance(op.value, Mapping):
        raise ValueError(
            f"value: must be a dict (or None to delete), got {type(op.value).__name__}"
        )


def _address(namespace: tuple[str, ...], key: str) -> str:
    """An item's address as its experience's source_task."""
    address = json.dumps([list(namespace), key], ensure_ascii=False, separators=(",", ":"))
    if len(address) > SOURCE_TASK_MAX:
        raise ValueError(
            f"namespace and key: at most {SOURCE_TASK_MAX:,} characters together as JSON "
            f"(the item's address), got {len(address):,}"
        )
    return address


def _parsed(experience: Any) -> tuple[tuple[str, ...], str] | None:
    """The address of an item's experience, or None for any other experience."""
    kind = experience.experience_type
    category = kind.get("category") if isinstance(kind, dict) else getattr(kind, "category", None)
    if category != STORE_CATEGORY or not experience.source_task:
        return None
    try:
        namespace, key = json.loads(experience.source_task)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, str) or not isinstance(namespace, list):
        return None
    if not all(isinstance(label, str) for label in namespace):
        return None
    return tuple(namespace), key


def _content(value: Mapping[str, Any]) -> str:
    try:
        content = json.dumps(dict(value), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"value: must be JSON (a dict of JSON values): {exc}") from None
    size = len(content.encode())
    if size > CONTENT_MAX_BYTES:
        raise ValueError(
            f"value: at most {CONTENT_MAX_BYTES:,} bytes as JSON (an experience's content), "
            f"got {size:,}"
        )
    return content


def _tag(prefix: tuple[str, ...]) -> str:
    joined = ".".join(prefix)
    tag = NAMESPACE_TAG + joined
    if len(tag) > DOMAIN_TAG_MAX:
        tag = HASHED_TAG + hashlib.sha256(joined.encode()).hexdigest()
    return tag


def _fields(experience: Any) -> dict[str, Any] | None:
    """An item's fields from its experience; None when it is no item's, or its content
    is not a JSON object (an experience written by other hands)."""
    address = _parsed(experience)
    if address is None:
        return None
    try:
        value = json.loads(experience.content)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {
        "namespace": address[0],
        "key": address[1],
        "value": value,
        "created_at": _moment(experience.valid_from_ms or experience.timestamp_ms),
        "updated_at": _moment(experience.timestamp_ms),
    }


def _item(experience: Any) -> Item | None:
    fields = _fields(experience)
    return None if fields is None else Item(**fields)


def _scored(experience: Any, score: float | None) -> SearchItem | None:
    fields = _fields(experience)
    return None if fields is None else SearchItem(**fields, score=score)


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _passes(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    """Whether an item's value passes a search's filter: each key a field (nested dicts
    compared field by field), each value equal, or operators on it."""
    return not flt or all(_holds(value.get(k), wanted) for k, wanted in flt.items())


_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


def _holds(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict) and any(str(k).startswith("$") for k in wanted):
        return all(_compares(value, name, operand) for name, operand in wanted.items())
    if isinstance(wanted, dict):
        return isinstance(value, dict) and all(_holds(value.get(k), w) for k, w in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_holds(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _compares(value: Any, name: str, operand: Any) -> bool:
    if name == "$eq":
        return bool(value == operand)
    if name == "$ne":
        return bool(value != operand)
    if name not in _OPERATORS:
        raise ValueError(f"filter: unknown operator {name!r:.40}; use one of {_OPERATORS}")
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False  # (a field missing, or not a number: no match)
    if name == "$gt":
        return left > right
    if name == "$gte":
        return left >= right
    if name == "$lt":
        return left < right
    return left <= right


def _matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether a namespace matches a list_namespaces condition ("*" matches any label)."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        part = namespace[: len(path)]
    elif condition.match_type == "suffix":
        part = namespace[len(namespace) - len(path) :]
    else:
        raise ValueError(f"match_type: must be 'prefix' or 'suffix', got {condition.match_type!r}")
    return all(p == "*" or p == label for p, label in zip(path, part, strict=True))


async def _bounded(calls: Sequence[Awaitable[T]]) -> list[T]:
    """The answers of ``calls``, in order, at most ``AT_ONCE`` of them in flight."""
    if len(calls) <= 1:
        return [await call for call in calls]
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))
