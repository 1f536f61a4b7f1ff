"""The CLI reference page (docs/cli.md) is generated from the commands' declarations
(``ops.cli.reference``): it fails here when the committed page and the commands disagree,
so a command, an option or a help text changed without the page is caught."""

from __future__ import annotations

import re
from pathlib import Path

from ops.cli.reference import render
from ops.cli.registry import COMMANDS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
REGENERATE = "regenerate it: python -m ops.cli.reference > docs/cli.md"


def _sections(page: str) -> dict[str, str]:
    """Each command's section of the page, by its heading (`pulse collective create`)."""
    parts = re.split(r"^### (pulse [^\n]+)\n", page, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_page_is_what_the_commands_say() -> None:
    assert PAGE.read_text() == render(), f"docs/cli.md differs from the commands; {REGENERATE}"


def test_the_page_documents_every_command_with_its_options_and_examples() -> None:
    sections = _sections(PAGE.read_text())
    assert set(sections) == {" ".join(("pulse", *c.path)) for c in COMMANDS}, REGENERATE
    for command in COMMANDS:
        heading = " ".join(("pulse", *command.path))
        section = sections[heading]
        summary = command.summary.replace("<", "&lt;").replace(">", "&gt;")
        assert section.lstrip().startswith(summary), f"{heading}: {REGENERATE}"
        assert "\n```sh\n" in section, f"{heading}: no example"
        for argument in command.every_argument():
            shown = (*argument.flags, argument.options.get("metavar"))
            assert any(f"- `{name}" in section for name in shown if name), (
                f"{heading}: {argument.name} is not on the page; {REGENERATE}"
            )
