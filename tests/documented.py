"""The documented examples, found by name: a page marks a runnable block with
``<!-- example: NAME -->`` on the line before its fence, and the output it shows with
``<!-- output: NAME -->``. Tests look examples up by that name, so moving or adding a
block never makes a test run the wrong one, and a renamed or removed example fails."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKED = re.compile(r"^<!-- (example|output): ([a-z0-9-]+) -->\n```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Example:
    name: str
    language: str  # the fence's: python, console, py, text, ...
    code: str
    page: Path
    output: str | None  # the block marked as its output, if the page shows one


def documented() -> dict[str, Example]:
    """Every named example of the README and the docs."""
    code: dict[str, tuple[str, str, Path]] = {}
    shown: dict[str, str] = {}
    for page in PAGES:
        for kind, name, language, body in MARKED.findall(page.read_text()):
            into: dict[str, object] = code if kind == "example" else shown  # type: ignore[assignment]
            assert name not in into, f"{kind} {name!r} is named twice ({page.name})"
            if kind == "example":
                code[name] = (language, body, page)
            else:
                shown[name] = body
    missing = set(shown) - set(code)
    assert not missing, f"outputs without their example: {sorted(missing)}"
    return {
        name: Example(name, language, body, page, shown.get(name))
        for name, (language, body, page) in code.items()
    }


def example(name: str) -> Example:
    """The example named ``name``; fails, naming it, when no page has it."""
    found = documented().get(name)
    assert found is not None, f"no page has the example {name!r} (<!-- example: {name} -->)"
    return found
