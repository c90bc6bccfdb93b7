"""The README's two Quickstart commands stay true: CI runs the test one, the example exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_quickstart_has_exactly_two_commands():
    assert len(quickstart_commands()) == 2


def test_ci_runs_the_readme_test_command():
    test_cmd = quickstart_commands()[1]
    assert "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_example_command_names_an_existing_example():
    example_cmd = quickstart_commands()[0]
    script = re.search(r"python (\S+\.py)", example_cmd).group(1)
    assert (ROOT / script).exists()
