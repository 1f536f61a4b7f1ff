"""Clients generated from a running `pulse up`'s /openapi.json work as generated, without
edits: in Python (openapi-python-client) and in TypeScript (openapi-typescript's types
with openapi-fetch, type-checked by tsc and run with node). Each creates a collective,
records experiences, searches in every mode (similar, text, hybrid), reads one back,
runs SQL and gets an error as the typed error body, so agents in other languages can
rely on the schema.

The npm packages are the project's own (``tests/clients/package.json`` and its lock):
``npm ci`` installs them once (``make`` does, or the first run of this module)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.harness import Service, start, stop

CLIENTS = Path(__file__).parent / "clients"  # the TypeScript program and its packages
GENERATOR = str(Path(sys.executable).parent / "openapi-python-client")
MISSING = "01900000-0000-7000-8000-000000000000"  # an experience id nobody recorded
NOTES = [
    "Retry NATS publishes with the same message id after a timeout",
    "NATS publish timeouts came from slow fsync on the server",
    "DuckDB allows one writer process per database file",
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One `pulse up` for the module's clients, and its schema beside its data."""
    running = start(tmp_path_factory.mktemp("generated") / "data")
    schema = httpx.get(f"{running.url}/openapi.json", timeout=60)
    assert schema.status_code == 200, schema.text
    (running.data_dir.parent / "openapi.json").write_text(schema.text)
    yield running
    if running.process.poll() is None:
        stop(running)


# -- Python ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pulse_client(served: Service) -> Iterator[ModuleType]:
    """The package openapi-python-client makes of the schema, imported as it is."""
    where = served.data_dir.parent
    (where / "generator.yaml").write_text("post_hooks: []\n")  # (no formatter runs on it)
    made = subprocess.run(
        [GENERATOR, "generate", "--path", str(where / "openapi.json"), "--meta", "none",
         "--output-path", str(where / "pulse_client"), "--config", str(where / "generator.yaml")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert "Warning" not in made.stdout + made.stderr, made.stdout + made.stderr
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module("pulse_client")
    finally:
        sys.path.remove(str(where))
        for name in [name for name in sys.modules if name.split(".")[0] == "pulse_client"]:
            del sys.modules[name]


def test_a_generated_python_client_works_untouched(
    served: Service, pulse_client: ModuleType
) -> None:
    from pulse_client import AuthenticatedClient  # type: ignore[import-not-found]

    assert served.token is not None
    with AuthenticatedClient(base_url=served.url, token=served.token) as client:
        speak_python(client)


def speak_python(client: Any) -> None:
    """What an agent does, through the generated client's functions and models."""
    from pulse_client.api.analytics import sql
    from pulse_client.api.collectives import create_collective
    from pulse_client.api.experiences import get_experience, record_experience
    from pulse_client.api.search import search_hybrid, search_similar, search_text
    from pulse_client.models import (
        CreateCollectiveRequest,
        CreateCollectiveRequestEmbedderType0,
        ErrorBody,
        Experience,
        GetExperienceRequest,
        RecordExperienceRequest,
        SearchHybridRequest,
        SearchSimilarRequest,
        SearchTextRequest,
        SqlRequest,
        SqlResult,
    )

    team = create_collective.sync(
        client=client,
        body=CreateCollectiveRequest(
            owner_id="py", name="team", embedder=CreateCollectiveRequestEmbedderType0.HASH
        ),
    )
    assert isinstance(team, UUID), team
    ids = []
    for content in NOTES:
        recorded = record_experience.sync(
            client=client,
            body=RecordExperienceRequest(collective_id=team, content=content, domain=["ops"]),
        )
        assert isinstance(recorded, UUID), recorded
        ids.append(recorded)
    found: dict[str, list[UUID]] = {}
    for mode, call, body in [
        ("similar", search_similar, SearchSimilarRequest(collective_id=team, query="NATS", k=3)),
        ("text", search_text, SearchTextRequest(collective_id=team, text="NATS", k=3)),
        ("hybrid", search_hybrid, SearchHybridRequest(collective_id=team, text="NATS", k=3)),
    ]:
        hits = call.sync(client=client, body=body)
        assert isinstance(hits, list), (mode, hits)
        found[mode] = [hit.experience.experience_id for hit in hits]
    assert set(found["similar"]) == set(found["hybrid"]) == set(ids)
    assert set(found["text"]) == set(ids[:2])  # the two that say "NATS"
    read = get_experience.sync(client=client, body=GetExperienceRequest(experience_id=ids[0]))
    assert isinstance(read, Experience) and read.content == NOTES[0]
    assert read.domain == ["ops"] and read.collective_id == team
    mine = f"collective_id = '{team}'"
    query = f"SELECT content FROM experiences WHERE {mine} AND contains(content, 'DB')"
    answer = sql.sync(client=client, body=SqlRequest(query=query))
    assert isinstance(answer, SqlResult), answer
    assert answer.columns == ["content"] and answer.rows == [[NOTES[2]]]
    missing = get_experience.sync_detailed(
        client=client, body=GetExperienceRequest(experience_id=UUID(MISSING))
    )
    assert missing.status_code == 404 and isinstance(missing.parsed, ErrorBody)
    assert missing.parsed.error == "NotFoundError"
    assert missing.parsed.message == "experience_id: none with that id"
    refused = sql.sync_detailed(client=client, body=SqlRequest(query="DELETE FROM experiences"))
    assert refused.status_code == 422 and isinstance(refused.parsed, ErrorBody)
    assert refused.parsed.error == "ValidationError"
    assert refused.parsed.message.startswith("query: only read-only queries are allowed")


# -- TypeScript -----------------------------------------------------------------------------------


def _npm_packages() -> Path:
    """``tests/clients/node_modules``, installed from the lock file when it is missing or
    older than the lock (``npm ci``: exactly the locked versions)."""
    installed = CLIENTS / "node_modules" / ".package-lock.json"
    lock = CLIENTS / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        npm = shutil.which("npm")
        assert npm is not None, "npm (with node 20 or later) is needed for this test"
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=CLIENTS, capture_output=True,
            text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    return CLIENTS / "node_modules"


@pytest.fixture(scope="module")
def typescript_client(served: Service) -> Path:
    """The TypeScript program (``tests/clients/pulse.ts``) compiled by tsc against the
    types openapi-typescript makes of the schema: a build directory to run with node."""
    packages = _npm_packages()
    where = served.data_dir.parent / "ts"
    where.mkdir()
    (where / "node_modules").symlink_to(packages, target_is_directory=True)
    for name in ("pulse.ts", "tsconfig.json", "package.json"):
        shutil.copy(CLIENTS / name, where / name)
    node = shutil.which("node")
    assert node is not None
    for step in (
        [str(packages / ".bin" / "openapi-typescript"), str(where.parent / "openapi.json"),
         "--output", str(where / "schema.d.ts"),
         # (an argument with a default is optional to send, though always in an answer)
         "--default-non-nullable", "false"],
        [node, str(packages / "typescript" / "bin" / "tsc"), "--project", str(where)],
    ):  # fmt: skip
        done = subprocess.run(step, cwd=where, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    return where


def test_a_generated_typescript_client_works_untouched(
    served: Service, typescript_client: Path
) -> None:
    node = shutil.which("node")
    assert node is not None and served.token is not None
    run = subprocess.run(
        [node, str(typescript_client / "build" / "pulse.js"), served.url],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PULSE_TOKEN": served.token},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    seen: dict[str, Any] = json.loads(run.stdout)
    ids = seen["recorded"]
    assert len(ids) == 3 and all(UUID(i) for i in ids)
    assert set(seen["similar"]) == set(seen["hybrid"]) == set(ids)
    assert set(seen["text"]) == set(ids[:2])
    assert seen["read"] == {"experience_id": ids[0], "content": seen["notes"][0]}
    assert seen["sql"] == {"columns": ["content"], "rows": [[seen["notes"][2]]]}
    assert seen["missing"] == {
        "status": 404, "error": "NotFoundError", "message": "experience_id: none with that id"
    }  # fmt: skip
    assert seen["refused"]["status"] == 422 and seen["refused"]["error"] == "ValidationError"
