"""Reuse analysis and prefix groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.tiers import (
    FixedTTL,
    TieredPrefixStore,
    TierSpec,
    analyze_reuse,
    prefix_groups,
    replay,
)

TRACE = [
    (0.0, [1, 2, 3]),
    (1.0, [1, 2, 4]),
    (3.0, [5]),
    (4.0, [1, 2, 3]),
]


class TestAnalyzeReuse:
    def test_intervals_distances_and_counts(self) -> None:
        """Each reuse has its seconds since the last use and the distinct blocks between."""
        a = analyze_reuse(TRACE)
        assert (a.references, a.unique_blocks, a.reuses) == (10, 5, 5)
        assert a.intervals.tolist() == [1.0, 1.0, 3.0, 3.0, 4.0]
        # refs: 1 2 3 | 1 2 4 | 5 | 1 2 3
        assert a.stack_distances.tolist() == [2, 2, 3, 3, 4]
        assert a.reuse_counts.tolist() == [2, 2, 1, 0, 0]
        assert a.reuse_ratio == 0.5

    def test_lru_and_ttl_hit_ratios(self) -> None:
        """LRU of c blocks hits reuses at stack distance < c; a TTL hits intervals <= t."""
        a = analyze_reuse(TRACE)
        assert [a.lru_hit_ratio(c) for c in (0, 2, 3, 4, 5)] == [0.0, 0.0, 0.2, 0.4, 0.5]
        assert [a.ttl_hit_ratio(t) for t in (0.0, 1.0, 3.0, 4.0)] == [0.0, 0.2, 0.4, 0.5]

    def test_hot_fraction(self) -> None:
        """The smallest share of blocks covering a share of reuses (§3.1.1)."""
        a = analyze_reuse(TRACE)
        assert a.hot_fraction(0.8) == 2 / 5  # blocks 1 and 2 carry 4 of 5 reuses
        assert a.hot_fraction(1.0) == 3 / 5

    @pytest.mark.parametrize(
        ("trace", "exc", "needle"),
        [
            ([(1.0, [1]), (0.5, [2])], ValueError, "time goes backwards: 0.5 < 1.0"),
            ([(-1.0, [1])], ValueError, "time must be finite and >= 0: -1.0"),
            ([(0.0, [1, "x"])], TypeError, "block_hashes must hold ints: 'x'"),
            ([(0.0,)], TypeError, "must be a \\(time, block_hashes\\) pair"),
            ("abc", TypeError, "'trace' must be a sequence"),
        ],
    )
    def test_bad_traces_raise(self, trace: object, exc: type[Exception], needle: str) -> None:
        """Malformed rows are named by index."""
        with pytest.raises(exc, match=needle):
            analyze_reuse(trace)  # type: ignore[arg-type]

    @settings(max_examples=80, deadline=None)
    @given(
        refs=st.lists(st.integers(0, 12), min_size=1, max_size=80),
        capacity=st.integers(0, 14),
    )
    def test_lru_hit_ratio_matches_an_lru_store(self, refs: list[int], capacity: int) -> None:
        """Stack distances predict exactly what a one-tier LRU store of that size serves."""
        trace = [(float(k), [b]) for k, b in enumerate(refs)]
        tier = TierSpec("dram", 10 * capacity, 1.0, 1.0)
        result = replay(trace, TieredPrefixStore((tier,), 10, ttl=FixedTTL()))
        assert result.hit_blocks / len(refs) == analyze_reuse(trace).lru_hit_ratio(capacity)


class TestPrefixGroups:
    def test_groups_ranked_by_reuse_with_a_residual(self) -> None:
        """Top-K subtrees by reuse events, then everything else in the residual group."""
        trace = [
            (0.0, [1, 10]),
            (1.0, [2, 20]),
            (2.0, [1, 10]),
            (4.0, [1, 11]),
            (5.0, [3]),
            (9.0, [2, 21]),
        ]
        top, residual = prefix_groups(trace, top_k=1)
        assert (top.key, top.unique_blocks, top.references) == (1, 3, 6)
        assert top.intervals.tolist() == [2.0, 2.0, 2.0]
        assert (residual.key, residual.unique_blocks, residual.references) == (None, 4, 5)
        assert residual.intervals.tolist() == [8.0]

    def test_depth_two_splits_a_shared_root(self) -> None:
        """At depth 2 the shared first block is its own group and subtrees split below it."""
        trace = [(0.0, [0, 5, 6]), (1.0, [0, 7]), (2.0, [0, 5, 6])]
        groups = prefix_groups(trace, top_k=3, depth=2)
        assert [(g.key, g.unique_blocks, g.reuses) for g in groups] == [
            (0, 1, 2),
            (5, 2, 2),
            (7, 1, 0),
            (None, 0, 0),
        ]
        assert np.array_equal(groups[1].intervals, [2.0, 2.0])

    def test_bad_arguments_raise(self) -> None:
        """top_k and depth are checked."""
        with pytest.raises(ValueError, match="'top_k' must be >= 0: -1"):
            prefix_groups(TRACE, top_k=-1)
        with pytest.raises(ValueError, match="'depth' must be >= 1: 0"):
            prefix_groups(TRACE, top_k=1, depth=0)
