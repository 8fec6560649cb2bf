"""Seed 003's claims checked on the public Mooncake conversation trace (Kimi, FAST'25).

The trace's ``hash_ids`` are chained prefix hashes of 512-token blocks, the input the
paper's simulator replays ("salted hash blocks ... of each request", §3.3).
"""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import get_model
from kvpolicy.tiers import (
    FixedTTL,
    ReplayEvaluator,
    ReuseAnalysis,
    TieredPrefixStore,
    TierSpec,
    allocate_group_ttls,
    get_tier,
    plan_tiers,
    prefix_groups,
    replay,
    uniform_ttl_for_budget,
)

pytestmark = pytest.mark.traces

Trace = list[tuple[float, list[int]]]
# Llama-3-8B KV of one 512-token block: 32 layers · 2 · 8 heads · 128 · 2 bytes · 512.
BLOCK_BYTES = get_model("Llama-3-8B").kv_bytes_per_block(512)


class TestMooncakeReuse:
    def test_reuse_ratio_matches_the_provenance_statistics(
        self, mooncake_reuse: ReuseAnalysis
    ) -> None:
        """288,500 block references, 182,790 unique: 36.6 % hit with an unbounded cache."""
        a = mooncake_reuse
        assert (a.references, a.unique_blocks, a.reuses) == (288_500, 182_790, 105_710)
        assert round(a.reuse_ratio, 3) == 0.366

    def test_reuse_is_skewed_like_a_chat_trace(self, mooncake_reuse: ReuseAnalysis) -> None:
        """18.4 % of blocks carry 90 % of reuses: between the paper's 0.67 % and 31.95 %."""
        a = mooncake_reuse
        assert round(a.hot_fraction(0.9), 4) == 0.1837

    def test_capacity_gains_diminish(self, mooncake_reuse: ReuseAnalysis) -> None:
        """§3.1.2: 250 -> 1000 GB adds ~21 % reuse, 1000 -> 2000 GB under 7 % (LRU)."""
        assert BLOCK_BYTES == 64 << 20
        a = mooncake_reuse
        ratio = {gb: a.lru_hit_ratio(int(gb * 1e9 // BLOCK_BYTES)) for gb in (250, 1000, 2000)}
        assert [round(ratio[gb], 4) for gb in (250, 1000, 2000)] == [0.0803, 0.2549, 0.3253]
        assert ratio[1000] - ratio[250] > 2 * (ratio[2000] - ratio[1000])


class TestMooncakeGroupTTL:
    @staticmethod
    def out_of_sample(trace: Trace, budget: float) -> list[tuple[int, float]]:
        """TTLs fitted on the first 30 min, replayed on the last 30 (§4.3's online use)."""
        history = [r for r in trace if r[0] < 1800.0]
        future = [r for r in trace if r[0] >= 1800.0]
        groups = prefix_groups(history, top_k=8, depth=2)  # every request shares block 0
        group = allocate_group_ttls(groups, budget).policy(tier="disk", depth=2)
        ttl, _ = uniform_ttl_for_budget(groups, budget)
        out = []
        for policy, hook in ((group, group.assign), (FixedTTL({"disk": ttl}), None)):
            store = TieredPrefixStore((TierSpec("disk", 1 << 50, 1e9, 1e9),), 1, ttl=policy)
            result = replay(future, store, on_request=hook)
            store.fetch([-1], future[-1][0] + 1e6)  # let every block expire
            out.append((result.hit_blocks, store.stats().tiers[0].byte_seconds))
        return out

    def test_group_ttl_wins_under_a_tight_budget(self, mooncake: Trace) -> None:
        """At 2e6 block-seconds group TTL serves 31 % more reuses on half the storage."""
        (g_hits, g_usage), (u_hits, u_usage) = self.out_of_sample(mooncake, 2e6)
        assert (g_hits, u_hits) == (8521, 6527)
        assert g_usage < 0.5 * u_usage

    def test_group_ttl_is_marginal_under_a_loose_budget(self, mooncake: Trace) -> None:
        """At 5e7 block-seconds both serve the same within 0.2 % (§5.3.2 on trace A)."""
        (g_hits, g_usage), (u_hits, u_usage) = self.out_of_sample(mooncake, 5e7)
        assert (g_hits, u_hits) == (43465, 43521)
        assert abs(g_usage - u_usage) < 0.01 * u_usage


class TestMooncakeParetoSearch:
    @pytest.mark.slow
    def test_adaptive_search_matches_the_grid_with_fewer_evaluations(self, mooncake: Trace) -> None:
        """Fig. 13: far fewer evaluations than the grid, nearly the same hypervolume."""
        evaluate = ReplayEvaluator(
            mooncake[:600],
            BLOCK_BYTES,
            prefill_seconds_per_block=0.05,
            decode_seconds_per_request=0.5,
            gpu_price_per_hour=3.0,
            dram=get_tier("dram"),
            disk=get_tier("disk"),
        )
        result = plan_tiers(evaluate, grid=True)
        adaptive, grid = result.adaptive, result.grid
        assert grid is not None
        assert result.hypervolume_ratio is not None
        assert len(adaptive.evaluations) < 0.25 * len(grid.evaluations)
        assert result.hypervolume_ratio >= 0.98
