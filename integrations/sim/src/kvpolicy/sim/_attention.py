"""A synthetic attention-return model, for token eviction without a model in the loop.

Decoder attention concentrates on three kinds of keys (StreamingLLM's attention sinks, the
recency window, H2O's heavy hitters). The model gives key position ``p`` a weight when the
query is the ``length``-th token (keys ``0 .. length - 1``, the newest at distance
``d = length - 1 - p = 0``)::

    w(p) = s · [p < n_sink]  +  r · max(d, 1)^(-alpha)  +  h · length^(-gamma) · z_p · e_p

and the attention it receives is ``a(p) = w(p) / Z`` with ``Z = sum_q w(q)``, the sum over
*every* earlier position, resident or evicted. The mass on evicted keys is the attention a
policy lost; ``sum_{p resident} a(p)`` is its *attention recall*.

- Recency is a power law: attention recorded from SmolLM2-135M falls as ``d^-1`` above its
  floor from distance 1 to 256 (an exponential cannot follow both ends). The newest key is
  the query's own (``d = 0``); the recording weights it like ``d = 1`` (0.057 and 0.066),
  hence ``max(d, 1)``.
- The heavy-hitter weight per key, ``h · length^-gamma``, falls as the context grows: the
  recorded sink share stays near 0.27 from 300 to 2048 keys, where a constant weight would
  let the body's growing total push it down to 0.21.
- ``z_p`` is a per-token heavy-hitter score drawn once, log-normal with unit mean and log
  standard deviation ``sigma``: H2O reports that some tokens draw attention throughout a
  generation.
- ``e_p`` is per-query noise, log-normal with unit mean and log standard deviation
  ``query_sigma``, drawn afresh for every query: the recording's heavy hitters change from
  query to query, so the attention a token has accumulated predicts its next attention only
  partly. :meth:`AttentionModel.weights` and :meth:`AttentionModel.normaliser` give the
  expectation over ``e``; :meth:`AttentionModel.query_weights` draws it.

Default parameters are fitted by :func:`~kvpolicy.sim.fit_attention` (in ``_attention_fit``)
to attention recorded from SmolLM2-135M-Instruct (three 1024-token texts, averaged over layers
and heads); the data, the goodness of fit and the eviction check are in ``ATTENTION_FIT.md``
next to this package's ``pyproject.toml``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from attrs import asdict, field, fields, frozen
from attrs.validators import ge, instance_of, le
from numpy.typing import NDArray

__all__ = ["AttentionModel"]

# Terms of sum k^-alpha summed exactly before the Euler-Maclaurin tail: the first neglected
# correction, B_6 f^(5)(K) / 6!, is below 1e-12 of the sum at K = 32.
_EXACT_TERMS = 32


@functools.lru_cache(maxsize=64)
def _head_sums(alpha: float) -> NDArray[np.float64]:
    """(K + 1,) float64 partial sums ``sum_{k=1}^{n} k^-alpha`` for n = 0 .. K."""
    k = np.arange(1, _EXACT_TERMS + 1, dtype=np.float64)
    out: NDArray[np.float64] = np.concatenate(([0.0], np.cumsum(k**-alpha)))
    return out


def _power_sum(n: int, alpha: float) -> float:
    """``sum_{k=1}^{n} k^-alpha`` (the generalised harmonic number ``H_{n,alpha}``) in O(1)."""
    if n <= _EXACT_TERMS:
        return float(_head_sums(alpha)[max(n, 0)])
    k = float(_EXACT_TERMS)
    x = float(n)
    a = alpha
    # Euler-Maclaurin: sum_{j=K+1}^{n} f(j) = int_K^n f + (f(n) - f(K)) / 2
    #   + (f'(n) - f'(K)) / 12 - (f'''(n) - f'''(K)) / 720 + ...
    if a == 1.0:
        integral = math.log(x / k)
    else:
        # (n^(1-a) - K^(1-a)) / (1 - a), stable as a -> 1.
        b = 1.0 - a
        integral = (math.expm1(b * math.log(x)) - math.expm1(b * math.log(k))) / b
    f: float = x**-a - k**-a
    f1: float = -a * (x ** (-a - 1) - k ** (-a - 1))
    f3: float = -a * (a + 1) * (a + 2) * (x ** (-a - 3) - k ** (-a - 3))
    return float(_head_sums(a)[-1]) + integral + f / 2 + f1 / 12 - f3 / 720


def _recency(dist: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    out: NDArray[np.float64] = np.maximum(dist, 1.0) ** -alpha
    return out


@frozen
class AttentionModel:
    """Parameters of the synthetic attention-return model (see the module docstring).

    The defaults are the fit to SmolLM2-135M-Instruct (``ATTENTION_FIT.md``); only ratios of
    the weights matter (``h = 1`` in the fit).
    """

    sink_tokens: int = field(default=1, validator=[instance_of(int), ge(0)])
    """``n_sink``: leading positions that act as attention sinks."""
    sink_weight: float = field(default=24.87, converter=float, validator=ge(0.0))
    """``s``: weight of each sink token."""
    recency_weight: float = field(default=6.17, converter=float, validator=ge(0.0))
    """``r``: weight of the newest key (and of the key one position back)."""
    recency_alpha: float = field(default=0.993, converter=float, validator=[ge(0.0), le(4.0)])
    """``alpha``: exponent of the power-law recency decay ``max(d, 1)^-alpha``."""
    heavy_weight: float = field(default=1.0, converter=float, validator=ge(0.0))
    """``h``: weight of a token of average heavy-hitter score at a query over one key."""
    heavy_decay: float = field(default=0.59, converter=float, validator=[ge(0.0), le(2.0)])
    """``gamma``: the heavy-hitter weight of a query over ``length`` keys is
    ``h · length^-gamma``. With ``gamma = 0`` the body's total weight grows with the context
    and the sink's share falls as ``1 / length``; the recording's sink share stays near 0.27
    from 300 to 2048 keys, which a positive ``gamma`` reproduces."""
    heavy_sigma: float = field(default=2.65, converter=float, validator=[ge(0.0), le(5.0)])
    """``sigma``: log standard deviation of the persistent heavy-hitter score ``z``."""
    query_sigma: float = field(default=1.65, converter=float, validator=[ge(0.0), le(5.0)])
    """``query_sigma``: log standard deviation of the per-query noise ``e`` on ``h · z``."""

    def __attrs_post_init__(self) -> None:
        if self.sink_weight * self.sink_tokens + self.recency_weight + self.heavy_weight <= 0:
            raise ValueError(
                "'sink_weight', 'recency_weight' and 'heavy_weight' must not all be zero: "
                f"{self.sink_weight}, {self.recency_weight}, {self.heavy_weight}"
            )

    # ------------------------------------------------------------------ the model
    def token_scores(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """Draw ``z`` for ``n`` tokens.

        Returns:
            (n,) float64 positive scores of mean 1 (log-normal, ``mu = -sigma^2 / 2``).
        """
        out: NDArray[np.float64] = rng.lognormal(-0.5 * self.heavy_sigma**2, self.heavy_sigma, n)
        return out

    def body_weight(self, length: int) -> float:
        """``h · length^-gamma``: the weight of a key of score ``z = 1`` for this query."""
        return float(self.heavy_weight * max(length, 1) ** -self.heavy_decay)

    def weights(
        self, positions: NDArray[np.int64], length: int, z: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Expected weights ``E_e[w(p)]`` of ``positions`` for a query over ``length`` keys.

        Args:
            positions: (n,) int64 key positions, each ``< length``.
            length: keys the query attends to (the newest is ``length - 1``).
            z: (>= max(positions) + 1,) float64 heavy-hitter scores of the stream.

        Returns:
            (n,) float64 weights.
        """
        dist = (length - 1 - positions).astype(np.float64)
        w = (
            self.recency_weight * _recency(dist, self.recency_alpha)
            + self.body_weight(length) * z[positions]
        )
        if self.sink_tokens:
            w = w + self.sink_weight * (positions < self.sink_tokens)
        return w

    def query_weights(
        self,
        positions: NDArray[np.int64],
        length: int,
        z: NDArray[np.float64],
        rng: np.random.Generator,
        queries: int = 1,
    ) -> NDArray[np.float64]:
        """Weights summed over ``queries`` queries over ``length`` keys, per-query noise drawn.

        With ``queries = 1`` this is one draw of ``w(p)``. For more, the sum of ``queries``
        unit-mean log-normal noises is itself drawn as a log-normal of the same mean and
        variance (Fenton-Wilkinson), so the cost stays O(n) whatever ``queries`` is.

        Args:
            positions: (n,) int64 key positions, each ``< length``.
            length: keys each query attends to.
            z: (>= max(positions) + 1,) float64 heavy-hitter scores of the stream.
            rng: source of the noise.
            queries: queries summed, >= 1.

        Returns:
            (n,) float64 weights; their expectation is ``queries * weights(...)``.
        """
        if isinstance(queries, bool) or not isinstance(queries, int) or queries < 1:
            raise ValueError(f"'queries' must be an int >= 1: {queries!r}")
        body = self.body_weight(length) * z[positions]
        base = self.weights(positions, length, z) - body
        if self.query_sigma == 0.0:
            noise = np.ones(len(positions))
        else:
            var = math.log1p(math.expm1(self.query_sigma**2) / queries)
            noise = rng.lognormal(-0.5 * var, math.sqrt(var), len(positions))
        out: NDArray[np.float64] = queries * (base + body * noise)
        return out

    def normaliser(self, length: int, z_prefix_sum: float) -> float:
        """Expected ``Z`` over every position ``< length``, given ``sum(z[:length])``.

        Closed form: the recency sum is ``1 + H_{length-1, alpha}`` (Euler-Maclaurin, O(1)).
        """
        if length <= 0:
            return 0.0
        recency = 1.0 + _power_sum(length - 1, self.recency_alpha)
        sinks = min(self.sink_tokens, length)
        return (
            self.sink_weight * sinks
            + self.recency_weight * recency
            + self.body_weight(length) * z_prefix_sum
        )

    def matrix(
        self, z: NDArray[np.float64], rng: np.random.Generator | None = None
    ) -> NDArray[np.float64]:
        """The full ``(T, T)`` attention matrix of a stream with scores ``z`` (T = len(z)).

        Row ``t`` is the attention of the query at ``t`` over keys ``0..t`` (the query
        attends to itself as the newest key), so every row sums to 1.

        Args:
            z: (T,) float64 heavy-hitter scores.
            rng: draws the per-query noise ``e``; None gives the expected weights.

        Returns:
            (T, T) float64 lower-triangular row-stochastic matrix.
        """
        n = len(z)
        out = np.zeros((n, n), dtype=np.float64)
        pos = np.arange(n, dtype=np.int64)
        for t in range(n):
            if rng is None:
                w = self.weights(pos[: t + 1], t + 1, z)
            else:
                w = self.query_weights(pos[: t + 1], t + 1, z, rng)
            out[t, : t + 1] = w / w.sum()
        return out

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, float | int]:
        """The parameters as a flat dict (field name -> value)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionModel:
        """Build from :meth:`to_dict`'s output; missing fields take their defaults.

        Raises:
            TypeError: ``data`` is not a mapping, or a value has the wrong type.
            ValueError: an unknown key, or a value out of range.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"'data' must be a mapping: {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"'data' has unknown attention-model fields {unknown}; known: {sorted(known)}"
            )
        return cls(**dict(data))

    def to_json(self) -> str:
        """The parameters as a JSON object (what ``kvpolicy sim fit-attention --out`` writes)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AttentionModel:
        """Parse :meth:`to_json`'s output.

        Raises:
            ValueError: not JSON, not an object, or as :meth:`from_dict`.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'text' is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"'text' must hold a JSON object: {type(data).__name__}")
        return cls.from_dict(data)
