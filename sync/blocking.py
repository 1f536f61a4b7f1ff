"""The blocking facade: the same instance for code that is not async.

``PulseDBSync.open(data_dir, nats_url=None)`` runs a ``PulseDB`` on a private event loop
in a background thread; every public coroutine method of ``PulseDB`` is available here
as a plain method with the same name, arguments and result; ``health()`` is the same
too (read on the instance's loop), and ``watch_experiences()`` is a plain iterator.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sync.instance import ExperienceChange, ExperienceWatch, Health, PulseDB


class PulseDBSync:
    def __init__(self, db: PulseDB, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self._db = db
        self._loop = loop
        self._thread = thread

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        nats_url: str | Sequence[str] | None = None,
        **options: Any,
    ) -> PulseDBSync:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="pulse-instance", daemon=True)
        thread.start()
        try:
            db = asyncio.run_coroutine_threadsafe(
                PulseDB.open(data_dir, nats_url, **options), loop
            ).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        return cls(db, loop, thread)

    @property
    def instance_id(self) -> Any:
        return self._db.instance_id

    @property
    def instance(self) -> PulseDB:
        """The instance itself (its coroutine methods run on ``loop`` only)."""
        return self._db

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the instance runs on, in its own thread."""
        return self._loop

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._db, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(method):
            raise AttributeError(name)

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._call(method(*args, **kwargs))

        blocking.__name__ = name
        blocking.__doc__ = method.__doc__
        return blocking

    def health(self) -> Health:
        """Whether the instance is connected and replicating, and how far it applied."""

        async def read() -> Health:  # (on the loop whose state it reads)
            return self._db.health()

        result: Health = self._call(read())
        return result

    def watch_experiences(self) -> Iterator[ExperienceChange]:
        """Changes as they are applied, from the moment of this call: a plain iterator."""
        changes: queue.Queue[ExperienceChange | None] = queue.Queue()

        async def start() -> ExperienceWatch:
            return self._db.watch_experiences()

        watch = self._call(start())  # registered before this returns

        async def pump() -> None:
            try:
                async for change in watch:
                    changes.put(change)
            finally:
                changes.put(None)

        asyncio.run_coroutine_threadsafe(pump(), self._loop)

        def iterate() -> Iterator[ExperienceChange]:
            while (change := changes.get()) is not None:
                yield change

        return iterate()

    def close(self) -> None:
        async def shut() -> None:
            await self._db.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        try:
            self._call(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()

    def __enter__(self) -> PulseDBSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
