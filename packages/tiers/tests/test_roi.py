"""Hit and cost curves of §4.3 and Algorithm 2 (ROI-aware group TTL)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.tiers import (
    GroupTTL,
    PrefixGroup,
    allocate_group_ttls,
    group_cost,
    group_hits,
    roi_optimal_ttl,
    uniform_ttl_for_budget,
)


def group(key: int | None, blocks: int, intervals: list[float]) -> PrefixGroup:
    return PrefixGroup(
        key=key, unique_blocks=blocks, references=blocks + len(intervals), intervals=intervals
    )


class TestCurves:
    def test_hits_count_intervals_within_the_ttl(self) -> None:
        """H(t) counts δ <= t; a TTL of 0 keeps nothing."""
        d = [1.0, 2.0, 2.0, 5.0]
        assert [group_hits(d, t) for t in (0.0, 0.5, 1.0, 2.0, 4.9, 5.0)] == [0, 0, 1, 3, 3, 4]

    def test_cost_is_blocks_times_ttl_plus_clipped_intervals(self) -> None:
        """C(t) = |B| t + Σ min(t, δ), in block-seconds."""
        d = [1.0, 2.0, 2.0, 5.0]
        assert group_cost(d, 3, 0.0) == 0.0
        assert group_cost(d, 3, 2.0) == 3 * 2.0 + (1.0 + 2.0 + 2.0 + 2.0)
        assert group_cost(d, 3, 10.0) == 30.0 + 10.0

    def test_roi_optimal_ttl_is_the_best_interval(self) -> None:
        """R(t) = H/C peaks at a δ value: here t = 1 gives 2 hits for 2·1 + 2 + 1 = 5."""
        # t=1: H=2, C=2+1+1+1=5 -> 0.4; t=10: H=3, C=2*10+1+1+10=32 -> 0.09
        assert roi_optimal_ttl([1.0, 1.0, 10.0], 2) == 1.0
        assert roi_optimal_ttl([], 4) == 0.0

    def test_same_instant_reuses_are_bought_at_the_minimum_ttl(self) -> None:
        """δ = 0 makes R unbounded near 0; the search starts at min_ttl."""
        assert roi_optimal_ttl([0.0, 0.0, 5.0], 1) == 1e-3
        assert roi_optimal_ttl([0.0, 0.0, 5.0], 1, min_ttl=0.5) == 0.5
        with pytest.raises(ValueError, match="'min_ttl' must be finite and > 0: 0"):
            roi_optimal_ttl([1.0], 1, min_ttl=0)

    def test_bad_inputs_raise(self) -> None:
        """Negative TTLs, intervals or block counts are refused, named."""
        with pytest.raises(ValueError, match="'ttl' must be finite and >= 0: -1"):
            group_hits([1.0], -1.0)
        with pytest.raises(ValueError, match="'intervals' must be finite and >= 0"):
            group_cost([-1.0], 1, 1.0)
        with pytest.raises(ValueError, match="'unique_blocks' must be >= 0: -2"):
            group_cost([1.0], -2, 1.0)


class TestAllocation:
    def test_higher_roi_group_gets_the_longer_ttl(self) -> None:
        """With room for one group, the one with more hits per block-second keeps it."""
        hot = group(1, 100, [50.0] * 900)  # R(50) = 900 / 50000
        cold = group(2, 100, [50.0] * 100)  # R(50) = 100 / 10000, lower
        a = allocate_group_ttls([hot, cold, group(None, 0, [])], budget=50_000.0)
        assert a.ttls[:2] == (50.0, 0.0)
        assert (a.hits, a.cost) == (900, 50_000.0)

    def test_budget_is_respected_and_unused_budget_goes_to_the_next_best(self) -> None:
        """The allocation never exceeds B and spends what fits on the next group."""
        hot = group(1, 100, [50.0] * 900)
        cold = group(2, 100, [50.0] * 100)
        a = allocate_group_ttls([hot, cold], budget=60_000.0)
        assert a.ttls == (50.0, 50.0)
        assert (a.hits, a.cost) == (1000, 60_000.0)
        a = allocate_group_ttls([hot, cold], budget=59_999.0)
        assert a.ttls == (50.0, 0.0)

    def test_roi_ttls_are_reported(self) -> None:
        """The allocation records the per-group ROI-optimal TTLs of line 5."""
        a = allocate_group_ttls([group(1, 2, [1.0, 1.0, 10.0])], budget=1e9)
        assert a.roi_ttls == (1.0,)
        assert a.ttls == (10.0,)  # with budget to spare every reuse is bought

    def test_policy_applies_the_ttls(self) -> None:
        """The allocation becomes a GroupTTL with the residual group's TTL as residual."""
        a = allocate_group_ttls(
            [group(1, 100, [50.0] * 900), group(None, 10, [5.0] * 10)], budget=50_000.0 + 100.0
        )
        p = a.policy(tier="disk")
        assert isinstance(p, GroupTTL)
        assert p.ttls == {1: 50.0}
        assert p.ttl(12345, "disk") == a.ttls[1] == 5.0

    def test_bad_budget_raises(self) -> None:
        """A negative budget or an empty group list is refused."""
        with pytest.raises(ValueError, match="'budget' must be finite and >= 0: -1"):
            allocate_group_ttls([group(1, 1, [])], budget=-1.0)
        with pytest.raises(TypeError, match="'groups' must be a non-empty sequence"):
            allocate_group_ttls([], budget=1.0)

    @settings(max_examples=60, deadline=None)
    @given(
        groups=st.lists(
            st.tuples(st.integers(1, 20), st.lists(st.integers(0, 60), max_size=30)),
            min_size=1,
            max_size=5,
        ),
        budget=st.floats(0.0, 5000.0),
    )
    def test_never_over_budget_and_never_worse_than_one_ttl(
        self, groups: list[tuple[int, list[int]]], budget: float
    ) -> None:
        """Σ C_g(t_g) <= B, the hits match the curves, and the fixed TTL is not better."""
        gs = [group(k, b, [float(x) for x in d]) for k, (b, d) in enumerate(groups)]
        a = allocate_group_ttls(gs, budget)
        cost = sum(
            group_cost(g.intervals, g.unique_blocks, t) for g, t in zip(gs, a.ttls, strict=True)
        )
        assert cost <= budget + 1e-6
        assert a.cost == pytest.approx(cost)
        assert a.hits == sum(group_hits(g.intervals, t) for g, t in zip(gs, a.ttls, strict=True))
        ttl, hits = uniform_ttl_for_budget(gs, budget)
        assert (
            sum(group_cost(g.intervals, g.unique_blocks, ttl) for g in gs)
            <= budget * (1 + 1e-9) + 1e-9
        )
        # TTLs below min_ttl (1 ms) are not considered; at such budgets a single tiny TTL
        # can still buy same-instant reuses.
        assert a.hits >= hits or ttl < 1e-3
