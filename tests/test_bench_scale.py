"""ops.bench.scale: its exact search and recall against an independent brute force, a
tiny real run (the HNSW path: a threshold below the experiences) with every figure
present and finite, and an interrupted run leaving nothing behind."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ops.bench import scale


def brute_force(queries: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ rows.T), axis=1, kind="stable")[:, :k]


def interruptible() -> None:
    """Ctrl-C as at a terminal: a shell's background job (``make test &``) inherits an
    ignored SIGINT, and Python then installs no KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_exact_neighbours_in_chunks_are_the_brute_force_ones() -> None:
    rng = np.random.default_rng(5)
    rows = scale.unit(rng.normal(size=(1000, 16)))
    queries = scale.unit(rng.normal(size=(30, 16)))
    for chunk in (7, 100, 333, 1000):
        chunks = ((first, rows[first : first + chunk]) for first in range(0, len(rows), chunk))
        found = scale.exact_neighbours(queries, chunks, k=10)
        assert (found == brute_force(queries, rows, 10)).all(), chunk


def test_exact_neighbours_of_the_written_data(tmp_path: Path) -> None:
    plan = scale.Plan(n=1200, queries=20, truth_queries=20)
    files = scale.Files(tmp_path)
    scale.write_data(files, plan, lambda text: None)
    vectors = scale.read_matrix(files.vectors, scale.DIM)
    queries = scale.read_matrix(files.queries, scale.DIM)
    assert vectors.shape == (1200, scale.DIM) and queries.shape == (20, scale.DIM)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    truth = scale.exact_neighbours(queries, scale.file_chunks(files.vectors, plan.n))
    assert (truth == brute_force(queries, vectors, scale.K)).all()
    texts_fd, offsets_fd = (
        os.open(files.texts, os.O_RDONLY),
        os.open(files.text_offsets, os.O_RDONLY),
    )
    try:
        texts = scale.read_texts(texts_fd, offsets_fd, 998, 5)
    finally:
        os.close(texts_fd)
        os.close(offsets_fd)
    assert [scale.number_of(t) for t in texts] == [998, 999, 1000, 1001, 1002]


def test_recall_counts_the_true_neighbours_among_the_first_k() -> None:
    truth = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int64)
    # query 0: 2 of 3 in the first 3 (the third true one comes 4th: not counted);
    # query 1: all 3, in another order
    found = [[0, 9, 1, 2], [5, 3, 4]]
    assert scale.recall_at(found, truth, k=3) == pytest.approx(5 / 6)
    independent = np.mean(
        [len(set(f[:3]) & set(t.tolist())) / 3 for f, t in zip(found, truth, strict=True)]
    )
    assert scale.recall_at(found, truth, k=3) == pytest.approx(independent)


def test_texts_are_reproducible_and_name_their_item() -> None:
    texts = scale.Texts(3)
    labels = np.array([0, 5, 5], dtype=np.int32)
    made = texts.make("note", 40, labels)
    assert made == scale.Texts(3).make("note", 40, labels)
    assert [scale.number_of(t) for t in made] == [40, 41, 42]
    assert all(scale.TEXT_MIN // 2 <= len(t.encode()) <= scale.TEXT_MAX for t in made)


def test_a_failed_figure_is_not_met_and_shows_as_failed() -> None:
    failed = scale.Figure("rebuild_vs_faiss_build", math.nan, "lower", 1.5, {"error": "x"})
    assert failed.met is False
    assert "failed" in scale.table([failed]) and "NO" in scale.table([failed])


DIM_BYTES = 4 * 384  # a message of the raw log holds a vector and its text


def test_a_tiny_run_measures_every_figure() -> None:
    plan = scale.Plan(n=3000, queries=60, truth_queries=60, callers=2, hnsw_threshold=1000,
                      writes_max=400)  # fmt: skip
    found = {f.name: f for f in scale.run(plan)}
    assert set(found) == {
        "raw_log_vs_faiss_build", "ingest_vs_faiss_build", "similar_p50_vs_faiss",
        "similar_recall_at_10", "similar_p99_over_p50_writing", "memory_ingesting_vs_raw",
        "memory_restarted_vs_raw", "rebuild_vs_faiss_build", "open_seconds",
    }  # fmt: skip
    for f in found.values():
        assert math.isfinite(f.value) and f.value > 0, f
        assert isinstance(f.met, bool)
    search = found["similar_p50_vs_faiss"].detail
    assert search["pulse_index"] == "IndexHNSWSQ"  # past the threshold: the graph
    # the hits were mapped back to their items: a wrong mapping would find none
    assert 0.9 <= found["similar_recall_at_10"].value <= 1
    assert 0.9 <= float(search["faiss_recall_at_10"]) <= 1  # type: ignore[arg-type]
    assert found["raw_log_vs_faiss_build"].detail["bytes_per_message"] > DIM_BYTES
    assert found["rebuild_vs_faiss_build"].detail["events"] > 3000  # type: ignore[operator]
    assert found["similar_p99_over_p50_writing"].detail["writes"] > 0  # type: ignore[operator]


def test_an_interrupted_run_leaves_nothing_behind() -> None:
    command = [sys.executable, "-m", "ops.bench.scale", "--size", "0.002", "--queries", "20"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True, cwd=scale.REPO,
                               preexec_fn=interruptible)  # fmt: skip
    assert process.stderr is not None
    work = None
    deadline = time.monotonic() + 120
    try:
        for line in process.stderr:  # until the ingest (a phase's process) has begun
            if line.startswith("scale: working in "):
                work = line.removeprefix("scale: working in ").strip()
            if line.startswith("scale: faiss: ") and "s (" in line:
                break
            assert time.monotonic() < deadline, "the run did not reach the ingest"
        assert work is not None and Path(work).exists()
        # and its process has been handed over: the phase's Popen returned (the ingest
        # has opened its data directory), so the run's Phases.stop sees it (a Ctrl-C
        # while Popen starts it is another matter, and not this test's)
        while not (ingesting(work) and scale.Files(Path(work)).data_dir.exists()):
            assert time.monotonic() < deadline, "the ingest's process did not start"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    assert not Path(work).exists()
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and uses(pid, work)]


def ingesting(work: str) -> bool:
    """Whether the ingest phase's process of the run in ``work`` is running."""
    return any(
        pid.isdigit() and uses(pid, work) and uses(pid, "ingest") for pid in os.listdir("/proc")
    )


def uses(pid: str, path: str) -> bool:
    """Whether process ``pid``'s command line names ``path``."""
    try:
        return path in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
