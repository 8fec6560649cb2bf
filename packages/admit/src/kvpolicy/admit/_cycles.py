"""Detection of periodic orbits (limit cycles) in a simulated trajectory (seed 002 §3.2)."""

from __future__ import annotations

import numpy as np
from attrs import frozen
from numpy.typing import NDArray

__all__ = ["LimitCycle", "detect_limit_cycle"]


@frozen(eq=False)
class LimitCycle:
    """A periodic orbit ``X_1 -> ... -> X_p -> X_1`` found at the end of a trajectory."""

    period: int
    """Smallest ``p`` with ``X^{n+p} = X^n`` (1 for a fixed point)."""
    eviction_level: int
    """Empty stages of the orbit's states (the maximum over the orbit)."""
    throughput: float
    """Mean completions per iteration over one period."""
    evictions_per_step: float
    """Mean evicted mass per iteration over one period."""
    states: NDArray[np.float64]
    """(period, L) float64 stage totals of the orbit."""


def detect_limit_cycle(
    stages: NDArray[np.float64],
    completed: NDArray[np.float64],
    evicted: NDArray[np.float64] | None = None,
    *,
    max_period: int | None = None,
    rtol: float = 1e-6,
    repeats: int = 3,
) -> LimitCycle | None:
    """The smallest period with which the end of a trajectory repeats, or None.

    Args:
        stages: (T, L) float64 stage totals per iteration (``record_stages=True``).
        completed: (T,) float64 completions per iteration.
        evicted: (T,) float64 evictions per iteration (optional).
        max_period: longest period tried (default ``T // repeats``).
        rtol: tolerance relative to the largest stage mass.
        repeats: the last ``repeats`` periods must agree.
    """
    arr = np.asarray(stages, dtype=np.float64)
    done = np.asarray(completed, dtype=np.float64)
    if arr.ndim != 2 or done.shape != (arr.shape[0],):
        raise ValueError(f"'stages' must be (T, L) and 'completed' (T,): {arr.shape}, {done.shape}")
    if repeats < 2:
        raise ValueError(f"'repeats' must be at least 2: {repeats!r}")
    total = arr.shape[0]
    limit = total // repeats if max_period is None else min(max_period, total // repeats)
    scale = max(float(np.abs(arr).max()), 1e-300)
    for p in range(1, limit + 1):
        tail = arr[total - repeats * p :]
        blocks = tail.reshape(repeats, p, -1)
        if np.all(np.abs(blocks - blocks[-1]) <= rtol * scale):
            orbit = arr[total - p :]
            empty = int(np.max(np.sum(orbit <= rtol * scale, axis=1)))
            ev = 0.0 if evicted is None else float(np.mean(np.asarray(evicted)[total - p :]))
            return LimitCycle(
                period=p,
                eviction_level=empty,
                throughput=float(done[total - p :].mean()),
                evictions_per_step=ev,
                states=orbit.copy(),
            )
    return None
