"""The README stays true: its two Quickstart commands (CI runs the test one, the example
exists) and every Python snippet, run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_python_snippets():
    assert len(python_snippets()) >= 3


@pytest.mark.parametrize("index", range(len(python_snippets())))
def test_every_python_snippet_runs_as_written(index, tmp_path):
    """Each ```python block of the README, run as a script from the repository root in a
    fresh process: what a reader pasting it would get (embedded clusters included)."""
    script = tmp_path / f"snippet{index}.py"
    script.write_text(python_snippets()[index])
    # FLOWSERVE_HOME: never the user's `flowserve up` cluster; TMPDIR: the embedded cluster's files are ours
    env = dict(os.environ, FLOWSERVE_HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path), FLOWSERVE_QUIET="1")
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (
        f"README snippet {index} failed:\n{python_snippets()[index]}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    )
    leftover = subprocess.run(
        ["pgrep", "-f", f"executors.(daemon|executor).*{tmp_path}"], capture_output=True, text=True
    ).stdout.split()
    assert not leftover, "the snippet left a cluster running"


def flowserve_commands() -> list[str]:
    """Every `flowserve ...` command line of the README's ```bash blocks, its comment cut,
    the synopsis lines (``[OPTION]``, ``A | B``, ``...``) left out: they are not commands."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("flowserve ") and not re.search(r"\[|\||\.\.\.", line):
                commands.append(line)
    return commands


def test_every_flowserve_command_in_the_readme_is_one_the_cli_takes():
    """Each README command names a real subcommand with options it has (the CLI's own
    parser, which exits 2 on anything else); the dev loop's and the walk-through's run for
    real in tests/executors/test_devloop.py and test_cli.py."""
    import shlex

    from flowserve.cli import build_parser

    commands = flowserve_commands()
    assert len(commands) >= 10, commands
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as e:
            pytest.fail(f"the README's `{command}` is not a command the CLI takes (exit {e.code})")
