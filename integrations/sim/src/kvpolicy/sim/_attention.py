"""A synthetic attention-return model, for token eviction without a model in the loop.

Decoder attention concentrates on three kinds of keys (StreamingLLM's attention sinks, the
recency window, H2O's heavy hitters). The model gives key position ``p`` a weight when the
query is at position ``t`` (``p < t``)::

    w_t(p) = s · [p < n_sink]  +  r · exp(-(t - 1 - p) / tau)  +  h · z_p

and the attention it receives is ``a_t(p) = w_t(p) / Z_t`` with ``Z_t = sum_{q < t} w_t(q)``,
the sum over *every* earlier position, resident or evicted. The mass on evicted keys is the
attention a policy lost; ``sum_{p resident} a_t(p)`` is its *attention recall*.

``z_p`` is a per-token heavy-hitter score drawn once, log-normal with unit mean and log
standard deviation ``sigma``: H2O reports that a few tokens draw most of the attention
throughout a generation, which a persistent heavy-tailed score reproduces.

Default parameters are calibrated to the attention statistics recorded from SmolLM2-135M
(kvpolicy-evict's ``quality/ATTENTION.md``: 512 tokens, averaged over every layer and head):
one sink token drawing 30% of a query's attention and the 16 newest keys 31%, which the
defaults reproduce at the recording's mean context of 288 tokens (0.302 and 0.308). The
recorded recency decays as a power law (``d^-0.81``) and an exponential cannot follow both
ends: the model gives distance 1 a weight of 0.031 (recorded 0.072), distance 16 0.0089
(0.0057) and distance 128 0.0011 (0.0012). ``z`` is persistent per token while the recording
shows per-query heavy hitters that change from query to query, so accumulated scores (H2O)
predict a token's future attention better here than on the real model. :func:`fit_attention`
fits the parameters to a recorded ``(T, T)`` matrix, for a user's own model.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of
from numpy.typing import NDArray

__all__ = ["AttentionModel", "fit_attention"]


@frozen
class AttentionModel:
    """Parameters of the synthetic attention-return model (see the module docstring)."""

    sink_tokens: int = field(default=1, validator=[instance_of(int), ge(0)])
    """``n_sink``: leading positions that act as attention sinks."""
    sink_weight: float = field(default=300.0, converter=float, validator=ge(0.0))
    """``s``: weight of each sink token."""
    recency_weight: float = field(default=32.5, converter=float, validator=ge(0.0))
    """``r``: weight of the most recent token."""
    recency_tau: float = field(default=11.2, converter=float, validator=gt(0.0))
    """``tau``: decay length of the recency term, in tokens."""
    heavy_weight: float = field(default=1.1, converter=float, validator=gt(0.0))
    """``h``: weight of a token of average heavy-hitter score."""
    heavy_sigma: float = field(default=1.0, converter=float, validator=ge(0.0))
    """``sigma``: log standard deviation of the heavy-hitter score ``z``. The recording's
    accumulated top 10% of keys hold 56% of the mass, most of it the sink's, so the body's
    scores are only moderately dispersed; 1.0 is a judgement, not a fit."""

    def token_scores(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """Draw ``z`` for ``n`` tokens.

        Returns:
            (n,) float64 positive scores of mean 1 (log-normal, ``mu = -sigma^2 / 2``).
        """
        out: NDArray[np.float64] = rng.lognormal(-0.5 * self.heavy_sigma**2, self.heavy_sigma, n)
        return out

    def weights(
        self, positions: NDArray[np.int64], length: int, z: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Unnormalised weights ``w_t(p)`` of ``positions`` for a query at ``t = length``.

        Args:
            positions: (n,) int64 key positions, each ``< length``.
            length: tokens before the query.
            z: (>= max(positions) + 1,) float64 heavy-hitter scores of the stream.

        Returns:
            (n,) float64 weights.
        """
        dist = (length - 1 - positions).astype(np.float64)
        w = (
            self.recency_weight * np.exp(-dist / self.recency_tau)
            + self.heavy_weight * z[positions]
        )
        if self.sink_tokens:
            w = w + self.sink_weight * (positions < self.sink_tokens)
        return w

    def normaliser(self, length: int, z_prefix_sum: float) -> float:
        """``Z_t`` over every position ``< length``, given ``sum(z[:length])``."""
        decay = math.exp(-1.0 / self.recency_tau)
        recency = (1.0 - decay**length) / (1.0 - decay)
        sinks = min(self.sink_tokens, length)
        return (
            self.sink_weight * sinks
            + self.recency_weight * recency
            + self.heavy_weight * z_prefix_sum
        )

    def matrix(self, z: NDArray[np.float64]) -> NDArray[np.float64]:
        """The full ``(T, T)`` attention matrix of a stream with scores ``z`` (T = len(z)).

        Row ``t`` is the attention of the query at ``t`` over keys ``0..t`` (the query
        attends to itself as the most recent key), so every row sums to 1.
        """
        n = len(z)
        out = np.zeros((n, n), dtype=np.float64)
        pos = np.arange(n, dtype=np.int64)
        for t in range(n):
            w = self.weights(pos[: t + 1], t + 1, z)
            out[t, : t + 1] = w / w.sum()
        return out


def fit_attention(
    attention: NDArray[np.float64], *, sink_tokens: int = 1, max_distance: int = 256
) -> AttentionModel:
    """Fit :class:`AttentionModel` to a recorded attention matrix.

    The fit reads the three terms off separately, each where it dominates:

    1. ``tau``: the mean attention at distance ``d`` above its floor (the median at distances
       ``max_distance/2 .. max_distance``) decays as ``exp(-d / tau)``; a log-linear least
       squares over the distances where it is above the floor gives the slope.
    2. ``z``: a key's attention far from the query (distance > ``4 tau``), scaled by the row
       length, averaged over rows and divided by its mean; ``sigma`` is the standard
       deviation of ``log z``.
    3. ``s``, ``r`` relative to ``h = 1``: the mean row shares of the sinks, the recency
       excess and the body give ``s / h`` and ``r / h`` through the normaliser.

    Args:
        attention: (T, T) float64 row-stochastic lower-triangular attention, averaged over
            heads and layers; ``T > 2 · max_distance``.
        sink_tokens: ``n_sink`` to assume.
        max_distance: largest query-key distance used to fit the recency decay.

    Raises:
        ValueError: ``attention`` is not square, too short, or not row-stochastic.
    """
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"'attention' must be a square (T, T) matrix: got shape {a.shape}")
    n = a.shape[0]
    if n <= 2 * max_distance or max_distance < 8:
        raise ValueError(
            f"'attention' must have T > 2 * max_distance = {2 * max_distance}: got T = {n}"
        )
    if not np.allclose(a.sum(axis=1), 1.0, atol=1e-6) or np.any(a < 0):
        raise ValueError("'attention' rows must be non-negative and sum to 1")
    rows = np.arange(max(2 * max_distance, n // 2), n)
    # 1. recency decay. Distance d of key p from query t is t - p (the query itself is d = 0).
    d = np.arange(0, max_distance)
    by_dist = np.array([a[rows, rows - k].mean() for k in d])
    floor = float(np.median(by_dist[max_distance // 2 :]))
    excess = by_dist - floor
    ok = excess > 0.02 * max(excess[0], 1e-30)
    ok &= np.cumprod(ok).astype(bool)  # the contiguous run from d = 0
    if ok.sum() >= 2:
        slope = np.polyfit(d[ok], np.log(excess[ok]), 1)[0]
        tau = float(-1.0 / slope) if slope < 0 else float(max_distance)
    else:
        tau = 1.0
    # 2. heavy-hitter scores from far keys, scaled by row length (Z grows with t).
    far = max(int(4 * tau), 1)
    cols = np.arange(sink_tokens, rows[0] - far)
    scaled = a[rows][:, cols] * (rows + 1)[:, None]
    z = scaled.mean(axis=0)
    z = z / z.mean()
    sigma = float(np.std(np.log(np.clip(z, 1e-12, None))))
    # 3. shares of each term, averaged over rows; h = 1.
    sink_share = float(a[rows, :sink_tokens].sum(axis=1).mean()) if sink_tokens else 0.0
    recency_share = float(np.clip(excess[ok], 0.0, None).sum()) if ok.any() else 0.0
    body_share = max(1.0 - sink_share - recency_share, 1e-9)
    t_mean = float((rows + 1).mean())
    body_tokens = t_mean - sink_tokens
    decay = math.exp(-1.0 / tau)
    recency_sum = 1.0 / (1.0 - decay)
    s = (sink_share / body_share) * body_tokens / sink_tokens if sink_tokens else 0.0
    r = (recency_share / body_share) * body_tokens / recency_sum
    return AttentionModel(
        sink_tokens=sink_tokens,
        sink_weight=s,
        recency_weight=r,
        recency_tau=tau,
        heavy_weight=1.0,
        heavy_sigma=sigma,
    )
