"""`python -m ops.bench.quick`: the comparison with the baseline (which way is worse for
each figure, what is missing, what is new) on constructed figures, the command's exits
and files without measuring (``--from`` saved outputs), and one small real run that
prints every figure. No timing is asserted anywhere."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.quick import (
    BASELINE,
    SPECS,
    BaselineError,
    Figure,
    baseline_document,
    compare,
    main,
    medians,
    read_baseline,
    worse_by,
)

ROOT = Path(__file__).resolve().parent.parent


def lower(name: str, value: float) -> Figure:
    return Figure(name, value, "lower")


def higher(name: str, value: float) -> Figure:
    return Figure(name, value, "higher")


def test_worse_is_up_for_a_lower_is_better_figure_and_down_for_a_higher_is_better_one() -> None:
    assert worse_by(1.2, 1.0, "lower") == pytest.approx(0.2)
    assert worse_by(0.8, 1.0, "lower") == pytest.approx(-0.2)
    assert worse_by(0.8, 1.0, "higher") == pytest.approx(0.2)
    assert worse_by(1.2, 1.0, "higher") == pytest.approx(-0.2)
    assert worse_by(3.0, 3.0, "lower") == 0.0


def test_a_zero_baseline_makes_any_change_infinitely_worse_or_better() -> None:
    assert worse_by(0.0, 0.0, "lower") == 0.0
    assert worse_by(0.5, 0.0, "lower") == math.inf
    assert worse_by(0.5, 0.0, "higher") == -math.inf


def test_compare_reports_each_figure_by_its_own_direction() -> None:
    baseline = {
        "latency_up": 2.0,  # lower is better, now 2.4: 20% worse
        "rate_down": 0.5,  # higher is better, now 0.4: 20% worse
        "latency_down": 2.0,  # lower is better, now 1.6: 20% better
        "rate_up": 0.5,  # higher is better, now 0.6: 20% better
        "latency_noise": 2.0,  # now 2.2: 10% worse, within the tolerance
        "rate_noise": 0.5,  # now 0.46: 8% worse, within the tolerance
        "gone": 1.0,  # not measured any more
    }
    figures = [
        lower("latency_up", 2.4), higher("rate_down", 0.4), lower("latency_down", 1.6),
        higher("rate_up", 0.6), lower("latency_noise", 2.2), higher("rate_noise", 0.46),
        lower("added", 7.0),
    ]  # fmt: skip
    result = compare(figures, baseline)
    assert [(c.name, round(c.worse_by, 3)) for c in result.worse] == [
        ("latency_up", 0.2), ("rate_down", 0.2)
    ]  # fmt: skip
    assert [(c.name, round(c.worse_by, 3)) for c in result.better] == [
        ("latency_down", -0.2), ("rate_up", -0.2)
    ]  # fmt: skip
    assert result.missing == ["gone"]
    assert result.new == ["added"]
    assert result.failed


def test_the_tolerance_is_fifteen_percent_either_side() -> None:
    baseline = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}
    figures = [lower("a", 1.14), lower("b", 1.16), higher("c", 0.86), higher("d", 0.84)]
    result = compare(figures, baseline)
    assert [c.name for c in result.worse] == ["b", "d"]
    assert compare(figures, baseline, tolerance=0.2).worse == []


def test_new_figures_alone_do_not_fail_but_a_missing_one_does() -> None:
    only_new = compare([lower("a", 1.0), higher("b", 9.0)], {"a": 1.0})
    assert only_new.new == ["b"] and not only_new.failed
    one_gone = compare([lower("a", 1.0)], {"a": 1.0, "b": 2.0})
    assert one_gone.missing == ["b"] and one_gone.worse == [] and one_gone.failed


def test_a_written_baseline_reads_back(tmp_path: Path) -> None:
    figures = [Figure("record_p99_over_p50", 4.2, "lower", 3.0), higher("new_one", 0.5)]
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline_document(figures, runs=3)))
    assert read_baseline(path) == {"record_p99_over_p50": 4.2, "new_one": 0.5}
    written = json.loads(path.read_text())
    assert written["measured"]["runs"] == 3
    assert written["figures"]["record_p99_over_p50"]["better"] == "lower"


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"figures": []}', '{"figures": {"a": {"value": "1"}}}',
     '{"figures": {"a": {"value": true}}}', '{"figures": {"a": 1.0}}',
     '{"figures": {"a": {"value": NaN}}}'],
)  # fmt: skip
def test_a_baseline_that_is_not_one_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(text)
    with pytest.raises(BaselineError):
        read_baseline(path)
    with pytest.raises(BaselineError):
        read_baseline(tmp_path / "absent.json")


def line(name: str, value: float, better: str = "lower", bench: str = "quick") -> str:
    return json.dumps({"bench": bench, "figure": name, "value": value, "better": better})


def test_medians_of_saved_runs_keep_each_figure_and_its_direction() -> None:
    runs = [
        line("a", 1.0), line("b", 0.5, "higher"), "a readable line", line("a", 9, bench="other"),
        line("a", 3.0), line("b", 0.7, "higher"),
        line("a", 2.0), line("b", 0.6, "higher"), line("c", 4.0),
        json.dumps({"bench": "quick", "figure": "summary", "worse": []}),
        line("cpu_per_record", 9.0, "higher"),  # a figure of SPECS: its direction is SPECS'
    ]  # fmt: skip
    got = medians(runs)
    assert [(f.name, f.value, f.better, f.target) for f in got] == [
        ("a", 2.0, "lower", None), ("b", 0.6, "higher", None), ("c", 4.0, "lower", None),
        ("cpu_per_record", 9.0, "lower", 2.5),
    ]  # fmt: skip


def saved_run(path: Path, values: dict[str, float]) -> Path:
    path.write_text(
        "\n".join(line(name, value, SPECS[name].better) for name, value in values.items()) + "\n"
    )
    return path


def printed(out: str) -> list[dict[str, object]]:
    return [json.loads(text) for text in out.splitlines()]


def test_the_command_prints_each_figure_then_the_worse_ones_and_strict_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"record_p99_over_p50": 3.0, "writes_1_caller_record": 0.5, "cpu_per_record": 4.0}
    baseline = tmp_path / "baseline.json"
    assert main(["--from", str(saved_run(tmp_path / "run0", base)), "--baseline",
                 str(baseline), "--write-baseline"]) == 0  # fmt: skip
    assert read_baseline(baseline) == base
    capsys.readouterr()

    # p99/p50 up 30% (worse), the rate down 20% (worse), CPU down 10% (noise)
    now = {"record_p99_over_p50": 3.9, "writes_1_caller_record": 0.4, "cpu_per_record": 3.6}
    run = saved_run(tmp_path / "run1", now)
    assert main(["--from", str(run), "--baseline", str(baseline)]) == 0
    captured = capsys.readouterr()
    lines = printed(captured.out)
    assert [x["figure"] for x in lines] == [*now, "summary"]
    rate = lines[1]
    assert rate["better"] == "higher" and rate["baseline"] == 0.5 and rate["worse_by"] == 0.2
    assert rate["target"] == 0.6 and rate["met"] is False
    summary = lines[-1]
    assert [w["figure"] for w in summary["worse"]] == [  # type: ignore[union-attr]
        "record_p99_over_p50", "writes_1_caller_record"
    ]  # fmt: skip
    assert summary["missing"] == [] and summary["new"] == []
    assert "2 figure(s) more than 15% worse" in captured.err
    assert "writes_1_caller_record: 0.4 (baseline 0.5, higher is better): 20% worse" in captured.err

    assert main(["--from", str(run), "--baseline", str(baseline), "--strict"]) == 1
    capsys.readouterr()
    # the medians of three runs become the baseline; then nothing is worse
    runs = [saved_run(tmp_path / f"run{i}", now) for i in (2, 3)]
    argv = ["--from", str(run), *map(str, runs), "--baseline", str(baseline)]
    assert main([*argv, "--write-baseline"]) == 0
    assert read_baseline(baseline) == now
    assert json.loads(baseline.read_text())["measured"]["runs"] == 3
    assert main([*argv, "--strict"]) == 0
    assert "no figure more than 15% worse" in capsys.readouterr().err


def test_a_missing_or_broken_baseline_stops_the_command_unless_it_is_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = saved_run(tmp_path / "run", {"cpu_per_record": 4.0})
    absent = tmp_path / "absent.json"
    assert main(["--from", str(run), "--baseline", str(absent)]) == 2
    assert "cannot read a baseline" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["--from", str(run), "--baseline", str(broken), "--write-baseline"]) == 2
    assert broken.read_text() == "{"
    assert main(["--from", str(run), "--baseline", str(absent), "--write-baseline"]) == 0
    assert read_baseline(absent) == {"cpu_per_record": 4.0}


def test_the_committed_baseline_holds_every_figure_in_its_direction() -> None:
    committed = json.loads(BASELINE.read_text())["figures"]
    assert list(committed) == list(SPECS)
    for name, spec in SPECS.items():
        assert committed[name]["better"] == spec.better, name
        assert committed[name]["target"] == spec.target, name
    assert read_baseline(BASELINE).keys() == SPECS.keys()


def test_a_small_real_run_prints_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.quick", "--size", "0.1"],
        capture_output=True, text=True, timeout=170, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(text) for text in done.stdout.splitlines() if text.startswith("{")]
    assert [x["figure"] for x in lines] == [*SPECS, "summary"], done.stdout
    for x in lines[:-1]:
        assert x["bench"] == "quick"
        assert isinstance(x["value"], float) and math.isfinite(x["value"]), x
        assert x["better"] == SPECS[str(x["figure"])].better
        assert isinstance(x["baseline"], float), x  # the committed baseline has it
    assert lines[-1]["missing"] == [] and lines[-1]["new"] == []
    assert "than " + str(BASELINE) in done.stderr
