"""Forgetting that reaches the disk: after a delete (and the scrub bound, or `pulse
compact`), no file of any host, of any NATS node's store or of a backup holds the deleted
text or any 16 bytes of its embedding; before the delete the same scan finds them (so the
scan is real). Three NATS nodes with R3 streams, two hosts, a backup through the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from uuid import UUID

import numpy as np

from eventlog import StreamSettings
from eventlog import events as ev
from eventlog.keys import DESTROYED, Keyring, key_name
from eventlog.log import LogEntry
from eventlog.sealing import Sealer
from eventlog.subjects import collective_subject
from ops.cluster import LocalCluster
from projections.projection import Projection, ProjectionSettings
from projections.text import WORDS
from sync import PulseDB
from tests.harness import PULSE, cli_env, eventually, scan

DIM = 16


def _term_count(db: PulseDB, term: str) -> Awaitable[int]:
    """Documents of the text index holding ``term``, deleted ones included (tantivy only
    marks a deleted document: its terms stay in the segment until it is rewritten), in
    the field of English words or of the words of any other language (the collective's
    language is "auto": each text is in the field of the language detected)."""

    def count(p: Projection) -> int:
        p.text.commit()
        p.text.index.reload()
        searcher = p.text.index.searcher()
        fields = [kind + part for kind in ("experience", "insight") for part in ("", WORDS)]
        return sum(searcher.doc_freq(field, term) for field in fields)

    return db.engine.run(count)


def _secret() -> tuple[str, bytes]:
    """A text and a unit embedding no other run of this test shares."""
    # 15 random digits (a number: no stemmer changes the word the text index keeps)
    tag = str(10**14 + int.from_bytes(os.urandom(8), "big") % (9 * 10**14))
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    vector = rng.standard_normal(DIM).astype(np.float32)
    vector /= np.float32(np.linalg.norm(vector))
    return f"the launch code is ZEBRA-{tag}-QUOKKA", vector.astype("<f4").tobytes()


def _needles(text: str, embedding: bytes) -> dict[str, bytes]:
    found = {"text": text.encode(), "text, lower case": text.lower().encode()}
    for start in range(len(embedding) - 15):  # every 16-byte run of the embedding
        found[f"embedding[{start}:{start + 16}]"] = embedding[start : start + 16]
    return found


def backup(urls: list[str], destination: Path, data_dir: Path) -> None:
    result = subprocess.run(
        [PULSE, "--data-dir", str(data_dir), "--nats-url", ",".join(urls), "backup",
         str(destination)],
        capture_output=True, text=True, timeout=120, env=cli_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


async def test_a_deleted_secret_is_in_no_file_of_any_host_store_or_backup(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    text, embedding = _secret()
    vector = np.frombuffer(embedding, dtype="<f4").tolist()
    needles = _needles(text, embedding)
    streams = StreamSettings(replicas=3)
    urls = cluster.urls
    # host a forgets on disk when told (`compact`); host b within its bound, by itself
    a = await PulseDB.open(
        tmp_path / "a", urls[0], stream_settings=streams,
        projection_settings=ProjectionSettings(scrub_after=3600),
    )  # fmt: skip
    b = await PulseDB.open(
        tmp_path / "b", urls[1], stream_settings=streams,
        projection_settings=ProjectionSettings(scrub_after=1.0),
    )  # fmt: skip
    hosts, stores, copy = [tmp_path / "a", tmp_path / "b"], [cluster.root], tmp_path / "backup"
    try:
        cid = await a.create_collective("owner", "vault", DIM)
        rng = np.random.default_rng(7)
        kept = [
            await a.record_experience(cid, f"an ordinary note {i}", rng.standard_normal(DIM))
            for i in range(20)
        ]
        secret = await a.record_experience(cid, text, vector, domain=["ops"])
        insight = await a.store_insight(
            cid, f"distilled: {text}", vector, source_experiences=[secret]
        )
        await a.invalidate_experience(secret, f"rotated away from {text}")
        await b.sync()  # (b writes about the secret: it must have read it first)
        await b.reinforce_experience(secret)
        await a.sync()
        await b.sync()
        for db in (a, b):
            assert (await db.get_experience(secret)).content == text  # type: ignore[union-attr]
            await db.engine.run(lambda p: p.save())  # (as a quiet second would)
        backup(urls, copy, tmp_path / "cli")

        before = scan(hosts, needles)
        for host in hosts:  # each host's own files hold it while it is there
            found = set().union(*(v for k, v in before.items() if k.startswith(str(host))))
            assert "text" in found and "embedding[0:16]" in found, (host, before)
        term = text.split("-")[1].lower()  # the secret's own word, as the index keeps it
        assert [await _term_count(db, term) for db in (a, b)] == [2, 2]
        # the log, every node's store and the backup hold it only sealed: not even now
        assert scan([*stores, copy], needles) == {}
        await a.export(tmp_path / "export-before")  # (an export holds what is live)
        assert scan([tmp_path / "export-before"], {"text": text.encode()})
        shutil.rmtree(tmp_path / "export-before")  # the analyst deletes theirs too
        record = await _sealed_record(a, cid, secret)
        assert scan([*stores, copy], {"box": record.box}), "the scan reads stores and backup"

        await b.delete_experience(secret)
        await a.delete_insight(insight)
        await a.sync()
        await a.compact()

        async def b_forgot() -> bool:
            await b.sync()
            return scan([hosts[1]], needles) == {}

        await eventually(b_forgot, timeout=30)
        exported = tmp_path / "export"  # an analyst's export made now: the live rows only
        await a.export(exported)
        assert any(exported.iterdir())
        assert scan([*hosts, *stores, copy, exported], needles) == {}
        assert [await _term_count(db, term) for db in (a, b)] == [0, 0]

        # the copies left (the backup's, any block not rewritten yet) are noise: the key
        # is destroyed in the store every host reads, and no host can open the box
        name = key_name("experience", secret, cid)
        assert await a.sealer.keyring.store.get(name) is DESTROYED
        fresh = Sealer(Keyring(a.log.key_store()))
        subject = collective_subject(cid, "experience", secret)
        (still,) = await fresh.open([LogEntry(1, subject, record)])
        assert still.event == record and still.error is None  # sealed: folds to nothing
        digest = await a.digest()
        assert await b.digest() == digest
    finally:
        await a.close()
        await b.close()
    c = await PulseDB.open(tmp_path / "c", urls[2], stream_settings=streams)
    try:  # a host built from the log after it all: the same state, nothing of the secret
        assert await c.digest() == digest
        assert await c.get_experience(kept[0]) is not None
        assert await c.get_experience(secret) is None
    finally:
        await c.close()
    assert scan([tmp_path / "c"], needles) == {}


async def _sealed_record(db: PulseDB, cid: UUID, experience_id: UUID) -> ev.Sealed:
    """The record of an experience as the log holds it."""
    subject = collective_subject(cid, "experience", experience_id)
    async for batch in db.log.read(1, subjects=[subject]):
        for entry in batch:
            if isinstance(entry.event, ev.Sealed) and entry.event.kind == "experience.recorded":
                return entry.event
    raise AssertionError(f"no sealed record on {subject}")


async def test_a_scrub_a_stop_prevented_is_done_after_the_host_opens_again(
    tmp_path: Path,
) -> None:
    """The rewrite a delete owes is recorded with the state: a host stopped before it
    (here: a bound longer than it ran) does it soon after it opens again."""
    text, embedding = _secret()
    needles = _needles(text, embedding)
    vector = np.frombuffer(embedding, dtype="<f4").tolist()
    data = tmp_path / "host"
    db = await PulseDB.open(data, projection_settings=ProjectionSettings(scrub_after=3600))
    try:
        cid = await db.create_collective("owner", "vault", DIM)
        await db.record_experience(cid, "an ordinary note", [1.0] + [0.0] * (DIM - 1))
        secret = await db.record_experience(cid, text, vector)
        await db.engine.run(lambda p: p.save())
        assert scan([data], needles)  # the host's files hold it
        await db.delete_experience(secret)
    finally:
        await db.close()
    assert scan([data], needles)  # stopped before its bound: still in its files
    db = await PulseDB.open(data, projection_settings=ProjectionSettings(scrub_after=0.5))
    try:
        await eventually(lambda: scan([data], needles) == {}, what="the owed scrub", timeout=30)
        assert await db.get_experience(secret) is None
    finally:
        await db.close()
