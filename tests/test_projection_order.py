"""The DuckDB projection is order-free too: any delivery order, duplicates and batch
boundaries give the same digest, and the stored rows equal the plain model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eventlog import events as ev
from eventlog.log import LogEntry
from projections import fold
from projections.projection import Projection
from tests.histories import creates_in_two_collectives, histories, redeliveries, stored_model


def entries(events: list[ev.Event]) -> list[LogEntry]:
    return [LogEntry(seq, "pulse.test", event) for seq, event in enumerate(events, start=1)]


@settings(max_examples=25)
@given(st.data())
def test_any_delivery_gives_the_same_digest_and_the_model_state(data: st.DataObject) -> None:
    events = data.draw(histories)
    # the first create on the stream fixes an entity's collective: with creates naming
    # two collectives, which is first depends on the order (tests/test_hostile.py)
    assume(not creates_in_two_collectives(events))
    again = data.draw(redeliveries(events))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(again)), max_size=4)))
    with tempfile.TemporaryDirectory() as tmp:
        ordered = Projection(Path(tmp) / "ordered")
        ordered.apply(entries(events))
        shuffled = Projection(Path(tmp) / "shuffled")
        delivered = entries(again)
        for start, end in zip([0, *cuts], [*cuts, len(delivered)], strict=True):
            shuffled.apply(delivered[start:end])
        assert shuffled.digest() == ordered.digest()
        expected = stored_model(events)
        for row_type in fold.ROW_TYPES:
            stored = ordered.store.rows(row_type)
            for row in stored.values():  # stamped from the stream, which bare events lack
                if isinstance(row, fold.Placed):
                    row.create_seq = None
            assert stored == expected[row_type], row_type.__name__
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
