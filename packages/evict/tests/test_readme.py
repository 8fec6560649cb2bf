"""The README's example runs and prints what it says."""

from __future__ import annotations

import pathlib
import re

import numpy as np


def test_readme_example_runs() -> None:
    """The python block of the package README evicts position 1, then rolls back 3."""
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)
    evicted = scope["evicted"]
    assert isinstance(evicted, dict)
    assert {k: v.tolist() for k, v in evicted.items()} == {"req7": [1]}
    policy = scope["policy"]
    assert np.asarray(policy.resident_positions("req7")).tolist() == [0, 2]  # type: ignore[attr-defined]


def test_readme_policy_example_is_a_policy() -> None:
    """The README's key-hook example is a working policy in two lines."""
    from kvpolicy.evict import ScoredPolicy

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, re.S)[1]
    scope: dict[str, object] = {"np": np, "ScoredPolicy": ScoredPolicy}
    exec(compile(block, "README.md", "exec"), scope)
    policy = scope["ScorePolicy"]()  # type: ignore[operator]
    policy.insert("a", np.arange(3), np.array([[0.3], [0.1], [0.2]]))
    assert {k: v.tolist() for k, v in policy.evict(1).items()} == {"a": [1, 2]}
