"""Naive max-length reservation against paged allocation (seed 001 §4).

A naive server reserves ``max_len`` slots per request up front; a paged one holds
``ceil(len / block_size)`` blocks, wasting at most one partial block per request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from attrs import frozen
from numpy.typing import NDArray

__all__ = [
    "UtilisationPoint",
    "naive_utilisation",
    "paged_utilisation",
    "seed001_lengths",
    "utilisation_sweep",
]


def _lengths(lengths: Sequence[int] | NDArray[np.int64]) -> NDArray[np.int64]:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"'lengths' must be a non-empty 1-D sequence: shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"'lengths' must hold integers: dtype {arr.dtype}")
    if (arr <= 0).any():
        raise ValueError(f"'lengths' must be > 0: found {int(arr.min())}")
    return arr.astype(np.int64)


def naive_utilisation(lengths: Sequence[int] | NDArray[np.int64], max_len: int) -> float:
    """Used over reserved slots when every request reserves ``max_len`` slots.

    Args:
        lengths: (n,) int tokens each request actually holds (each <= ``max_len``).
        max_len: slots reserved per request.
    """
    arr = _lengths(lengths)
    if max_len <= 0:
        raise ValueError(f"'max_len' must be > 0: {max_len}")
    if int(arr.max()) > max_len:
        raise ValueError(f"'lengths' must be <= max_len={max_len}: found {int(arr.max())}")
    return float(arr.sum() / (max_len * arr.size))


def paged_utilisation(lengths: Sequence[int] | NDArray[np.int64], block_size: int = 16) -> float:
    """Used over allocated slots when each request holds ``ceil(len / block_size)`` blocks.

    Args:
        lengths: (n,) int tokens each request holds.
        block_size: tokens per block.
    """
    arr = _lengths(lengths)
    if block_size <= 0:
        raise ValueError(f"'block_size' must be > 0: {block_size}")
    blocks = -(-arr // block_size)
    return float(arr.sum() / (blocks.sum() * block_size))


def seed001_lengths(n: int, rng: np.random.Generator, max_len: int = 2048) -> NDArray[np.int64]:
    """Seed 001's length sample: normal(500, 200) rounded, clipped to [200, ``max_len``]."""
    if n <= 0:
        raise ValueError(f"'n' must be > 0: {n}")
    return np.clip(np.rint(rng.normal(500.0, 200.0, size=n)), 200, max_len).astype(np.int64)


@frozen
class UtilisationPoint:
    """Naive and paged utilisation for one batch size."""

    batch_size: int
    """Concurrent requests."""
    naive: float
    """Utilisation under max-length reservation."""
    paged: float
    """Utilisation under paged allocation."""


def utilisation_sweep(
    batch_sizes: Sequence[int] = (10, 25, 50, 100, 200),
    *,
    max_len: int = 2048,
    block_size: int = 16,
    seed: int = 42,
) -> list[UtilisationPoint]:
    """Seed 001's sweep: naive against paged utilisation across batch sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for n in batch_sizes:
        lengths = seed001_lengths(n, rng, max_len)
        out.append(
            UtilisationPoint(
                batch_size=n,
                naive=naive_utilisation(lengths, max_len),
                paged=paged_utilisation(lengths, block_size),
            )
        )
    return out
