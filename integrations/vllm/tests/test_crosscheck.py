"""The cross-check's own pieces, which need neither vLLM nor the simulator."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

TRACES = pathlib.Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
AZURE_CONV = TRACES / "azure-llm-2023-conv" / "AzureLLMInferenceTrace_conv.csv"


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


def test_shared_and_trace_workloads() -> None:
    """shared:N puts request i in prefix group i % 4; trace:N:STEP_MS:PATH reads a trace's
    lengths and arrivals (skipped without the public trace)."""
    from kvpolicy.vllm._crosscheck import load_workload

    rows = load_workload("shared:8:1")
    assert all(len(r.prompt) >= 256 + 16 for r in rows)
    assert rows[0].prompt[:256] == rows[4].prompt[:256] != rows[1].prompt[:256]
    assert rows[0].prompt[256:] != rows[4].prompt[256:]
    if not AZURE_CONV.is_file():
        pytest.skip(f"public trace not found at {AZURE_CONV} (see DESIGN.md: ../shared/traces)")
    pytest.importorskip("kvpolicy.sim", reason="trace:... reads the trace with kvpolicy-sim")
    at_once = load_workload(f"trace:50:0:{AZURE_CONV}")
    spread = load_workload(f"trace:50:20:{AZURE_CONV}")
    assert [len(r.prompt) for r in at_once][:2] == [374, 396]  # the trace's first two rows
    assert [r.max_tokens for r in at_once][:2] == [44, 109]
    assert {r.arrival_step for r in at_once} == {0}
    steps = [r.arrival_step for r in spread]
    assert steps == sorted(steps)
    assert steps[0] == 0
    assert steps[-1] > 50


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("uniform:x", "N must be an integer"),
        ("shared:0", r"shared:N\[:SEED\[:GAP\]\] with N >= 1"),
        ("trace:10:20", "trace:N:STEP_MS:PATH"),
        ("trace:10:20:/no/such/trace.csv", "trace file not found"),
        ("nothing-here.json", "neither uniform:N"),
    ],
)
def test_bad_workload_spec_is_named(spec: str, match: str) -> None:
    """A malformed workload spec is refused naming '--workload'."""
    from kvpolicy.vllm import ConfigError
    from kvpolicy.vllm._crosscheck import load_workload

    with pytest.raises(ConfigError, match=rf"'--workload'.*{match}"):
        load_workload(spec)


@pytest.mark.parametrize(
    "kvpolicy",
    [None, {"preemption": {"name": "least-progressed-first"}}],
    ids=["vllm-order", "least-progressed-first"],
)
def test_sim_matches_vllm(needs_vllm: None, kvpolicy: dict[str, Any] | None) -> None:
    """On a preemption-heavy workload the simulator's vllm stack matches vLLM's real
    scheduler within 1% on steps and 5% on preemptions and recomputed tokens, with vLLM's
    own victim order and with least-progressed-first on both sides."""
    pytest.importorskip("kvpolicy.sim", reason="the cross-check needs kvpolicy-sim")
    from kvpolicy.vllm._crosscheck import crosscheck, load_workload

    out = crosscheck(load_workload("shared:80:1"), 160, kvpolicy=kvpolicy)
    assert out["vllm"]["preemptions"] >= 10
    diff = out["relative_difference"]
    assert abs(diff["steps"]) <= 0.01
    assert abs(diff["preemptions"]) <= 0.05
    assert abs(diff["recomputed_tokens"]) <= 0.05
    assert out["finish_rank_correlation"] > 0.99
    assert out["seconds"]["vllm"] > 0
    assert out["seconds"]["sim"] > 0
