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
    log_example, instance_example = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    for example in (log_example, instance_example):
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
    assert (tmp_path / ".pulse-mine" / "state").exists()  # the instance example's data dir
