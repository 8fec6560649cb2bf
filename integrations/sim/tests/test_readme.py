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


def _printed(code: str) -> list[tuple[str, str | None]]:
    """Run a README block; each print's output and the comment on its line (or None)."""
    outs: list[str] = []

    def capture(*args: object, sep: str | None = " ", end: str | None = "\n") -> None:
        outs.append((sep if sep is not None else " ").join(map(str, args)))

    exec(compile(code, str(README), "exec"), {"__name__": "readme", "print": capture})
    comments = [
        line.split("  # ", 1)[1].strip() if "  # " in line else None
        for line in code.splitlines()
        if line.startswith("print(")
    ]
    assert len(outs) == len(comments), "one print per print( line"
    return list(zip(outs, comments, strict=True))


class TestReadme:
    def test_python_examples_run(self) -> None:
        """Every python block of the README executes without error."""
        blocks = _blocks("python")
        assert blocks
        for code in blocks:
            _printed(code)

    def test_python_examples_print_what_their_comments_say(self) -> None:
        """A print's comment starts with exactly what it prints (then its explanation)."""
        checked = 0
        for code in _blocks("python"):
            for out, comment in _printed(code):
                if comment is None:
                    continue
                checked += 1
                rest = comment[len(out) :]
                assert comment.startswith(out), (out, comment)
                assert rest == "" or rest[0] in " ,:;(", (out, comment)
        assert checked >= 8

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
