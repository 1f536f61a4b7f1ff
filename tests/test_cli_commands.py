"""The commands' records agree with the API's declaration (``sync.api.OPERATIONS``): each
operation a command names is declared; a command offers --idempotency-key when it writes
with an operation that takes one, and --as-of when all it reads can answer as of a moment;
and `pulse call` reaches every declared operation, run as a user runs it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.cli.registry import COMMANDS
from sync.api import OPERATIONS

PULSE = str(Path(sys.executable).parent / "pulse")

# commands that write with an idempotent operation but offer no key, and why
WITHOUT_KEY = {("import",): "each batch is a call of its own: a repeated import stores again"}


def test_every_operation_a_command_names_is_declared() -> None:
    for command in COMMANDS:
        unknown = [name for name in command.operations if name not in OPERATIONS]
        assert not unknown, f"pulse {' '.join(command.path)} names {unknown}"
    assert any(c.operations for c in COMMANDS)


def test_a_command_takes_a_key_when_it_writes_and_a_moment_when_it_only_reads() -> None:
    for command in COMMANDS:
        named = [OPERATIONS[name] for name in command.operations]
        keyed = any(o.idempotent for o in named) and command.path not in WITHOUT_KEY
        assert command.writes == keyed, f"pulse {' '.join(command.path)}: --idempotency-key"
        as_of = bool(named) and all("as_of" in o.request.model_fields for o in named)
        assert command.reads == as_of, f"pulse {' '.join(command.path)}: --as-of"


def test_the_command_line_holds_no_database_connection() -> None:
    """The CLI asks the layers below (``sync.maintenance``, the instance) for what it
    needs of the state; it never opens DuckDB itself."""
    package = Path(__file__).resolve().parent.parent / "ops" / "cli"
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 10
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "duckdb"], module.name


def _pulse(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    return subprocess.run(
        [PULSE, "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_call_lists_every_declared_operation(tmp_path: Path) -> None:
    shown = _pulse(tmp_path, "call", "--help")
    assert shown.returncode == 0, shown.stderr
    listed = [line.split()[0] for line in shown.stdout.split("operations (")[1].splitlines()
              if line.startswith("  ") and not line.startswith("      ")]  # fmt: skip
    assert listed == list(OPERATIONS)


def test_call_runs_any_operation_through_the_service(service: Any) -> None:
    data = Path(service.data_dir)
    created = _pulse(
        data, "call", "create_collective", '{"owner_id": "me", "name": "demo", "embedder": "hash"}',
        "--idempotency-key", "first",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    cid = json.loads(created.stdout)
    again = _pulse(
        data, "call", "create_collective", '{"owner_id": "me", "name": "demo", "embedder": "hash"}',
        "--idempotency-key", "first", "--json",
    )  # fmt: skip
    assert json.loads(again.stdout) == cid  # stored once
    found = _pulse(data, "call", "find_collective", '{"collective": "demo"}', "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["collective_id"] == cid
    refused: dict[tuple[str, ...], str] = {
        ("nowhere",): "operation: no operation 'nowhere'; `pulse call --help` lists them",
        ("find_collective", "[1]"): "arguments: must be a JSON object of the operation's "
        "fields, got list",
        ("get_experience", '{"experience_id": "x"}'): "experience_id:",
        ("status", "{}", "--idempotency-key", "k"): "idempotency_key: status does not write",
    }
    for args, message in refused.items():
        result = _pulse(data, "call", *args)
        assert result.returncode == 1 and result.stderr.startswith(f"pulse: error: {message}"), (
            args, result.stderr,
        )  # fmt: skip
        assert len(result.stderr.strip().splitlines()) == 1
