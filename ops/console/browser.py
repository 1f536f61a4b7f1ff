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


def launch(playwright: Any) -> Any:
    """A headless Chromium browser from ``playwright`` (``sync_playwright()``'s)."""
    return playwright.chromium.launch(
        executable_path=chromium_path(), args=list(FLAGS), headless=True
    )
