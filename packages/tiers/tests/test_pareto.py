"""Pareto filter, hypervolume and Algorithm 1 (adaptive Pareto search)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.tiers import (
    Objectives,
    SearchAxis,
    adaptive_pareto_search,
    grid_search,
    hypervolume,
    pareto_mask,
)


class TestParetoMask:
    def test_known_set(self) -> None:
        """Dominated rows are dropped; equal rows are both kept."""
        pts = [[1, 3], [2, 2], [3, 1], [2, 3], [2, 2], [4, 4]]
        assert pareto_mask(pts).tolist() == [True, True, True, False, True, False]

    def test_three_objectives(self) -> None:
        """A point worse in one objective and better in another survives."""
        pts = [[1, 1, 1], [0, 2, 2], [1, 1, 2], [2, 2, 2]]
        assert pareto_mask(pts).tolist() == [True, True, False, False]

    def test_rejects_non_finite(self) -> None:
        """NaN objectives are refused."""
        with pytest.raises(ValueError, match="'points' must be finite"):
            pareto_mask([[1.0, float("nan")]])


class TestHypervolume:
    def test_two_dimensions(self) -> None:
        """A staircase of three points under reference (4, 4): 3 + 2 + 1."""
        assert hypervolume([[1, 3], [2, 2], [3, 1]], [4, 4]) == 6.0

    def test_three_dimensions(self) -> None:
        """Three unit-offset boxes: 3 · 2 - 3 · 1 + 1 = 4 by inclusion-exclusion."""
        assert hypervolume([[1, 2, 2], [2, 1, 2], [2, 2, 1]], [3, 3, 3]) == 4.0
        assert hypervolume([[0, 0, 0]], [1, 2, 3]) == 6.0

    def test_points_outside_the_reference_add_nothing(self) -> None:
        """A point not strictly better than the reference in every objective counts 0."""
        assert hypervolume([[5, 0], [1, 1]], [4, 4]) == 9.0
        assert hypervolume(np.zeros((0, 2)), [1, 1]) == 0.0

    def test_mismatched_reference_raises(self) -> None:
        """The reference must have one value per objective."""
        with pytest.raises(ValueError, match="'reference' has 3 objectives but 'points' has 2"):
            hypervolume([[1, 1]], [2, 2, 2])

    @settings(max_examples=60, deadline=None)
    @given(
        pts=st.lists(
            st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9)),
            min_size=1,
            max_size=12,
        )
    )
    def test_matches_a_unit_cell_count(self, pts: list[tuple[int, int, int]]) -> None:
        """On integer points the volume equals the count of dominated unit cells."""
        ref = np.array([10, 10, 10])
        grid = np.stack(np.meshgrid(*(np.arange(10),) * 3, indexing="ij"), -1).reshape(-1, 3)
        p = np.array(pts)
        covered = np.zeros(len(grid), dtype=bool)
        for q in p:
            covered |= np.all(grid >= q, axis=1)
        assert hypervolume(p, ref) == float(covered.sum())
        assert hypervolume(p[pareto_mask(p)], ref) == hypervolume(p, ref)


def synthetic(config: Mapping[str, float]) -> Objectives:
    """Latency falls linearly until 16 GiB of DRAM and 4 s of TTL; TTL is cheaper."""
    d, t = config["dram"], config["ttl"]
    return Objectives(latency=max(16 - d, 0) + max(4 - t, 0), throughput=1.0, cost=d + 0.5 * t)


class TestAdaptiveSearch:
    def test_finds_the_true_front_with_fewer_evaluations(self) -> None:
        """From a coarse grid, refinement reaches every point of the fine-grid front."""
        coarse = [
            SearchAxis.of("dram", 0, 32, 8, min_step=1),
            SearchAxis.of("ttl", 0, 8, 4, min_step=1),
        ]
        fine = [SearchAxis.of("dram", 0, 32, 1), SearchAxis.of("ttl", 0, 8, 1)]
        adaptive = adaptive_pareto_search(
            synthetic, coarse, expand_threshold=0.01, perf_threshold=0.01, cost_threshold=0.01
        )
        truth = grid_search(synthetic, fine)
        key = sorted(e.objectives.as_minimization() for e in adaptive.front)
        assert key == sorted(e.objectives.as_minimization() for e in truth.front)
        assert len(truth.evaluations) == 33 * 9
        assert len(adaptive.evaluations) == 114
        ref = [40.0, 0.0, 40.0]
        assert adaptive.hypervolume(ref) == truth.hypervolume(ref)

    def test_three_axes_dram_disk_ttl(self) -> None:
        """Over (DRAM, disk, TTL) the search also reaches the fine-grid front, at a third."""

        def ev(c: Mapping[str, float]) -> Objectives:
            d, k, t = c["dram"], c["disk"], c["ttl"]
            latency = max(8 - d, 0) + 0.5 * max(4 - k, 0) + max(2 - t, 0)
            return Objectives(latency, 10 - max(8 - d, 0), d + 0.25 * k + 0.1 * t)

        coarse = [
            SearchAxis.of("dram", 0, 16, 4, min_step=1),
            SearchAxis.of("disk", 0, 8, 4, min_step=1),
            SearchAxis.of("ttl", 0, 4, 2, min_step=1),
        ]
        fine = [SearchAxis.of(a.name, a.low, a.high, 1) for a in coarse]
        adaptive = adaptive_pareto_search(
            ev, coarse, expand_threshold=0.01, perf_threshold=0.01, cost_threshold=0.01
        )
        truth = grid_search(ev, fine)
        key = sorted(e.objectives.as_minimization() for e in adaptive.front)
        assert key == sorted(e.objectives.as_minimization() for e in truth.front)
        assert (len(adaptive.evaluations), len(truth.evaluations), len(key)) == (264, 765, 63)

    def test_expansion_stops_when_the_marginal_gain_is_small(self) -> None:
        """DRAM grows past the grid while one step still cuts latency by > 10 %."""

        def ev(c: Mapping[str, float]) -> Objectives:
            return Objectives(latency=100 / (1 + c["dram"]), throughput=1.0, cost=c["dram"])

        result = adaptive_pareto_search(
            ev,
            [SearchAxis.of("dram", 0, 8, 4, min_step=4, limit=64)],
            expand_threshold=0.1,
            perf_threshold=1.0,
            cost_threshold=1.0,
        )
        # One step of 4 cuts latency by 4 / (1 + d): still > 0.1 at d = 36, not at d = 40.
        assert [e.value("dram") for e in result.evaluations] == [
            0.0,
            4.0,
            8.0,
            12.0,
            16.0,
            20.0,
            24.0,
            28.0,
            32.0,
            36.0,
            40.0,
        ]

    def test_expansion_stops_at_the_limit(self) -> None:
        """The first axis never expands beyond its limit."""

        def ev(c: Mapping[str, float]) -> Objectives:
            return Objectives(latency=100 - c["dram"], throughput=1.0, cost=c["dram"])

        result = adaptive_pareto_search(
            ev,
            [SearchAxis.of("dram", 0, 8, 4, min_step=4, limit=20)],
            expand_threshold=0.0,
            perf_threshold=1.0,
            cost_threshold=1.0,
        )
        assert max(e.value("dram") for e in result.evaluations) == 20.0

    def test_evaluation_budget_is_a_hard_cap(self) -> None:
        """No more than max_evaluations calls of the evaluation function."""
        calls: list[dict[str, float]] = []

        def ev(c: Mapping[str, float]) -> Objectives:
            calls.append(dict(c))
            return synthetic(c)

        axes = [SearchAxis.of("dram", 0, 32, 8, min_step=1), SearchAxis.of("ttl", 0, 8, 4)]
        result = adaptive_pareto_search(
            ev,
            axes,
            expand_threshold=0.0,
            perf_threshold=0.0,
            cost_threshold=0.0,
            max_evaluations=20,
        )
        assert len(calls) == len(result.evaluations) == 20

    def test_bad_arguments_raise(self) -> None:
        """Thresholds, axes and the evaluation's return type are checked."""
        axes = [SearchAxis.of("dram", 0, 8, 4)]
        with pytest.raises(ValueError, match="'perf_threshold' must be finite and >= 0: -1"):
            adaptive_pareto_search(
                synthetic, axes, expand_threshold=0, perf_threshold=-1, cost_threshold=0
            )
        with pytest.raises(TypeError, match="'evaluate' must return Objectives: 3"):
            adaptive_pareto_search(
                lambda c: 3,  # type: ignore[arg-type,return-value]
                axes,
                expand_threshold=0,
                perf_threshold=0,
                cost_threshold=0,
            )
        with pytest.raises(ValueError, match="'axes' must have distinct names"):
            grid_search(synthetic, axes * 2)


class TestSearchAxis:
    def test_grid_includes_both_ends(self) -> None:
        """The initial grid runs from low to high inclusive."""
        assert SearchAxis.of("d", 0, 2048, 512).grid() == [0.0, 512.0, 1024.0, 1536.0, 2048.0]

    @pytest.mark.parametrize(
        ("args", "needle"),
        [
            (("d", 4, 2, 1), "'high' must be >= 'low' \\(4.0\\): 2.0"),
            (("d", 0, 2, 0), "'step' must be > 0.0: 0.0"),
            (("d", -1, 2, 1), "'low' must be >= 0.0: -1.0"),
        ],
    )
    def test_bad_axes_raise(self, args: tuple[object, ...], needle: str) -> None:
        """Inverted ranges and empty steps are refused."""
        with pytest.raises(ValueError, match=needle):
            SearchAxis.of(*args)  # type: ignore[arg-type]

    def test_limit_below_high_raises(self) -> None:
        """The expansion limit cannot be below the grid."""
        with pytest.raises(ValueError, match=r"'limit' must be >= 'high' \(8.0\): 4.0"):
            SearchAxis.of("d", 0, 8, 4, limit=4)
