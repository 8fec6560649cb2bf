"""Linear stability of the eviction-free equilibrium: seed 002 §4.2-§4.3 and Appendix B.

The characteristic polynomial ``F`` (eq. 10), its large-input limit ``A`` (eq. 11), the GCD
verdict of Theorem 3, and the finite-input threshold ``l0,min`` of §4.3, computed exactly
(a root of ``F`` crosses the unit circle) and by the asymptotic formula of Proposition 4.

Polynomials are (n + 1,) float64 coefficient arrays, highest power first (numpy's
``polyval`` order). Decoding lengths go up to a few thousand, so beyond small degrees
roots come from the Aberth-Ehrlich iteration (quadratic cost) rather than a dense
companion matrix (cubic cost), and ``l0,min`` from a one-dimensional crossing search on
the unit circle (FFT grid plus Brent's method) that never forms the roots at all.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np
from attrs import frozen
from numpy.typing import NDArray

from kvpolicy.admit._errors import RootFindingError
from kvpolicy.admit._workload import StabilityWorkload

__all__ = [
    "StabilityReport",
    "analyze_stability",
    "asymptotic_min_input_len",
    "characteristic_polynomial",
    "count_roots_outside",
    "decode_gcd",
    "limiting_polynomial",
    "min_stable_input_len",
    "polynomial_roots",
    "spectral_radius",
]

_DENSE_MAX_DEGREE = 160


def decode_gcd(decode_lens: tuple[int, ...] | list[int]) -> int:
    """``g = gcd(l1,1, ..., l1,K)``, the period shared by every completion (Theorem 3)."""
    if not decode_lens:
        raise ValueError(f"'decode_lens' must not be empty: {decode_lens!r}")
    return reduce(math.gcd, (int(v) for v in decode_lens))


def _survival(workload: StabilityWorkload) -> NDArray[np.float64]:
    """``s_m = sum_{k: l1,k > m} p_k`` for lags ``m = 0..L-1``: (L,) float64."""
    lags = np.arange(workload.max_decode_len)
    l1 = np.asarray(workload.decode_lens)[:, None]
    return np.asarray(workload.mix) @ (lags[None, :] < l1).astype(np.float64)


def characteristic_polynomial(workload: StabilityWorkload) -> NDArray[np.float64]:
    """``F(z) = sum_m (sum_{k: l1,k > m} p_k (l0,k + 1 + m)) z^(L-1-m)`` (eq. 10).

    Its roots are the modes of the admission perturbations of the linearised recurrence
    (9) around the eviction-free equilibrium.

    Returns:
        (L,) float64 coefficients, highest power first, ``L = max_k l1,k``.
    """
    lags = np.arange(workload.max_decode_len, dtype=np.float64)
    l1 = np.asarray(workload.decode_lens)[:, None]
    alive = (lags[None, :] < l1).astype(np.float64)
    l0 = np.asarray(workload.input_lens, dtype=np.float64)[:, None]
    return np.asarray(workload.mix) @ (alive * (l0 + 1.0 + lags[None, :]))


def limiting_polynomial(workload: StabilityWorkload) -> NDArray[np.float64]:
    """``A(z) = sum_m (sum_{k: l1,k > m} p_k r_k) z^(L-1-m)`` (eq. 11).

    ``r_k = l0,k / max_k l0,k`` (the input-length ratios of the scaling (7)); any common
    scale gives the same roots.

    Returns:
        (L,) float64 coefficients, highest power first.
    """
    lags = np.arange(workload.max_decode_len)
    l1 = np.asarray(workload.decode_lens)[:, None]
    alive = (lags[None, :] < l1).astype(np.float64)
    r = np.asarray(workload.input_lens, dtype=np.float64) / max(workload.input_lens)
    return (np.asarray(workload.mix) * r) @ alive


def _check_coeffs(coeffs: NDArray[np.float64]) -> NDArray[np.float64]:
    c = np.trim_zeros(np.asarray(coeffs, dtype=np.float64), "f")
    if c.ndim != 1 or c.size < 1 or not np.all(np.isfinite(c)):
        raise ValueError(f"'coeffs' must be a finite non-zero 1-d array: {coeffs!r}")
    return c


def _newton_ratio(coeffs: NDArray[np.float64], z: NDArray[np.complex128]) -> NDArray[np.complex128]:
    """``F(z) / F'(z)`` at every point of ``z`` (coefficients highest power first).

    Outside the unit disk Horner's rule runs on the reversed polynomial ``R(w) = w^n F(1/w)``,
    ``F/F' = z / (n - w R'(w) / R(w))``, so that no power of ``|z| > 1`` overflows.
    """
    degree = coeffs.size - 1
    outer = np.abs(z) > 1.0
    w = np.where(outer, 1.0 / np.where(outer, z, 1.0), z)
    if z.size <= 32 < degree:
        # Few points: one (m, n) power matrix beats n Python-level Horner steps. |w| <= 1,
        # so the powers cannot overflow.
        powers = np.arange(degree + 1)
        vander = np.exp(np.log(np.where(w == 0, 1e-300, w))[:, None] * powers[None, :])
        fwd_asc = coeffs[::-1]
        rev_asc = coeffs
        value = np.where(outer, vander @ rev_asc, vander @ fwd_asc)
        deriv = np.where(
            outer,
            vander[:, :-1] @ (powers[1:] * rev_asc[1:]),
            vander[:, :-1] @ (powers[1:] * fwd_asc[1:]),
        )
    else:
        value = np.where(outer, coeffs[-1], coeffs[0]).astype(np.complex128)
        deriv = np.zeros(z.shape, dtype=np.complex128)
        for fwd, rev in zip(coeffs[1:], coeffs[-2::-1], strict=True):
            deriv = deriv * w + value
            value = value * w + np.where(outer, rev, fwd)
    with np.errstate(divide="ignore", invalid="ignore"):
        inner_ratio = value / deriv
        outer_ratio = z / (degree - w * deriv / value)
    ratio: NDArray[np.complex128] = np.where(outer, outer_ratio, inner_ratio)
    return ratio


def _aberth(coeffs: NDArray[np.float64]) -> NDArray[np.complex128]:
    """All roots by the Aberth-Ehrlich iteration, vectorised over the roots.

    Each sweep costs ``O(n^2)`` (Horner at ``n`` points and the pairwise repulsion sum) with
    no cubic eigenvalue step; started on a circle at the geometric-mean modulus, it needs a
    few tens of sweeps for the near-circular root sets of eq. (10) and (11).
    """
    degree = coeffs.size - 1
    radius = abs(coeffs[-1] / coeffs[0]) ** (1.0 / degree)
    angles = 2 * np.pi * (np.arange(degree) + 0.25) / degree
    z = radius * np.exp(1j * angles)
    active = np.ones(degree, dtype=bool)
    chunk = max(1, (1 << 22) // degree)
    for _ in range(200):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            return np.asarray(z, dtype=np.complex128)
        ratio = _newton_ratio(coeffs, z[idx])
        repulsion = np.empty(idx.size, dtype=np.complex128)
        for start in range(0, idx.size, chunk):
            part = idx[start : start + chunk]
            diff = z[part][:, None] - z[None, :]
            diff[np.arange(part.size), part] = np.inf
            repulsion[start : start + chunk] = (1.0 / diff).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = ratio / (1.0 - ratio * repulsion)
        step = np.where(np.isfinite(step), step, 0.0)
        z[idx] -= step
        active[idx] = np.abs(step) > 2e-15 * np.maximum(np.abs(z[idx]), 1e-300)
    # Rounding can keep a few steps just above the tolerance: accept roots whose residual
    # is at rounding level relative to the size of the terms.
    residual = np.abs(np.polyval(coeffs, z)) / np.polyval(np.abs(coeffs), np.abs(z))
    if float(residual.max()) < 1e-12:
        return np.asarray(z, dtype=np.complex128)
    raise RootFindingError(f"Aberth iteration did not converge for a polynomial of degree {degree}")


def polynomial_roots(coeffs: NDArray[np.float64]) -> NDArray[np.complex128]:
    """All roots of a polynomial.

    Degrees up to 160 use the companion matrix (``numpy.roots``); larger ones (decoding
    lengths in the thousands) use the Aberth-Ehrlich iteration, whose cost is quadratic
    instead of cubic and whose roots are accurate to about ``1e-13`` relative.

    Args:
        coeffs: (n + 1,) float64 coefficients, highest power first.

    Returns:
        (n',) complex128 roots, ``n'`` the degree after dropping leading zeros.
    """
    c = _check_coeffs(coeffs)
    trailing = c.size - 1 - int(np.flatnonzero(c)[-1])
    core = c[: c.size - trailing]
    zeros = np.zeros(trailing, dtype=np.complex128)
    if core.size <= 1:
        return zeros
    if core.size - 1 <= _DENSE_MAX_DEGREE:
        return np.concatenate([np.roots(core).astype(np.complex128), zeros])
    return np.concatenate([_aberth(core / core[0]), zeros])


def count_roots_outside(coeffs: NDArray[np.float64], radius: float = 1.0) -> int:
    """Number of roots of modulus greater than ``radius * (1 + 1e-12)``.

    Args:
        coeffs: (n + 1,) float64 polynomial coefficients, highest power first.
        radius: the circle.
    """
    if radius <= 0:
        raise ValueError(f"'radius' must be positive: {radius!r}")
    roots = polynomial_roots(coeffs)
    return int(np.count_nonzero(np.abs(roots) > radius * (1 + 1e-12)))


def spectral_radius(coeffs: NDArray[np.float64]) -> float:
    """Largest root modulus of a polynomial (Schur stable when below 1).

    Args:
        coeffs: (n + 1,) float64 coefficients, highest power first; ``n >= 1``.
    """
    roots = polynomial_roots(coeffs)
    if roots.size == 0:
        raise ValueError(f"'coeffs' must have degree at least 1: {coeffs!r}")
    return float(np.max(np.abs(roots)))


def min_stable_input_len(decode_lens: tuple[int, ...], mix: tuple[float, ...]) -> int | None:
    """Exact finite-input threshold ``l0,min`` of §4.3 for a common input length.

    With a common input length ``l0``, eq. (10) reads ``F = (l0 + 1) S(z) + T(z)`` with
    ``S = sum_m s_m z^(L-1-m)`` and ``T = sum_m m s_m z^(L-1-m)``, ``s_m`` the surviving mass.
    A root sits on the unit circle exactly when ``l0 + 1 = -T(z)/S(z)`` is real for some
    ``|z| = 1``; the largest such crossing value ``lambda`` bounds the unstable input lengths,
    so ``l0,min = max(0, floor(lambda))``. The crossings are found on a fine FFT grid over
    the circle and refined with Brent's method. Lemma 29 of seed 002 (no stable islands
    below the crossing) makes the first stable length the last crossing.

    Args:
        decode_lens: decoding lengths ``l1,k``.
        mix: proportions ``p_k`` (sum to 1).

    Returns:
        ``l0,min``, or None when no input length is stable (``gcd > 1``: a root of ``S``
        stays on the unit circle, Theorem 3).
    """
    workload = StabilityWorkload(
        input_lens=(1,) * len(decode_lens),
        decode_lens=decode_lens,
        memory=max(decode_lens) + 2,
        mix=mix,
    )
    if decode_gcd(workload.decode_lens) > 1:
        return None
    s = _survival(workload)
    m = np.arange(s.size, dtype=np.float64)
    grid = 1 << max(10, (32 * s.size - 1).bit_length())
    # S(e^{i t}) e^{-i (L-1) t} = sum_m s_m e^{-i m t}: numpy's forward FFT.
    s_hat = np.fft.fft(s, grid)[: grid // 2 + 1]
    t_hat = np.fft.fft(m * s, grid)[: grid // 2 + 1]
    imag = (t_hat * np.conj(s_hat)).imag

    def f_imag(theta: float) -> float:
        phase = np.exp(-1j * m * theta)
        return float((np.dot(m * s, phase) * np.conj(np.dot(s, phase))).imag)

    def crossing(theta: float) -> float:
        phase = np.exp(-1j * m * theta)
        sv = np.dot(s, phase)
        tv = np.dot(m * s, phase)
        return float(-(tv * np.conj(sv)).real / abs(sv) ** 2)

    thetas = 2 * np.pi * np.arange(grid // 2 + 1) / grid
    sign = np.sign(imag)
    changes = np.flatnonzero(sign[1:-1] * sign[2:] < 0) + 1
    # Only the crossings with the largest lambda matter; refine the few best on the grid.
    # lambda is large only where S nearly vanishes (a root of S close to the circle), in a
    # window far narrower than the grid: rank the sign changes by |S| at their ends.
    near = np.minimum(np.abs(s_hat[changes]), np.abs(s_hat[changes + 1]))
    order = np.argsort(near)[:32]
    # scipy.optimize takes ~0.7 s to import: only where a crossing is refined.
    from scipy.optimize import brentq

    best = crossing(math.pi)
    for j in changes[order]:
        theta = brentq(f_imag, thetas[j], thetas[j + 1], xtol=1e-15, rtol=1e-15)
        best = max(best, crossing(theta))
    for j in np.flatnonzero(sign[1:-1] == 0) + 1:
        best = max(best, crossing(float(thetas[j])))
    if best < 1.0:
        return 0
    return math.floor(best)


def asymptotic_min_input_len(decode_lens: tuple[int, int], short_share: float) -> float:
    """Proposition 4: ``l0,min ~ ((1-p) + p theta)^3 / (2 pi^2 p (1-p)) l1,2^3``.

    Args:
        decode_lens: ``(l1,1, l1,2)`` with ``l1,1 < l1,2``.
        short_share: ``p``, the proportion of the shorter class.
    """
    if len(decode_lens) != 2 or not decode_lens[0] < decode_lens[1]:
        raise ValueError(f"'decode_lens' must be two increasing lengths: {decode_lens!r}")
    if not 0.0 < short_share < 1.0:
        raise ValueError(f"'short_share' must be in (0, 1): {short_share!r}")
    p = short_share
    theta = decode_lens[0] / decode_lens[1]
    return ((1 - p) + p * theta) ** 3 / (2 * math.pi**2 * p * (1 - p)) * decode_lens[1] ** 3


@frozen
class StabilityReport:
    """Linear stability of one workload's eviction-free equilibrium (§4)."""

    gcd: int
    """``gcd`` of the decoding lengths."""
    spectral_radius: float
    """Largest root modulus of ``F`` (eq. 10); below 1 means linearly stable."""
    limiting_spectral_radius: float
    """Largest root modulus of ``A`` (eq. 11); exactly 1 when ``gcd > 1``."""
    unstable_roots: int
    """Roots of ``F`` outside the unit circle."""
    stable: bool
    """``spectral_radius < 1``: perturbations of the eviction-free state decay."""
    gcd_verdict: bool
    """Theorem 3: stable for large enough inputs iff ``gcd == 1`` (always False for K=1)."""
    min_input_len: int | None
    """Exact ``l0,min`` for the workload's decoding lengths and mix (common input length);
    None when no input length is stable."""
    min_input_len_asymptotic: float | None
    """Proposition 4's formula (two classes only), else None."""

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-ready dictionary."""
        return {
            "gcd": self.gcd,
            "spectral_radius": self.spectral_radius,
            "limiting_spectral_radius": self.limiting_spectral_radius,
            "unstable_roots": self.unstable_roots,
            "stable": self.stable,
            "gcd_verdict": self.gcd_verdict,
            "min_input_len": self.min_input_len,
            "min_input_len_asymptotic": self.min_input_len_asymptotic,
        }


def analyze_stability(workload: StabilityWorkload) -> StabilityReport:
    """Spectral radius, unstable roots, GCD verdict and ``l0,min`` of a workload."""
    g = decode_gcd(workload.decode_lens)
    f = characteristic_polynomial(workload)
    if f.size < 2:
        rho, unstable = 0.0, 0
    else:
        rho = spectral_radius(f)
        unstable = count_roots_outside(f, 1.0)
    a = limiting_polynomial(workload)
    rho_inf = 1.0 if g > 1 else (spectral_radius(a) if a.size > 1 else 0.0)
    distinct = len(set(workload.decode_lens)) > 1
    asym: float | None = None
    lens = workload.decode_lens
    if len(lens) == 2 and lens[0] != lens[1] and g == 1:
        order = (0, 1) if lens[0] < lens[1] else (1, 0)
        asym = asymptotic_min_input_len((lens[order[0]], lens[order[1]]), workload.mix[order[0]])
    return StabilityReport(
        gcd=g,
        spectral_radius=rho,
        limiting_spectral_radius=rho_inf,
        unstable_roots=unstable,
        stable=rho < 1.0,
        gcd_verdict=distinct and g == 1,
        min_input_len=min_stable_input_len(workload.decode_lens, workload.mix),
        min_input_len_asymptotic=asym,
    )
