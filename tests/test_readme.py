"""The README's commands and example stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).parent.parent / "README.md").read_text()
CI = (Path(__file__).parent.parent / ".ci" / "run").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert (
        first_block
        and README.index("```sh") < README.index("\n\n", README.index("# Pulse") + 8) + 2
    )
    commands = [line.split("#")[0].strip() for line in first_block.group(1).strip().splitlines()]
    assert commands == ["make run", "make test"]
    assert "make test" in CI


def test_readme_python_examples_run(tmp_path: Path) -> None:
    log_example, instance_example, api_example, owners_example, time_example = re.findall(
        r"```python\n(.*?)```", README, re.DOTALL
    )
    for example in (log_example, instance_example, api_example, owners_example, time_example):
        result = subprocess.run(
            [sys.executable, "-c", example],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        if example is log_example:
            assert re.fullmatch(
                r"1 pulse\.c\.[0-9a-f-]{36}\.collective\.[0-9a-f-]{36} CollectiveCreated\n",
                result.stdout,
            )
        if example is api_example:
            similar, relations, agents = result.stdout.splitlines()
            assert "retry NATS publishes" in similar and "slow fsync" in similar
            assert relations == "[('Elaborates', 0.9)]" and agents == "['agent-7']"
        if example in (owners_example, time_example):  # the output shown after it
            shown = README[README.index(example) :].split("```text\n", 1)[1]
            assert result.stdout == shown.split("```", 1)[0]
    assert (tmp_path / ".pulse-mine" / "state").exists()  # the instance example's data dir


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")


def normalized(text: str) -> str:
    """Ids and clock times differ from run to run; everything else must match."""
    return WHEN.sub("<time>", UUID.sub("<id>", text)).strip()


def test_the_readme_quickstart_prints_what_it_shows(tmp_path: Path) -> None:
    block = re.search(
        r"<!-- quickstart: run by tests/test_readme.py -->\n```console\n(.*?)```", README, re.S
    )
    assert block, "the README has no checked quickstart"
    steps: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    assert len(steps) >= 10
    script = "set -e\n" + "".join(
        f"echo '@@@ {i}'\n{command}\n" for i, (command, _) in enumerate(steps)
    )
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    outputs = re.split(r"^@@@ \d+\n", result.stdout, flags=re.M)[1:]
    assert len(outputs) == len(steps)
    for (command, shown), printed in zip(steps, outputs, strict=True):
        assert normalized(printed) == normalized("\n".join(shown)), f"$ {command}"
