"""Idempotent writes: a call retried after its answer was lost is stored once.

Every public write method takes ``idempotency_key=`` (keyword only; 1..200 printable
characters, e.g. a UUID the client made). With a key, the ids the call draws (its
events' ids, and a new entity's id) are derived from the key instead of being random,
and each event carries a fingerprint of the call (method and arguments, defaults
filled in). So a retry publishes the same event ids again, and:

- within the stream's duplicate window (``StreamSettings.duplicate_window``, 120 s by
  default) JetStream keeps the first copy, on whatever host the retry arrives; the
  retry compares fingerprints (``EventLog.append_keyed``): the same call returns the
  first call's result and stores nothing new, another call under the same key is a
  ``ConflictError``;
- the instance that served the call also remembers its last ``REMEMBERED`` keys with
  their fingerprints and results, so a retry there answers from memory even after the
  window;
- past both, a retried create names the entity id the first call made (the fold keeps
  one entity), a retried update, archive or delete writes what it wrote before; only a
  reinforcement retried on another host past the window counts again.

A key must not be reused for a different call: that is what ``ConflictError`` reports
while the key is remembered. Keys are per principal: the same key given by two
principals names two calls.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import msgspec
import numpy as np

from eventlog.errors import ValidationError

P = ParamSpec("P")
T = TypeVar("T")

KEY_MAX = 200  # characters of an idempotency key
REMEMBERED = 10_000  # keys an instance remembers with their results


@dataclass(slots=True)
class KeyedCall:
    """The idempotent call in progress (in a context variable, so concurrent calls on
    one instance each draw their own ids)."""

    key: str
    fingerprint: str
    drawn: int = 0
    results: dict[str, Any] = field(default_factory=dict)

    def next_id(self) -> UUID:
        """The next id of this call: the same sequence for every retry of it."""
        self.drawn += 1
        digest = hashlib.sha256(f"pulse-idempotency\0{self.key}\0{self.drawn}".encode()).digest()
        raw = bytearray(digest[:16])
        raw[6] = (raw[6] & 0x0F) | 0x80  # version 8: custom
        raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
        return UUID(bytes=bytes(raw))


CURRENT: contextvars.ContextVar[KeyedCall | None] = contextvars.ContextVar(
    "pulse_idempotent_call", default=None
)


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= KEY_MAX or not key.isprintable():
        shown = repr(key) if not isinstance(key, str) else f"{len(key)} characters"
        raise ValidationError(
            f"idempotency_key: must be 1..{KEY_MAX} printable characters, got {shown}"
        )
    return key


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_plain, order="sorted")


def fingerprint(method: str, arguments: dict[str, Any]) -> str:
    """What a call was asked to do: its method and arguments, as a digest."""
    body = _encoder.encode([method, arguments])
    return hashlib.sha256(body).hexdigest()[:32]


def _scoped(principal: Any, key: str) -> str:
    """A key in the namespace of the principal that gives it (``sync.access``): its owner,
    agent, scope and collectives. Two principals' keys never meet, so one cannot read the
    other's answers by reusing a key (an answer remembered here is given without running
    the call's checks again), nor collide with its derived ids. The local operator's keys
    stay as given."""
    if principal.local:
        return key
    limited = ",".join(sorted(map(str, principal.collectives or ())))
    return (
        f"{principal.owner}\x1f{principal.agent or ''}\x1f{principal.scope}\x1f{limited}\x1f{key}"
    )


def idempotent(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Make a write method honour ``idempotency_key=`` (which it must declare, keyword
    only, and leave alone): see the module docstring. The method's object has the
    ``writer`` of its instance (``sync.writer.Writer``)."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    async def keyed(*args: P.args, **kwargs: P.kwargs) -> T:
        key = kwargs.get("idempotency_key")
        if key is None or CURRENT.get() is not None:  # not keyed, or inside a keyed call
            return await method(*args, **kwargs)
        key = check_key(key)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        instance = arguments.pop("self")
        arguments.pop("idempotency_key", None)
        for name, param in signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        print_ = fingerprint(method.__name__, arguments)
        writer = instance.writer  # (sync.writer: the results of the last keyed calls)
        key = _scoped(writer.me(), key)
        remembered = writer.remembered(key)
        if remembered is not None:
            if remembered[0] != print_:
                raise writer.key_conflict()
            return remembered[1]  # type: ignore[no-any-return]
        token = CURRENT.set(KeyedCall(key, print_))
        try:
            result = await method(*args, **kwargs)
        finally:
            CURRENT.reset(token)
        writer.remember(key, print_, result)
        return result

    return keyed
