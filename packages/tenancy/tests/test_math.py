"""Eqs. (1)-(3) of seed 004 and the Retry-After capacity model."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpolicy.tenancy import (
    ELASTIC,
    PriorityCoefficients,
    burst_intensity,
    ewma,
    priority_weight,
    retry_after,
    service_gap,
    update_debt,
)

POOL_MEAN_SLO_S = (0.5 + 30.0) / 2  # experiment 2: copilot 500 ms, synth 30 s -> 15,250 ms


class TestPriorityWeight:
    def test_experiment_two_weights(self) -> None:
        """Copilot and synth weigh 93.8 and 20.3 with the pool mean SLO of 15.25 s (§5.3)."""
        copilot = priority_weight(ELASTIC.weight, 0.5, POOL_MEAN_SLO_S)
        synth = priority_weight(ELASTIC.weight, 30.0, POOL_MEAN_SLO_S)
        assert round(copilot, 1) == 93.8
        assert round(synth, 1) == 20.3
        assert round(copilot / synth, 1) == 4.6

    def test_peak_debt_of_synth(self) -> None:
        """At debt 0.775 synth weighs 20.27 * 4.1 = 83.1 (the paper rounds 20.3 * 4.1 = 83.2)."""
        synth = priority_weight(ELASTIC.weight, 30.0, POOL_MEAN_SLO_S, debt=0.775)
        assert synth == pytest.approx(100 / (1 + 60 / 15.25) * 4.1)
        assert round(synth, 1) == 83.1
        assert round(20.3 * (1 + 4.0 * 0.775), 1) == 83.2

    def test_gap_narrows_to_three_point_nine(self) -> None:
        """With both at their peak debts (0.607, 0.775) the 4.6x gap narrows to 3.9x."""
        copilot = priority_weight(ELASTIC.weight, 0.5, POOL_MEAN_SLO_S, debt=0.607)
        synth = priority_weight(ELASTIC.weight, 30.0, POOL_MEAN_SLO_S, debt=0.775)
        assert round(copilot / synth, 1) == 3.9

    def test_reports_weight_uses_the_two_tenant_mean(self) -> None:
        """Reports' w = 60 holds for the 15.25 s mean; the three-tenant mean gives 54.2."""
        assert round(priority_weight(100, 5.0, POOL_MEAN_SLO_S)) == 60
        assert round(priority_weight(100, 5.0, (0.5 + 30.0 + 5.0) / 3), 1) == 54.2

    def test_burst_divides(self) -> None:
        """A burst intensity of 1 halves the weight with alpha_burst = 1."""
        assert priority_weight(100, 1.0, 1.0, burst=1.0) == pytest.approx(100 / 3 / 2)

    def test_credit_stays_positive(self) -> None:
        """Debt -0.5 gives the reciprocal factor 1 / (1 + 4 * 0.5) = 1/3, not 1 - 2 = -1."""
        assert priority_weight(100, 1.0, 1.0, debt=-0.5) == pytest.approx(100 / 3 / 3)

    def test_coefficients(self) -> None:
        """Zero alphas leave the class weight alone."""
        zero = PriorityCoefficients(alpha_slo=0, alpha_burst=0, alpha_debt=0)
        assert priority_weight(1000, 5.0, 1.0, 3.0, 0.9, zero) == 1000.0

    def test_bad_input(self) -> None:
        """A non-positive SLO or a negative burst names the parameter."""
        with pytest.raises(ValueError, match="'slo_target_s' must be > 0: 0"):
            priority_weight(100, 0, 1.0)
        with pytest.raises(ValueError, match="'burst' must be >= 0: -1"):
            priority_weight(100, 1, 1.0, burst=-1)
        with pytest.raises(TypeError, match="'debt' must be a number: 'x'"):
            priority_weight(100, 1, 1.0, debt="x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=re.escape("'gamma_d' must be < 1.0: 1.0")):
            PriorityCoefficients(gamma_d=1.0)

    @given(
        st.floats(0.01, 100),
        st.floats(0.01, 100),
        st.floats(0, 10),
        st.floats(-1, 1),
        st.floats(-1, 1),
    )
    def test_monotone_in_debt_and_positive(
        self, slo: float, mean: float, burst: float, d1: float, d2: float
    ) -> None:
        """The weight is positive and does not decrease with debt."""
        lo, hi = sorted((d1, d2))
        w_lo = priority_weight(100, slo, mean, burst, lo)
        w_hi = priority_weight(100, slo, mean, burst, hi)
        assert 0 < w_lo <= w_hi


class TestDebt:
    def test_gap_signs(self) -> None:
        """Half served is a gap of 0.5; served at twice baseline is -1 (the clamp)."""
        assert service_gap(100, 50) == 0.5
        assert service_gap(100, 200) == -1.0
        assert service_gap(100, 400) == -1.0

    def test_gap_without_contention(self) -> None:
        """A tenant the pool never denied is owed nothing, but bursting still earns credit."""
        assert service_gap(100, 30, contended=False) == 0.0
        assert service_gap(100, 150, contended=False) == -0.5
        assert service_gap(100, 30) == 0.7
        with pytest.raises(TypeError, match="'contended' must be bool: 1"):
            service_gap(100, 30, contended=1)  # type: ignore[arg-type]

    def test_eq_two(self) -> None:
        """d(k) = 0.7 d(k-1) + 0.3 g(k)."""
        assert update_debt(0.5, 1.0) == pytest.approx(0.65)
        assert update_debt(0.5, 1.0, gamma_d=0.0) == 1.0

    def test_decay_from_peak(self) -> None:
        """With no gap, the paper's peak 0.775 falls under 0.025 after ten steps of 0.7."""
        d = 0.775
        for _ in range(10):
            d = update_debt(d, 0.0)
        assert d == pytest.approx(0.775 * 0.7**10)
        assert d < 0.025

    def test_ewma_bad_gamma(self) -> None:
        """Gamma outside [0, 1) is refused."""
        with pytest.raises(ValueError, match=re.escape("'gamma' must be in [0, 1): 1.5")):
            ewma(0.0, 1.0, 1.5)

    @given(st.floats(-1, 1), st.lists(st.floats(-1, 1), max_size=30))
    def test_debt_stays_in_gap_range(self, d0: float, gaps: list[float]) -> None:
        """EWMA of gaps in [-1, 1] stays in [-1, 1]."""
        d = d0
        for g in gaps:
            d = update_debt(d, g)
            assert -1.0 - 1e-12 <= d <= 1.0 + 1e-12


class TestBurstIntensity:
    def test_eq_three(self) -> None:
        """Twice the tokens, 1.5x the KV and the baseline concurrency sum to 1.5."""
        assert burst_intensity(200, 150, 4, 100, 100, 4) == pytest.approx(1.5)

    def test_below_baseline_is_zero(self) -> None:
        """Use below baseline in every dimension is no burst."""
        assert burst_intensity(10, 10, 1, 100, 100, 4) == 0.0

    def test_bad_baseline(self) -> None:
        """A zero baseline names the field."""
        with pytest.raises(ValueError, match="'baseline_kv_bytes' must be > 0: 0"):
            burst_intensity(1, 1, 1, 1, 0, 1)


class TestRetryAfter:
    def test_tokens_from_refill(self) -> None:
        """Lacking 120 tokens at 240 tokens/s is half a second."""
        wait = retry_after(
            tokens_needed=120,
            in_flight=0,
            in_flight_tokens=0,
            in_flight_kv_bytes=0,
            drain_tokens_per_s=240,
        )
        assert wait == 0.5

    def test_slot_from_completion_rate(self) -> None:
        """8 requests of 128 tokens drained at 256 tokens/s complete 2 per second: 1 slot 0.5 s."""
        wait = retry_after(
            slots_needed=1,
            in_flight=8,
            in_flight_tokens=1024,
            in_flight_kv_bytes=8000,
            drain_tokens_per_s=256,
        )
        assert wait == 0.5

    def test_kv_from_completion_rate(self) -> None:
        """Completions free 1000 bytes each at 2 per second: 3000 bytes take 1.5 s."""
        wait = retry_after(
            kv_bytes_needed=3000,
            in_flight=8,
            in_flight_tokens=1024,
            in_flight_kv_bytes=8000,
            drain_tokens_per_s=256,
        )
        assert wait == 1.5

    def test_longest_dimension_wins(self) -> None:
        """The wait is the longest of the dimensions that fall short."""
        wait = retry_after(
            slots_needed=1,
            tokens_needed=512,
            in_flight=8,
            in_flight_tokens=1024,
            in_flight_kv_bytes=8000,
            drain_tokens_per_s=256,
        )
        assert wait == 2.0

    def test_clamps(self) -> None:
        """Nothing needed gives min_s; nothing in flight to free gives max_s; long waits clamp."""
        kw = {"in_flight_tokens": 0.0, "in_flight_kv_bytes": 0.0, "drain_tokens_per_s": 1.0}
        assert retry_after(in_flight=0, **kw) == 0.05
        assert retry_after(slots_needed=1, in_flight=0, **kw) == 60.0
        assert retry_after(tokens_needed=1e6, in_flight=0, max_s=30.0, **kw) == 30.0

    def test_bad_input(self) -> None:
        """A negative need or a zero drain names the parameter."""
        with pytest.raises(ValueError, match="'slots_needed' must be >= 0: -1"):
            retry_after(
                slots_needed=-1,
                in_flight=0,
                in_flight_tokens=0,
                in_flight_kv_bytes=0,
                drain_tokens_per_s=1,
            )
        with pytest.raises(ValueError, match="'drain_tokens_per_s' must be > 0: 0"):
            retry_after(in_flight=0, in_flight_tokens=0, in_flight_kv_bytes=0, drain_tokens_per_s=0)
        with pytest.raises(ValueError, match="'max_s' must be >= 'min_s'"):
            retry_after(
                in_flight=0,
                in_flight_tokens=0,
                in_flight_kv_bytes=0,
                drain_tokens_per_s=1,
                min_s=2,
                max_s=1,
            )

    @given(st.floats(0, 1e6), st.floats(0, 1e12), st.floats(0, 1e9), st.integers(0, 1000))
    def test_always_within_bounds(self, slots: float, kv: float, tokens: float, n: int) -> None:
        """Every answer lies in [min_s, max_s]."""
        wait = retry_after(
            slots_needed=slots,
            kv_bytes_needed=kv,
            tokens_needed=tokens,
            in_flight=n,
            in_flight_tokens=128.0 * n,
            in_flight_kv_bytes=1e4 * n,
            drain_tokens_per_s=240,
        )
        assert math.isfinite(wait)
        assert 0.05 <= wait <= 60.0
