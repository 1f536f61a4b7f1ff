"""The text index committed on another thread (``TextIndex.commit_behind``, what the
background save runs on its saver thread): the changes made while that commit runs are
held, in order, and reach the index after it; tantivy's writer refuses any call during
a commit ("Already borrowed"), so none may reach it then."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.ids import uuid7
from projections.language import ENGLISH
from projections.text import TextIndex

IDS = [uuid7() for _ in range(6)]
COLLECTIVES = [uuid7(), uuid7()]

# one change: put id (in collective, with word), remove id, or remove a collective
Change = tuple[str, int, int, int]
changes = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "remove", "remove_collective"]),
        st.integers(0, len(IDS) - 1),
        st.integers(0, len(COLLECTIVES) - 1),
        st.integers(0, 2),
    ),
    max_size=25,
)


def apply(text: TextIndex, change: Change) -> None:
    what, i, c, word = change
    if what == "put":
        text.put("experience", IDS[i], COLLECTIVES[c], f"word{word} common", ENGLISH)
    elif what == "remove":
        text.remove(IDS[i])
    else:
        text.remove_collective(COLLECTIVES[c])


def found(text: TextIndex) -> dict[tuple[UUID, str], set[UUID]]:
    """What each search finds: every collective, every word."""
    return {
        (cid, word): {doc_id for doc_id, _ in text.search("experience", cid, word, 50)}
        for cid in COLLECTIVES
        for word in ("common", "word0", "word1", "word2")
    }


@settings(max_examples=25, deadline=None)
@given(before=changes, during=changes, after=changes, start_at=st.integers(0, 25))
def test_changes_made_during_a_commit_elsewhere_land_as_if_made_in_turn(
    before: list[Change], during: list[Change], after: list[Change], start_at: int
) -> None:
    """Changes, a commit taken (some of ``before`` not committed before it), changes
    held while it has not run, then more: the index finds what one that took every
    change in turn finds."""
    with tempfile.TemporaryDirectory() as work:
        text, reference = TextIndex(Path(work, "text")), TextIndex(Path(work, "reference"))
        for change in before[:start_at]:
            apply(text, change)
        text.commit()
        for change in before[start_at:]:
            apply(text, change)
        commit = text.commit_behind()
        for change in during:  # (held: the commit has not run)
            apply(text, change)
        if commit is not None:
            commit()
        for change in after:
            apply(text, change)
        for change in before + during + after:
            apply(reference, change)
        assert found(text) == found(reference)
        text.close()
        reference.close()


def test_the_engine_changes_the_index_while_a_commit_runs_on_another_thread(
    tmp_path: Path,
) -> None:
    """A commit of many documents runs on a thread while this one goes on putting and
    removing (tantivy lets go of the GIL while it commits): no call reaches the writer
    mid-commit, and every change is found after."""
    text = TextIndex(tmp_path / "text")
    cid = uuid7()
    first = [uuid7() for _ in range(3000)]
    for doc_id in first:
        text.put("experience", doc_id, cid, f"first lesson {doc_id.hex}", ENGLISH)
    commit = text.commit_behind()
    assert commit is not None
    failed: list[BaseException] = []

    def run() -> None:
        try:
            commit()
        except BaseException as exc:  # (reported below, with the test's own failure)
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    later = [uuid7() for _ in range(200)]
    for doc_id in later:
        text.put("experience", doc_id, cid, "later lesson", ENGLISH)
    for doc_id in first[:100]:
        text.remove(doc_id)
    thread.join(60)
    assert not failed
    hits = {doc_id for doc_id, _ in text.search("experience", cid, "lesson", 10_000)}
    assert hits == set(first[100:]) | set(later)
    text.close()
