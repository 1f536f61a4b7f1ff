"""Benchmarks: one scenario per module, run with `python -m ops.bench.<name>`."""

from __future__ import annotations

import json
from collections.abc import Callable


def emitter(bench: str) -> Callable[..., None]:
    """The ``emit(figure, **values)`` of a benchmark: one JSON line per figure, named
    by ``bench``, printed at once."""

    def emit(figure: str, **values: object) -> None:
        print(json.dumps({"bench": bench, "figure": figure, **values}), flush=True)

    return emit
