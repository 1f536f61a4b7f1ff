"""The fold is a join-semilattice: laws of the merge, order- and duplicate-freedom, and
agreement with the plain model in tests/histories.py (written from the specification,
sharing no code with the fold)."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from projections import fold
from tests.histories import EVENTS, histories, later, model, redeliveries


def folded(events: list[ev.Event]) -> fold.FoldState:
    state = fold.FoldState()
    for event in events:
        state.apply(event)
    return state


def same_key_rows(events: list[ev.Event]) -> list[fold.Row]:
    rows = [r for r in map(fold.row_of, events) if r is not None]
    if not rows:
        return []
    first = rows[0]
    return [r for r in rows if type(r) is type(first) and r.key() == first.key()]


def join(a: fold.Row, b: fold.Row) -> fold.Row:
    return a.copy().merge(b)


@given(st.lists(EVENTS, min_size=2, max_size=12))
def test_merge_is_commutative(events: list[ev.Event]) -> None:
    rows = same_key_rows(events)
    for a in rows:
        for b in rows:
            assert join(a, b) == join(b, a)


@given(st.lists(EVENTS, min_size=3, max_size=12))
def test_merge_is_associative(events: list[ev.Event]) -> None:
    rows = same_key_rows(events)
    for a, b, c in zip(rows, rows[1:], rows[2:], strict=False):
        assert join(join(a, b), c) == join(a, join(b, c))


@given(st.lists(EVENTS, min_size=1, max_size=12))
def test_merge_is_idempotent(events: list[ev.Event]) -> None:
    rows = same_key_rows(events)
    for a in rows:
        assert join(a, a) == a
        for b in rows:
            once = join(a, b)
            assert join(once, b) == once


@given(EVENTS, EVENTS)
def test_stamps_order_writes_by_hlc_then_instance_then_event(a: ev.Event, b: ev.Event) -> None:
    assert (fold.stamp_of(a) < fold.stamp_of(b)) == (later(a) < later(b))


@given(st.data())
def test_any_order_with_duplicates_folds_to_the_same_state(data: st.DataObject) -> None:
    events = data.draw(histories)
    again = data.draw(redeliveries(events))
    assert folded(again).rows == folded(events).rows


@given(histories)
def test_fold_matches_the_plain_model(events: list[ev.Event]) -> None:
    assert folded(events).rows == model(events)


@given(st.data())
def test_batches_fold_like_one_batch(data: st.DataObject) -> None:
    """Merging per-batch states (what the store does with its rows) equals one fold."""
    events = data.draw(histories)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=4)))
    state = fold.FoldState()
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        state.merge(folded(events[start:end]))
    assert state.rows == folded(events).rows


CREATES = (
    ev.CollectiveCreated, ev.ExperienceRecorded, ev.RelationStored, ev.InsightStored,
    ev.WisdomStored,
)  # fmt: skip


# (five of the history's event kinds are creates: the filter drops most draws by design,
# which hypothesis' filter health check sometimes refuses on a slow, shared machine)
@settings(suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(EVENTS.filter(lambda e: isinstance(e, CREATES)), st.integers(1, 10**6))
def test_one_create_stamped_twice_folds_alike_in_either_order(
    event: ev.Event, later_ms: int
) -> None:
    """An idempotent call retried past the duplicate window stores its create again
    under the same event id with a new stamp: either order folds to the same rows,
    whose create is the first one (its stamp, its time)."""
    again = msgspec.structs.replace(event, hlc=event.hlc + (later_ms << ev.HLC_LOGICAL_BITS))
    rows = folded([event, again]).rows
    assert rows == folded([again, event]).rows
    (row,) = [r for table in rows.values() for r in table.values()]
    assert (row.create_event, row.created_hlc) == (event.event_id, event.hlc)  # type: ignore[attr-defined]
