"""Attention statistics of a causal attention matrix: sink mass, decay with distance,
heavy-hitter concentration and persistence.

The one home of these definitions: :func:`attention_statistics` takes any (T, T) matrix
(numpy only, no torch), so the same numbers describe attention recorded from a real model
(kvpolicy-evict-quality's ``model_attention_statistics``, ``kvpolicy evict stats``) and the
simulator's synthetic attention model (``kvpolicy sim fit-attention`` and its fitter). The
values measured on SmolLM2-135M-Instruct are written down in kvpolicy-evict-quality's
``kvpolicy/evict/quality/ATTENTION.md``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "attention_statistics",
    "heavy_hitter_statistics",
    "validate_attention",
]

_DISTANCES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SINKS = 4
_RECENT = 16
_TOPS = (1, 5, 10)


def validate_attention(attention: object, name: str = "attention") -> NDArray[np.float64]:
    """``attention`` as a (T, T) float64 causal row-stochastic matrix, or ValueError.

    Args:
        attention: (T, T) array: row ``q`` is query ``q``'s attention over keys ``0..q``.
        name: the argument's name in error messages.

    Raises:
        ValueError: not square, not finite and non-negative, mass above the diagonal
            (> 1e-6), or a row that does not sum to 1 (within 1e-4).
    """
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"'{name}' must be a square (T, T) matrix: got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"'{name}' must be finite and non-negative")
    if np.any(np.triu(a, 1) > 1e-6):
        raise ValueError(f"'{name}' must be causal (zero above the diagonal)")
    worst = float(np.abs(a.sum(axis=1) - 1.0).max()) if a.size else 0.0
    if worst > 1e-4:
        raise ValueError(f"'{name}' rows must sum to 1: off by up to {worst:.3g}")
    return a


def attention_statistics(
    attention: NDArray[np.float64], warmup: int = 64, *, validate: bool = True
) -> dict[str, float]:
    """Sink mass, decay with distance and heavy-hitter concentration of a causal matrix.

    Args:
        attention: (T, T) float64 causal row-stochastic matrix (a model's attention averaged
            over layers and heads, or a synthetic one), T > ``warmup`` + 8.
        warmup: queries before this row are left out of the per-query statistics (their
            few keys would inflate every share).
        validate: check ``attention`` with :func:`validate_attention` (a caller that built
            the matrix itself, e.g. a fitter drawing thousands, may skip it).

    Returns:
        A flat dict of floats:

        - ``tokens``: T;
        - ``sink_mass_first_token``, ``sink_mass_first_4``: mean share of a query's
          attention on key 0 and on keys 0-3;
        - ``recent_mass_last_16``: mean share on the 16 most recent keys (self included);
        - ``attention_at_distance_<d>``: mean weight on the key ``d`` positions back
          (sink keys excluded), for d in 1, 2, ..., 256 (those with a query);
        - ``decay_exponent``: α of the least-squares fit ``weight ∝ d^-α`` over those d
          (with at least two positive weights);
        - ``per_query_top_<p>pct_mass``: mean share of a query's attention held by its
          ``ceil((q + 1) p / 100)`` largest keys (p = 1, 5, 10);
        - ``accumulated_top_<p>pct_mass``: share of the column sums (H2O's accumulated
          attention) held by the ``ceil(T p / 100)`` largest;
        - ``persistence``: the correlation of ``log a[t, k]`` and ``log a[t + T/8, k]`` over
          the keys ``4 <= k < t - 64`` both queries see from afar, averaged over 16 rows
          ``t`` of the second half: how far the keys a query favours are the keys a much
          later query favours (1.0 when no row qualifies).

    Raises:
        TypeError, ValueError: ``warmup`` is not an int >= 0, ``attention`` is not a causal
            row-stochastic matrix, or T <= ``warmup`` + 8.
    """
    a, queries = _checked(attention, warmup, validate)
    n = a.shape[0]
    out: dict[str, float] = {
        "tokens": float(n),
        "sink_mass_first_token": float(a[queries, 0].mean()),
        "sink_mass_first_4": float(a[queries, :_SINKS].sum(axis=1).mean()),
    }
    cum = np.cumsum(a, axis=1)
    lo = queries - _RECENT
    before = np.where(lo >= 0, cum[queries, np.maximum(lo, 0)], 0.0)
    out["recent_mass_last_16"] = float((cum[queries, queries] - before).mean())
    used: list[tuple[int, float]] = []
    for d in _DISTANCES:
        qs = np.arange(max(warmup, d + _SINKS), n)
        if len(qs):
            w = float(a[qs, qs - d].mean())
            out[f"attention_at_distance_{d}"] = w
            if w > 0:
                used.append((d, w))
    if len(used) >= 2:
        slope = np.polyfit(np.log([d for d, _ in used]), np.log([w for _, w in used]), 1)[0]
        out["decay_exponent"] = float(-slope)
    out.update(_heavy_hitters(a, queries))
    return out


def heavy_hitter_statistics(
    attention: NDArray[np.float64], warmup: int = 64, *, validate: bool = True
) -> dict[str, float]:
    """The heavy-hitter part of :func:`attention_statistics`, alone (a fitter's objective).

    Returns:
        ``per_query_top_<p>pct_mass`` and ``accumulated_top_<p>pct_mass`` for p = 1, 5, 10,
        then ``persistence``, defined as in :func:`attention_statistics`.

    Raises:
        TypeError, ValueError: as :func:`attention_statistics`.
    """
    return _heavy_hitters(*_checked(attention, warmup, validate))


def _checked(
    attention: object, warmup: object, validate: bool
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """(the matrix, its query rows from ``warmup`` on), or TypeError / ValueError."""
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"'warmup' must be an int: {warmup!r}")
    if warmup < 0:
        raise ValueError(f"'warmup' must be >= 0: {warmup!r}")
    a = validate_attention(attention) if validate else np.asarray(attention, dtype=np.float64)
    n = a.shape[0]
    if n <= warmup + 8:
        raise ValueError(f"'attention' must be longer than warmup + 8 = {warmup + 8}: {n}")
    return a, np.arange(warmup, n)


def _heavy_hitters(a: NDArray[np.float64], queries: NDArray[np.int64]) -> dict[str, float]:
    n = a.shape[0]
    ranked = np.cumsum(-np.sort(-a[queries], axis=1), axis=1)
    col = np.cumsum(-np.sort(-a.sum(axis=0)))
    out = {}
    for p in _TOPS:
        k = np.maximum(1, np.ceil((queries + 1) * p / 100).astype(np.int64))
        out[f"per_query_top_{p}pct_mass"] = float(ranked[np.arange(len(queries)), k - 1].mean())
    for p in _TOPS:
        top = float(col[max(1, math.ceil(n * p / 100)) - 1] / col[-1])
        out[f"accumulated_top_{p}pct_mass"] = top
    lag = max(1, n // 8)
    corr = []
    for t in np.linspace(n // 2, n - 1 - lag, 16).astype(np.int64):
        keys = np.arange(_SINKS, t - 64)
        if len(keys) < 8:
            continue
        x = np.log(np.maximum(a[t, keys], 1e-300))
        y = np.log(np.maximum(a[t + lag, keys], 1e-300))
        if x.std() > 0 and y.std() > 0:
            corr.append(float(np.corrcoef(x, y)[0, 1]))
    out["persistence"] = float(np.mean(corr)) if corr else 1.0
    return out
