"""One property test per law: the merges of the G-counter and the LWW register the fold
is built from are commutative, associative and idempotent (stamps are the fold's bytes);
the fold's application rows are G-counter entries; the hybrid logical clock is monotonic
across restarts and skewed wall clocks."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.events import HLC_LOGICAL_MAX, hlc_millis, pack_hlc
from projections import fold
from projections.crdt import NO_STAMP, GCounter, LWWRegister
from sync.hlc import MAX_AHEAD_MS, HybridClock

actors = st.sampled_from([UUID(int=i) for i in range(1, 5)])
counters = st.dictionaries(actors, st.integers(0, 50)).map(GCounter)
EXPERIENCE = UUID(int=0xE0)


def write(hlc: int, instance: UUID, event: UUID) -> ev.ExperienceArchived:
    return ev.ExperienceArchived(
        event_id=event, instance_id=instance, hlc=hlc, experience_id=EXPERIENCE,
        collective_id=UUID(int=0xC0),
    )  # fmt: skip


# small ranges, so that stamps share their HLC, their instance or both
stamps = st.just(NO_STAMP) | st.builds(
    write, st.integers(0, 3), actors, st.sampled_from([UUID(int=i) for i in range(4)])
).map(fold.stamp_of)
registers = st.builds(LWWRegister, st.integers(0, 3), stamps)


def join(a: GCounter, b: GCounter) -> GCounter:
    return a.copy().merge(b)


@given(counters, counters)
def test_gcounter_merge_is_commutative(a: GCounter, b: GCounter) -> None:
    assert join(a, b) == join(b, a)


@given(counters, counters, counters)
def test_gcounter_merge_is_associative(a: GCounter, b: GCounter, c: GCounter) -> None:
    assert join(join(a, b), c) == join(a, join(b, c))


@given(counters, counters)
def test_gcounter_merge_is_idempotent(a: GCounter, b: GCounter) -> None:
    assert join(a, a) == a
    assert join(join(a, b), b) == join(a, b)


@given(counters, actors, st.integers(-2, 60))
def test_gcounter_merges_one_entry_like_a_counter_of_one(
    a: GCounter, actor: UUID, total: int
) -> None:
    grown = a.copy()
    growth = grown.merge_entry(actor, total)
    assert grown == join(a, GCounter({actor: total}))
    assert growth == grown.value - a.value >= 0
    assert grown.merge_entry(actor, total) == 0  # a redelivered total counts once


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


@given(st.lists(st.tuples(actors, st.integers(0, 9), st.integers(0, 20)), min_size=1))
def test_the_folded_application_rows_are_the_entries_of_a_gcounter(
    reports: list[tuple[UUID, int, int]],
) -> None:
    """What an engine keeping per-experience totals does (one ``GCounter``, fed the
    folded rows) agrees with the G-counter of the totals the instances reported."""
    state = fold.FoldState()
    reported = GCounter()
    for seq, (instance, total, hlc) in enumerate(reports):
        state.apply(
            ev.ExperienceReinforced(
                event_id=UUID(int=seq), instance_id=instance, hlc=hlc, experience_id=EXPERIENCE,
                collective_id=UUID(int=0xC0), applications=total,
            )
        )  # fmt: skip
        reported.merge_entry(instance, total)
    kept = GCounter()
    for row in state.rows[fold.ApplicationRow].values():
        assert isinstance(row, fold.ApplicationRow)
        kept.merge_entry(row.instance_id, row.applications)
    assert kept == reported and kept.value == reported.value


@given(
    st.lists(st.integers(0, 1_000), min_size=1, max_size=50),
    st.lists(st.integers(0, 2**40), max_size=10),
)
def test_hlc_is_monotonic_whatever_the_wall_clock_does(walls: list[int], seen: list[int]) -> None:
    readings = iter(walls + [walls[-1]] * 200)
    clock = HybridClock(wall=lambda: next(readings))
    issued: list[int] = []
    taken: list[int] = []
    for i in range(len(walls)):
        if i < len(seen):
            if clock.observe(seen[i]):
                taken.append(seen[i])
            else:  # refused only when too far ahead of every wall reading
                assert hlc_millis(seen[i]) > min(walls) + MAX_AHEAD_MS
        issued.append(clock.now())
        assert issued[-1] > max(taken, default=0)
    assert issued == sorted(issued) and len(set(issued)) == len(issued)
    # a value within the bound of the wall clock is always taken in
    near = pack_hlc(walls[-1] + MAX_AHEAD_MS // 2, 0)
    assert clock.observe(near) and clock.now() > near


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


def test_a_saved_clock_from_the_future_is_not_kept_across_a_restart(tmp_path: Path) -> None:
    """A clock file holding a value far ahead of the wall clock (older versions took in
    any remote clock, e.g. 2**63-1) would stamp every later write too far ahead for any
    host to accept: the restarted clock starts from the wall clock instead."""
    state = tmp_path / "clock.json"
    state.write_text(f'{{"hlc": {2**63 - 1}}}')
    clock = HybridClock(wall=lambda: 1_000_000, state_file=state)
    assert hlc_millis(clock.now()) == 1_000_000
    restarted = HybridClock(wall=lambda: 1_000_000, state_file=state)
    assert 1_000_000 <= hlc_millis(restarted.now()) <= 1_000_000 + MAX_AHEAD_MS


def test_restarts_after_clean_stops_do_not_push_the_clock_ahead(tmp_path: Path) -> None:
    """Each incarnation (a CLI command) issues one value and stops cleanly: the clock
    stays at the wall clock however many times it restarts within one millisecond."""
    state = tmp_path / "clock.json"
    issued = []
    for _ in range(20):
        clock = HybridClock(wall=lambda: 1_000_000, state_file=state)
        issued.append(clock.now())
        clock.close()
    assert issued == sorted(set(issued))
    assert hlc_millis(issued[-1]) == 1_000_000
