"""The HTTP API's reference in the docs: the OpenAPI schema the running code serves, kept
as ``docs/openapi.json``, and rendered into ``docs/http-api.md`` when the site is built.

    python -m ops.docs_schema          # write docs/openapi.json from the running code

The schema is taken from a real ``pulse up`` (on a temporary data directory, its own port)
rather than rebuilt here, so the docs show what a client of this code gets, whatever the
service is made of. ``tests/test_docs.py`` fails when the committed file and the running
code's schema differ. The site renders the committed file (``on_page_markdown``, a MkDocs
hook named in ``mkdocs.yml``) as plain Markdown: no script, nothing fetched, searchable.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "docs" / "openapi.json"
MARKER = "<!-- openapi: reference -->"  # where http-api.md takes the reference


def current(timeout: float = 120) -> dict[str, Any]:
    """The schema ``GET /openapi.json`` answers on a fresh ``pulse up``."""
    with tempfile.TemporaryDirectory(prefix="pulse-schema-") as tmp:
        with serving(Path(tmp) / "data") as url:
            return schema_at(url, timeout)


def schema_at(url: str, timeout: float = 120) -> dict[str, Any]:
    """The schema a running service at ``url`` serves (it needs no credential)."""
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=timeout) as answer:
        schema: dict[str, Any] = json.load(answer)
    return schema


@contextlib.contextmanager
def serving(data_dir: Path) -> Iterator[str]:
    """``pulse up`` on ``data_dir`` (on a free port, without the caller's $PULSE_*
    settings) while the block runs; yields its HTTP address."""
    pulse = shutil.which("pulse", path=str(Path(sys.executable).parent)) or "pulse"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    process = subprocess.Popen(
        [pulse, "--data-dir", str(data_dir), "up", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    drain: threading.Thread | None = None
    try:
        url = _served_at(process)
        # what it prints after its banner is read to the end, or a full pipe would
        # block its event loop
        drain = threading.Thread(target=process.stdout.read, daemon=True)  # type: ignore[union-attr]
        drain.start()
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain is not None:
            drain.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def _served_at(process: subprocess.Popen[str]) -> str:
    """The HTTP address ``pulse up`` prints in its banner, once it serves."""
    assert process.stdout is not None
    lines: list[str] = []
    while not lines or "Ctrl-C stops" not in lines[-1]:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"pulse up ended before it served: {''.join(lines)}")
        lines.append(line)
    found = re.search(r"HTTP\s+http://[\d.]+:(\d+)", "".join(lines))
    if not found:
        raise RuntimeError(f"pulse up printed no HTTP address: {''.join(lines)}")
    return f"http://127.0.0.1:{found.group(1)}"


def text(schema: Mapping[str, Any]) -> str:
    """The schema as committed: sorted keys, two spaces, a final newline (stable diffs)."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def markdown(schema: Mapping[str, Any], level: int = 3) -> str:
    """Every route of ``schema`` as Markdown (tags as headings of ``level``): each with
    its description, what it answers, its request body's fields (type, whether required,
    limits) and the statuses it answers with."""
    components = schema.get("components", {}).get("schemas", {})
    routes = sorted(_routes(schema), key=lambda r: (r[2].get("tags", ["~"])[0], r[0]))
    out: list[str] = []
    tag = None
    for path, method, operation in routes:
        here = operation.get("tags", ["other"])[0]
        if here != tag:
            tag = here
            out.append(f"{'#' * level} {tag}\n")
        out.append(f"{'#' * (level + 1)} `{method.upper()} {path}`\n")
        said = str(operation.get("description") or operation.get("summary") or "").strip()
        if said:
            out.append(f"{_escape(said)}\n")
        answer = (
            operation.get("responses", {}).get("200", {}).get("content", {})
            .get("application/json", {}).get("schema")
        )  # fmt: skip
        if answer:
            out.append(f"Answers: `{_type(answer, components)}`.\n")
        sent = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
        if sent.get("schema"):
            out.append(_fields(_resolve(sent["schema"], components), components))
        if "example" in sent:
            shown = json.dumps(sent["example"], indent=2, ensure_ascii=False)
            out.append(f"A request body:\n\n```json\n{shown}\n```\n")
        statuses = operation.get("responses", {})
        if statuses:
            out.append("| status | meaning |\n| --- | --- |")
            for status in sorted(statuses):
                said = " ".join(str(statuses[status].get("description", "")).split())
                out.append(f"| {status} | {_cell(said)} |")
            out.append("")
    return "\n".join(out)


def _routes(schema: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            if isinstance(operation, dict) and method in {"get", "post", "put", "delete"}:
                yield path, method, operation


def _resolve(node: Mapping[str, Any], components: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        return _resolve(components.get(ref.rsplit("/", 1)[1], {}), components)
    return node


def _fields(body: Mapping[str, Any], components: Mapping[str, Any]) -> str:
    properties: Mapping[str, Any] = body.get("properties", {})
    if not properties:
        return ""
    required = set(body.get("required", []))
    rows = ["| field | type | required | limits and meaning |", "| --- | --- | --- | --- |"]
    for name, field in properties.items():
        resolved = _resolve(field, components)
        said = " ".join(str(resolved.get("description", field.get("description", ""))).split())
        limits = _limits(resolved)
        meaning = "; ".join(x for x in (limits, said) if x)
        rows.append(
            f"| `{name}` | {_cell(_type(resolved, components))} | "
            f"{'yes' if name in required else ''} | {_cell(meaning)} |"
        )
    return "\n".join(rows) + "\n"


def _type(node: Mapping[str, Any], components: Mapping[str, Any]) -> str:
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[1]
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(_type(x, components) for x in node[key])
    kind = node.get("type")
    if kind == "array":
        return f"array of {_type(node.get('items', {}), components)}"
    if "enum" in node:
        return " / ".join(json.dumps(x) for x in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    return str(kind or "any")


LIMITS = (
    ("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"), ("minLength", "length ≥ {}"), ("maxLength", "length ≤ {}"),
    ("x-max-bytes", "≤ {} bytes (UTF-8)"), ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"), ("default", "default {}"),
)  # fmt: skip


def _limits(node: Mapping[str, Any]) -> str:
    said = []
    for key, form in LIMITS:
        if key in node:
            value = node[key]
            said.append(form.format(json.dumps(value) if key == "default" else value))
    return ", ".join(said)


def _escape(text: str) -> str:
    """Docstrings as Markdown paragraphs: kept as written, HTML-looking text defused."""
    return text.replace("<", "&lt;")


def _cell(text: str) -> str:
    return _escape(text).replace("|", "\\|").replace("\n", " ")


def on_page_markdown(markdown_text: str, page: Any, **_: Any) -> str:
    """MkDocs hook: the committed schema rendered where a page holds ``MARKER``."""
    if MARKER not in markdown_text:
        return markdown_text
    schema = json.loads(COMMITTED.read_text())
    return markdown_text.replace(MARKER, markdown(schema))


def main() -> None:
    COMMITTED.write_text(text(current()))
    print(f"wrote {COMMITTED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
