"""The edge benchmark (``python -m ops.bench.edges``) and its Postgres+pgvector peer
(``ops.bench.pg``): the pure helpers against computations of their own, the peer's SQL
against those helpers on a real server, one small real run whose output has every
figure and whose peer answered, and a run interrupted with Ctrl-C that leaves nothing
running. No timing is asserted anywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import numpy as np
import pytest

from ops.bench import pg
from ops.bench.edges import KINDS, SIDES, SIDES_1, SIDES_2, exact_top, percentile_ms, recall_at

ROOT = Path(__file__).resolve().parent.parent

# -- the helpers -------------------------------------------------------------------------------


def interruptible() -> None:
    """Ctrl-C as at a terminal: a shell's background job (``make test &``) inherits an
    ignored SIGINT, and Python then installs no KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_percentile_interpolates_between_the_nearest_ranks_in_ms() -> None:
    samples = [0.004, 0.001, 0.003, 0.002]  # seconds; sorted 1, 2, 3, 4 ms
    assert percentile_ms(samples, 50) == pytest.approx(2.5)
    assert percentile_ms(samples, 0) == pytest.approx(1.0)
    assert percentile_ms(samples, 100) == pytest.approx(4.0)
    # p99 of 1..100 ms: rank 0.99 x 99 = 98.01 -> 99 + 0.01 x (100 - 99)
    assert percentile_ms([i / 1000 for i in range(1, 101)], 99) == pytest.approx(99.01)


def test_recall_counts_the_shared_ids_of_the_first_k() -> None:
    truth = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert recall_at([[1, 2, 3, 4], [5, 6, 7, 8]], truth, 4) == 1.0
    assert recall_at([[4, 3, 9, 9], [8, 0, 0, 0]], truth, 4) == pytest.approx((2 / 4 + 1 / 4) / 2)
    # only the first k of each count
    assert recall_at([[9, 9, 1, 2]], [[1, 2, 3, 4]], 2) == 0.0


def test_exact_top_is_the_brute_force_order_by_inner_product() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(size=(300, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:5] + 0.1 * rng.normal(size=(5, 16)).astype(np.float32)
    top = exact_top(base, queries, 7)
    for q, row in zip(queries, top, strict=True):
        scores = [(float(np.dot(q, b)), j) for j, b in enumerate(base)]
        assert list(row) == [j for _, j in sorted(scores, reverse=True)[:7]]


def test_fuse_sums_reciprocal_ranks() -> None:
    # a: 1/61 + 1/62; b: 1/62; c: 1/61; d: 1/63
    fused = pg.fuse([["a", "b", "d"], ["c", "a"]], k=10, rrf_k=60)
    assert fused == ["a", "c", "b", "d"]
    assert pg.fuse([["x", "y"], ["y", "x"]], k=1) == ["x"]  # a tie keeps the first seen


def test_or_query_joins_the_words_with_or_and_drops_operators() -> None:
    assert pg.or_query("Retry the  retry & key!") == "retry | the | key"
    assert pg.or_query("a|b (c)") == "a | b | c"
    assert pg.or_query("!!") == "''"


def test_a_vector_is_sent_in_pgvectors_binary_form() -> None:
    dumped = pg.VectorDumper(pg.Vector).dump(pg.Vector([1.0, -2.5]))
    assert dumped == b"\x00\x02\x00\x00" + np.array([1.0, -2.5], dtype=">f4").tobytes()


# -- the peer's SQL on a real server -----------------------------------------------------------


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, UUID, dict[str, Any]]]:
    """A server holding 300 rows: a vector each (near one of 3 centers) and words."""
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(3, pg.DIM))
    vectors = centers[rng.integers(0, 3, 300)] + 0.5 * rng.normal(size=(300, pg.DIM))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ids = [uuid4() for _ in range(300)]
    contents = [" ".join(f"w{int(i)}" for i in rng.integers(0, 40, 6)) for _ in range(300)]
    for j in range(8):  # "alpha" j + 1 times: a text ranking without ties
        contents[40 * j] += " alpha" * (j + 1)
    cid = uuid4()
    with pg.Postgres.start(tmp_path_factory.mktemp("pg") / "server") as server:
        connection = server.connect()
        server.create(connection)
        assert server.load(connection, cid, zip(ids, contents, vectors, strict=True)) == 300
        server.index(connection, 16, 64)
        server.set_ef_search(connection, 400)
        try:
            yield connection, cid, {"ids": ids, "contents": contents, "vectors": vectors}
        finally:
            connection.close()


def test_similar_uses_the_hnsw_index_and_finds_the_nearest(peer: Any) -> None:
    connection, cid, rows = peer
    q = rows["vectors"][7]
    params = {"q": pg.Vector(q), "c": cid, "k": 10}
    assert "experiences_embedding" in pg.Postgres.plan(connection, pg.SIMILAR, params)
    found = [r[0] for r in connection.execute(pg.SIMILAR, params)]
    truth = [rows["ids"][j] for j in exact_top(rows["vectors"], q[None, :], 10)[0]]
    assert found[0] == rows["ids"][7]
    assert recall_at([found], [truth], 10) >= 0.9


def test_text_finds_rows_with_any_of_the_words(peer: Any) -> None:
    connection, cid, rows = peer
    words = ["w1", "w2"]
    found = {r[0] for r in connection.execute(pg.TEXT, {"t": pg.or_query("w1 w2"), "c": cid,
                                                         "k": 1000})}  # fmt: skip
    expected = {i for i, c in zip(rows["ids"], rows["contents"], strict=True)
                if set(c.split()) & set(words)}  # fmt: skip
    assert found == expected and expected


def test_hybrid_is_the_rrf_of_the_vector_and_text_rankings(peer: Any) -> None:
    connection, cid, rows = peer
    q, text = rows["vectors"][11], pg.or_query("alpha zzz")
    by_vector = [r[0] for r in connection.execute(pg.SIMILAR, {"q": pg.Vector(q), "c": cid,
                                                               "k": 50})]  # fmt: skip
    by_text = [r[0] for r in connection.execute(pg.TEXT, {"t": text, "c": cid, "k": 50})]
    assert by_text == [rows["ids"][40 * j] for j in reversed(range(8))]
    expected: dict[UUID, float] = {}
    for ranking in (by_vector, by_text):
        for rank, eid in enumerate(ranking):
            expected[eid] = expected.get(eid, 0.0) + 1 / (60 + rank + 1)
    params = {"q": pg.Vector(q), "t": text, "c": cid, "k": 10, "pool": 50, "recent": 5}
    hybrid = connection.execute(pg.HYBRID, params).fetchall()
    assert len(hybrid) == 10
    for row in hybrid:
        assert float(row[-1]) == pytest.approx(expected[row[0]])
    scores = [float(r[-1]) for r in hybrid]
    assert scores == sorted(scores, reverse=True)
    left_out = [score for eid, score in expected.items() if eid not in {r[0] for r in hybrid}]
    assert max(left_out) <= min(scores) + 1e-12  # the best 10 (ties either way)
    assert {r[0] for r in hybrid} >= set(pg.fuse([by_vector, by_text], 3))
    context = connection.execute(pg.CONTEXT, params).fetchall()
    assert [r[0] for r in context] == ["similar"] * 10 + ["recent"] * 5
    assert [r[1] for r in context[:10]] == [r[0] for r in hybrid]


# -- the benchmark -----------------------------------------------------------------------------


def running_in(directory: str) -> list[int]:
    """The processes whose command line names ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if directory in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def gone(directory: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while running_in(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return not Path(directory).exists()


def test_a_small_real_run_prints_every_figure_and_the_peer_answered() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.edges", "--size", "0.002"],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(line["bench"] == "edges" for line in lines)
    by_figure: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_figure.setdefault(line["figure"], []).append(line)

    setup = by_figure["setup"][0]
    assert setup["postgres_rows"] == setup["experiences"] == 200
    calibration = by_figure["recall_calibration"][0]
    assert calibration["postgres_recall"] > 0 and calibration["pulse_recall"] > 0

    for figure, target in (("http_vs_in_process", 1.3), ("http_vs_postgres", 1.0)):
        assert [f["call"] for f in by_figure[figure]] == list(KINDS)
        for f in by_figure[figure]:
            assert f["target"] == target and f["met"] == (f["value"] <= target)
            assert all(f[f"{side}_p50_ms"] > 0 for side in SIDES_2)
    # the transport's floor: what a server that only answers costs, beside each call
    floors = by_figure["http_floor_vs_in_process"]
    assert [f["call"] for f in floors] == list(KINDS)
    for f in floors:
        bound = (f["in_process_p50_ms"] + f["floor_p50_ms"]) / f["in_process_p50_ms"]
        assert f["value"] == pytest.approx(bound, rel=0.01) and f["value"] > 1
        assert f["below_target"] == (f["value"] > 1.3)
    similar = by_figure["http_vs_postgres"][0]
    assert similar["postgres_recall"] > 0 and similar["in_process_recall"] > 0

    tails = by_figure["write_p99_over_p50"]
    assert [(f["side"], f["writers"]) for f in tails] == [
        (side, writers) for writers in (1, 8) for side in SIDES
    ]
    assert all(f["target"] == 3.0 and f["writes"] == 40 for f in tails)
    raw = by_figure["raw_log_p99_over_p50"]  # the log's own tail, in the same rounds
    assert [f["writers"] for f in raw] == [1, 8] and all(f["writes"] == 40 for f in raw)
    assert all(f["value"] >= 1 and f["target"] is None for f in raw)
    assert {"raw"} == set(SIDES_1) - set(SIDES)
    versus = by_figure["write_p99_vs_postgres"]
    assert [(f["side"], f["writers"]) for f in versus] == [
        (side, writers) for writers in (1, 8) for side in ("in_process", "http")
    ]
    rows = by_figure["peer_rows"][0]  # every write reached the peer's table
    assert rows["met"] and rows["rows"] == rows["expected"] == 200 + 5 + 20 + 2 * 40
    assert "Target 2, no HTTP tax" in done.stderr and "Target 1, no write tail" in done.stderr
    directory = next(
        line.split("working in ", 1)[1] for line in done.stderr.splitlines() if "working in" in line
    )
    assert gone(directory)


def test_ctrl_c_leaves_nothing_running() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.bench.edges", "--size", "0.002"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible,
    )  # fmt: skip
    assert process.stderr is not None
    directory = ""
    try:
        for line in process.stderr:
            if "working in" in line:
                directory = line.split("working in ", 1)[1].strip()
            if "Pulse instances open" in line:  # Postgres and pulse up both running
                break
        assert directory and running_in(directory)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode != 0
    assert gone(directory)
