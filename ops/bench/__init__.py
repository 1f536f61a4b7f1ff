"""Benchmarks: one scenario per module, run with `python -m ops.bench.<name>`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence


def emitter(bench: str) -> Callable[..., None]:
    """The ``emit(figure, **values)`` of a benchmark: one JSON line per figure, named
    by ``bench``, printed at once."""

    def emit(figure: str, **values: object) -> None:
        print(json.dumps({"bench": bench, "figure": figure, **values}), flush=True)

    return emit


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Rows under a header, in columns as wide as their widest cell (for stderr)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
