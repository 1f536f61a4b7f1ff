"""The DuckDB projection is order-free too: any delivery order, duplicates and batch
boundaries give the same digest, and the stored rows equal the plain model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.log import LogEntry
from eventlog.sealing import seal_with, sealed_name, tombstone_name
from projections import fold
from projections.projection import Projection
from tests.harness import by_profile
from tests.histories import creates_in_two_collectives, histories, redeliveries, stored_model


def entries(events: list[ev.Event]) -> list[LogEntry]:
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=1)]


@settings(max_examples=by_profile(ci=12, dev=50))  # each example ~0.6 CPU-s
@given(st.data())
def test_any_delivery_gives_the_same_digest_and_the_model_state(data: st.DataObject) -> None:
    events = data.draw(histories)
    # the first create on the stream fixes an entity's collective: with creates naming
    # two collectives, which is first depends on the order (tests/test_hostile.py)
    assume(not creates_in_two_collectives(events))
    again = data.draw(redeliveries(events))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(again)), max_size=6)))
    with tempfile.TemporaryDirectory() as tmp:
        ordered = Projection(Path(tmp) / "ordered")
        ordered.apply(entries(events))
        shuffled = Projection(Path(tmp) / "shuffled")
        delivered = entries(again)
        # the engine writes DuckDB every flush interval, so between any two batches: a
        # row written before its create came (a change delivered first) is replaced
        # when the create comes, a row created since is added once
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            shuffled.apply(delivered[start:end])
            shuffled.flush()
        assert shuffled.digest() == ordered.digest()
        assert shuffled.store.checkpoint() == (len(again), len(again))
        expected = stored_model(events)
        for row_type in fold.ROW_TYPES:
            stored = ordered.store.rows(row_type)
            for row in stored.values():  # stamped from the stream, which bare events lack
                if isinstance(row, fold.Placed):
                    row.create_seq = None
            assert stored == expected[row_type], row_type.__name__
            for k, row in stored.items():  # the same Python types, not only equal values
                model = expected[row_type][k]
                for name in row.__dataclass_fields__:
                    assert type(getattr(row, name)) is type(getattr(model, name)), name
        assert shuffled.store.checkpoint() == (len(again), len(again))
        ordered.close()
        shuffled.close()


def test_reapplying_an_old_batch_changes_nothing(tmp_path: Path) -> None:
    from tests import factories as f

    cid = f.uuid7()
    batch = entries([f.collective(cid), f.experience(cid), f.experience(cid)])
    projection = Projection(tmp_path)
    projection.apply(batch)
    before = (projection.digest(), projection.store.checkpoint())
    projection.apply(batch)  # redelivered after a reconnect: below the checkpoint
    assert (projection.digest(), projection.store.checkpoint()) == before
    projection.close()


@settings(max_examples=by_profile(ci=12, dev=50))  # each example ~0.6 CPU-s
@given(st.data())
def test_events_sealed_with_a_destroyed_key_fold_as_if_purged(data: st.DataObject) -> None:
    """What a host reads of a deleted entity whose key is destroyed (its events still
    sealed: ``eventlog.sealing``) folds to nothing, in any order, with any duplicates:
    the same state as the log with those events purged."""
    events = data.draw(histories)
    assume(not creates_in_two_collectives(events))
    names = sorted({n for n in map(sealed_name, events) if n is not None})
    # the entities whose keys are destroyed: those deleted, and any others drawn (the
    # fold must not care why a box does not open)
    deleted = {n for n in map(tombstone_name, events) if n is not None}
    deleted |= data.draw(st.sets(st.sampled_from(names))) if names else set()
    key = data.draw(st.binary(min_size=32, max_size=32))  # no host has it: destroyed

    def sealed(event: ev.Event) -> ev.Event | None:
        name = sealed_name(event)
        return seal_with(event, key, name) if name in deleted and name is not None else None

    shredded = [sealed(e) or e for e in events]
    purged = [e for e in events if sealed(e) is None]
    again = data.draw(redeliveries(shredded))
    with tempfile.TemporaryDirectory() as tmp:
        read = Projection(Path(tmp) / "sealed")
        read.apply(entries(again))
        clean = Projection(Path(tmp) / "purged")
        clean.apply(entries(purged))
        assert read.digest() == clean.digest()
        read.close()
        clean.close()


def test_a_row_written_before_its_create_is_replaced_by_it(tmp_path: Path) -> None:
    from tests import factories as f

    cid = f.uuid7()
    recorded = f.experience(cid, "the create comes last")
    updated = ev.ExperienceUpdated(
        event_id=f.uuid7(), instance_id=f.INSTANCE, hlc=recorded.hlc + 1,
        experience_id=recorded.experience_id, collective_id=cid, importance=0.9,
    )  # fmt: skip
    projection = Projection(tmp_path / "state")
    projection.apply(entries([f.collective(cid), updated]))
    projection.flush()  # the row, without its create
    projection.apply([LogEntry(3, "pulse.test", recorded)])
    projection.flush()
    found = projection.store.con.execute(
        "SELECT content, importance, create_seq FROM experience_rows"
    ).fetchall()
    assert found == [("the create comes last", 0.9, 3)]
    assert projection.store.checkpoint() == (3, 3)
    projection.close()
    reopened = Projection(tmp_path / "state")
    assert reopened.memory.experiences[(recorded.experience_id,)].content == recorded.content
    reopened.close()


def _latest_hlc(rows: dict[type[fold.Row], dict[object, fold.Row]]) -> int:
    """The model's largest HLC of anything folded: every row's creation or last report,
    and the HLC at the head of every register's stamp (tokens aside)."""
    best = 0
    for row_type, table in rows.items():
        if row_type is fold.TokenRow:
            continue
        for row in table.values():
            for name in row.__dataclass_fields__:
                value = getattr(row, name)
                if name in ("created_hlc", "last_hlc") and value is not None:
                    best = max(best, value)
                elif name.endswith("_stamp") and value:
                    best = max(best, int.from_bytes(value[:8], "big"))
    return best


@settings(max_examples=by_profile(ci=10, dev=40))
@given(histories)
def test_the_clock_restarts_past_the_largest_hlc_folded(events: list[ev.Event]) -> None:
    """What a restarted host's clock starts past (``MemoryState.max_hlc``, read in one
    pass a column): the model's largest HLC, after the fold and after an open."""
    # the model takes the smallest create event id for an entity created in two
    # collectives, the projection the first on the stream (tests/test_hostile.py)
    assume(not creates_in_two_collectives(events))
    expected = _latest_hlc(stored_model(events))
    with tempfile.TemporaryDirectory() as tmp:
        projection = Projection(Path(tmp) / "p")
        projection.apply(entries(events))
        assert projection.memory.max_hlc() == expected
        projection.close()
        reopened = Projection(Path(tmp) / "p")
        assert reopened.memory.max_hlc() == expected
        reopened.close()
