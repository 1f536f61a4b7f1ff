"""ops.bench.graph_build: a small run prints every build it was asked for, with recalls
checked against numpy's exact neighbours (an exact index finds all of them), and bad
options are refused by name."""

from __future__ import annotations

import json

import pytest

from ops.bench import graph_build


def test_a_small_run_prints_every_build(capsys: pytest.CaptureFixture[str]) -> None:
    code = graph_build.main(
        ["--n", "3000", "--shape", "20000", "--queries", "40", "--chunks", "700",
         "--efc", "40", "--pace", "100000"]
    )  # fmt: skip
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["build"] for line in lines] == ["bulk", "chunks-700", "efc-40", "pulse"]
    for line in lines:
        assert 0.5 <= line["recall"] <= 1.0 and line["seconds"] >= 0, line
    assert lines[0]["vs_bulk"] == 1.0
    # below the HNSW threshold Pulse's index is exact: every true neighbour is found
    assert lines[-1]["recall"] == 1.0


def test_the_recall_of_the_truth_is_one_and_of_nothing_zero() -> None:
    bench = graph_build.Bench(500, 5000, 10, seed=3)
    assert graph_build.recall(bench.truth.tolist(), bench.truth) == 1.0
    assert graph_build.recall([[-1] * 10] * 10, bench.truth) == 0.0


@pytest.mark.parametrize("bad", [["--chunks", "a,b"], ["--efc", "0"], ["--n", "0"]])
def test_bad_options_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        graph_build.main(bad)
    assert stopped.value.code == 2
    assert bad[0] in capsys.readouterr().err
