"""The HTTP contract: a live `pulse up` answers as its OpenAPI schema says, tried with
schemathesis (property-based requests made from /openapi.json: the schema's examples,
its boundaries, random valid and invalid bodies) with every check it has; and what the
schema promises beyond JSON: Prometheus text from prometheus_client, server-sent events,
and POST /v1/sql as Arrow IPC or Parquet."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet
import pytest

from tests.harness import Service, by_profile, call, start, stop
from tests.harness import clean_env as _env

ST = str(Path(sys.executable).parent / "st")
TOKEN = "contract-s3cret"
SEED = 17
# random cases per operation of the fuzzing and stateful phases (the coverage phase's
# cases, every operation's boundaries, negatives and statuses, are all sent whatever this
# is); `HYPOTHESIS_PROFILE=dev` draws more
MAX_EXAMPLES = by_profile(ci=3, dev=10)
JSON = {"Content-Type": "application/json"}


def _guarded(data_dir: Path) -> Any:
    running = start(data_dir, "--token", TOKEN, env=_env())
    running.token = TOKEN
    yield running
    if running.process.poll() is None:
        stop(running)


@pytest.fixture
def guarded(tmp_path: Path) -> Any:
    """`pulse up` with a bearer token of its own, for a test that needs one as it was
    started (the examples name what they made by the names the examples give)."""
    yield from _guarded(tmp_path / "data")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One `pulse up` with a bearer token of its own, for the tests that read its schema,
    its refusals or only what they stored themselves (none counts what it holds, none
    depends on the others' writes)."""
    yield from _guarded(tmp_path_factory.mktemp("contract") / "data")


def schemathesis(
    service: Service, workdir: Path, phases: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`st run` against the service: the ``phases`` given, every check (schemathesis' own
    positive_data_acceptance replaced by tests.contract_hooks', and no response-time
    limit short of the request timeout), a fixed seed. One
    worker: schemathesis' threads trip over Python 3.11's ast (a runtime error of the
    run, not of the service)."""
    env = {**_env(), "SCHEMATHESIS_HOOKS": "tests.contract_hooks", "NO_COLOR": "1"}
    env["PYTHONPATH"] = str(Path(__file__).parent.parent)
    return subprocess.run(
        [ST, "run", f"{service.url}/openapi.json",
         "--header", f"Authorization: Bearer {TOKEN}",
         "--phases", phases,
         "--checks", "all", "--exclude-checks", "positive_data_acceptance",
         # (no time limit short of the request timeout: tests assert no timings, the
         # machine is shared and the suite runs on every core; speed is for ops/bench)
         "--max-response-time", "30",
         "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES),
         "--workers", "1", "--request-timeout", "30", "--no-shrink",
         "--output-truncate", "true",
         # a watch is a stream without end: schemathesis would read each until its
         # request timeout (test_a_watch_is_an_event_stream holds it to its schema)
         "--exclude-path", "/v1/watch_experiences", *extra],
        capture_output=True, text=True, timeout=840, cwd=workdir, env=env,
    )  # fmt: skip


# -- what the schema says beyond JSON ----------------------------------------------------------


async def test_the_schema_states_media_types_statuses_and_limits(shared: Service) -> None:
    async with shared.client() as client:
        schema = (await client.get("/openapi.json")).json()
    paths, components = schema["paths"], schema["components"]["schemas"]
    assert (
        "text/event-stream" in paths["/v1/watch_experiences"]["get"]["responses"]["200"]["content"]
    )
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == [
        "text/plain; version=0.0.4; charset=utf-8"
    ]
    sql = paths["/v1/sql"]["post"]
    assert set(sql["responses"]["200"]["content"]) == {
        "application/json", "application/vnd.apache.arrow.stream", "application/vnd.apache.parquet"
    }  # fmt: skip
    assert {"408", "413", "499"} <= set(sql["responses"])
    record = paths["/v1/record_experience"]["post"]
    assert record["requestBody"]["required"] is True
    assert {"401", "403", "404", "409", "413", "422", "500", "503"} <= set(record["responses"])
    assert record["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert paths["/v1/status"]["post"]["requestBody"]["required"] is False
    content = components["record_experience_request"]["properties"]["content"]
    assert (content["minLength"], content["maxLength"], content["x-max-bytes"]) == (
        1, 102400, 102400
    )  # fmt: skip
    assert "bytes of UTF-8" in content["description"]
    for name, path in paths.items():
        if name.startswith("/v1/") and "post" in path:
            assert "example" in path["post"]["requestBody"]["content"]["application/json"], name


async def test_json_types_are_strict_and_refusals_name_the_field(shared: Service) -> None:
    async with shared.client() as client:
        for body, problem in [
            ({"timeout": False}, "timeout: Input should be a valid number"),
            ({"timeout": "5"}, "timeout: Input should be a valid number"),
        ]:
            response = await client.post("/v1/sync", json=body)
            assert response.status_code == 422, response.text
            assert response.json()["problems"] == [f"{problem} (got {body['timeout']!r})"]
        team = await call(client, "create_collective", owner_id="o", name="t",
                          embedding_dimension=2)  # fmt: skip
        for body, field in [
            ({"collective_id": team, "content": ""}, "content: must be 1 byte"),
            ({"collective_id": team, "content": "x", "embedding": [True, 1]}, "embedding:"),
            ({"collective_id": team, "content": "x", "embedding": ["1", 1]}, "embedding:"),
        ]:
            response = await client.post("/v1/record_experience", json=body)
            assert response.status_code == 422 and response.json()["message"].startswith(field)
        too_long = "é" * 51_201  # 51,201 characters: within maxLength, past 102,400 bytes
        response = await client.post("/v1/record_experience",
                                     json={"collective_id": team, "content": too_long})  # fmt: skip
        assert response.status_code == 422
        assert "102,400 bytes of UTF-8" in response.json()["message"]
        # no body where arguments are required; none where none is: the defaults
        response = await client.post("/v1/record_experience")
        assert response.status_code == 422 and response.json()["message"].startswith(
            "body: required"
        )
        response = await client.post("/v1/record_experience", content=b"null",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        assert response.status_code == 422 and response.json()["message"].startswith(
            "body: must be"
        )
        assert (await client.post("/v1/status")).status_code == 200


async def test_a_watch_is_an_event_stream(shared: Service) -> None:
    async with shared.client() as client:
        async with client.stream("GET", "/v1/watch_experiences") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = aiter(response.aiter_lines())
            assert await anext(lines) == ": watching"
        async with shared.client(token="not-a-token") as stranger:
            refused = await stranger.get("/v1/watch_experiences")
    assert refused.status_code == 401
    assert set(refused.json()) == {"error", "message"} and refused.json()["error"] == "Unauthorized"


# -- /metrics from prometheus_client ------------------------------------------------------------


async def test_metrics_are_prometheus_text(shared: Service) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    def requests(text: str) -> dict[tuple[str, str], float]:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert {"pulse_http_requests", "pulse_http_request_duration_seconds",
                "pulse_events_applied", "pulse_applied_sequence", "pulse_stream_sequence",
                "pulse_replication_lag_events"} <= set(families)  # fmt: skip
        return {
            (s.labels["route"], s.labels["status"]): s.value
            for s in families["pulse_http_requests"].samples
            if s.name == "pulse_http_requests_total"
        }

    async with shared.client() as client:  # (shared: what this test's request added)
        before = requests((await client.get("/metrics")).text)
        await client.post("/v1/status")
        response = await client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    after = requests(response.text)
    assert after[("/v1/status", "200")] == before.get(("/v1/status", "200"), 0) + 1


# -- POST /v1/sql in Arrow IPC and Parquet --------------------------------------------------------


async def test_sql_answers_in_arrow_and_parquet(shared: Service) -> None:
    async with shared.client() as client:
        team = await call(client, "create_collective", owner_id="o", name="t",
                          embedding_dimension=2)  # fmt: skip
        for i in range(3):
            await call(client, "record_experience", collective_id=team, content=f"note {i}",
                       embedding=[1, i], importance=i / 4)  # fmt: skip
        query = {"query": "SELECT content, importance FROM experiences "
                          f"WHERE collective_id = '{team}' ORDER BY content"}  # fmt: skip
        plain = (await client.post("/v1/sql", json=query)).json()
        arrow = await client.post("/v1/sql", params={"format": "arrow"}, json=query)
        assert arrow.headers["content-type"] == "application/vnd.apache.arrow.stream"
        parquet = await client.post(
            "/v1/sql", json=query, headers={"Accept": "application/vnd.apache.parquet"}
        )
        assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
        unknown = await client.post("/v1/sql", params={"format": "csv"}, json=query)
    from_arrow = pyarrow.ipc.open_stream(arrow.content).read_all()
    from_parquet = pyarrow.parquet.read_table(io.BytesIO(parquet.content))
    for found in (from_arrow, from_parquet):
        assert found.column_names == plain["columns"] == ["content", "importance"]
        rows = [dict(zip(plain["columns"], row, strict=True)) for row in plain["rows"]]
        assert found.to_pylist() == rows
        assert found.schema.field("importance").type == pa.float64()
        assert found.schema.metadata[b"pulse.seq"] == str(plain["seq"]).encode()
    assert unknown.status_code == 422 and unknown.json()["message"].startswith("format:")


def test_integers_past_64_bits_travel_as_text_in_arrow_and_parquet() -> None:
    """DuckDB's HUGEINT (or a column of unsigned and negative values) has no Arrow
    integer type: the column is text, as a column of mixed types is, never a 500."""
    from ops import tables
    from projections.analytics import SqlResult

    result = SqlResult(columns=["n", "m"], rows=[[2**64 - 1, 2**70], [-1, 1]], seq=3)
    for form in ("arrow", "parquet"):
        body = tables.encode(result, form)
        found = (
            pyarrow.ipc.open_stream(body).read_all()
            if form == "arrow"
            else pyarrow.parquet.read_table(io.BytesIO(body))
        )
        assert found.to_pylist() == [{"n": str(2**64 - 1), "m": str(2**70)}, {"n": "-1", "m": "1"}]


# -- what a generated client reads in the schema ---------------------------------------------------

# the operations that end or remove what the others use, in the order they can run
LAST = ("end_activity", "end_session", "revoke_token", "delete_relation", "delete_insight",
        "delete_wisdom", "delete_session", "delete_thread", "delete_experience",
        "delete_collective")  # fmt: skip


async def test_every_example_works_on_a_collective_made_as_the_quickstart_does(
    guarded: Service,
) -> None:
    """Each operation's example, its ids those of what the examples of the making
    operations made (a collective that embeds with the hash embedder, as the quickstart's
    does), is answered 200: a newcomer can send them as they are."""
    from ops import contract

    async with guarded.client() as client:
        schema = (await client.get("/openapi.json")).json()
        examples = {
            path.removeprefix("/v1/"): item["post"]["requestBody"]["content"]["application/json"][
                "example"
            ]
            for path, item in schema["paths"].items()
            if path.startswith("/v1/") and "post" in item
        }
        assert examples["create_collective"]["embedder"] == "hash"
        made: dict[str, str] = {}  # an example's id -> the id of what its example made

        async def send(name: str, body: dict[str, Any]) -> Any:
            for example_id, real in made.items():
                body = json.loads(json.dumps(body).replace(example_id, real))
            response = await client.post(f"/v1/{name}", json=body)
            assert response.status_code == 200, (name, body, response.text)
            return response.json()

        makers = list(contract.MADE)
        for name in makers:
            field, _ = contract.MADE[name]
            answer = await send(name, examples[name])
            made[contract.EXAMPLES[field]] = answer if isinstance(answer, str) else answer[field]
            if name == "record_experience":  # ... and the other experience the examples name
                made[contract.OTHER] = await send(name, examples[name])
        for name in sorted(set(examples) - set(makers) - set(LAST)):
            await send(name, examples[name])
        for name in LAST:
            await send(name, examples[name])


async def test_operations_are_named_and_the_bearer_scheme_declared(shared: Service) -> None:
    async with shared.client() as client:
        schema = (await client.get("/openapi.json")).json()
    named = {
        operation["operationId"]: path
        for path, item in schema["paths"].items()
        for operation in item.values()
    }
    for operation_id, path in named.items():
        assert path in (f"/v1/{operation_id}", f"/{operation_id}"), (operation_id, path)
    assert {"health", "metrics", "watch_experiences", "sql", "create_collective"} <= set(named)
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["security"] == [{"bearer": []}]
    assert {} in schema["paths"]["/health"]["get"]["security"]  # (up or down to anyone)
    scopes = {path: item["post"]["x-scope"] for path, item in schema["paths"].items()
              if path.startswith("/v1/") and "post" in item}  # fmt: skip
    assert (scopes["/v1/search_text"], scopes["/v1/record_experience"]) == ("read", "write")
    assert scopes["/v1/create_token"] == "admin"
    assert (
        "needs admin or more"
        in schema["paths"]["/v1/create_token"]["post"]["responses"]["403"]["description"]
    )
    rows = schema["components"]["schemas"]["SqlResult"]["properties"]["rows"]
    assert rows["items"]["type"] == "array" and "items" in rows["items"]
    for name, component in schema["components"]["schemas"].items():
        if name.endswith("_request"):  # one flat object: no shapes to choose from
            assert not {"anyOf", "oneOf", "allOf"} & set(component), name
    update = schema["components"]["schemas"]["update_experience_request"]
    assert update["x-at-least-one"] == ["importance", "confidence", "domain", "related_files"]


async def test_every_error_has_the_one_body_404_and_405_too(shared: Service) -> None:
    from ops.contract import ErrorBody

    async with shared.client() as client:
        answers = {
            "unknown path": await client.get("/v2/status"),
            "unknown asset": await client.get("/docs/assets/no-such-file.js"),
            "wrong method": await client.get("/v1/status"),
            "wrong method on /health": await client.post("/health"),
            "not JSON": await client.post("/v1/status", content=b"{", headers=JSON),
        }
        async with shared.client(token="not-a-token") as stranger:
            answers["no credential"] = await stranger.post("/v1/status")
    statuses = {name: response.status_code for name, response in answers.items()}
    assert statuses == {
        "unknown path": 404, "unknown asset": 404, "wrong method": 405,
        "wrong method on /health": 405, "not JSON": 422, "no credential": 401,
    }  # fmt: skip
    for name, response in answers.items():
        body = response.json()
        assert set(body) <= set(ErrorBody.model_fields), (name, body)
        ErrorBody.model_validate(body, strict=True)
    assert answers["unknown path"].json()["error"] == "NotFoundError"
    assert answers["wrong method"].json() == {
        "error": "MethodNotAllowed",
        "message": "method: GET is not allowed on '/v1/status'; use POST",
    }
    assert answers["wrong method"].headers["allow"] == "POST"


# -- every operation against its schema, from the outside ---------------------------------------


# one run of every phase, on the module's service, last in the module (it leaves the
# service as its random writes, deletes and key rotations made it). Not split into runs
# that test processes take at once: each `st run` loads and walks the schema again and
# each needs a service of its own, so three runs cost 168 CPU-s where one costs 99 (the
# scheduling in tests/conftest.py starts this module first in its test process instead).
# One `st run` is one thread: about 100 CPU-s, so 2-3 minutes under `make test`, but more
# than 400 s on a machine loaded ten times over (a bound against a hang, not a speed).
@pytest.mark.timeout(900)
def test_the_service_keeps_to_its_openapi_schema(shared: Service, tmp_path: Path) -> None:
    # (the first GET of the schema builds it; st gives up loading it after 10 s, which a
    # loaded machine's fresh service may take)
    schema = httpx.get(f"{shared.url}/openapi.json", timeout=120).json()
    operations = [path for path, item in schema["paths"].items() for _ in item
                  if path != "/v1/watch_experiences"]  # fmt: skip
    assert 10 < len(operations) <= 67
    started = time.monotonic()
    run = schemathesis(shared, tmp_path, "examples,coverage,fuzzing,stateful")
    took = time.monotonic() - started
    summary = run.stdout[run.stdout.find("SUMMARY") :]
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
    assert f"Tested: {len(operations)}\n" in summary, summary
    print(f"schemathesis: {took:.0f} s\n{summary}")
