"""A headless Chromium for the console's tests, its benchmark and its screenshots:
Playwright's Python API driving the machine's own Chromium ($CHROMIUM, by default
Debian's /usr/bin/chromium, which `make test` installs), never a browser Playwright
downloads. (Imported by those only: Pulse itself needs no browser.)"""

from __future__ import annotations

import os
import shutil
from typing import Any

# what keeps a headless Chromium on a closed machine from reaching out (updates, sync,
# safe browsing, field trials) or waiting on what it cannot have (a GPU, a sandbox as root)
FLAGS = (
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic", "--no-first-run", "--disable-default-apps", "--disable-extensions",
    "--metrics-recording-only", "--disable-features=Translate,OptimizationHints,MediaRouter",
)  # fmt: skip


def chromium_path() -> str:
    """The Chromium to drive: $CHROMIUM, else the first of chromium, chromium-browser on
    PATH; RuntimeError saying how to get one when there is none."""
    given = os.environ.get("CHROMIUM")
    if given and os.access(given, os.X_OK):
        return given
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "no Chromium: `make test` installs Debian's (apt-get install chromium), or set "
        f"CHROMIUM=/path/to/chromium (CHROMIUM is {given!r})"
    )


def sign_in(page: Any, url: str, token: str) -> None:
    """``page`` on the console of the service at ``url``, signed in with ``token``, once
    its first page is drawn."""
    if not page.url.startswith(f"{url}/ui/"):  # (already there: its sign-in shown)
        page.goto(f"{url}/ui/")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("main[data-state=ready]", state="attached")


def show(page: Any, route: str) -> float:
    """The console's page at ``route`` (a hash route, ``/c/<id>?at=...``) shown as a
    click on a link shows it, once drawn; the page's own clock of it (ms, ``data-took``).
    A route equal to the one shown is not drawn again: add a parameter the page ignores."""
    page.evaluate("document.getElementById('main').dataset.state = 'stale'")
    page.evaluate(f"location.hash = {'#' + route!r}")
    page.wait_for_selector("main[data-state=ready]", state="attached", timeout=60_000)
    return float(page.get_attribute("main", "data-took") or "nan")


def launch(playwright: Any) -> Any:
    """A headless Chromium browser from ``playwright`` (``sync_playwright()``'s)."""
    return playwright.chromium.launch(
        executable_path=chromium_path(), args=list(FLAGS), headless=True
    )
