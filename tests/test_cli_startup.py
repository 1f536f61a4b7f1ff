"""`pulse` starts without what it does not use (issue 17): importing ``ops.cli``, every
``--help``, and the commands that go through a running `pulse up` load none of DuckDB,
FAISS, tantivy, the web stack, MCP, NATS, numpy or pydantic, and no embedder. Each is
checked in a fresh interpreter (``sys.modules``); how fast that makes `pulse` is for the
benchmark to say (``ops.bench.cli_start``), never a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.cli.registry import COMMANDS

# modules of the engines, the service, the log's client and the instance
HEAVY = (
    "duckdb", "faiss", "tantivy", "fastapi", "starlette", "uvicorn", "mcp", "httpx",
    "nats", "numpy", "pydantic", "cryptography", "sync.instance", "sync.models",
    "sync.embedders", "projections.projection", "projections.engine",
)  # fmt: skip

# commands whose --help imports what holds their defaults: the projection's checkpoint
# interval (catch-up, rebuild) and the API's batch limit (import); bulk work, not per
# action; and `pulse call`, whose help lists the API's declared operations
HELP_IMPORTS = {("catch-up",), ("rebuild",), ("import",), ("call",)}

# runs `pulse` commands (JSON argv lists) one after the other in this interpreter, and
# prints for each its exit code, its output and the heavy modules loaded so far
PROBE = """
import contextlib, io, json, sys

from ops.cli import main

heavy, runs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for argv in runs:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    loaded = sorted(m for m in heavy if m in sys.modules)
    print(json.dumps({"argv": argv, "code": code, "out": out.getvalue(), "loaded": loaded}))
"""


def probe(*runs: list[str]) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(runs)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_importing_the_cli_and_building_its_parser_loads_no_heavy_module() -> None:
    code = (
        "import json, sys\n"
        "import ops.cli\n"
        "ops.cli.build_parser().format_help()\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_every_help_loads_no_heavy_module() -> None:
    paths = [cmd.path for cmd in COMMANDS]
    groups = sorted({(cmd.group,) for cmd in COMMANDS if cmd.group is not None})
    runs = [["--help"]] + [[*path, "--help"] for path in [*groups, *paths]]
    runs = [run for run in runs if tuple(run[:-1]) not in HELP_IMPORTS]
    results = probe(*runs)
    assert len(results) == len(runs)
    for result in results:
        command = " ".join(["pulse", *result["argv"]])
        assert result["code"] == 0 and "usage: pulse" in result["out"], command
        assert result["loaded"] == [], f"`{command}` loaded {result['loaded']}"


def test_a_help_that_imports_its_defaults_still_shows_them() -> None:
    (catch_up,) = probe(["catch-up", "--help"])
    text = " ".join(catch_up["out"].split())
    assert catch_up["code"] == 0 and "every N events (default 200000)" in text


def test_commands_through_a_running_service_load_no_heavy_module(service: Any) -> None:
    data = ["--data-dir", str(service.data_dir)]
    (created,) = probe([*data, "collective", "create", "demo", "--owner", "me",
                        "--embedder", "hash"])  # fmt: skip
    assert created["code"] == 0, created
    recorded, *rest = probe(
        [*data, "record", "-c", "demo", "Retry NATS publishes on timeout", "--domain", "nats"],
        [*data, "search", "-c", "demo", "nats timeout", "--json"],
        [*data, "collective", "list"],
    )
    experience = recorded["out"].strip()
    assert recorded["code"] == 0 and len(experience) == 36, recorded
    searched, listed = rest
    assert [h["experience"]["experience_id"] for h in json.loads(searched["out"])] == [experience]
    assert "demo  owner me" in listed["out"] and "embedder hash" in listed["out"]
    got, reinforced, again = probe(
        [*data, "get", experience],
        [*data, "reinforce", experience],
        [*data, "reinforce", experience, "--json"],
    )
    assert "Retry NATS publishes on timeout" in got["out"] and "[nats]" in got["out"]
    assert reinforced["out"].strip() == "1"
    assert json.loads(again["out"]) == {"experience_id": experience, "applications": 2}
    for result in (recorded, searched, listed, got, reinforced, again):
        assert result["code"] == 0, result
        command = " ".join(["pulse", *result["argv"]])
        assert result["loaded"] == [], f"`{command}` loaded {result['loaded']}"


def test_the_service_file_describes_the_api_the_cli_calls(service: Any) -> None:
    """`pulse up` writes what a client needs of each method beside its URL, from PulseDB
    itself, so the CLI binds arguments and decodes results as PulseDB declares them."""
    from ops.remote import _type, describe_api, return_type

    written = json.loads((Path(service.data_dir) / "service.json").read_text())
    assert written["api"] == describe_api()
    for name, method in written["api"].items():
        assert _type(method["returns"]) == return_type(name), name


def test_a_description_from_another_version_falls_back_to_this_pulsedb() -> None:
    """A service started by another version may name a type this one moved or lacks: the
    client then decodes into the type its own PulseDB declares."""
    from ops.remote import _Method, describe_api, return_type

    described = dict(describe_api()["get_experience"], returns={"class": "nowhere:Gone"})
    assert _Method("get_experience", described).returns == return_type("get_experience")
