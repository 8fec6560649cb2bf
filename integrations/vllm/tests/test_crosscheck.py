"""The cross-check's own pieces, which need neither vLLM nor the simulator."""

from __future__ import annotations

import json
import pathlib

import pytest

from kvpolicy.vllm import ConfigError


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


def test_arrivals_refused() -> None:
    """Requests arriving after step 0 are refused with the reason, before any run."""
    from kvpolicy.vllm import WorkloadRequest
    from kvpolicy.vllm._crosscheck import crosscheck

    with pytest.raises(ConfigError, match="arrivals over time"):
        crosscheck([WorkloadRequest("a", [3] * 20, 4, arrival_step=2)], num_blocks=64)
