"""Pages of a listing: ``Page`` (a list, and the cursor of the page after it) and
``PAGE_MAX``. Apart from ``sync.models`` (pydantic), so that a client decoding a page,
such as the CLI through a running service, does not import the API's input models."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

PAGE_MAX = 1000  # items per page of a listing, at most (a limit of the API)

T = TypeVar("T")


class Page(list[T]):
    """One page of a listing: a list of at most ``limit`` items, and ``next``, the cursor
    of the page after it (pass it as ``after=``), or None when this page is the last.

    Cursors are keyset cursors (the sort key of the last item, opaque to callers): a page
    never repeats an item of an earlier page, and an item that stays put while a caller
    pages is listed exactly once, whatever else is written meanwhile."""

    def __init__(self, items: Iterable[T] = (), next: str | None = None) -> None:
        super().__init__(items)
        self.next = next

    def __repr__(self) -> str:
        return f"Page({list.__repr__(self)}, next={self.next!r})"
