"""``python -m recipes --help`` as a user runs it: the usage names the command and the next line
says what it does (not Lightning's generic "Lightning Trainer command line tool"); each
subcommand's help keeps its own description."""

import os
import subprocess
import sys
from pathlib import Path

from recipes.cli import DESCRIPTION

ROOT = Path(__file__).parents[2]


def help_lines(*args: str) -> list[str]:
    """The non-empty lines of ``python -m recipes ARGS --help``, run from the checkout at the
    usual terminal width (argparse wraps the description to it)."""
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "recipes", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_help_starts_with_the_usage_and_a_one_line_description():
    lines = help_lines()
    assert lines[0] == "usage: python -m recipes [-c CONFIG] {fit,validate,test} ..."
    assert lines[1] == DESCRIPTION
    assert lines[2] == "options:"  # the description is one line, not wrapped
    assert "Lightning Trainer command line tool" not in "\n".join(lines)


def test_subcommand_help_keeps_the_trainer_method_description():
    lines = help_lines("fit")
    assert lines[0].startswith("usage: python -m recipes [options] fit ")
    description = next(line for line in lines if not line.startswith((" ", "usage:")))
    assert description == "Runs the full optimization routine."  # Trainer.fit's docstring
