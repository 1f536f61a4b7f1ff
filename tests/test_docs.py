"""The README and the docs site stay true: the site builds offline with no broken link,
the README opens with the two commands, the HTTP reference is the schema the running code
serves, and every documented example runs, found by its name, and prints what its page
shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import docs_schema
from tests.documented import ROOT, documented, example

README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()
BIN = Path(sys.executable).parent


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_the_site_builds_strictly_and_fetches_nothing_from_outside(tmp_path: Path) -> None:
    built = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) >= 14
    for page in pages:
        html = page.read_text()
        # no web fonts, scripts or styles from elsewhere: the site works offline
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", html), page
        assert "fonts.googleapis" not in html, page
    reference = (tmp_path / "site" / "http-api" / "index.html").read_text()
    for path in json.loads((ROOT / "docs" / "openapi.json").read_text())["paths"]:
        assert path in reference, f"{path} is not in the rendered HTTP reference"


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    with (docs / "concepts.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    config = (ROOT / "mkdocs.yml").read_text()
    hook = "ops/mkdocs_hooks/http_reference.py"
    assert hook in config
    (tmp_path / "mkdocs.yml").write_text(config.replace(hook, str(ROOT / hook)))
    built = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert (
        first_block
        and README.index("```sh") < README.index("\n\n", README.index("# Pulse") + 8) + 2
    )
    commands = [line.split("#")[0].strip() for line in first_block.group(1).strip().splitlines()]
    assert commands == ["make run", "make test"]
    assert "make test" in CI


def test_the_readme_is_a_front_door_whose_links_lead_somewhere() -> None:
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert link.startswith("http") or (ROOT / link).exists(), link


def test_every_named_example_is_run_by_a_test() -> None:
    run_here = {
        "quickstart-cli", "readme-quickstart", "http-curl", "python-log", "python-instance",
        "python-context", "two-owners", "as-of", "readme-python", "langgraph-two-hosts",
        "langgraph-store", "concepts-languages", "concepts-duplicates",
    }  # fmt: skip
    run_elsewhere = {"snapshot-python"}  # tests/test_snapshot.py, against a running service
    assert set(documented()) == run_here | run_elsewhere


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")
# numbers of an HTTP answer that depend on the clock: when it was recorded, and its
# energy (which decays with the time since), hence its score
CLOCKED = re.compile(r'"(timestamp_ms|valid_from_ms|energy|score)":[0-9.e-]+')


def normalized(text: str) -> str:
    """Ids and clock times differ from run to run; everything else must match."""
    text = CLOCKED.sub(r'"\1":<n>', text)
    return WHEN.sub("<time>", UUID.sub("<id>", text)).strip()


def run_console(block: str, cwd: Path, home: Path) -> None:
    """Run a ``console`` block's ``$`` commands in one shell, in order, and check that
    each prints what the block shows after it."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    # each output is preceded by a marker on a line of its own (an answer of curl has no
    # final newline)
    script = "set -e\n" + "".join(
        f"printf '\\n@@@ {i}\\n'\n{command}\n" for i, (command, _) in enumerate(steps)
    )
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert result.returncode == 0, result.stderr
    outputs = re.split(r"^@@@ \d+\n", result.stdout, flags=re.M)[1:]
    assert len(outputs) == len(steps)
    for (command, shown), printed in zip(steps, outputs, strict=True):
        assert normalized(printed) == normalized("\n".join(shown)), f"$ {command}"


def test_the_quickstart_prints_what_it_shows(tmp_path: Path) -> None:
    """Run as a newcomer would after `make run`: the commands go through the service of
    ``./.pulse`` (each would otherwise start its own embedded NATS: slower, same output)."""
    quickstart = example("quickstart-cli")
    assert quickstart.language == "console"
    assert len(quickstart.code.splitlines()) >= 10
    with docs_schema.serving(tmp_path / ".pulse"):
        run_console(quickstart.code, tmp_path, tmp_path)


@pytest.mark.parametrize("name", ["concepts-languages", "concepts-duplicates"])
def test_the_concepts_examples_print_what_they_show(name: str, tmp_path: Path) -> None:
    """Languages per document in a Latin-named default collective, and a duplicate
    reinforced, as the concepts page shows them (each command with its own embedded
    NATS, as without `pulse up`)."""
    run_console(example(name).code, tmp_path, tmp_path)


def test_the_readme_quickstart_is_the_start_of_the_tested_one() -> None:
    """The README shows the first steps of the quickstart the test above runs, as they
    are there (so it is tested without running it twice)."""
    short = example("readme-quickstart").code.splitlines()
    whole = example("quickstart-cli").code.splitlines()
    assert len(short) >= 5 and short[0].startswith("$ ")
    assert whole[: len(short)] == short
    assert len(whole) == len(short) or whole[len(short)].startswith("$ ")  # whole steps


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``pulse up`` on ``<tmp>/.pulse`` (as ``make run`` in ``<tmp>``); its URL and ``<tmp>``."""
    home = tmp_path_factory.mktemp("served")
    with docs_schema.serving(home / ".pulse") as url:
        yield url, home


def test_the_committed_schema_is_the_one_the_code_serves(service: tuple[str, Path]) -> None:
    url, _ = service
    committed = (ROOT / "docs" / "openapi.json").read_text()
    served = docs_schema.text(docs_schema.schema_at(url))
    assert committed == served, (
        "docs/openapi.json differs from the schema the code serves: "
        "run `python -m ops.docs_schema` and commit it"
    )


def test_the_http_examples_print_what_they_show(service: tuple[str, Path]) -> None:
    url, home = service
    calls = example("http-curl")
    assert "localhost:8765" in calls.code
    here = calls.code.replace("localhost:8765", url.removeprefix("http://"))
    run_console(here, home, home)


def run_python(code: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_event_log_example_appends_once_and_reads_back(tmp_path: Path) -> None:
    printed = run_python(example("python-log").code, tmp_path)
    assert re.fullmatch(
        r"1 pulse\.c\.[0-9a-f-]{36}\.collective\.[0-9a-f-]{36} CollectiveCreated\n", printed
    )


def test_the_instance_example_keeps_its_data_directory(tmp_path: Path) -> None:
    run_python(example("python-instance").code, tmp_path)
    assert (tmp_path / ".pulse-mine" / "state").exists()


def test_the_context_example_gathers_the_lessons_relations_and_agents(tmp_path: Path) -> None:
    similar, relations, agents = run_python(example("python-context").code, tmp_path).splitlines()
    assert "retry NATS publishes" in similar and "slow fsync" in similar
    assert relations == "[('Elaborates', 0.9)]" and agents == "['agent-7']"


@pytest.mark.parametrize(
    "name", ["two-owners", "as-of", "readme-python", "langgraph-two-hosts", "langgraph-store"]
)
def test_the_python_example_prints_what_its_page_shows(name: str, tmp_path: Path) -> None:
    shown = example(name)
    assert shown.output is not None, f"{name}: the page shows no output"
    assert run_python(shown.code, tmp_path) == shown.output
