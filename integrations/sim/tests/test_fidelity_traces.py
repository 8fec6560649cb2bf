"""Seed 000 Table 1 on the Azure conversation trace at high load (reads ../shared/traces).

Finding: the shape "peak memory FIFO > LRU > H2O >= Token-PD at equal budgets" does not
hold here. Each policy is given the same hard budget and, at high load, every one of them
fills it: peak resident memory equals the budget for all four. Table 1's peak-memory gaps
need policies that stop short of their budget; FIFO, LRU and H2O evict only when over it,
and Token-PD's dual price rises until demand meets the budget (eq. 5 of seed 000), so it
settles at the budget too. What separates the policies at equal memory is what they keep:
the share of the synthetic attention mass on resident tokens (the attention model fitted to
SmolLM2-135M, see ATTENTION_FIT.md). With eviction rounds every 32 iterations it ranks
Token-PD > H2O > LRU > FIFO, Table 1's order (0.959, 0.936, 0.934, 0.780). With the default rounds
every 512 iterations H2O edges Token-PD (0.942 vs 0.941): the dual price moves once per
round, so coarse rounds cost Token-PD more than H2O's plain accumulated scores. (LRU counts a
token as used when it gets more than the mean attention: every resident token gets some
attention at each step, so counting any attention as a use would make LRU rank below FIFO.)
"""

from __future__ import annotations

import pathlib

import pytest

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import simulate, stack_from_dict

TRACE = (
    pathlib.Path(__file__).resolve().parents[3]
    / ".."
    / "shared"
    / "traces"
    / "azure-llm-2023-conv"
    / "AzureLLMInferenceTrace_conv.csv"
)

pytestmark = [pytest.mark.traces, pytest.mark.slow]

_POLICIES = {"fifo": {}, "lru": {}, "h2o": {"recent_window": 64}, "token-pd": {}}


@pytest.fixture(scope="module", params=[512, 32], ids=["interval512", "interval32"])
def table(request: pytest.FixtureRequest) -> dict[str, tuple[int, float, int]]:
    """(peak resident tokens, attention recall, budget) per policy, and the interval."""
    if not TRACE.is_file():
        pytest.skip(f"Azure conversation trace not found at {TRACE}")
    pytest.importorskip("kvpolicy.evict", reason="kvpolicy-evict is not installed")
    from kvpolicy.sim.workloads import load_trace

    w = load_trace(TRACE, limit=400, rate=40.0)
    out = {}
    for name, params in _POLICIES.items():
        cfg = stack_from_dict(
            {
                "name": name,
                "eviction": {
                    "name": name,
                    "params": params,
                    "budget_fraction": 0.3,
                    "every": request.param,
                },
                "preemption": {"name": "least-progressed-first"},
            }
        )
        r = simulate(w.requests, get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)
        budget = r.record.eviction_budget
        assert budget is not None
        out[name] = (r.summary.peak_resident_tokens, r.summary.attention_recall, budget)
    out["interval"] = (request.param, 0.0, 0)
    return out


class TestSeed000Table1:
    def test_every_policy_fills_the_budget(self, table: dict[str, tuple[int, float, int]]) -> None:
        """At equal budgets every policy fills its budget (to within 0.5%: the last
        admissions of a round stop at a block or token-budget boundary)."""
        for name, (peak, _, budget) in table.items():
            if name != "interval":
                assert budget * 0.995 <= peak <= budget

    def test_attention_kept_ranks_the_policies(
        self, table: dict[str, tuple[int, float, int]]
    ) -> None:
        """Token-PD and H2O keep more attention mass than LRU, LRU more than FIFO; with
        frequent rounds Token-PD keeps the most (Table 1's order), with coarse ones it is
        within 0.02 of H2O."""
        recall = {k: v[1] for k, v in table.items()}
        assert min(recall["token-pd"], recall["h2o"]) > recall["lru"] > recall["fifo"]
        if table["interval"][0] <= 32:
            assert recall["token-pd"] > recall["h2o"]
        else:
            assert abs(recall["token-pd"] - recall["h2o"]) < 0.02
