"""`pulse import`: JSON lines and Parquet into a collective, up to 1,000 experiences a call,
run as a user runs it (the installed script, or `ops.cli.main` in this process where a
second interpreter would only add start-up time); ids in file order; a bad line named,
the batches before it kept; through a running `pulse up` when one serves the directory."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import duckdb
import httpx
import pytest

from ops.cli import main
from sync import PulseDB
from tests.harness import start, stop

PULSE = str(Path(sys.executable).parent / "pulse")
T = TypeVar("T")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with four collectives: "notes" and "strict" (3-d, callers bring
    vectors), "texts" and "seen" (the hash embedder: content alone is enough). Each test
    writes to its own collective."""
    directory = tmp_path_factory.mktemp("import") / "data"

    async def create(db: PulseDB) -> None:
        await db.create_collective("me", "notes", 3)
        await db.create_collective("me", "strict", 3)
        await db.create_collective("me", "texts", embedder="hash")
        await db.create_collective("me", "seen", embedder="hash")

    api(directory, create)
    return directory


@pytest.fixture(autouse=True)
def _no_pulse_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PULSE_NATS_URL", "PULSE_DATA_DIR", "PULSE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def api(data_dir: Path, check: Callable[[PulseDB], Awaitable[T]]) -> T:
    """``check`` run on an instance of the data directory (no CLI process may hold it)."""

    async def run() -> T:
        db = await PulseDB.open(data_dir)
        try:
            return await check(db)
        finally:
            await db.close()

    return asyncio.run(run())


def cli(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, str, str]:
    """`pulse --data-dir DATA_DIR ARGS...` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(["--data-dir", str(data_dir), *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_lines(path: Path, records: Iterable[dict[str, Any] | str]) -> Path:
    """One JSON object a line (a str is written as it is: a blank or broken line)."""
    with path.open("w") as out:
        for record in records:
            out.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return path


def note(n: int, **fields: Any) -> dict[str, Any]:
    return {"content": f"note {n}", "embedding": [1.0, float(n), 0.5], **fields}


def test_json_lines_are_imported_in_file_order(data_dir: Path, tmp_path: Path) -> None:
    def lines() -> Iterator[dict[str, Any] | str]:
        for n in range(1, 2501):
            if n == 1200:
                yield ""  # a blank line is skipped
            yield note(
                n, domain=[f"d{n % 5}"], importance=(n % 11) / 10, source_agent="importer",
                experience_type="Generic" if n % 2 else {"kind": "Solution",
                                                         "approach": f"a{n}", "worked": True},
            )  # fmt: skip

    source = write_lines(tmp_path / "notes.jsonl", lines())
    ids_file = tmp_path / "ids.txt"
    result = subprocess.run(
        [PULSE, "--data-dir", str(data_dir), "import", str(source), "-c", "notes",
         "--ids", str(ids_file), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["count"] == 2500 and summary["seconds"] > 0 and summary["rate"] > 0
    assert summary["ids_file"] == str(ids_file)
    progress = result.stderr.strip().splitlines()
    assert progress[-1].startswith("importing into notes 2,500/2,500 (100%, ")
    assert progress[-1].endswith(" experiences/s)")

    ids = ids_file.read_text().split()
    assert len(ids) == len(set(ids)) == 2500

    async def check(db: PulseDB) -> None:
        cid = UUID(summary["collective_id"])
        collective = await db.get_collective(cid)
        assert collective is not None and collective.name == "notes"
        assert (await db.get_collective_stats(cid)).experiences == 2500
        rows = (await db.sql("SELECT experience_id, content FROM experiences")).rows
        content_of = {str(eid): content for eid, content in rows}
        assert [content_of[i] for i in ids] == [f"note {n}" for n in range(1, 2501)]
        first, last = await db.get_experience(UUID(ids[0])), await db.get_experience(UUID(ids[-1]))
        assert first is not None and type(first.experience_type).__name__ == "Generic"
        assert last is not None and (last.content, last.domain) == ("note 2500", ("d0",))
        assert (last.importance, last.source_agent) == (0.3, "importer")
        assert type(last.experience_type).__name__ == "Solution"

    api(data_dir, check)


def test_parquet_with_an_embedder_needs_content_only(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "texts.parquet"
    with duckdb.connect() as con:
        con.execute(
            "CREATE TEMP TABLE texts AS SELECT 'text ' || i AS content, "
            "['parquet', 'p' || (i % 3)] AS domain, ['src/' || i || '.py'] AS related_files, "
            "CASE WHEN i % 2 = 0 THEN NULL ELSE 0.9 END AS importance, "  # a DECIMAL column
            "'Generic' AS experience_type FROM range(1, 1201) AS r(i)"
        )
        con.execute(f"COPY texts TO '{source}' (FORMAT parquet)")

    code, out, err = cli(capsys, data_dir, "import", str(source), "-c", "texts")
    assert code == 0, err
    assert re.fullmatch(r"imported 1,200 experiences into texts in \d+\.\d s \([\d,]+/s\)\n", out)
    assert "importing into texts 1,200/1,200 (100%" in err

    code, out, err = cli(capsys, data_dir, "stats", "texts", "--json")
    assert code == 0, err
    assert json.loads(out)["experiences"] == 1200

    async def check(db: PulseDB) -> list[list[Any]]:
        return (
            await db.sql(
                "SELECT c.name, e.content, e.domain, e.related_files, e.importance "
                "FROM experiences e JOIN collectives c USING (collective_id) "
                "WHERE e.content IN ('text 1', 'text 2')  ORDER BY e.content"
            )
        ).rows

    assert api(data_dir, check) == [
        ["texts", "text 1", ["parquet", "p1"], ["src/1.py"], 0.9],
        ["texts", "text 2", ["parquet", "p2"], ["src/2.py"], 0.5],  # NULL: the default
    ]


def test_a_bad_line_is_named_and_the_batches_before_it_stay(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = write_lines(
        tmp_path / "refused.jsonl",
        (note(n, importance=2 if n == 23 else 0.5) for n in range(1, 26)),
    )
    code, out, err = cli(capsys, data_dir, "import", str(refused), "-c", "strict", "--batch", "10")
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        "pulse: error: line 23: importance: Input should be less than or equal to 1 (got 2); "
        "20 experiences before it were imported (through line 20)"
    )

    broken = write_lines(tmp_path / "broken.jsonl", [note(1), note(2), note(3), note(4), "{oops"])
    code, out, err = cli(capsys, data_dir, "import", str(broken), "-c", "strict", "--batch", "2")
    assert code == 1
    assert err.splitlines()[-1] == (
        "pulse: error: line 5: not valid JSON (Expecting property name enclosed in double "
        "quotes at column 2); 4 experiences before it were imported (through line 4)"
    )

    short = write_lines(tmp_path / "short.jsonl", [note(1), {"content": "x", "embedding": [1, 0]}])
    code, out, err = cli(capsys, data_dir, "import", str(short), "-c", "strict")
    assert code == 1
    assert err.splitlines()[-1].startswith(
        "pulse: error: line 2: embedding: 2 values, collective 'strict' has dimension 3"
    )
    assert err.splitlines()[-1].endswith("; nothing was imported")

    async def contents(db: PulseDB) -> list[str]:
        cid = next(c.collective_id for c in await db.list_collectives() if c.name == "strict")
        found = await db.list_experiences(cid, limit=100)
        return [e.content for e in found]

    assert api(data_dir, contents) == [f"note {n}" for n in (*range(1, 21), *range(1, 5))]


def test_import_goes_through_the_running_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = start(tmp_path / "served")
    try:
        operator = {"Authorization": f"Bearer {service.token}"}
        with httpx.Client(base_url=service.url, timeout=60, headers=operator) as client:

            def call(method: str, **body: Any) -> Any:
                response = client.post(f"/v1/{method}", json=body)
                assert response.status_code == 200, response.text
                return response.json()

            cid = call("create_collective", owner_id="me", name="served", embedder="hash")
            source = write_lines(
                tmp_path / "served.jsonl", ({"content": f"served {n}"} for n in range(1, 1501))
            )
            code, out, err = cli(capsys, service.data_dir, "import", str(source), "-c", "served")
            assert code == 0, err
            assert out.startswith("imported 1,500 experiences into served in ")
            assert call("get_collective_stats", collective_id=cid)["experiences"] == 1500
            metrics = client.get("/metrics").text
            assert 'method="POST",route="/v1/record_experiences",status="200"} 2.0' in metrics
    finally:
        stop(service)


def test_help_shows_an_example(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path), "import", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "example:" in text
    assert "pulse import a.jsonl -c demo" in text.split("example:")[1]
    assert "--batch" in text and "--ids" in text


def test_visibility_is_given_per_line_or_for_the_file(
    capsys: pytest.CaptureFixture[str], data_dir: Path, tmp_path: Path
) -> None:
    source = write_lines(
        tmp_path / "seen.jsonl",
        [{"content": "for all", "visibility": "org"}, {"content": "default"}],
    )
    code, _, err = cli(capsys, data_dir, "import", str(source), "-c", "seen",
                       "--visibility", "private")  # fmt: skip
    assert code == 0, err

    async def check(db: PulseDB) -> dict[str, str]:
        found = await db.sql(
            "SELECT e.content, e.visibility FROM experiences e JOIN collectives c "
            "USING (collective_id) WHERE c.name = 'seen'"
        )
        return {content: seen for content, seen in found.rows}

    seen = api(data_dir, check)
    assert seen["for all"] == "org" and seen["default"] == "private"
