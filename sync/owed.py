"""Purges an instance owes: forgetting that survives a crash.

A delete appends a tombstone and then purges what came before it from the stream. A
process killed between the two would leave the deleted content in the log with nothing
to say so. So a delete first records what it owes here (a small JSON file in the data
directory, replaced atomically and flushed to disk before the tombstone is appended),
and clears the entry once the purge is done; an instance that opens finishes every
entry it finds (``sync.forgetting.Forgetting._finish_owed_purges``). An entry holds
what finishing needs and nothing more: the tombstone itself (appending it again is
harmless: JetStream or the fold drops the copy), or a collective to delete again, or a
subject and sequence to purge.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from eventlog.ids import uuid7


class OwedPurges:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        try:
            found = json.loads(path.read_text())
            if isinstance(found, dict):
                self._entries = {str(k): v for k, v in found.items() if isinstance(v, dict)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:  # never written half (see _save): say so loudly
            raise RuntimeError(f"{path}: unreadable record of owed purges: {exc}") from exc

    def owe(self, entry: dict[str, Any]) -> str:
        """Record a purge owed (on disk before this returns); returns its token."""
        token = str(uuid7())
        with self._lock:
            self._entries[token] = entry
            self._save()
        return token

    def paid(self, token: str) -> None:
        with self._lock:
            if self._entries.pop(token, None) is not None:
                self._save()

    def pending(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return list(self._entries.items())

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump(self._entries, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
