"""UUIDv7 ids and packed HLC values: ordering and layout."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.ids import uuid7, uuid7_millis


def test_uuid7_is_version_7_rfc_variant_and_strictly_increasing() -> None:
    before = time.time_ns() // 1_000_000
    ids = [uuid7() for _ in range(20_000)]  # more than 4096 per millisecond on a fast machine
    after = time.time_ns() // 1_000_000
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert before <= uuid7_millis(ids[0]) and uuid7_millis(ids[-1]) <= after + 1


@given(st.integers(0, 2**47), st.integers(0, ev.HLC_LOGICAL_MAX))
def test_hlc_packing_round_trips_and_sorts_like_its_parts(wall: int, logical: int) -> None:
    packed = ev.pack_hlc(wall, logical)
    assert (ev.hlc_millis(packed), ev.hlc_logical(packed)) == (wall, logical)
    assert ev.pack_hlc(wall, min(logical + 1, ev.HLC_LOGICAL_MAX)) >= packed
    assert ev.pack_hlc(wall + 1, 0) > packed


def test_hlc_logical_counter_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="logical counter"):
        ev.pack_hlc(1, ev.HLC_LOGICAL_MAX + 1)


def test_vectors_must_be_one_dimensional() -> None:
    with pytest.raises(ValueError, match="one-dimensional"):
        ev.pack_vector([[1.0, 2.0]])
