"""Token-PD's allocator on the online knapsack of seed 000 (Sec. 3-4, Appendix A).

Tokens arrive in batches, one batch per decoding step; each has a value
``a = R - lambda sigma^2`` (eq. 2) and a cost ``c``, and the budget over the whole horizon is
``B``. The learner sees a batch, keeps the tokens with ``g = a - mu c >= 0`` (eq. 4) while the
budget lasts (a hard budget, never exceeded), and updates the price with eq. 5 against the
per-step share ``M = B / T``. The clairvoyant knows every value in advance and keeps the ``B``
best. Seed 000 claims ``Regret(T) = O(sqrt(T))`` and a price that settles in ~10 steps.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import field, frozen
from attrs.validators import instance_of
from numpy.typing import NDArray

from kvpolicy.evict._tokenpd import TokenPDConfig, dual_update

__all__ = ["KnapsackRun", "clairvoyant_value", "online_knapsack", "settling_step"]


@frozen
class KnapsackRun:
    """Outcome of :func:`online_knapsack`."""

    value: float = field(converter=float)
    """Total value of the kept tokens."""
    kept: int = field(validator=instance_of(int))
    """Tokens kept (never more than the budget)."""
    prices: NDArray[np.float64] = field(eq=False)
    """(T + 1,) float64 price ``mu`` before each step and after the last."""


def _check_values(values: object) -> NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"'values' must be a non-empty (T, n) array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("'values' must be finite")
    return arr


def _check_budget(budget: object, total: int) -> int:
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise TypeError(f"'budget' must be int: {budget!r}")
    if not 0 < budget <= total:
        raise ValueError(f"'budget' must be in (0, {total}]: {budget}")
    return budget


def clairvoyant_value(values: NDArray[np.float64], budget: int) -> float:
    """Best total value of at most ``budget`` tokens, knowing every value in advance.

    Args:
        values: (T, n) float64 token values ``a``, one row per step.
        budget: tokens that may be kept over the horizon.
    """
    arr = _check_values(values).ravel()
    b = _check_budget(budget, arr.size)
    top = -np.partition(-arr, b - 1)[:b]
    return float(top[top > 0].sum())


def online_knapsack(values: NDArray[np.float64], budget: int, config: TokenPDConfig) -> KnapsackRun:
    """Run Token-PD's keep rule and dual update on an online knapsack.

    Args:
        values: (T, n) float64 token values ``a = R - lambda sigma^2``, one row per step,
            revealed one row at a time.
        budget: tokens that may be kept over the horizon (``B``); each costs
            ``config.token_cost``.
        config: Token-PD parameters. ``eta = learning_rate / sqrt(horizon or T)``. With
            ``initial_price=None`` the first price is the one that would keep exactly the
            per-step share of the first batch.

    Returns:
        The value collected, the tokens kept and the price path.
    """
    arr = _check_values(values)
    steps, n = arr.shape
    b = _check_budget(budget, arr.size)
    c = config.token_cost
    share = b / steps  # M of eq. 5, in tokens per step
    eta = config.learning_rate / math.sqrt(config.horizon or steps)
    if config.initial_price is None:
        k = min(n, max(1, round(share)))
        first = float(np.partition(arr[0], n - k)[n - k])
        mu = max(first / c, config.min_price)
    else:
        mu = config.initial_price
    prices = np.empty(steps + 1, dtype=np.float64)
    left = b
    total = 0.0
    for t in range(steps):
        prices[t] = mu
        row = arr[t]
        keep = np.flatnonzero(row - mu * c >= 0)  # eq. 4
        if keep.size > left:  # hard budget: the best of the eligible tokens
            keep = keep[np.argsort(-row[keep], kind="stable")[:left]]
        left -= keep.size
        total += float(row[keep].sum())
        mu = max(dual_update(mu, keep.size * c, share * c, eta), config.min_price)
    prices[steps] = mu
    return KnapsackRun(value=total, kept=b - left, prices=prices)


def settling_step(prices: NDArray[np.float64], target: float, tolerance: float = 0.1) -> int:
    """First step after which the price stays within ``tolerance`` of ``target``.

    Args:
        prices: (T,) float64 price path.
        target: the price to settle at (e.g. the clairvoyant threshold), > 0.
        tolerance: relative band, > 0.

    Returns:
        The step index, or ``len(prices)`` when the price never settles.
    """
    p = np.asarray(prices, dtype=np.float64)
    if not target > 0:
        raise ValueError(f"'target' must be > 0: {target!r}")
    if not tolerance > 0:
        raise ValueError(f"'tolerance' must be > 0: {tolerance!r}")
    outside = np.flatnonzero(np.abs(p / target - 1.0) > tolerance)
    return 0 if outside.size == 0 else int(outside[-1]) + 1
