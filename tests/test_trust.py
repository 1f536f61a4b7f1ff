"""Who may reach `pulse up`, tried as a neighbour, a web page and a tool would: every
request needs a credential (the operator secret in the data directory, or an access
token), another OS user cannot read that secret, a browser cannot forge a request (exact
application/json, Origin checked on every path), the contract is readable without a
token and its docs page loads nothing from elsewhere, /metrics and /health's details are
for admins, and an unexpected error is one line in the log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from eventlog.errors import ValidationError
from ops.operator_secret import ensure_secret, read_secret, secret_file
from tests.harness import Service, call, clean_env, drain, start, stop

APP = "https://app.example"  # a web app's origin, allowed on the second service
EVIL = "http://evil.example"
NOBODY = 65534


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`pulse up` as the quickstart starts it: nothing configured."""
    running = start(tmp_path_factory.mktemp("trust") / "data")
    yield running
    stop(running)


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`pulse up` with a web app's origin allowed, private docs and a metrics address."""
    running = start(
        tmp_path_factory.mktemp("trust-configured") / "data",
        "--allow-origin", APP, "--private-docs", "--metrics-listen", "127.0.0.1:0",
    )  # fmt: skip
    yield running
    stop(running)


def anonymous(service: Service) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=service.url, timeout=30)


def port_of(service: Service) -> int:
    return int(urlsplit(service.url).port or 0)


# -- 1. the operator secret ------------------------------------------------------------------------


def test_the_operator_secret_is_private_made_once_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    made = ensure_secret(data_dir)
    path = secret_file(data_dir)
    assert made.startswith("pulse-operator-") and len(made) > 40
    assert path.stat().st_mode & 0o777 == 0o600
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert ensure_secret(data_dir) == made == read_secret(data_dir)  # reused
    assert ensure_secret(data_dir, "chosen") == "chosen" == read_secret(data_dir)
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)  # once readable by others, its secret may be known: refused
    with pytest.raises(ValidationError, match=r"operator-token: .* can be read by other users"):
        ensure_secret(data_dir)


async def test_the_banner_says_how_and_loopback_is_no_credential(served: Service) -> None:
    secret = secret_file(served.data_dir)
    assert (
        f'  access   a credential on every request; as the operator: curl -H "Authorization: '
        f'Bearer $(cat {secret})" {served.url}/health\n'
    ) in served.banner
    assert served.token == secret.read_text().strip()
    async with anonymous(served) as client:
        for path in ("/v1/list_collectives", "/v1/sql", "/v1/status"):
            refused = await client.post(path, json={"query": "SELECT 1"} if "sql" in path else {})
            assert refused.status_code == 401, (path, refused.text)
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/v1/watch_experiences")).status_code == 401
        assert (await client.post("/mcp", json={})).status_code == 401
        assert (await client.get("/health")).json() == {"status": "up"}
    async with served.client() as operator:
        assert (await call(operator, "list_collectives"))["items"] == []


def test_another_os_user_can_neither_read_the_secret_nor_call_the_api(served: Service) -> None:
    """User nobody on the same machine: the secret file is out of reach, and the API
    without it is 401 (loopback is no credential)."""
    probe = """
import json, sys, urllib.error, urllib.request
found = {}
try:
    open(sys.argv[1]).read()
    found["read"] = "read"
except OSError as exc:
    found["read"] = type(exc).__name__
request = urllib.request.Request(sys.argv[2] + "/v1/sql", method="POST",
    data=b'{"query": "SELECT 1"}', headers={"Content-Type": "application/json"})
try:
    found["status"] = urllib.request.urlopen(request, timeout=30).status
except urllib.error.HTTPError as exc:
    found["status"] = exc.code
print(json.dumps(found))
"""

    def as_nobody() -> None:
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    assert os.geteuid() == 0, "run as root (as CI does) to act as another user"
    result = subprocess.run(
        ["/usr/bin/python3", "-c", probe, str(secret_file(served.data_dir)), served.url],
        capture_output=True, text=True, timeout=60, preexec_fn=as_nobody, cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"read": "PermissionError", "status": 401}


# -- 2. browsers cannot forge requests ------------------------------------------------------


async def test_a_cross_origin_simple_post_is_refused_and_stores_nothing(served: Service) -> None:
    """The issue's request: a page's text/plain;charset=json POST (no CORS preflight)."""
    forged = {"owner_id": "page", "name": "planted", "embedder": "hash"}
    body = json.dumps(forged).encode()
    simple = {"Content-Type": "text/plain;charset=json", "Origin": EVIL}
    async with anonymous(served) as client:
        page = await client.post("/v1/create_collective", content=body, headers=simple)
    assert page.status_code == 403, page.text
    assert page.json()["error"] == "Forbidden"
    assert page.json()["message"].startswith(f"origin: {EVIL!r} is not an origin of this service")
    async with served.client() as operator:  # even with the credential, the type is exact
        for content_type in ("text/plain;charset=json", "application/json-seq", None):
            headers = {} if content_type is None else {"Content-Type": content_type}
            refused = await operator.post("/v1/create_collective", content=body, headers=headers)
            assert refused.status_code == 415, (content_type, refused.text)
            assert refused.json()["error"] == "UnsupportedMediaType"
        assert (await call(operator, "list_collectives"))["items"] == []  # nothing stored
        fine = await operator.post(
            "/v1/list_collectives", content=b"{}",
            headers={"Content-Type": "Application/JSON; charset=utf-8"},
        )  # fmt: skip
        assert fine.status_code == 200, fine.text


async def test_a_foreign_origin_is_403_on_every_path(served: Service) -> None:
    port = port_of(served)
    async with served.client() as operator:  # the credential does not make it any better
        for method, path, body in (
            ("POST", "/v1/list_collectives", {}),
            ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}),
            ("GET", "/v1/watch_experiences", None),
            ("GET", "/health", None),
            ("GET", "/metrics", None),
            ("GET", "/openapi.json", None),
            ("GET", "/docs", None),
        ):
            for origin in (
                EVIL,
                "null",
                f"http://127.0.0.1:{port + 1}",
                f"https://127.0.0.1:{port}",
            ):
                response = await operator.request(method, path, json=body,
                                                  headers={"Origin": origin})  # fmt: skip
                assert response.status_code == 403, (path, origin, response.text)
                assert "access-control-allow-origin" not in response.headers
        for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"):
            response = await operator.post("/v1/list_collectives", json={}, headers={"Origin": own})
            assert response.status_code == 200, (own, response.text)
            assert "access-control-allow-origin" not in response.headers  # CORS is off


async def test_a_configured_origin_gets_cors_and_no_other(configured: Service) -> None:
    assert f"  origins  {APP} (CORS) besides this service's own\n" in configured.banner
    preflight = {
        "Origin": APP,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    async with anonymous(configured) as client:
        allowed = await client.options("/v1/list_collectives", headers=preflight)
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == APP
        assert "POST" in allowed.headers["access-control-allow-methods"]
        assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
        other = await client.options("/v1/list_collectives", headers={**preflight, "Origin": EVIL})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    async with configured.client() as operator:
        response = await operator.post("/v1/list_collectives", json={}, headers={"Origin": APP})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == APP
        initialize = {
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                       "clientInfo": {"name": "app", "version": "1"}},
        }  # fmt: skip
        mcp = await operator.post(
            "/mcp",
            json=initialize,
            headers={"Origin": APP, "Accept": "application/json, text/event-stream"},
        )  # (the MCP SDK checks Origin too: it takes the configured ones)
        assert mcp.status_code == 200, mcp.text
        assert mcp.headers["access-control-allow-origin"] == APP


# -- 10. the contract is readable -----------------------------------------------------------


class _Assets(HTMLParser):
    """The URLs a page loads: scripts, style sheets, icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        for key in ("src", "href"):
            if found.get(key) and tag in ("script", "link", "img"):
                self.urls.append(str(found[key]))


async def test_the_contract_is_readable_without_a_token_and_needs_no_other_site(
    served: Service,
) -> None:
    async with anonymous(served) as client:
        schema = await client.get("/openapi.json")
        assert schema.status_code == 200 and "/v1/record_experience" in schema.json()["paths"]
        page = await client.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert not re.findall(r"https?://", page.text), "the page names another site"
        parser = _Assets()
        parser.feed(page.text)
        assert len(parser.urls) >= 3, parser.urls  # the script, the style sheet, the icon
        for url in parser.urls:
            where = urljoin(f"{served.url}/docs", url)
            assert urlsplit(where).netloc == urlsplit(served.url).netloc, url
            asset = await client.get(where)
            assert asset.status_code == 200 and asset.content, url
        assert "'/openapi.json'" in page.text
        assert (await client.get("/redoc")).status_code in (401, 404)  # (no CDN page there)


async def test_private_docs_want_a_credential(configured: Service) -> None:
    async with anonymous(configured) as client:
        for path in ("/openapi.json", "/docs", "/docs/assets/swagger-ui.css"):
            assert (await client.get(path)).status_code == 401, path
    async with configured.client() as operator:
        assert (await operator.get("/openapi.json")).status_code == 200
        assert (await operator.get("/docs")).status_code == 200


async def test_metrics_and_health_details_are_for_admins(configured: Service) -> None:
    async with configured.client() as operator:
        reader = await call(operator, "create_token", owner_id="ana", scope="read")
        admin = await call(operator, "create_token", owner_id="root", scope="admin")
        details = (await operator.get("/health")).json()
        assert {"applied_seq", "stream_seq", "lag", "instance_id", "snapshot"} <= set(details)
        assert (await operator.get("/metrics")).status_code == 200
    async with configured.client(reader["token"]) as client:
        assert (await client.get("/health")).json() == {"status": "up"}
        refused = await client.get("/metrics")
        assert refused.status_code == 403 and refused.json()["error"] == "Forbidden"
        assert "reading /metrics needs an admin token" in refused.json()["message"]
    async with configured.client(admin["token"]) as client:
        assert "applied_seq" in (await client.get("/health")).json()
        assert (await client.get("/metrics")).status_code == 200
    # scrapers: GET /metrics on an address of its own, without a credential
    match = re.search(r"^  metrics  (http://127\.0\.0\.1:\d+)/metrics ", configured.banner, re.M)
    assert match, configured.banner
    async with httpx.AsyncClient(base_url=match.group(1), timeout=30) as scraper:
        scraped = await scraper.get("/metrics")
        assert scraped.status_code == 200 and "pulse_applied_sequence" in scraped.text
        assert (await scraper.post("/v1/list_collectives", json={})).status_code == 404
        assert (await scraper.get("/metrics", headers={"Origin": EVIL})).status_code == 403


# -- 9. an unexpected error is one line in the log ------------------------------------------

BROKEN = """
import functools, sys
from sync.instance import PulseDB

def broken(method):  # (an error no input reaches: the test's own)
    @functools.wraps(method)
    async def failing(self, *args, **kwargs):
        raise RuntimeError("secret detail\\nover two lines")
    return failing

PulseDB.get_collective_stats = broken(PulseDB.get_collective_stats)
PulseDB.get_active_agents = broken(PulseDB.get_active_agents)
from ops.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start_broken(data_dir: Path, env: dict[str, str]) -> Service:
    """The real `pulse up` (its logging, uvicorn, the MCP SDK), two of whose methods fail."""
    process = subprocess.Popen(
        [sys.executable, "-c", BROKEN, "--data-dir", str(data_dir), "up", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or "Ctrl-C stops" not in lines[-1]:
        line = process.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    port = re.search(r"HTTP\s+http://[\d.]+:(\d+)", "".join(lines)).group(1)  # type: ignore[union-attr]
    service = Service(f"http://127.0.0.1:{port}", data_dir, process, read_secret(data_dir))
    service.drains = [drain(process.stdout, service.printed), drain(process.stderr, service.logged)]
    return service


@pytest.mark.parametrize("level", ["WARNING", "DEBUG"])
async def test_an_unexpected_error_is_one_line_in_the_log(tmp_path: Path, level: str) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    service = _start_broken(tmp_path / "data", clean_env(PULSE_LOG_LEVEL=level))
    try:
        async with service.client() as client:
            team = await call(client, "create_collective", owner_id="o", name="team",
                              embedder="hash")  # fmt: skip
            failed = [
                await client.post("/v1/get_collective_stats", json={"collective_id": team})
                for _ in range(3)
            ]
        async with (
            service.mcp_client() as http,
            streamable_http_client(f"{service.url}/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tool = await session.call_tool("activity", {"collective": "team", "action": "active"})
    finally:
        stop(service)
    ids = [response.json()["error_id"] for response in failed]
    assert all(response.status_code == 500 for response in failed)
    assert tool.isError
    ids.append(re.search(r"internal error (\w+):", tool.content[0].text).group(1))  # type: ignore[union-attr]
    log = "".join(service.logged)
    wheres = [("service", "POST /v1/get_collective_stats")] * 3 + [("mcp", "MCP tool activity")]
    for error_id, (logger, where) in zip(ids, wheres, strict=True):
        (line,) = [line for line in log.splitlines() if error_id in line and " ERROR " in line]
        assert line.endswith(
            f"ERROR pulse.{logger}: internal error {error_id} in {where}: RuntimeError "
            "'secret detail\\nover two lines'"
        ), line
    if level == "WARNING":  # one line per error, and nothing else
        assert "Traceback" not in log, log[-3000:]
        assert len([line for line in log.splitlines() if "internal error" in line]) == 4, log
    else:  # the traceback once per error, at debug level
        assert log.count("Traceback (most recent call last)") == 4, log[-3000:]
        assert log.count("RuntimeError: secret detail") == 4
