"""The README's examples run as written."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def _blocks(lang: str) -> list[str]:
    if not README.exists():
        pytest.skip(f"README.md not found at {README}")
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


class TestReadme:
    def test_python_examples_run(self) -> None:
        """Every python block of the README executes without error."""
        blocks = _blocks("python")
        assert blocks
        for code in blocks:
            exec(compile(code, str(README), "exec"), {"__name__": "readme"})

    def test_kvpolicy_commands_run(self) -> None:
        """Every `kvpolicy ...` line of the README's bash blocks exits 0."""
        commands = [
            line.split("#")[0].strip()
            for block in _blocks("bash")
            for line in block.splitlines()
            if line.startswith("kvpolicy ")
        ]
        assert commands
        runner = CliRunner()
        for command in commands:
            result = runner.invoke(main, shlex.split(command)[1:])
            assert result.exit_code == 0, f"{command}: {result.output}"
