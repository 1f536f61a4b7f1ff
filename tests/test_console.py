"""The console (``ops.console``) in a real headless Chromium (Debian's, driven by
Playwright) against a real ``pulse up``: sign-in, recall in each mode, an experience and
its graph, time travel, the live feed, the hosts page, and what another owner's read
token may see and do. Every page is read as a user reads it (the DOM the browser built),
and every test also holds the page to its policy: no script error, no Content-Security-
Policy violation, and the token in no URL the browser asked for."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from ops.console import CONTENT_SECURITY_POLICY
from ops.console.browser import launch
from tests.harness import Service, clean_env, start, stop

# every page a test opens records what would break the console's promises
WATCH_PAGE = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    running = start(tmp_path_factory.mktemp("console") / "data")
    yield running
    if running.process.poll() is None:
        stop(running)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


def call(service: Service, operation: str, token: str | None = None, **body: Any) -> Any:
    response = httpx.post(
        f"{service.url}/v1/{operation}", json=body, timeout=60,
        headers={"Authorization": f"Bearer {token or service.token}"},
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


@dataclass
class Console:
    """A browser tab on the console, signed in with ``token``."""

    page: Page
    service: Service
    token: str
    asked: list[str] = field(default_factory=list)  # every URL the page requested
    # script errors and errors logged (a 404 or 401 the API answered, which the browser
    # logs too, is an answer the page shows, not an error of the page's)
    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # answers of 500 and above

    def open(self, route: str) -> None:
        """Show ``route`` (a page opened again is read again), once it is ready."""
        target = f"{self.service.url}/ui/#{route}"
        self.page.evaluate("document.getElementById('main').dataset.state = 'stale'")
        if self.page.url == target:
            self.page.reload()
        else:
            self.page.goto(target)
        self.ready()

    def ready(self) -> None:
        self.page.wait_for_selector("main[data-state=ready]", state="attached")

    def text(self) -> str:
        return self.page.inner_text("main")

    def check(self) -> None:
        """What every test asks of every page it opened."""
        assert self.page.evaluate("window.__violations") == []
        assert self.errors == [] and self.failed == []
        assert self.asked and not [url for url in self.asked if self.token in url]


@pytest.fixture
def console(up: Service, browser: Browser) -> Iterator[Any]:
    contexts = []

    def sign_in(token: str | None = None, refused: bool = False) -> Console:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC")
        contexts.append(context)
        context.add_init_script(WATCH_PAGE)
        page = context.new_page()
        tab = Console(page, up, token or up.token or "")
        page.on("request", lambda request: tab.asked.append(request.url))
        page.on("pageerror", lambda error: tab.errors.append(str(error)))
        page.on(
            "console",
            lambda m: (
                m.type == "error"
                and not m.text.startswith("Failed to load resource")
                and tab.errors.append(m.text)
            ),
        )
        page.on("response", lambda r: r.status >= 500 and tab.failed.append(f"{r.status} {r.url}"))
        page.on("dialog", lambda dialog: dialog.accept())  # (a revocation asks first)
        page.goto(f"{up.url}/")  # (redirected to /ui/)
        page.wait_for_selector("#sign-in:not([hidden])")
        page.fill("#token", tab.token)
        page.click("#sign-in-form button[type=submit]")
        if refused:
            page.wait_for_selector("#sign-in-error:not(:empty)")
        else:
            tab.ready()
        return tab

    yield sign_in
    for context in contexts:
        context.close()


def collective(up: Service, name: str, owner: str = "ana") -> str:
    made: str = call(up, "create_collective", owner_id=owner, name=name, embedder="hash")
    return made


def record(up: Service, cid: str, content: str, token: str | None = None, **more: Any) -> str:
    made: str = call(up, "record_experience", token, collective_id=cid, content=content, **more)
    return made


# -- the tests ------------------------------------------------------------------------------


def test_the_pages_answer_without_a_credential_under_a_strict_policy(up: Service) -> None:
    root = httpx.get(f"{up.url}/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    page = httpx.get(f"{up.url}/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert (
        "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
    )
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline
    library = httpx.get(f"{up.url}/ui/vendor/cytoscape-3.34.4.esm.min.js")
    assert library.status_code == 200 and library.headers["content-type"].startswith(
        "text/javascript"
    )
    again = httpx.get(f"{up.url}/ui/app.js", headers={"If-None-Match": library.headers["etag"]})
    assert again.status_code == 200  # (another file's ETag)
    same = httpx.get(f"{up.url}/ui/app.js")
    assert (
        httpx.get(
            f"{up.url}/ui/app.js", headers={"If-None-Match": same.headers["etag"]}
        ).status_code
        == 304
    )
    for path in ("/ui/nothing.js", "/ui/..%2Fpyproject.toml", "/ui/%2e%2e/__init__.py"):
        assert httpx.get(f"{up.url}{path}").status_code == 404, path
    # the data is not public: the API still wants a credential
    assert httpx.post(f"{up.url}/v1/list_collectives", json={}).status_code == 401


def test_sign_in_refuses_a_bad_token_and_never_puts_one_in_a_url(up: Service, console: Any) -> None:
    tab = console("pulse_not-a-token", refused=True)
    assert tab.page.is_visible("#sign-in")
    assert "token" in tab.page.inner_text("#sign-in-error").lower()
    assert tab.page.is_hidden("#nav")
    good = console()
    assert "operator · admin" in good.page.inner_text("#me")
    assert good.page.is_visible("nav a[data-nav=hosts]")
    good.page.reload()  # the token lives in the tab: still signed in
    good.ready()
    assert good.page.is_hidden("#sign-in")
    good.check()
    assert not [line for line in up.logged if (up.token or "") in line]
    good.page.click("#sign-out")
    good.page.wait_for_selector("#sign-in:not([hidden])")
    assert good.page.evaluate("sessionStorage.length") == 0


def test_search_in_each_mode_and_open_a_hit(up: Service, console: Any) -> None:
    cid = collective(up, "recall")
    wanted = record(up, cid, "Retry NATS publishes with the same message id after a timeout",
                    domain=["nats"], importance=0.9)  # fmt: skip
    record(up, cid, "Billing speaks API v2 since March", domain=["billing"])
    hostile = record(up, cid, '<img src=x onerror="window.__owned=1"> publishes <b>bold</b>')
    tab = console()
    for mode, hit in (
        ("both", wanted),
        ("meaning", wanted),
        ("words", wanted),
        ("context", wanted),
    ):
        tab.open(f"/recall/{cid}")
        tab.page.fill("#recall-form input[name=q]", "retry NATS publishes timeout")
        tab.page.select_option("#recall-form select[name=mode]", mode)
        tab.page.click("#recall-form button[type=submit]")
        tab.page.wait_for_selector(f"main[data-state=ready] tr[data-hit='{hit}']")
        first = tab.page.get_attribute("#results tr[data-hit] >> nth=0", "data-hit")
        assert first == wanted, mode
        why = tab.page.inner_text(f"tr[data-hit='{hit}'] .why") if mode != "context" else ""
        if mode == "both":
            assert "meaning #1" in why and "words #1" in why and "energy" in why
    # filters: a type none is, then theirs; a domain none has, then the hit's
    tab.open(f"/recall/{cid}?q=publishes&mode=words&types=Fact")
    assert tab.page.locator("tr[data-hit]").count() == 0
    tab.open(f"/recall/{cid}?q=publishes&mode=words&types=Generic,Fact")
    assert tab.page.locator("tr[data-hit]").count() == 2
    tab.open(f"/recall/{cid}?q=publishes&mode=words&domains=billing")
    assert tab.page.locator("tr[data-hit]").count() == 0
    tab.open(f"/recall/{cid}?q=publishes&mode=words&domains=nats&min_importance=0.5")
    assert tab.page.locator("tr[data-hit]").count() == 1
    # a hit opens, and an agent's text is shown as text, never parsed as HTML
    tab.open(f"/recall/{cid}?q=publishes&mode=words")
    tab.page.click(f"tr[data-hit='{hostile}'] a[data-experience]")
    tab.page.wait_for_selector("main[data-page=experience][data-state=ready]")
    assert tab.page.inner_text("#content").startswith("<img src=x")
    assert tab.page.locator("main img").count() == 0
    assert tab.page.evaluate("window.__owned") is None
    tab.check()


def test_an_experience_shows_its_versions_and_its_graph_expands_node_by_node(
    up: Service, console: Any
) -> None:
    cid = collective(up, "graph")
    a = record(up, cid, "A: the deploy script needs the staging key")
    b = record(up, cid, "B: staging keys rotate on Mondays")
    c = record(up, cid, "C: the rotation job runs at 02:00 UTC")
    call(up, "store_relation", source_id=a, target_id=b, relation_type="Supports")
    call(up, "store_relation", source_id=b, target_id=c, relation_type="Elaborates")
    call(up, "update_experience", experience_id=a, importance=0.95, domain=["deploy"])
    for _ in range(3):
        call(up, "reinforce_experience", experience_id=a)
    call(
        up, "store_insight", collective_id=cid, content="keys drive deploys", source_experiences=[a]
    )
    tab = console()
    tab.open(f"/e/{a}")
    assert tab.page.inner_text("#content") == "A: the deploy script needs the staging key"
    events = tab.page.eval_on_selector_all(
        "#versions tr[data-event]", "rows => rows.map(r => r.dataset.event)"
    )
    assert events == ["experience.recorded", "experience.updated"]
    changed = tab.page.inner_text("#versions tr[data-event='experience.updated']")
    assert "importance: 0.5 → 0.95" in changed and "deploy" in changed
    assert "3 reinforcements" in tab.page.inner_text("#reinforcements")
    assert tab.page.locator("#reinforcements svg circle").count() == 3
    assert "keys drive deploys" in tab.page.inner_text("#insights")
    graph = tab.page.locator("#graph")
    assert graph.get_attribute("data-nodes") == "2" and graph.get_attribute("data-edges") == "1"
    assert tab.page.locator(f"#graph-nodes li[data-node='{c}']").count() == 0
    tab.page.click(f"#graph-nodes button[data-expand='{b}']")  # B's own relations come in
    tab.page.wait_for_selector("#graph[data-nodes='3'][data-state=ready]")
    assert graph.get_attribute("data-edges") == "2"
    assert tab.page.locator(f"#graph-nodes li[data-node='{c}']").count() == 1
    assert tab.page.locator("#graph canvas").count() > 0  # drawn by cytoscape.js
    tab.page.click(f"#graph-nodes li[data-node='{c}'] a")
    tab.page.wait_for_selector(f"main[data-state=ready] #fields >> text={c}")
    tab.check()


def test_the_time_slider_shows_the_text_before_an_update(up: Service, console: Any) -> None:
    cid = collective(up, "time")
    eid = record(up, cid, "The billing service speaks API v1", domain=["v1"])
    recorded_ms = call(up, "get_experience", experience_id=eid)["timestamp_ms"]
    deadline = time.monotonic() + 10
    while time.time() * 1000 <= recorded_ms + 5:  # (a later millisecond than the record)
        assert time.monotonic() < deadline
    between = int(time.time() * 1000)
    while time.time() * 1000 <= between + 5:
        assert time.monotonic() < deadline
    call(up, "update_experience", experience_id=eid, domain=["v2"])
    call(up, "invalidate_experience", experience_id=eid, reason="v1 was retired")
    tab = console()
    tab.open(f"/e/{eid}")
    assert tab.page.inner_text("[data-field=domain]") == "v2"
    assert "v1 was retired" in tab.page.inner_text("[data-field=validity]")
    assert tab.page.is_visible("#write-controls")
    # the date-time field: a moment between the record and the update (local time: UTC)
    moment = datetime.fromtimestamp(between / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    tab.page.fill("#at", moment)
    tab.page.dispatch_event("#at", "change")
    tab.page.wait_for_url("**at=*")
    tab.ready()
    assert tab.page.inner_text("[data-field=domain]") == "v1"
    assert "open-ended" in tab.page.inner_text("[data-field=validity]")
    assert tab.page.is_visible("#past") and tab.page.locator("#write-controls").count() == 0
    # the navigation keeps the moment, and every page reads as of it
    at = tab.page.url.split("at=")[1]
    tab.page.click("nav a[data-nav=collectives]")
    tab.page.wait_for_url(f"**/ui/#/?at={at}")
    tab.ready()
    tab.open(f"/c/{cid}?at={at}")
    assert "The billing service" in tab.page.inner_text("#recent")
    assert tab.page.locator("#feed, #record-form").count() == 0  # (the present's only)
    tab.open(f"/recall/{cid}?q=billing&mode=words&domains=v1&invalid=1&at={at}")
    assert tab.page.locator(f"tr[data-hit='{eid}']").count() == 1
    tab.open(f"/recall/{cid}?q=billing&mode=words&domains=v1&invalid=1")
    assert tab.page.locator(f"tr[data-hit='{eid}']").count() == 0  # (v2 now)
    tab.open(f"/hosts?at={at}")
    assert tab.page.locator("#token-form, button[data-revoke]").count() == 0
    tab.open(f"/e/{eid}?at={at}")
    # the slider at its left end (the collective's creation): the experience was not yet
    tab.page.eval_on_selector(
        "#at-slider", "s => { s.value = '0'; s.dispatchEvent(new Event('change')); }"
    )
    tab.page.wait_for_selector("main[data-state=ready] >> text=It did not exist then")
    # and back to now
    tab.page.click("#at-now")
    tab.page.wait_for_selector("main[data-state=ready] [data-field=domain] >> text=v2")
    assert tab.page.is_hidden("#past")
    tab.check()


def test_an_experience_recorded_through_the_api_appears_live(up: Service, console: Any) -> None:
    cid = collective(up, "live")
    call(
        up,
        "register_activity",
        collective_id=cid,
        agent_id="scout",
        task_description="mapping the API",
    )
    tab = console()
    tab.open(f"/c/{cid}")
    assert "scout" in tab.page.inner_text("#agents")
    tab.page.wait_for_selector("#feed[data-live=open]", state="attached")
    eid = record(up, cid, "Arrived while the console was open")
    tab.page.wait_for_selector(
        f"#feed li[data-experience='{eid}'] >> text=Arrived while the console"
    )
    # the form records too, with the visibility chosen
    tab.page.fill("#record-form textarea[name=content]", "Recorded from the console's form")
    tab.page.select_option("#record-form select[name=visibility]", "private")
    tab.page.click("#record-form button[type=submit]")
    made = tab.page.wait_for_selector("#recorded a").inner_text()
    assert call(up, "get_experience", experience_id=made)["visibility"] == "private"
    tab.page.wait_for_selector(f"#feed li[data-experience='{made}']")
    # a collective that reinforces duplicates says so, and so does its form
    lessons = call(up, "create_collective", owner_id="ana", name="lessons", embedder="hash",
                   on_duplicate="reinforce")  # fmt: skip
    first = record(up, lessons, "Retry NATS publishes with the same message id")
    tab.open(f"/c/{lessons}")
    assert "reinforce the one they duplicate (cosine ≥ 0.95)" in tab.page.inner_text("main")
    assert "auto: each text its own" in tab.page.inner_text("main")
    tab.page.fill("#record-form textarea[name=content]",
                  "Retry NATS publishes with the same message id")  # fmt: skip
    tab.page.click("#record-form button[type=submit]")
    said = tab.page.wait_for_selector("#recorded >> text=A duplicate: reinforced")
    assert said.inner_text().endswith(first)
    tab.open(f"/c/{cid}")
    tab.page.wait_for_selector("#feed[data-live=open]", state="attached")
    # and a presence change shows without a reload too
    call(
        up,
        "register_activity",
        collective_id=cid,
        agent_id="builder",
        task_description="wiring it up",
    )
    tab.page.wait_for_selector("#agents li[data-agent=builder]", timeout=15_000)
    # leaving the page ends its live stream (and its timer: the stream's list is one)
    with tab.page.expect_event(
        "requestfailed", lambda request: "/v1/watch_experiences" in request.url
    ):
        tab.open("/recall")
    tab.check()


def test_another_owners_read_token_sees_no_private_memory_and_no_write_control(
    up: Service, console: Any
) -> None:
    cid = collective(up, "shared", owner="carol")
    carol = call(up, "create_token", owner_id="carol", agent_id="scribe", scope="write")["token"]
    secret = record(
        up, cid, "carol's private note: the vault code is 0420", carol, visibility="private"
    )
    team = record(up, cid, "carol's team note: deploys freeze on Fridays", carol)
    public = record(up, cid, "an org-wide note: the wiki moved to /docs", carol, visibility="org")
    call(
        up,
        "store_relation",
        carol,
        source_id=public,
        target_id=secret,
        relation_type="RelatedTo",
        visibility="private",
    )
    dave = call(up, "create_token", owner_id="dave", scope="read")["token"]
    tab = console(dave)
    assert "dave · read" in tab.page.inner_text("#me")
    assert tab.page.is_hidden("nav a[data-nav=hosts]")
    searches = [f"/recall/{cid}?q={q}&mode={m}" for q, m in
                (("note", "both"), ("vault code note", "words"), ("note", "context"))]  # fmt: skip
    pages = [f"/c/{cid}", *searches, f"/e/{public}", f"/e/{secret}", f"/e/{team}", "/", "/hosts"]
    for route in pages:
        tab.open(route)
        shown = tab.text()
        assert "0420" not in shown and "private note" not in shown, route
        assert "Fridays" not in shown, route  # (a team note: carol's team, not dave)
        for control in ("#record-form", "#write-controls", "#token-form", "button[data-revoke]"):
            assert tab.page.locator(control).count() == 0, (route, control)
    tab.open(f"/e/{public}")
    assert "the wiki moved" in tab.page.inner_text("#content")
    assert tab.page.locator("#graph").get_attribute("data-nodes") == "1"
    tab.open(f"/e/{secret}")
    assert "does not exist, or this token may not see it" in tab.text()
    # live: what carol records arrives in dave's feed only if dave may see it
    tab.open(f"/c/{cid}")
    tab.page.wait_for_selector("#feed[data-live=open]", state="attached")
    hidden = record(up, cid, "carol's second private note: 0420 again", carol, visibility="private")
    shown = record(up, cid, "an org-wide note: lunch at noon", carol, visibility="org")
    tab.page.wait_for_selector(f"#feed li[data-experience='{shown}']")
    assert tab.page.locator(f"#feed li[data-experience='{hidden}']").count() == 0
    assert "0420" not in tab.text()
    # carol's own write token sees her note and may act on it
    own = console(carol)
    own.open(f"/e/{secret}")
    assert "0420" in own.page.inner_text("#content") and own.page.is_visible("#write-controls")
    own.page.click("#write-controls button[data-action=reinforce_experience]")
    own.page.wait_for_selector("main[data-state=ready] [data-field=applications] >> text=/^1/")
    tab.check()
    own.check()


def test_an_admin_sees_the_host_and_makes_and_revokes_a_token(up: Service, console: Any) -> None:
    # (this host wrote something whichever of the module's tests ran first on this worker)
    record(up, collective(up, "hosts", owner="erin"), "a note: this host has written")
    tab = console()
    tab.open("/hosts")
    assert tab.page.inner_text("#host [data-stat=status] b") == "ok"
    assert tab.page.locator("#stream [data-stat=messages] b").inner_text().isdigit()
    assert tab.page.locator("#writers tr").count() >= 2  # a header and this host
    tab.page.fill("#token-form input[name=owner_id]", "erin")
    tab.page.select_option("#token-form select[name=scope]", "read")
    tab.page.click("#token-form button[type=submit]")
    made = tab.page.wait_for_selector("#token-secret").inner_text()
    assert made.startswith("pulse_")
    tokens = call(up, "list_tokens", owner_id="erin")
    assert [t["scope"] for t in tokens] == ["read"]
    erin = console(made)  # the secret shown once signs in
    assert "erin · read" in erin.page.inner_text("#me")
    tab.open("/hosts")  # the secret is not shown again
    assert made not in tab.text()
    tab.page.click(f"button[data-revoke='{tokens[0]['token_id']}']")
    tab.page.wait_for_selector(
        f"main[data-state=ready] #tokens:not(:has([data-token='{tokens[0]['token_id']}']))"
    )
    assert call(up, "list_tokens", owner_id="erin") == []
    erin.page.reload()  # a revoked token is signed out
    erin.page.wait_for_selector("#sign-in:not([hidden])")
    tab.check()


def test_the_benchmark_measures_every_page_beside_its_api_calls() -> None:
    """``ops.bench.console``, run small: a figure for every page, the page's and its API
    calls' (the 100,000-experience run is in docs/benchmarks.md)."""
    run = subprocess.run(
        [sys.executable, "-m", "ops.bench.console", "--n", "500", "--rounds", "2"],
        capture_output=True, text=True, timeout=300, env=clean_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    figures = {f["figure"]: f for f in map(json.loads, run.stdout.splitlines())}
    assert set(figures) == {
        "collectives", "collective", "recall: both", "recall: meaning", "recall: words",
        "recall: context", "experience", "experience: expand", "hosts",
    }  # fmt: skip
    for figure in figures.values():
        assert figure["page_p50_ms"] > 0 and figure["api_p50_ms"] > 0, figure
        assert figure["experiences"] == 500 and figure["target_ms"] == 200
    assert "page/API" in run.stderr


def test_no_text_of_the_memory_is_read_as_html(up: Service, console: Any) -> None:
    """Whatever agents wrote (a collective's name, an agent's id and task, a session's
    summary, an insight, tags, typed fields) is shown as text on every page."""
    bad = '<img src=x onerror="window.__owned=1">'
    cid = collective(up, f"x{bad}"[:100])
    eid = record(
        up, cid, f"{bad} content", domain=["<b>tag</b>"],
        experience_type={"kind": "Solution", "approach": bad, "worked": True},
    )  # fmt: skip
    call(up, "register_activity", collective_id=cid, agent_id=f"a{bad}", task_description=bad)
    call(up, "start_session", collective_id=cid, agent_id="a1", summary=bad)
    call(up, "store_insight", collective_id=cid, content=bad, source_experiences=[eid])
    tab = console()
    for route in ("/", f"/c/{cid}", f"/e/{eid}", f"/recall/{cid}?q=content&mode=both",
                  f"/recall/{cid}?q=content&mode=context", "/hosts"):  # fmt: skip
        tab.open(route)
        assert tab.page.locator("main img, main script").count() == 0, route
        assert tab.page.evaluate("window.__owned") is None, route
    tab.open(f"/c/{cid}")
    assert bad in tab.page.inner_text("#agents") and bad in tab.page.inner_text("#sessions")
    tab.open(f"/e/{eid}")
    assert bad in tab.page.inner_text("#insights") and bad in tab.page.inner_text("#fields")
    assert "<b>tag</b>" in tab.page.inner_text("[data-field=domain]")
    tab.check()
