"""Closed forms of seed 002 §3-§4: x*, the worst cycle, B, fixed points, Example 2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpolicy.admit import (
    StabilityWorkload,
    eviction_free_rate,
    eviction_level,
    fixed_point,
    lifetime_footprints,
    linearised_admissions,
    spread,
    stage_weights,
    transition_matrix,
    worst_cycle_ratio,
    worst_cycle_throughput,
)


class TestRates:
    """x* (eq. 4 and 8), worst-cycle throughput and the ratio of Lemma 1."""

    def test_example_2_rates(self) -> None:
        """l0=2, l1=3, M=24: x* = 2, worst cycle 8/5, ratio 0.8."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        assert eviction_free_rate(w) == pytest.approx(2.0)
        assert worst_cycle_throughput(w) == pytest.approx(1.6)
        assert worst_cycle_ratio(w) == pytest.approx(0.8)

    def test_figure_4_rates(self) -> None:
        """M=2000, l0=10, l1=40: worst cycle 1.00 and x* = 1.64 as Figure 4 states."""
        w = StabilityWorkload.homogeneous(10, 40, 2000)
        assert worst_cycle_throughput(w) == pytest.approx(1.0)
        assert eviction_free_rate(w) == pytest.approx(4000 / 2440)

    def test_examples_4_and_5_have_x_star_4(self) -> None:
        """Both two-class examples were built with x* = 4 (eq. 8)."""
        assert eviction_free_rate(
            StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        ) == pytest.approx(4)
        assert eviction_free_rate(
            StabilityWorkload((50, 50), (2, 4), 626, (0.5, 0.5))
        ) == pytest.approx(4)

    def test_lifetime_footprints(self) -> None:
        """C_k = l1 (l0 + (l1 + 1)/2)."""
        w = StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        assert lifetime_footprints(w).tolist() == [103.0, 156.0]

    @given(
        l0=st.integers(1, 500),
        l1=st.integers(1, 500),
        extra=st.integers(1, 10_000),
    )
    def test_ratio_closed_form(self, l0: int, l1: int, extra: int) -> None:
        """Worst-cycle ratio equals (2 l0 + l1 + 1) / (2 (l0 + l1)) and lies in (1/2, 1]."""
        w = StabilityWorkload.homogeneous(l0, l1, l0 + l1 + extra)
        ratio = worst_cycle_ratio(w)
        assert ratio == pytest.approx((2 * l0 + l1 + 1) / (2 * (l0 + l1)))
        assert 0.5 < ratio <= 1.0


class TestLinearMap:
    """The matrix B of eq. (3) and the fixed point."""

    def test_b_matrix(self) -> None:
        """l0=2, l1=3: first row (-1/3, -1/3, 5/3), then the stage shift."""
        b = transition_matrix(2, 3)
        expected = np.array([[-1 / 3, -1 / 3, 5 / 3], [1, 0, 0], [0, 1, 0]])
        np.testing.assert_allclose(b, expected)

    def test_b_fixes_ones(self) -> None:
        """alpha (l1 - 1) + beta = 1, so B 1 = 1."""
        np.testing.assert_allclose(transition_matrix(7, 11) @ np.ones(11), np.ones(11))

    def test_b_rejects_bad_lengths(self) -> None:
        """Non-positive lengths raise ValueError naming the argument."""
        with pytest.raises(ValueError, match="'decode_len'"):
            transition_matrix(2, 0)

    def test_fixed_point_example_2(self) -> None:
        """The eviction-free fixed point is (2, 2, 2) and fills memory exactly."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        x = fixed_point(w)
        assert x.tolist() == [[2.0, 2.0, 2.0]]
        assert float(np.sum(stage_weights(w) * x)) == pytest.approx(24.0)

    def test_example_3_step_matches_b(self) -> None:
        """One step of B from (5/2, 2, 17/10) is (4/3, 5/2, 2) (Example 3)."""
        x1 = transition_matrix(2, 3) @ np.array([2.5, 2.0, 1.7])
        np.testing.assert_allclose(x1, [4 / 3, 2.5, 2.0])

    def test_stage_weights_zero_past_decode_len(self) -> None:
        """w_kj = l0 + 1 + j below l1,k and 0 after."""
        w = StabilityWorkload((2, 5), (2, 3), 100, (0.5, 0.5))
        assert stage_weights(w).tolist() == [[3.0, 4.0, 0.0], [6.0, 7.0, 8.0]]


class TestStateMeasures:
    """Spread G (eq. 5) and eviction level (§3.2)."""

    def test_spread_example_3(self) -> None:
        """G^0 = 4/5 for (5/2, 2, 17/10)."""
        assert spread(np.array([2.5, 2.0, 1.7])) == pytest.approx(0.8)

    def test_eviction_level(self) -> None:
        """(8, 0, 0) is level 2, (0, 48/13, 24/13) level 1, (2, 2, 2) level 0."""
        assert eviction_level(np.array([8.0, 0.0, 0.0])) == 2
        assert eviction_level(np.array([0.0, 48 / 13, 24 / 13])) == 1
        assert eviction_level(np.array([2.0, 2.0, 2.0])) == 0

    def test_bad_state_shape(self) -> None:
        """A 3-d state is rejected."""
        with pytest.raises(ValueError, match="'state'"):
            spread(np.zeros((1, 1, 1)))


class TestLinearisedAdmissions:
    """The recurrence (9) behind Figure 2."""

    def test_example_4_converges_within_2_percent_by_iteration_8(self) -> None:
        """Coprime (2, 3): from a 25% over-admission, within 2% of x* = 4 at iteration 8."""
        w = StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        a = linearised_admissions(w, np.array([4.0, 4.0, 5.0]), 40)
        assert abs(a[7] - 4.0) / 4.0 < 0.02
        assert abs(a[-1] - 4.0) < 1e-4

    def test_example_5_oscillation_grows(self) -> None:
        """Non-coprime (2, 4): the period-2 oscillation grows geometrically."""
        w = StabilityWorkload((50, 50), (2, 4), 626, (0.5, 0.5))
        a = linearised_admissions(w, np.array([4.0, 4.0, 4.0, 5.0]), 200)
        early = np.abs(a[10:20] - 4).max()
        late = np.abs(a[190:200] - 4).max()
        assert late > 5 * early

    def test_history_shape_checked(self) -> None:
        """A history of the wrong length is rejected."""
        w = StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        with pytest.raises(ValueError, match="'history'"):
            linearised_admissions(w, np.ones(2), 5)
