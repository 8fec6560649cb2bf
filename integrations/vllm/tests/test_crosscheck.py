"""The cross-check's own pieces, which need neither vLLM nor the simulator."""

from __future__ import annotations

import json
import pathlib

import pytest


def test_spearman() -> None:
    """Rank correlation: 1 for the same order, -1 reversed, ties share ranks."""
    from kvpolicy.vllm._crosscheck import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [5, 5, 9]) == pytest.approx(1.0)


def test_workload_file(tmp_path: pathlib.Path) -> None:
    """A JSON request file gives shared prefixes to requests of the same prefix id."""
    from kvpolicy.vllm._crosscheck import load_workload

    path = tmp_path / "w.json"
    rows = [{"prompt_len": 40, "max_tokens": 5, "prefix": 32, "prefix_id": 0}] * 2
    path.write_text(json.dumps(rows))
    a, b = load_workload(str(path))
    assert a.prompt[:32] == b.prompt[:32]
    assert a.prompt[32:] != b.prompt[32:]
    assert len(load_workload("uniform:5:3")) == 5


def test_arrivals_over_time(tmp_path: pathlib.Path) -> None:
    """uniform:N:SEED:GAP spreads arrivals (Poisson, GAP steps apart on average); a JSON
    file's arrival_step is kept."""
    from kvpolicy.vllm._crosscheck import load_workload

    spread = load_workload("uniform:200:1:5")
    steps = [r.arrival_step for r in spread]
    assert steps == sorted(steps)
    assert steps[0] == 0
    assert 600 < steps[-1] < 1400
    assert [r.arrival_step for r in load_workload("uniform:5:1")] == [0] * 5
    path = tmp_path / "w.json"
    path.write_text(json.dumps([{"prompt_len": 40, "max_tokens": 3, "arrival_step": 7}]))
    assert [r.arrival_step for r in load_workload(str(path))] == [7]
