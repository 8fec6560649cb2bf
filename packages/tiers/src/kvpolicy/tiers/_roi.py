"""ROI-aware group TTL: the hit and cost curves of §4.3 and Algorithm 2 of seed 003.

For a group g with |B_g| distinct blocks and reuse inter-arrival times A_g = {δ_i}
(:class:`PrefixGroup`), a TTL t counted from each use gives (§4.3):

* hits ``H_g(t) = |{δ ∈ A_g : δ <= t}|`` (a reuse within the TTL finds its block), and
* storage ``C_g(t) = |B_g| · t + Σ_{δ ∈ A_g} min(t, δ)`` in block-seconds (each use keeps
  the block until the next use or for t, whichever is first; each block's last use keeps
  it for t).

``R_g(t) = H_g(t) / C_g(t)`` is the group's return on storage. Algorithm 2 maximises
``Σ_g H_g(t_g)`` subject to ``Σ_g C_g(t_g) <= B`` (eq. (3)). ``t = 0`` keeps nothing:
``H_g(0) = C_g(0) = 0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from attrs import field, frozen

from kvpolicy.tiers._check import is_sequence
from kvpolicy.tiers._reuse import PrefixGroup
from kvpolicy.tiers._ttl import GroupTTL, TTLPolicy

__all__ = [
    "GroupTTLAllocation",
    "allocate_group_ttls",
    "group_cost",
    "group_hits",
    "roi_optimal_ttl",
    "uniform_ttl_for_budget",
]

FloatArray = npt.NDArray[np.float64]


def _intervals(intervals: npt.ArrayLike) -> FloatArray:
    arr = np.asarray(intervals, dtype=np.float64).ravel()
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0):
        raise ValueError(f"'intervals' must be finite and >= 0: {arr!r}")
    return np.sort(arr)


def _blocks(unique_blocks: int) -> int:
    if isinstance(unique_blocks, bool) or not isinstance(unique_blocks, int):
        raise TypeError(f"'unique_blocks' must be an int: {unique_blocks!r}")
    if unique_blocks < 0:
        raise ValueError(f"'unique_blocks' must be >= 0: {unique_blocks!r}")
    return unique_blocks


def _ttl(ttl: float) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise TypeError(f"'ttl' must be a number of seconds: {ttl!r}")
    if not math.isfinite(ttl) or ttl < 0:
        raise ValueError(f"'ttl' must be finite and >= 0: {ttl!r}")
    return float(ttl)


def group_hits(intervals: npt.ArrayLike, ttl: float) -> int:
    """``H_g(t)``: reuses whose inter-arrival time is at most ``ttl`` (0 when ``ttl == 0``).

    Args:
        intervals: (reuses,) float seconds, the group's δ values.
        ttl: seconds.
    """
    t = _ttl(ttl)
    arr = _intervals(intervals)
    return 0 if t == 0 else int(np.searchsorted(arr, t, side="right"))


def group_cost(intervals: npt.ArrayLike, unique_blocks: int, ttl: float) -> float:
    """``C_g(t) = |B_g| · t + Σ min(t, δ)`` in block-seconds (§4.3).

    Args:
        intervals: (reuses,) float seconds, the group's δ values.
        unique_blocks: |B_g|.
        ttl: seconds.
    """
    t = _ttl(ttl)
    arr = _intervals(intervals)
    return float(_blocks(unique_blocks) * t + np.minimum(arr, t).sum())


@frozen(eq=False)
class _Curve:
    """A group's hits and cost at its candidate TTLs: 0 and every distinct positive δ."""

    ttls: FloatArray
    hits: npt.NDArray[np.int64]
    cost: FloatArray
    sorted_intervals: FloatArray
    prefix: FloatArray
    blocks: int

    @classmethod
    def of(cls, intervals: npt.ArrayLike, unique_blocks: int, min_ttl: float) -> _Curve:
        s = _intervals(intervals)
        blocks = _blocks(unique_blocks)
        prefix = np.concatenate(([0.0], np.cumsum(s)))
        # Between two consecutive δ values H is flat and C grows, so a TTL on the
        # boundary (t = δ_j) dominates every TTL inside the gap: these are the only
        # candidates an optimiser needs. Reuses closer than min_ttl (same-instant ones,
        # δ = 0) are bought by the smallest TTL considered, min_ttl.
        cand = np.unique(np.maximum(s, min_ttl)) if s.size else s
        ttls = np.concatenate(([0.0], cand))
        hits = np.searchsorted(s, ttls, side="right").astype(np.int64)
        hits[0] = 0
        below = np.searchsorted(s, ttls, side="left")
        cost = (blocks * ttls + prefix[below] + ttls * (s.size - below)).astype(np.float64)
        return cls(
            ttls=ttls, hits=hits, cost=cost, sorted_intervals=s, prefix=prefix, blocks=blocks
        )

    def cost_at(self, t: float) -> float:
        below = int(np.searchsorted(self.sorted_intervals, t, side="left"))
        s = self.sorted_intervals
        return float(self.blocks * t + self.prefix[below] + t * (s.size - below))

    def index_at(self, t: float) -> int:
        """Index of the largest candidate <= t (same hits as t, no more cost)."""
        return int(np.searchsorted(self.ttls, t, side="right")) - 1

    def roi_optimal(self) -> float:
        if self.ttls.size == 1:
            return 0.0
        roi = self.hits[1:] / self.cost[1:]
        return float(self.ttls[1 + int(np.argmax(roi))])


def _min_ttl(min_ttl: float) -> float:
    if isinstance(min_ttl, bool) or not isinstance(min_ttl, int | float):
        raise TypeError(f"'min_ttl' must be a number of seconds: {min_ttl!r}")
    if not math.isfinite(min_ttl) or min_ttl <= 0:
        raise ValueError(f"'min_ttl' must be finite and > 0: {min_ttl!r}")
    return float(min_ttl)


def roi_optimal_ttl(
    intervals: npt.ArrayLike, unique_blocks: int, *, min_ttl: float = 1e-3
) -> float:
    """``argmax_t R_g(t) = H_g(t) / C_g(t)`` over ``t >= min_ttl`` (Algorithm 2, line 5).

    The maximum lies at one of the δ values (H is flat between them while C grows), or at
    ``min_ttl`` for reuses closer than it; the smallest maximiser is returned, or 0.0 when
    the group has no reuse. ``min_ttl`` bounds the search from below: same-instant reuses
    (δ = 0) make R unbounded as t -> 0.
    """
    return _Curve.of(intervals, unique_blocks, _min_ttl(min_ttl)).roi_optimal()


@frozen
class GroupTTLAllocation:
    """Per-group TTLs chosen by :func:`allocate_group_ttls`."""

    keys: tuple[int | None, ...]
    """Group keys, in the order given (``None`` for the residual group)."""
    ttls: tuple[float, ...]
    """Seconds per group."""
    hits: int
    """``Σ H_g(t_g)``: reuses served under these TTLs."""
    cost: float
    """``Σ C_g(t_g)`` in block-seconds (at most the budget)."""
    budget: float
    """The budget B in block-seconds."""
    roi_ttls: tuple[float, ...] = field()
    """The per-group ROI-optimal TTLs t_g^ROI (line 5), before budget scaling."""

    def policy(
        self, *, tier: str = "disk", depth: int = 1, base: TTLPolicy | None = None
    ) -> GroupTTL:
        """A :class:`GroupTTL` applying these TTLs in ``tier`` (residual group included)."""
        ttls = {k: t for k, t in zip(self.keys, self.ttls, strict=True) if k is not None}
        residual = next((t for k, t in zip(self.keys, self.ttls, strict=True) if k is None), 0.0)
        return GroupTTL(ttls, residual=residual, tier=tier, depth=depth, base=base)


def _check_groups(groups: Sequence[PrefixGroup], budget: float) -> float:
    if not is_sequence(groups) or not groups:
        raise TypeError(f"'groups' must be a non-empty sequence of PrefixGroup: {groups!r}")
    for g in groups:
        if not isinstance(g, PrefixGroup):
            raise TypeError(f"'groups' must hold PrefixGroup values: {g!r}")
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        raise TypeError(f"'budget' must be a number of block-seconds: {budget!r}")
    if not math.isfinite(budget) or budget < 0:
        raise ValueError(f"'budget' must be finite and >= 0: {budget!r}")
    return float(budget)


def _scale_to_budget(curves: list[_Curve], base: FloatArray, budget: float) -> FloatArray:
    """``α · base`` with ``Σ C_g(α t_g) = budget`` (bisection; C is increasing in α)."""

    def total(alpha: float) -> float:
        return sum(c.cost_at(alpha * t) for c, t in zip(curves, base, strict=True))

    if not np.any(base > 0) or total(1.0) == 0.0:
        return base.copy()
    lo, hi = 0.0, 1.0
    while total(hi) < budget and hi < 1e15:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if total(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return np.asarray(base * lo, dtype=np.float64)


def _ascend(curves: list[_Curve], start: list[int], budget: float) -> list[int]:
    """Greedy marginal-ROI ascent over candidate TTLs from a feasible start.

    Each step raises one group's TTL to the candidate with the best extra hits per extra
    block-second that still fits the budget, until no raise fits.
    """
    idx = list(start)
    spent = sum(float(c.cost[i]) for c, i in zip(curves, idx, strict=True))
    while True:
        best_ratio = 0.0
        best: tuple[int, int] | None = None
        room = budget - spent
        for g, c in enumerate(curves):
            i = idx[g]
            if i + 1 >= c.ttls.size:
                continue
            dh = c.hits[i + 1 :] - c.hits[i]
            dc = c.cost[i + 1 :] - c.cost[i]
            ok = (dc <= room) & (dh > 0)
            if not np.any(ok):
                continue
            ratio = np.where(ok, dh / np.where(dc > 0, dc, 1.0), -1.0)
            j = int(np.argmax(ratio))
            if ratio[j] > best_ratio:
                best_ratio = float(ratio[j])
                best = (g, i + 1 + j)
        if best is None:
            return idx
        g, j = best
        spent += float(curves[g].cost[j] - curves[g].cost[idx[g]])
        idx[g] = j


def allocate_group_ttls(
    groups: Sequence[PrefixGroup], budget: float, *, seed: int = 0, min_ttl: float = 1e-3
) -> GroupTTLAllocation:
    """ROI-aware TTL allocation (Algorithm 2 of seed 003) under a storage budget.

    Lines 2-6: each group's ROI-optimal TTL. Lines 7-10: scale them by one factor α so the
    total cost meets the budget (the paper's ``α = B / C_unscaled`` assumes C linear in t;
    C is concave, so α is found by bisection instead). Lines 11-13: ``⌊√K⌋ + 1`` random
    multiplicative perturbations of that point (log-normal, σ = 0.5, seeded), each scaled
    back into the budget, plus two starts of ours: all zeros, and the single TTL that
    spends the budget (so the result is never worse than the fixed-TTL baseline).
    Line 16: the paper runs SLSQP from each start; ``H_g`` is a step function whose
    gradient is zero almost everywhere, so a gradient method cannot move. Each start is
    instead improved by a greedy marginal-ROI ascent over the candidate TTLs (the
    distinct δ values), which respects the budget exactly. Lines 17-22: the start with
    the most hits wins (ties: lower cost).

    Args:
        groups: the top-K groups and the residual group (:func:`prefix_groups`).
        budget: B, in block-seconds (multiply by the block size for byte-seconds).
        seed: seed of the perturbations.
        min_ttl: the smallest positive TTL considered, in seconds (the trace's time
            resolution; reuses closer than it are bought at this TTL).
    """
    b = _check_groups(groups, budget)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"'seed' must be an int: {seed!r}")
    m = _min_ttl(min_ttl)
    curves = [_Curve.of(g.intervals, g.unique_blocks, m) for g in groups]
    roi = np.array([c.roi_optimal() for c in curves], dtype=np.float64)
    init = _scale_to_budget(curves, roi, b)
    rng = np.random.default_rng(seed)
    k = len(groups)
    uniform = _uniform_ttl(curves, b)
    starts = [init, np.zeros(k), np.full(k, uniform)]
    for _ in range(math.isqrt(k) + 1):
        perturbed = init * np.exp(rng.normal(0.0, 0.5, size=k))
        if sum(c.cost_at(t) for c, t in zip(curves, perturbed, strict=True)) > b:
            lo, hi = 0.0, 1.0
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                cost = sum(c.cost_at(mid * t) for c, t in zip(curves, perturbed, strict=True))
                lo, hi = (mid, hi) if cost <= b else (lo, mid)
            perturbed = perturbed * lo
        starts.append(perturbed)
    best_idx: list[int] | None = None
    best_key = (-1, 0.0)
    for start in starts:
        snapped = [c.index_at(float(t)) for c, t in zip(curves, start, strict=True)]
        if sum(float(c.cost[i]) for c, i in zip(curves, snapped, strict=True)) > b:
            continue  # numerical edge of the scaling: the zero start is always feasible
        idx = _ascend(curves, snapped, b)
        hits = sum(int(c.hits[i]) for c, i in zip(curves, idx, strict=True))
        cost = sum(float(c.cost[i]) for c, i in zip(curves, idx, strict=True))
        if hits > best_key[0] or (hits == best_key[0] and cost < best_key[1]):
            best_key = (hits, cost)
            best_idx = idx
    assert best_idx is not None  # the zero start is always feasible
    return GroupTTLAllocation(
        keys=tuple(g.key for g in groups),
        ttls=tuple(float(c.ttls[i]) for c, i in zip(curves, best_idx, strict=True)),
        hits=best_key[0],
        cost=best_key[1],
        budget=b,
        roi_ttls=tuple(float(t) for t in roi),
    )


def _uniform_ttl(curves: list[_Curve], budget: float) -> float:
    """The largest single TTL t with ``Σ_g C_g(t) <= budget`` (bisection)."""

    def total(t: float) -> float:
        return sum(c.cost_at(t) for c in curves)

    if total(1.0) == 0.0:
        return 0.0  # no blocks at all: any TTL is free, and buys nothing
    lo, hi = 0.0, 1.0
    while total(hi) < budget and hi < 1e15:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) <= budget else (lo, mid)
    return lo


def uniform_ttl_for_budget(groups: Sequence[PrefixGroup], budget: float) -> tuple[float, int]:
    """The fixed-TTL baseline of §5.3.2: the largest single TTL whose total cost fits.

    Returns:
        ``(ttl, hits)``: the TTL in seconds and ``Σ_g H_g(ttl)``.
    """
    b = _check_groups(groups, budget)
    curves = [_Curve.of(g.intervals, g.unique_blocks, 1e-3) for g in groups]
    ttl = _uniform_ttl(curves, b)
    hits = sum(int(np.searchsorted(c.sorted_intervals, ttl, side="right")) for c in curves)
    return ttl, (hits if ttl > 0 else 0)
