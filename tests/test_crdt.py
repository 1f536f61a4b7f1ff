"""One property test per law: G-counter and LWW register merges are commutative,
associative and idempotent; the hybrid logical clock is monotonic across restarts and
skewed wall clocks."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog.events import HLC_LOGICAL_MAX, hlc_millis, pack_hlc
from sync.crdt import GCounter, LWWRegister
from sync.hlc import HybridClock

actors = st.sampled_from([UUID(int=i) for i in range(1, 5)])
counters = st.dictionaries(actors, st.integers(0, 50)).map(GCounter)
stamps = st.tuples(st.integers(0, 20), actors, st.sampled_from([UUID(int=i) for i in range(9)]))
registers = st.builds(LWWRegister, st.integers(0, 3), stamps)


@given(counters, counters)
def test_gcounter_merge_is_commutative(a: GCounter, b: GCounter) -> None:
    assert a.merge(b) == b.merge(a)


@given(counters, counters, counters)
def test_gcounter_merge_is_associative(a: GCounter, b: GCounter, c: GCounter) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@given(counters, counters)
def test_gcounter_merge_is_idempotent(a: GCounter, b: GCounter) -> None:
    assert a.merge(a) == a
    assert a.merge(b).merge(b) == a.merge(b)


@given(counters, actors, st.integers(0, 5))
def test_gcounter_increments_survive_any_merge(a: GCounter, actor: UUID, by: int) -> None:
    grown = a.increment(actor, by)
    assert grown.value == a.value + by
    assert grown.merge(a) == grown and a.merge(grown) == grown


def test_gcounter_never_shrinks() -> None:
    with pytest.raises(ValueError, match="only grows"):
        GCounter().increment(UUID(int=1), -1)


@given(registers, registers)
def test_lww_merge_is_commutative(a: LWWRegister[int], b: LWWRegister[int]) -> None:
    if a.stamp == b.stamp:  # one stamp names one write: equal stamps carry equal values
        b = LWWRegister(a.value, b.stamp)
    assert a.merge(b) == b.merge(a)


@given(registers, registers, registers)
def test_lww_merge_is_associative(
    a: LWWRegister[int], b: LWWRegister[int], c: LWWRegister[int]
) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@given(registers, registers)
def test_lww_merge_is_idempotent(a: LWWRegister[int], b: LWWRegister[int]) -> None:
    assert a.merge(a) == a
    assert a.merge(b).merge(b) == a.merge(b)


@given(
    st.lists(st.integers(0, 1_000), min_size=1, max_size=50),
    st.lists(st.integers(0, 2**40), max_size=10),
)
def test_hlc_is_monotonic_whatever_the_wall_clock_does(walls: list[int], seen: list[int]) -> None:
    readings = iter(walls + [walls[-1]] * 200)
    clock = HybridClock(wall=lambda: next(readings))
    issued = []
    for i in range(len(walls)):
        if i < len(seen):
            clock.observe(seen[i])
        issued.append(clock.now())
        assert issued[-1] > max(seen[: i + 1], default=0)
    assert issued == sorted(issued) and len(set(issued)) == len(issued)


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_hlc_is_monotonic_across_restarts(
    tmp_path_factory: pytest.TempPathFactory, before: int, after: int
) -> None:
    state = tmp_path_factory.mktemp("clock") / "clock.json"
    first = HybridClock(wall=lambda: before, state_file=state)
    last_issued = [first.now() for _ in range(3)][-1]
    restarted = HybridClock(wall=lambda: after, state_file=state)  # the wall may have gone back
    assert restarted.now() > last_issued


def test_hlc_borrows_a_millisecond_when_the_logical_counter_is_full(tmp_path: Path) -> None:
    clock = HybridClock(wall=lambda: 5)
    clock.observe(pack_hlc(5, HLC_LOGICAL_MAX))
    assert clock.now() == pack_hlc(6, 0) and hlc_millis(clock.last) == 6
