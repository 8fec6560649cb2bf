""":func:`~kvpolicy.evict.choose_states` in one pass when every token's values are one number
times the same shares, as in :class:`~kvpolicy.evict.TokenPDMixed`.

There a token of value ``v >= 0`` is worth ``v * keep[s]`` in state ``s`` (``keep`` the share
of its return a state keeps, the same for every token) and may take the states of one of a
few *patterns* (which precisions are offered below its current one). ``choose_states``
walks each token's upper hull of ``(cost, value)`` one vertex at a time, comparing slopes
``(v keep[j] - v keep[i]) / (cost[j] - cost[i])``: scaling by ``v > 0`` scales every slope,
so the hull of a pattern is one *chain* of states for every ``v > 0`` (and for ``v = 0``
one upgrade, slope 0, straight to the dearest state offered). :class:`ScaledChains` works
the chains out once, in exact rational arithmetic, and :meth:`ScaledChains.choose` lays out
every token's upgrades from them at once, computes each upgrade's value per byte with the
very floating-point expression ``choose_states`` uses, and takes the best ones in the same
order::

    upgrades, step-major:  step 0 of every token | step 1 of those with one | step 2 ...
                           (within a step: higher priority first, then lower index)
    stable sort by value per byte, best first    -> choose_states's (value/byte, step,
                                                    priority, index) order, bit for bit

Rounding can only change a walk where two slopes differ by less than their rounding error,
or where ``v`` times a share leaves the normal range of float64: a pattern whose margins
are that thin, or a value outside the range the margins were proved for, makes
:meth:`ScaledChains.choose` return None, and the caller runs ``choose_states`` itself.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._precision import StateChoice

__all__ = ["ScaledChains"]

_U = Fraction(1, 2**53)
"""Unit roundoff of float64."""


def _walk(
    keeps: list[Fraction], dcost: list[list[Fraction]], offered: list[int]
) -> tuple[list[tuple[int, int]], bool]:
    """The hull walk of ``choose_states`` for a value ``v > 0`` in exact arithmetic.

    Args:
        keeps: the share kept in each state (state 0 first).
        dcost: ``dcost[i][j]``, the float64 difference ``cost[j] - cost[i]`` as a Fraction
            (what ``choose_states`` divides by), > 0 for ``j > i``.
        offered: the states the pattern offers, ascending, 0 among them.

    Returns:
        The upgrades ``(from, to)`` in order, and whether float64 slopes of any normal
        ``v`` (see :meth:`ScaledChains.choose`) take the same ones: every other candidate
        is farther from the chosen slope than both rounding errors together, or both are
        exactly 0 in float as well (equal shares).
    """

    def slope(i: int, j: int) -> tuple[Fraction, Fraction]:
        # The slope per unit of v and a bound on the relative error of its float64 value:
        # fl(v k_j) and fl(v k_i) each err by u, their difference by u (|k_j| + |k_i|) /
        # |k_j - k_i| relative to it, the subtraction and the division by u each.
        dk = keeps[j] - keeps[i]
        if dk == 0:
            return Fraction(0), Fraction(0)  # fl(v k) - fl(v k) is exactly 0
        err = 2 * _U * ((abs(keeps[j]) + abs(keeps[i])) / abs(dk) + 2)
        return dk / dcost[i][j], err

    chain: list[tuple[int, int]] = []
    safe = True
    cur = 0
    while True:
        cand = [j for j in offered if j > cur]
        if not cand:
            break
        slopes = {j: slope(cur, j) for j in cand}
        best = max(cand, key=lambda j: (slopes[j][0], j))  # the dearest of equal slopes
        sb, eb = slopes[best]
        for j in cand:
            if j == best:
                continue
            sj, ej = slopes[j]
            if sb - sj <= eb * abs(sb) + ej * abs(sj) and not (sb == sj == 0 and eb == ej == 0):
                safe = False
        if sb != 0 and eb >= 1:
            safe = False  # the sign of the float slope is not certain
        if sb < 0:
            break
        chain.append((cur, best))
        cur = best
    return chain, safe


def _clamped(x: Fraction) -> float:
    """``x`` as a float64, inf beyond the largest one (the bounds keep a margin of 2**22
    over what they need, so rounding here does not matter)."""
    return math.inf if x > Fraction(sys.float_info.max) else float(x)


class ScaledChains:
    """The hull chains of every pattern of available states, for values ``v * keeps``.

    Args:
        keeps: (S,) float64 share of a token's value kept in each state (state 0, the free
            one, first; finite).
        costs: (S,) float64 bytes of each state, 0 first and increasing.
        patterns: (P, S) bool, the states each pattern offers (column 0 True).

    Raises:
        ValueError: shapes disagree, costs not increasing from 0, a share not finite, or a
            pattern without the free state.
    """

    def __init__(
        self, keeps: NDArray[np.float64], costs: NDArray[np.float64], patterns: NDArray[np.bool_]
    ) -> None:
        k = np.asarray(keeps, dtype=np.float64)
        c = np.asarray(costs, dtype=np.float64)
        avail = np.asarray(patterns, dtype=bool)
        s = c.size
        if c.shape != (s,) or k.shape != (s,) or avail.ndim != 2 or avail.shape[1] != s:
            raise ValueError(
                f"'keeps' (S,), 'costs' (S,) and 'patterns' (P, S) disagree: "
                f"{k.shape}, {c.shape}, {avail.shape}"
            )
        if s < 1 or c[0] != 0 or np.any(np.diff(c) <= 0):
            raise ValueError(f"'costs' must start at 0 and increase: {c.tolist()}")
        if not np.isfinite(k).all():
            raise ValueError(f"'keeps' must be finite: {k.tolist()}")
        if not avail[:, 0].all():
            raise ValueError("'patterns' must offer the free state (column 0)")
        self._keeps = k
        # dcost[i, j] = c[j] - c[i]: the float differences choose_states divides by.
        self._dcost = c[None, :] - c[:, None]
        kf = [Fraction(float(x)) for x in k]
        df = [[Fraction(float(x)) for x in row] for row in self._dcost]
        p = avail.shape[0]
        longest = max(s - 1, 1)
        # Chains of v > 0 (rows 0..P-1) and of v == 0 (rows P..2P-1), padded with 0.
        frm = np.zeros((2 * p, longest), dtype=np.int64)
        to = np.zeros((2 * p, longest), dtype=np.int64)
        length = np.zeros(2 * p, dtype=np.int64)
        safe = np.zeros(p, dtype=bool)
        for row in range(p):
            offered = np.flatnonzero(avail[row]).tolist()
            chain, safe[row] = _walk(kf, df, offered)
            length[row] = len(chain)
            for step, (a, b) in enumerate(chain):
                frm[row, step], to[row, step] = a, b
            if offered[-1] > 0:  # every slope is exactly 0: the dearest state at once
                length[p + row] = 1
                to[p + row, 0] = offered[-1]
        self._from, self._to, self._length, self._safe = frm, to, length, safe
        self._all_safe = bool(safe.all())
        self._patterns = p
        # Values for which every product v * keep, difference and quotient of a walk is a
        # normal float64 (the error bounds of _walk hold): 2**-1000 / the smallest nonzero
        # share, share difference or slope per unit of v, up to 2**1000 / the largest.
        mags = [abs(x) for x in kf if x]
        for i in range(s):
            for j in range(i + 1, s):
                dk = abs(kf[j] - kf[i])
                if dk:
                    mags += [dk, dk / df[i][j]]
        tiny, huge = Fraction(2) ** -1000, Fraction(2) ** 1000
        self._v_lo = _clamped(tiny / min(mags)) if mags else 0.0
        self._v_hi = _clamped(huge / max(mags)) if mags else math.inf

    @property
    def safe(self) -> NDArray[np.bool_]:
        """(P,) bool: patterns whose chain holds for every value in range."""
        return self._safe.copy()

    def choose(
        self,
        value: NDArray[np.float64],
        pattern: NDArray[np.int64],
        budget: float,
        priority: NDArray[np.float64] | NDArray[np.int64],
    ) -> StateChoice | None:
        """``choose_states(value[:, None] * keeps, costs, budget, patterns[pattern],
        priority)``, bit for bit, or None where the chains cannot vouch for that.

        Args:
            value: (n,) float64 values >= 0 (any that is not finite is declined), n >= 1.
            pattern: (n,) int64 each token's pattern (a row of ``patterns``).
            budget: bytes available, finite and >= 0.
            priority: (n,) float64 or int64 (below 2**53), larger first among upgrades of
                equal value per byte.

        Returns:
            The states, the price and the bytes spent, as ``choose_states`` gives them; None
            when a value is not finite or outside the range the chains were proved for, or
            a token of value > 0 has a pattern whose chain is not safe.
        """
        zero = value == 0
        if not value.max() <= self._v_hi:  # NaN and inf too
            return None
        if value.min() < self._v_lo and (value[~zero] < self._v_lo).any():
            return None
        if not self._all_safe and not self._safe[pattern[~zero]].all():
            return None
        chain = pattern + self._patterns * zero
        # Every token's upgrades, step-major; within a step by priority (larger first),
        # then index: the tie-breaks of choose_states after the value per byte.
        perm = np.argsort(-priority, kind="stable")
        lengths = self._length[chain[perm]]
        step, at = np.nonzero(np.arange(self._from.shape[1])[:, None] < lengths[None, :])
        tok = perm[at]
        row = chain[tok]
        frm, dest = self._from[row, step], self._to[row, step]
        vt = value[tok]
        keeps = self._keeps
        # The very expression choose_states evaluates for this upgrade.
        dcost = self._dcost[frm, dest]
        eff = (vt * keeps[dest] - vt * keeps[frm]) / dcost
        order = np.argsort(-eff, kind="stable")
        spent = np.cumsum(dcost[order])
        taken = int(np.searchsorted(spent, budget, side="right"))
        chosen = order[:taken]
        state = np.zeros(value.size, dtype=np.int64)
        np.maximum.at(state, tok[chosen], dest[chosen])
        price = float(eff[order[taken]]) if taken < order.size else 0.0
        return StateChoice(
            state=state, price=price, spent=float(spent[taken - 1]) if taken else 0.0
        )
