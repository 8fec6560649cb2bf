"""The README's tour runs."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_tour_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's Python example runs and prints what its comments say."""
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None
    exec(compile(code.group(1), str(README), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(["ok"] * 10 + ["pool-full"] * 2)
    assert lines[1] == "GateDecision(admitted=True, retry_after=0.0, reason='')"
    assert float(lines[2]) > 0
