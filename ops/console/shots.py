"""The console's screenshots in the docs: a small memory made through the API, each page
shown in headless Chromium (``ops.console.browser``) and saved as a PNG.

    python -m ops.console.shots [docs/img]

Starts ``pulse up`` on a temporary data directory, records what a team of agents might
(lessons of a deploy, a billing API that changed, relations, reinforcements, an insight,
an agent at work), then saves ``console-<page>.png`` for the sign-in, the collectives, a
collective (with an experience arriving live), recall by meaning and words, the context
for a task, an experience with its graph expanded, the same experience as of before its
update, and the hosts page.
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from ops.bench.service import OPERATOR, SECRET, start_service, stop_service
from ops.console.browser import launch, show, sign_in

LESSONS = [
    ("Retry NATS publishes with the same message id after a timeout: the server drops the "
     "duplicate", ["nats", "reliability"], 0.9, {"kind": "Solution", "approach": "same msg id",
                                                 "worked": True}),
    ("A publish that times out may still have been stored; a new id makes a duplicate",
     ["nats"], 0.8, {"kind": "ErrorPattern", "signature": "publish timeout, retried with a new id",
                     "fix": "retry with the same id", "prevention": "ids from the payload"}),
    ("The deploy script needs the staging key from the vault", ["deploy"], 0.6, None),
    ("Staging keys rotate every Monday at 02:00 UTC", ["deploy", "secrets"], 0.5, None),
    ("The billing service speaks API v1", ["billing"], 0.5, None),
    ("Ana prefers short commit messages in the imperative", ["style"], 0.4,
     {"kind": "UserPreference", "category": "style", "preference": "imperative commits",
      "strength": 0.7}),
]  # fmt: skip


def build(url: str) -> dict[str, Any]:
    """The memory the screenshots show; the ids they need."""
    with httpx.Client(base_url=url, headers=OPERATOR, timeout=60) as http:

        def call(operation: str, **body: Any) -> Any:
            answer = http.post(f"/v1/{operation}", json=body)
            if answer.status_code != 200:
                raise RuntimeError(f"{operation}: {answer.text}")
            return answer.json()

        team = call("create_collective", owner_id="ana", name="platform", embedder="hash")
        call("create_collective", owner_id="ana", name="research", embedder="hash")
        ids = []
        for content, domain, importance, kind in LESSONS:
            extra = {"experience_type": kind} if kind else {}
            ids.append(call("record_experience", collective_id=team, content=content,
                            domain=domain, importance=importance, source_agent="builder",
                            **extra))  # fmt: skip
        retry, timeout, deploy, rotate, billing, _ = ids
        call("store_relation", source_id=retry, target_id=timeout, relation_type="Elaborates")
        call("store_relation", source_id=deploy, target_id=rotate, relation_type="RelatedTo")
        call("store_relation", source_id=retry, target_id=deploy, relation_type="Supports",
             strength=0.3)  # fmt: skip
        for _ in range(4):
            call("reinforce_experience", experience_id=retry)
        call("store_insight", collective_id=team, source_experiences=[retry, timeout],
             content="Idempotent publishes make NATS retries safe")  # fmt: skip
        call("register_activity", collective_id=team, agent_id="builder",
             task_description="wiring retries into the ingest worker",
             working_on=["ingest/publish.py"])  # fmt: skip
        call("start_session", collective_id=team, agent_id="builder",
             summary="ingest worker: retries and idempotency")  # fmt: skip
        recorded_ms = call("get_experience", experience_id=billing)["timestamp_ms"]
        while time.time() * 1000 < recorded_ms + 50:
            pass  # (a later moment than the record, for the "before" screenshot)
        before = int(time.time() * 1000)
        while time.time() * 1000 < before + 50:
            pass
        call("update_experience", experience_id=billing, domain=["billing", "v2"], importance=0.8)
        call("invalidate_experience", experience_id=billing, reason="billing moved to API v2")
        call("create_token", owner_id="ana", agent_id="builder", scope="write")
        call("create_token", owner_id="bo", scope="read")
        call("sync")
        return {"team": team, "retry": retry, "deploy": deploy, "billing": billing,
                "before": before}  # fmt: skip


def shoot(url: str, ids: dict[str, Any], folder: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    saved: list[Path] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)

        def save(name: str, full: bool = False) -> None:
            path = folder / f"console-{name}.png"
            page.screenshot(path=str(path), full_page=full)
            saved.append(path)

        page.goto(f"{url}/ui/")
        page.wait_for_selector("#sign-in:not([hidden])")
        save("sign-in")
        sign_in(page, url, SECRET)
        save("collectives")
        show(page, f"/c/{ids['team']}")
        page.wait_for_selector("#feed[data-live=open]", state="attached")
        arriving = "Pin nats-server in CI: 2.12 changed the default sync interval"
        httpx.post(f"{url}/v1/record_experience", headers=OPERATOR, timeout=60, json={
            "collective_id": ids["team"], "source_agent": "reviewer", "content": arriving,
        })  # fmt: skip
        page.wait_for_selector("#feed li")
        save("collective", full=True)
        show(page, f"/recall/{ids['team']}?q=publish+timed+out+retry&mode=both")
        save("recall")
        show(page, f"/recall/{ids['team']}?q=make+NATS+publishes+safe+to+retry&mode=context")
        save("context", full=True)
        show(page, f"/e/{ids['retry']}")
        page.click(f"#graph-nodes button[data-expand='{ids['deploy']}']")
        page.wait_for_selector("#graph[data-nodes='4'][data-state=ready]", state="attached")
        save("experience", full=True)
        moment = datetime.fromtimestamp(ids["before"] / 1000, UTC).isoformat()
        show(page, f"/e/{ids['billing']}?at={moment.replace('+00:00', 'Z')}")
        save("time-travel")
        show(page, "/hosts")
        save("hosts", full=True)
        browser.close()
    return saved


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pulse-console-shots-") as tmp:
        process, url = start_service(Path(tmp) / "data")
        try:
            saved = shoot(url, build(url), folder)
        finally:
            stop_service(process)
    for path in saved:
        print(f"wrote {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
