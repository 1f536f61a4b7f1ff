"""UUIDv7 identifiers (RFC 9562): time-ordered, so ids sort roughly by creation time.

Python 3.11 has no `uuid.uuid7`; this is the RFC's method 1: 48 bits of Unix
milliseconds, then a 12-bit counter (``rand_a``) that keeps ids from one process
strictly increasing within a millisecond, then 62 random bits.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A new UUIDv7, strictly greater than every earlier one from this process."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x7FF  # leave room to count
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)


def uuid7_millis(value: uuid.UUID) -> int:
    """The Unix milliseconds embedded in a UUIDv7."""
    return value.int >> 80
