"""Characteristic polynomial, spectral radius, GCD verdict and l0,min (§4.2-§4.3)."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.admit import (
    StabilityWorkload,
    analyze_stability,
    asymptotic_min_input_len,
    characteristic_polynomial,
    count_roots_outside,
    decode_gcd,
    limiting_polynomial,
    min_stable_input_len,
    polynomial_roots,
    spectral_radius,
)


def _two_class(l0: int, lens: tuple[int, int], p: float = 0.5) -> StabilityWorkload:
    return StabilityWorkload((l0, l0), lens, 10**9, (p, 1 - p))


class TestPolynomials:
    """F of eq. (10) and A of eq. (11)."""

    def test_example_4_coefficients(self) -> None:
        """l0 = 50, l1 = (2, 3): F = 51 z^2 + 52 z + 26.5 and A = z^2 + z + 1/2."""
        w = StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        assert characteristic_polynomial(w).tolist() == [51.0, 52.0, 26.5]
        assert limiting_polynomial(w).tolist() == [1.0, 1.0, 0.5]

    def test_example_4_radii(self) -> None:
        """|z| = 1/sqrt(2) for A and 0.72 for finite l0 = 50 (Figure 2a)."""
        w = StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5))
        assert spectral_radius(limiting_polynomial(w)) == pytest.approx(1 / math.sqrt(2))
        assert spectral_radius(characteristic_polynomial(w)) == pytest.approx(math.sqrt(26.5 / 51))
        assert round(spectral_radius(characteristic_polynomial(w)), 2) == 0.72

    def test_example_5_radius(self) -> None:
        """l1 = (2, 4): A has the root -1 and finite l0 = 50 drifts it to |z| = 1.019."""
        w = StabilityWorkload((50, 50), (2, 4), 626, (0.5, 0.5))
        assert abs(np.polyval(limiting_polynomial(w), -1.0)) < 1e-12
        rho = spectral_radius(characteristic_polynomial(w))
        assert round(rho, 3) == 1.019
        assert count_roots_outside(characteristic_polynomial(w)) == 1

    @settings(max_examples=30, deadline=None)
    @given(
        g=st.integers(2, 6),
        a=st.integers(1, 5),
        b=st.integers(6, 12),
        p=st.floats(0.05, 0.95),
    )
    def test_roots_of_unity_are_roots_of_a(self, g: int, a: int, b: int, p: float) -> None:
        """When g divides every decode length, A vanishes at the non-trivial g-th roots of 1."""
        w = StabilityWorkload((40, 70), (g * a, g * b), 10**6, (p, 1 - p))
        coeffs = limiting_polynomial(w)
        scale = float(np.abs(coeffs).sum())
        for j in range(1, g):
            z = cmath.exp(2j * math.pi * j / g)
            assert abs(np.polyval(coeffs, z)) < 1e-9 * scale

    @settings(max_examples=25, deadline=None)
    @given(a=st.integers(1, 20), b=st.integers(21, 40), p=st.floats(0.1, 0.9))
    def test_coprime_limit_inside_unit_circle(self, a: int, b: int, p: float) -> None:
        """gcd 1: every root of A lies strictly inside the unit circle (Theorem 3)."""
        if math.gcd(a, b) != 1:
            return
        w = StabilityWorkload((10, 10), (a, b), 10**6, (p, 1 - p))
        assert spectral_radius(limiting_polynomial(w)) < 1.0


class TestRootFinding:
    """The quadratic Aberth solver agrees with the companion matrix and scales to 4,096."""

    @pytest.mark.parametrize(
        ("lens", "l0"), [((193, 200), 300), ((2, 240), 20), ((251, 256), 5000)]
    )
    def test_aberth_matches_companion(self, lens: tuple[int, int], l0: int) -> None:
        """Spectral radius and unstable-root count equal numpy.roots' to 1e-12."""
        coeffs = characteristic_polynomial(_two_class(l0, lens))
        dense = np.roots(coeffs)
        assert spectral_radius(coeffs) == pytest.approx(float(np.abs(dense).max()), abs=1e-12)
        assert count_roots_outside(coeffs) == int(np.sum(np.abs(dense) > 1 + 1e-12))

    def test_roots_are_roots(self) -> None:
        """Every returned root of a degree-999 F has a tiny relative residual."""
        coeffs = characteristic_polynomial(_two_class(100, (999, 1000)))
        roots = polynomial_roots(coeffs)
        assert roots.size == 999
        residual = np.abs(np.polyval(coeffs, roots)) / np.polyval(np.abs(coeffs), np.abs(roots))
        assert float(residual.max()) < 1e-12

    def test_zero_roots_kept(self) -> None:
        """Trailing zero coefficients give roots at 0."""
        roots = polynomial_roots(np.array([1.0, -3.0, 2.0, 0.0]))
        assert sorted(roots.real.round(12).tolist()) == [0.0, 1.0, 2.0]

    def test_rejects_empty(self) -> None:
        """An all-zero polynomial is rejected."""
        with pytest.raises(ValueError, match="'coeffs'"):
            spectral_radius(np.zeros(3))


class TestThreshold:
    """l0,min by root crossing, checked against the roots themselves and Proposition 4."""

    @pytest.mark.parametrize(
        ("lens", "expected"),
        [((2, 3), 2), ((2, 5), 7), ((2, 7), 18), ((2, 9), 34), ((3, 7), 23), ((4, 7), 30)],
    )
    def test_exact_threshold(self, lens: tuple[int, int], expected: int) -> None:
        """At l0,min F is Schur stable; one token less it is not (a root on or outside)."""
        l0 = min_stable_input_len(lens, (0.5, 0.5))
        assert l0 == expected
        assert spectral_radius(characteristic_polynomial(_two_class(l0, lens))) < 1
        below = spectral_radius(characteristic_polynomial(_two_class(l0 - 1, lens)))
        assert below >= 1 - 1e-12

    def test_non_coprime_never_stable(self) -> None:
        """gcd > 1 has no stable input length."""
        assert min_stable_input_len((4, 8), (0.5, 0.5)) is None

    def test_asymptotic_agrees_for_long_decodes(self) -> None:
        """For (4089, 4096) the exact threshold is within 0.01% of Proposition 4's formula."""
        exact = min_stable_input_len((4089, 4096), (0.5, 0.5))
        assert exact is not None
        assert exact == pytest.approx(asymptotic_min_input_len((4089, 4096), 0.5), rel=1e-4)

    def test_asymptotic_rejects_bad_share(self) -> None:
        """p outside (0, 1) names 'short_share'."""
        with pytest.raises(ValueError, match="'short_share'"):
            asymptotic_min_input_len((2, 3), 1.0)


class TestAnalyzeStability:
    """The combined report."""

    def test_example_4_report(self) -> None:
        """(2, 3) at l0 = 50: gcd 1, stable, l0,min = 2."""
        report = analyze_stability(StabilityWorkload((50, 50), (2, 3), 518, (0.5, 0.5)))
        assert (report.gcd, report.stable, report.gcd_verdict, report.unstable_roots) == (
            1,
            True,
            True,
            0,
        )
        assert report.min_input_len == 2
        assert report.limiting_spectral_radius == pytest.approx(1 / math.sqrt(2))

    def test_homogeneous_is_unstable(self) -> None:
        """One class (Theorem 2): the eviction-free point is not stable."""
        report = analyze_stability(StabilityWorkload.homogeneous(20, 20, 1000))
        assert report.gcd == 20
        assert not report.stable
        assert not report.gcd_verdict
        assert report.min_input_len is None

    def test_decode_gcd(self) -> None:
        """gcd of (100, 125, 200, 250) is 25 (Table 7)."""
        assert decode_gcd((100, 125, 200, 250)) == 25


class TestBounds:
    def test_long_decodes_are_refused_before_the_roots(self) -> None:
        """Decode lengths of 10^4 would take hours of root finding: a clear error instead."""
        with pytest.raises(ValueError, match=r"'decode_lens' must be at most 2048 .*: 10000"):
            analyze_stability(StabilityWorkload((50, 50), (2, 10_000), 20_000, (0.5, 0.5)))
