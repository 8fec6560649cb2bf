"""Closed-form analysis of seed 002 §3-§4: x*, the worst cycle, the matrix B, fixed points.

Pure functions over :class:`StabilityWorkload` and numpy state arrays. A *state* is the
``(K, L)`` float64 array ``X`` of active request mass by class and decoding stage, with
``L = max_k l1,k``; entries at stages ``j >= l1,k`` of class ``k`` are always zero.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from kvpolicy.admit._workload import StabilityWorkload

__all__ = [
    "eviction_free_rate",
    "eviction_level",
    "fixed_point",
    "lifetime_footprints",
    "linearised_admissions",
    "spread",
    "stage_weights",
    "transition_matrix",
    "worst_cycle_ratio",
    "worst_cycle_throughput",
]


def stage_weights(workload: StabilityWorkload) -> NDArray[np.float64]:
    """Memory of one request by class and stage, ``w_kj = l0,k + 1 + j`` (§2.2).

    Returns:
        (K, L) float64, zero at stages ``j >= l1,k`` (the convention ``w_k,l1,k = 0``).
    """
    length = workload.max_decode_len
    j = np.arange(length, dtype=np.float64)
    l0 = np.asarray(workload.input_lens, dtype=np.float64)[:, None]
    l1 = np.asarray(workload.decode_lens)[:, None]
    return np.where(j[None, :] < l1, l0 + 1.0 + j[None, :], 0.0)


def lifetime_footprints(workload: StabilityWorkload) -> NDArray[np.float64]:
    """``C_k = l1,k (l0,k + (l1,k + 1) / 2)``: token-iterations one request holds (§4.1).

    Returns:
        (K,) float64.
    """
    l0 = np.asarray(workload.input_lens, dtype=np.float64)
    l1 = np.asarray(workload.decode_lens, dtype=np.float64)
    return l1 * (l0 + (l1 + 1.0) / 2.0)


def eviction_free_rate(workload: StabilityWorkload) -> float:
    """Eviction-free admission (and completion) rate ``x* = M / sum_k p_k C_k``.

    Eq. (8) of seed 002; for one class it is eq. (4), ``2M / (l1 (2 l0 + l1 + 1))``.
    """
    mean_footprint = float(np.dot(workload.mix, lifetime_footprints(workload)))
    return workload.memory / mean_footprint


def worst_cycle_throughput(workload: StabilityWorkload) -> float:
    """Throughput of the maximal-eviction cycle, ``M / (l1 (l0 + l1))`` (Lemma 1).

    For several classes this is ``M / sum_k p_k l1,k (l0,k + l1,k)``: every request holds
    its peak footprint for its whole life. For ``K = 1`` it is Lemma 1's lower bound on the
    throughput of any limit cycle; for ``K > 1`` it is the throughput of a server that
    reserves each request's peak memory at admission, which the synchronised cycles of a
    multi-class system do not go below in our simulations.
    """
    l0 = np.asarray(workload.input_lens, dtype=np.float64)
    l1 = np.asarray(workload.decode_lens, dtype=np.float64)
    return workload.memory / float(np.dot(workload.mix, l1 * (l0 + l1)))


def worst_cycle_ratio(workload: StabilityWorkload) -> float:
    """Worst-cycle throughput over ``x*``; ``(2 l0 + l1 + 1) / (2 (l0 + l1))`` for one class."""
    return worst_cycle_throughput(workload) / eviction_free_rate(workload)


def transition_matrix(input_len: int, decode_len: int) -> NDArray[np.float64]:
    """The eviction-free linear map ``X^{n+1} = B X^n`` of one class (eq. 3).

    The first row is the memory balance (2): ``alpha = -1/(l0+1)`` on stages ``0..l1-2`` and
    ``beta = (l0+l1)/(l0+1)`` on the final stage; the other rows shift stages.

    Returns:
        (l1, l1) float64.
    """
    for name, value in (("input_len", input_len), ("decode_len", decode_len)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"'{name}' must be an int: {value!r}")
        if value <= 0:
            raise ValueError(f"'{name}' must be positive: {value!r}")
    b = np.zeros((decode_len, decode_len))
    b[0, :] = -1.0 / (input_len + 1)
    b[0, -1] = (input_len + decode_len) / (input_len + 1)
    b[np.arange(1, decode_len), np.arange(decode_len - 1)] = 1.0
    return b


def fixed_point(workload: StabilityWorkload) -> NDArray[np.float64]:
    """The eviction-free fixed point: ``p_k x*`` requests in every live stage of class ``k``.

    Returns:
        (K, L) float64 state whose memory is exactly ``M``.
    """
    alive = stage_weights(workload) > 0
    mass = eviction_free_rate(workload) * np.asarray(workload.mix)[:, None]
    return np.where(alive, mass, 0.0)


def _as_state(state: NDArray[np.float64]) -> NDArray[np.float64]:
    arr = np.asarray(state, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.size == 0:
        raise ValueError(f"'state' must be a non-empty (L,) or (K, L) array: shape {arr.shape}")
    return arr


def spread(state: NDArray[np.float64]) -> float:
    """``G = max_j x_j - min_j x_j`` of eq. (5), on the stage totals.

    Args:
        state: (L,) or (K, L) float64 mass by stage (classes are summed).
    """
    totals = _as_state(state).sum(axis=0)
    return float(totals.max() - totals.min())


def eviction_level(state: NDArray[np.float64], *, atol: float = 1e-9) -> int:
    """Number of empty stages (§3.2): 0 is eviction-free, ``l1 - 1`` the maximal level.

    Args:
        state: (L,) or (K, L) float64 mass by stage (classes are summed).
        atol: mass at or below which a stage counts as empty.
    """
    totals = _as_state(state).sum(axis=0)
    return int(np.count_nonzero(totals <= atol))


def linearised_admissions(
    workload: StabilityWorkload, history: NDArray[np.float64], steps: int
) -> NDArray[np.float64]:
    """Aggregate admissions of the eviction-free recurrence (9), memory held at ``M``.

    ``sum_m c_m x0^{n-m} = M`` with ``c_m = sum_{k: l1,k > m} p_k (l0,k + 1 + m)``, solved for
    the newest admission each iteration (no eviction, no clipping at zero: the linear map
    whose roots :func:`~kvpolicy.admit.characteristic_polynomial` gives).

    Args:
        workload: classes, mix and memory.
        history: (L,) float64 last ``L`` aggregate admissions, oldest first.
        steps: iterations to run.

    Returns:
        (steps,) float64 admissions ``x0^1 .. x0^steps``.
    """
    length = workload.max_decode_len
    hist = np.asarray(history, dtype=np.float64)
    if hist.shape != (length,):
        raise ValueError(f"'history' must have shape ({length},): {hist.shape}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"'steps' must be a positive int: {steps!r}")
    lags = np.arange(length, dtype=np.float64)
    alive = (lags[None, :] < np.asarray(workload.decode_lens)[:, None]).astype(np.float64)
    l0 = np.asarray(workload.input_lens, dtype=np.float64)[:, None]
    c = np.asarray(workload.mix) @ (alive * (l0 + 1.0 + lags[None, :]))
    window = list(hist[::-1])  # newest first: window[m] = x0^{n-m}
    out = np.empty(steps)
    for n in range(steps):
        older = np.asarray(window[: length - 1])
        newest = (workload.memory - float(np.dot(c[1:], older))) / c[0]
        window.insert(0, newest)
        window.pop()
        out[n] = newest
    return out
