"""The README's tour runs and prints what its comments say."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_tour_prints_what_the_comments_say(capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``print`` of the tour outputs the value written in its trailing comment."""
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None
    exec(compile(code.group(1), str(README), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "3 0.0101 dram",
        "3",
        "0.579 0.368",
        "(0, 1, None) (45.0, 30.0, 0.0) 7",
        "24 [{'dram_gib': 0.5, 'disk_gib': 0.0}]",
    ]
