"""Bootstrap confidence intervals of perplexity over token positions.

Next-token losses of neighbouring positions are correlated (a hard passage is hard for
several tokens), so positions are resampled in contiguous blocks (a moving-block
bootstrap) rather than one by one, which would make the intervals too narrow. Two policies
decoded on the same text are compared *paired*: the same resampled positions enter both
perplexities, so the interval of their ratio is much tighter than either interval alone
and a 1% difference can be told from noise.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of
from numpy.typing import NDArray

__all__ = ["Interval", "bootstrap_perplexity", "bootstrap_ratio"]


@frozen
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    value: float = field(converter=float)
    """The estimate on the positions as they are."""
    low: float = field(converter=float)
    """Lower end of the interval."""
    high: float = field(converter=float)
    """Upper end of the interval."""
    level: float = field(default=0.95, converter=float)
    """Coverage of the interval."""
    block: int = field(default=32, validator=[instance_of(int), ge(1)])
    """Block length of the resampling, in positions."""


def _losses(nll: object, name: str) -> NDArray[np.float64]:
    arr = np.asarray(nll, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"'{name}' must be a 1-D array of at least 2 losses: shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"'{name}' must be finite")
    return arr


def _block_means(
    values: NDArray[np.float64], reps: int, block: int, seed: int
) -> NDArray[np.float64]:
    """Means of ``reps`` moving-block resamples of ``values`` (same length, blocks wrap)."""
    if not isinstance(reps, int) or reps < 10:
        raise ValueError(f"'reps' must be an int >= 10: {reps!r}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"'block' must be an int >= 1: {block!r}")
    n = values.size
    block = max(1, min(block, n // 8))  # at least 8 blocks, else the resamples barely vary
    blocks = -(-n // block)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n, size=(reps, blocks))
    index = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(reps, -1)[:, :n] % n
    return np.asarray(values[index].mean(axis=1), dtype=np.float64)


def _interval(point: float, samples: NDArray[np.float64], level: float, block: int) -> Interval:
    if not (0 < level < 1):
        raise ValueError(f"'level' must be in (0, 1): {level!r}")
    lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return Interval(point, math.exp(lo), math.exp(hi), level, block)


def bootstrap_perplexity(
    nll: object, *, reps: int = 2000, block: int = 32, level: float = 0.95, seed: int = 0
) -> Interval:
    """Perplexity ``exp(mean nll)`` with a moving-block bootstrap interval over positions.

    Args:
        nll: (n,) next-token losses, n >= 2.
        reps: bootstrap resamples (>= 10).
        block: block length in positions (>= 1; 1 is the plain bootstrap).
        level: coverage in (0, 1).
        seed: seed of the resampling.
    """
    x = _losses(nll, "nll")
    samples = _block_means(x, reps, block, seed)
    return _interval(math.exp(float(x.mean())), samples, level, block)


def bootstrap_ratio(
    nll: object,
    reference: object,
    *,
    reps: int = 2000,
    block: int = 32,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Ratio of perplexities ``ppl(nll) / ppl(reference)`` with a paired bootstrap interval.

    Both arrays hold the losses of the same positions (two decodings of one text); each
    resample takes the same positions from both, so the interval reflects how consistently
    one is better, not how hard the text is.

    Raises:
        ValueError: the arrays differ in length, or are not finite 1-D arrays of >= 2 losses.
    """
    x = _losses(nll, "nll")
    y = _losses(reference, "reference")
    if x.size != y.size:
        raise ValueError(f"'nll' has {x.size} positions, 'reference' has {y.size}")
    diff = x - y
    samples = _block_means(diff, reps, block, seed)
    return _interval(math.exp(float(diff.mean())), samples, level, block)
