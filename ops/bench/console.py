"""Benchmark: each page of the console at 100,000 experiences, beside the API calls it makes.

    python -m ops.bench.console [--n 100000] [--rounds 15]

Fills an embedded NATS log with ``n`` experiences (``ops.bench.service``'s corpus: 12
words each, 384-d clustered vectors, one collective), starts ``pulse up`` on it (which
catches up first), gives one experience a history (an update, reinforcements, relations
two deep, an insight) and an agent an activity, then opens the console in headless
Chromium (``ops.console.browser``) signed in as the operator.

For each page, ``rounds`` times: the page is shown by a change of route, as a click on a
link shows it (the page's own clock, ``main[data-took]``: from the route's change to the
page drawn, every API call it makes, its graph laid out, included), and the same API
calls are made by a plain HTTP client (httpx) in the same phases (what the page asks at
once, at once). Prints one JSON line per page (p50 and p90 of both, ms, and the ratio)
and a table on stderr against the target: a page answers in under 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
import numpy as np

from eventlog import events as ev
from ops.bench import emitter, table
from ops.bench.service import OPERATOR, SECRET, corpus, fill, start_service, stop_service, words
from ops.console.browser import launch, show, sign_in

TARGET_MS = 200.0
emit = emitter("console")

Phase = list[tuple[str, dict[str, Any]]]  # calls made at once: (operation or GET path, body)


def pages(cid: str, eid: str, neighbour: str, query: str) -> dict[str, tuple[str, list[Phase]]]:
    """Each page: its route, and the API calls it makes, phase by phase (as app.js);
    "experience: expand" is a tap on the graph's node ``neighbour`` (not a route)."""
    one = {"collective_id": cid}
    q = quote_plus(query)
    writers = (
        f"SELECT source_agent, count(*) AS n FROM experiences WHERE collective_id = '{cid}' "
        "GROUP BY source_agent ORDER BY n DESC, source_agent LIMIT 20"
    )
    history = (
        "SELECT seq, written_at, event_type, author_owner, author_agent, instance_id, change "
        f"FROM history WHERE entity_id = '{eid}' ORDER BY seq"
    )
    insights = (
        "SELECT i.insight_id, i.content, i.confidence, i.created_at FROM insight_sources s "
        f"JOIN insights i USING (insight_id) WHERE s.experience_id = '{eid}' ORDER BY i.created_at"
    )
    hosts = (
        "SELECT instance_id, count(*) AS events, max(written_at) AS last FROM history "
        "GROUP BY instance_id ORDER BY last DESC LIMIT 50"
    )
    search = {"collective_id": cid, "k": 10, "flt": {}}
    listed: Phase = [("list_collectives", {"limit": 100})]
    return {
        "collectives": ("/", [listed, [("get_collective_stats", one),
                                       ("get_active_agents", {**one, "limit": 100})]]),
        "collective": (f"/c/{cid}", [[("get_collective", one)], [
            ("get_collective_stats", one), ("get_recent_experiences", {**one, "limit": 20}),
            ("sql", {"query": writers, "limit": 20}), ("get_active_agents", {**one, "limit": 50}),
            ("list_sessions", {**one, "open_only": True, "limit": 50}),
            ("list_tokens", {"owner_id": "bench"})]]),
        "recall: both": (f"/recall/{cid}?q={q}&mode=both", [listed, [
            ("search_hybrid", {**search, "text": query}),
            ("search_similar", {**search, "query": query}),
            ("search_text", {**search, "text": query})]]),
        "recall: meaning": (f"/recall/{cid}?q={q}&mode=meaning",
                            [listed, [("search_similar", {**search, "query": query})]]),
        "recall: words": (f"/recall/{cid}?q={q}&mode=words",
                          [listed, [("search_text", {**search, "text": query})]]),
        "recall: context": (f"/recall/{cid}?q={q}&mode=context", [listed, [
            ("get_context_candidates", {"collective_id": cid, "text": query, "k": 10,
                                        "filter": {}})]]),
        "experience": (f"/e/{eid}", [[("get_experience", {"experience_id": eid})], [
            ("get_related_experiences", {"experience_id": eid, "limit": 100}),
            ("sql", {"query": history, "limit": 1000}), ("sql", {"query": insights, "limit": 100}),
            ("get_collective", one)]]),
        "experience: expand": ("", [[
            ("get_related_experiences", {"experience_id": neighbour, "limit": 100})]]),
        "hosts": ("/hosts", [[
            ("status", {}), ("GET /health", {}), ("dead_letters", {"limit": 100}),
            ("sql", {"query": hosts, "limit": 50}), ("list_tokens", {"include_revoked": False})]]),
    }  # fmt: skip


async def api_round(client: httpx.AsyncClient, phases: list[Phase]) -> float:
    """The time (ms) of ``phases``' calls, each phase's at once, one phase after another."""

    async def one(name: str, body: dict[str, Any]) -> None:
        if name.startswith("GET "):
            answer = await client.get(name[4:])
        else:
            answer = await client.post(f"/v1/{name}", json=body)
        if answer.status_code >= 400 and answer.status_code != 404:
            raise RuntimeError(f"{name}: {answer.status_code} {answer.text[:200]}")

    started = time.perf_counter()
    for phase in phases:
        await asyncio.gather(*(one(name, body) for name, body in phase))
    return (time.perf_counter() - started) * 1000


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1)


def setup(url: str, cid: str, eids: list[str]) -> tuple[str, str]:
    """One experience with a history (two relations out, one two deep, an update, five
    reinforcements, an insight) and an active agent: the experience page's subject."""
    with httpx.Client(base_url=url, headers=OPERATOR, timeout=120) as http:

        def call(name: str, **body: Any) -> Any:
            answer = http.post(f"/v1/{name}", json=body)
            answer.raise_for_status()
            return answer.json()

        subject, near_one, far = eids[0], eids[1], eids[2]
        call("store_relation", source_id=subject, target_id=near_one, relation_type="Supports")
        call("store_relation", source_id=near_one, target_id=far, relation_type="Elaborates")
        call("store_relation", source_id=eids[3], target_id=subject, relation_type="RelatedTo")
        call("update_experience", experience_id=subject, importance=0.9, domain=["bench"])
        for _ in range(5):
            call("reinforce_experience", experience_id=subject)
        call("store_insight", collective_id=cid, content="a bench insight",
             source_experiences=[subject])  # fmt: skip
        call("register_activity", collective_id=cid, agent_id="bench-agent",
             task_description="benchmarking the console")  # fmt: skip
        call("sync")
        return subject, near_one


def browse(
    url: str, routes: dict[str, tuple[str, list[Phase]]], rounds: int,
    api_ms: Callable[[list[Phase]], float], eid: str, neighbour: str,
) -> dict[str, tuple[list[float], list[float]]]:  # fmt: skip
    """Each page ``rounds`` times in Chromium (ms by the page's clock), each round
    beside the same calls over plain HTTP (``api_ms``)."""
    from playwright.sync_api import sync_playwright

    measured: dict[str, tuple[list[float], list[float]]] = {}
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        sign_in(page, url, SECRET)

        def again(route: str, n: int) -> float:  # (round n: a route not shown just before)
            return show(page, f"{route}{'&' if '?' in route else '?'}round={n}")

        def expand(n: int) -> float:  # a node of the graph tapped (by its button)
            again(f"/e/{eid}", n)
            page.click(f"#graph-nodes button[data-expand='{neighbour}']")
            page.wait_for_selector("#graph[data-nodes='4'][data-state=ready]", state="attached")
            return float(page.get_attribute("#graph", "data-took") or "nan")

        for name, (route, phases) in routes.items():
            shown: list[float] = []
            asked: list[float] = []
            for n in range(rounds + 1):  # (the first round warms both up: not counted)
                took = expand(n) if name == "experience: expand" else again(route, n)
                api = api_ms(phases)
                if n:
                    shown.append(took)
                    asked.append(api)
            measured[name] = (shown, asked)
        browser.close()
    return measured


def main(n: int, rounds: int) -> None:
    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-console-") as tmp:
        data = Path(tmp) / "data"
        cid_uuid, events = corpus(n, rng)
        cid = str(cid_uuid)
        eids = [str(e.experience_id) for e in events[1:5] if isinstance(e, ev.ExperienceRecorded)]
        started = time.perf_counter()
        asyncio.run(fill(data, events))
        print(f"log filled with {n:,} experiences in {time.perf_counter() - started:.1f} s; "
              "pulse up catches up before it serves", file=sys.stderr)  # fmt: skip
        process, url = start_service(data)
        # the plain client runs on a loop of its own thread (Playwright's sync API runs
        # one in this thread, and refuses another here)
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever, daemon=True)
        runner.start()
        client = httpx.AsyncClient(base_url=url, headers=OPERATOR, timeout=120)

        def run(coroutine: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

        try:
            eid, neighbour = setup(url, cid, eids)
            routes = pages(cid, eid, neighbour, words(rng, 3))
            measured = browse(
                url, routes, rounds, lambda phases: run(api_round(client, phases)), eid, neighbour
            )
        finally:
            run(client.aclose())
            loop.call_soon_threadsafe(loop.stop)
            runner.join(timeout=10)
            stop_service(process)
    rows = []
    for name, (shown, asked) in measured.items():
        page_p50, api_p50 = pct(shown, 50), pct(asked, 50)
        ratio = round(page_p50 / api_p50, 2) if api_p50 else None
        met = page_p50 < TARGET_MS
        emit(name, experiences=n, rounds=rounds, page_p50_ms=page_p50, page_p90_ms=pct(shown, 90),
             api_p50_ms=api_p50, api_p90_ms=pct(asked, 90), page_vs_api=ratio,
             target_ms=TARGET_MS, met=met)  # fmt: skip
        rows.append([name, f"{page_p50:.1f}", f"{pct(shown, 90):.1f}", f"{api_p50:.1f}",
                     f"{ratio}x", f"< {TARGET_MS:.0f}", "yes" if met else "NO"])  # fmt: skip
    print(f"\nthe console at {n:,} experiences, {rounds} rounds (ms; p50 unless said)",
          file=sys.stderr)  # fmt: skip
    print(table(["page", "page", "page p90", "its API calls", "page/API", "target", "met"], rows),
          file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="experiences (default 100,000)")
    parser.add_argument("--rounds", type=int, default=15, help="times each page is shown")
    args = parser.parse_args()
    main(args.n, args.rounds)
