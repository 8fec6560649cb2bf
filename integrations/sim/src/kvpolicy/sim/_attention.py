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

Default parameters are fitted by :func:`fit_attention` to attention recorded from
SmolLM2-135M-Instruct (three 1024-token texts, averaged over layers and heads); the data, the
goodness of fit and the eviction check are in ``ATTENTION_FIT.md`` next to this package's
``pyproject.toml``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from attrs import asdict, field, fields, frozen
from attrs.validators import ge, instance_of, le
from numpy.typing import NDArray

from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["AttentionModel", "attention_recall", "attention_summary", "fit_attention"]

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


# ---------------------------------------------------------------------- checking input
def _check_matrix(attention: object, name: str = "attention") -> NDArray[np.float64]:
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


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{name}' must be an int: {value!r}")
    if value < low:
        raise ValueError(f"'{name}' must be >= {low}: {value!r}")
    return value


# ---------------------------------------------------------------------- the fit
def _power_cumsum(n: int, alpha: float) -> NDArray[np.float64]:
    """(n + 1,) float64 ``sum_{k=1}^{j} k^-alpha`` for j = 0 .. n."""
    k = np.arange(1, n + 1, dtype=np.float64)
    out: NDArray[np.float64] = np.concatenate(([0.0], np.cumsum(k**-alpha)))
    return out


class _Targets:
    """Row-averaged statistics of a matrix that the fit matches (see :func:`fit_attention`)."""

    def __init__(self, a: NDArray[np.float64], sinks: int, max_distance: int, warmup: int):
        """``a``: (K, T, T) float64 recorded matrices; their statistics are averaged."""
        n = a.shape[1]
        self.n = n
        self.sinks = sinks
        grid = np.geomspace(1, max_distance, 48).round().astype(np.int64)
        self.dist = np.unique(np.concatenate(([0], grid)))
        # First query row of each distance: after the warm-up, and key t - d past the sinks.
        self.first = np.maximum(warmup, self.dist + sinks)
        self.by_dist = np.array(
            [
                a[:, np.arange(f, n), np.arange(f, n) - d].mean()
                for d, f in zip(self.dist, self.first, strict=True)
            ]
        )
        self.groups = np.array_split(np.arange(warmup, n), 8) if sinks else []
        self.sink_share = np.array([a[:, g, :sinks].sum(axis=2).mean() for g in self.groups])

    def predict(
        self, s: float, r: float, alpha: float, gamma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Model means at ``dist`` and sink shares per group, with ``h = 1``, ``E z = 1``."""
        n = self.n
        t = np.arange(n)
        h_sum = _power_cumsum(n, alpha)
        body = (t + 1.0) ** -gamma  # per-key heavy-hitter weight of row t (length t + 1)
        z_row = s * np.minimum(self.sinks, t + 1) + r * (1.0 + h_sum[t]) + body * (t + 1)
        inv = 1.0 / z_row
        # Means over rows f .. n - 1 of 1 / Z_t and body_t / Z_t.
        tail = np.cumsum(inv[::-1])[::-1] / (n - t)
        tail_body = np.cumsum((body * inv)[::-1])[::-1] / (n - t)
        rec = _recency(self.dist.astype(np.float64), alpha)
        by_dist = r * rec * tail[self.first] + tail_body[self.first]
        shares = []
        for g in self.groups:
            d = (g[:, None] - np.arange(self.sinks)[None, :]).astype(np.float64)
            w = s + r * _recency(d, alpha) + body[g][:, None]
            shares.append(float((w.sum(axis=1) * inv[g]).mean()))
        return by_dist, np.array(shares)

    def residuals(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Log residuals, each family weighted to equal total weight."""
        s = math.exp(theta[0]) if self.sinks else 0.0
        by_dist, shares = self.predict(s, math.exp(theta[1]), float(theta[2]), float(theta[3]))
        res: NDArray[np.float64] = (
            np.log(by_dist) - np.log(np.maximum(self.by_dist, 1e-300))
        ) / math.sqrt(len(by_dist))
        if self.sinks:
            sink_res = (np.log(shares) - np.log(np.maximum(self.sink_share, 1e-300))) / math.sqrt(
                len(shares)
            )
            res = np.concatenate((res, sink_res))
        return res


def _levenberg_marquardt(
    fun: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    theta: NDArray[np.float64],
    lower: NDArray[np.float64],
    upper: NDArray[np.float64],
    iterations: int = 100,
) -> NDArray[np.float64]:
    """Minimise ``|fun(theta)|^2`` in the box [lower, upper] (numeric Jacobian).

    A parameter with ``lower == upper`` is held there. Each step moves only the parameters
    not held at a bound by their gradient (a projected step), so one pinned parameter does
    not stall the others.
    """
    x = np.clip(theta, lower, upper)
    res = fun(x)
    cost = float(res @ res)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.zeros((len(res), len(x)))
        for i in np.flatnonzero(upper > lower):
            step = 1e-6 * max(1.0, abs(x[i]))
            up = x.copy()
            up[i] += step
            jac[:, i] = (fun(up) - res) / step
        grad = jac.T @ res
        # Free: not fixed, and not at a bound that the descent direction -grad points past.
        free = (upper > lower) & ~((x <= lower) & (grad > 0)) & ~((x >= upper) & (grad < 0))
        if not free.any():
            break
        hess = jac[:, free].T @ jac[:, free]
        improved = False
        while damping < 1e10:
            delta = np.zeros_like(x)
            delta[free] = np.linalg.solve(
                hess + damping * np.diag(np.diag(hess) + 1e-12), -grad[free]
            )
            trial = np.clip(x + delta, lower, upper)
            trial_res = fun(trial)
            trial_cost = float(trial_res @ trial_res)
            if trial_cost < cost:
                improved = cost - trial_cost > 1e-15 * max(cost, 1e-300)
                x, res, cost = trial, trial_res, trial_cost
                damping = max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved:
            break
    return x


def _concentration(a: NDArray[np.float64], warmup: int) -> NDArray[np.float64]:
    """(7,) float64: per-query top 1/5/10% mass, accumulated top 1/5/10% mass, persistence.

    Per-query: the share of query ``q``'s attention (``q >= warmup``) on its
    ``ceil((q + 1) p / 100)`` largest keys, averaged over queries. Accumulated: the share of
    the column sums (H2O's scores) on the ``ceil(T p / 100)`` largest. Persistence: the
    correlation of ``log a[t, p]`` and ``log a[t + T/8, p]`` over the keys ``4 <= p < t - 64``
    both queries see from afar, averaged over 16 rows ``t`` of the second half: how far the
    keys a query favours are the keys a much later query favours.
    """
    n = a.shape[0]
    q = np.arange(warmup, n)
    ranked = np.cumsum(-np.sort(-a[q], axis=1), axis=1)
    col = np.cumsum(-np.sort(-a.sum(axis=0)))
    out = []
    for p in (1, 5, 10):
        k = np.maximum(1, np.ceil((q + 1) * p / 100).astype(np.int64))
        out.append(float(ranked[np.arange(len(q)), k - 1].mean()))
    for p in (1, 5, 10):
        out.append(float(col[max(1, math.ceil(n * p / 100)) - 1] / col[-1]))
    lag = max(1, n // 8)
    corr = []
    for t in np.linspace(n // 2, n - 1 - lag, 16).astype(np.int64):
        keys = np.arange(4, t - 64)
        if len(keys) < 8:
            continue
        x = np.log(np.maximum(a[t, keys], 1e-300))
        y = np.log(np.maximum(a[t + lag, keys], 1e-300))
        if x.std() > 0 and y.std() > 0:
            corr.append(float(np.corrcoef(x, y)[0, 1]))
    out.append(float(np.mean(corr)) if corr else 1.0)
    return np.array(out)


def _heavy_sigmas(
    a: NDArray[np.float64],
    s: float,
    r: float,
    alpha: float,
    gamma: float,
    sinks: int,
    warmup: int,
    seed: int,
) -> tuple[float, float]:
    """``(sigma, query_sigma)`` matching the heavy-hitter concentration of ``a``.

    The fitted sinks and recency fix everything but the dispersion of ``z · e``. Its two
    parts act differently: persistent ``z`` concentrates the accumulated (column-sum)
    attention and makes a later query favour the keys an earlier one favoured, per-query
    ``e`` disperses each query's attention alone. So the fit matches the seven statistics of
    :func:`_concentration` (per-query and accumulated top 1/5/10% mass, persistence over
    ``T/8`` queries) of ``a`` against those of matrices drawn from the model at the same
    ``T`` (least squares; the draws reuse one set of standard normals, so the objective is
    smooth in the two sigmas).
    """
    k, n = a.shape[0], a.shape[1]
    target = np.mean([_concentration(m, warmup) for m in a], axis=0)
    rng = np.random.default_rng(seed)
    gs = [rng.standard_normal(n) for _ in range(k)]
    big_gs = [rng.standard_normal((n, n)) for _ in range(k)]
    t = np.arange(n)
    dist = (t[:, None] - t[None, :]).astype(np.float64)
    causal = dist >= 0
    base = r * _recency(np.abs(dist), alpha) + s * (t[None, :] < sinks)
    body = ((t + 1.0) ** -gamma)[:, None]

    def residuals(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        sigma, q_sigma = float(theta[0]), float(theta[1])
        drawn = []
        for g, big_g in zip(gs, big_gs, strict=True):
            z = np.exp(sigma * g - 0.5 * sigma**2)
            noise = np.exp(q_sigma * big_g - 0.5 * q_sigma**2)
            w = np.where(causal, base + body * z[None, :] * noise, 0.0)
            drawn.append(_concentration(w / w.sum(axis=1, keepdims=True), warmup))
        out: NDArray[np.float64] = np.mean(drawn, axis=0) - target
        return out

    lower = np.zeros(2)
    upper = np.array([4.0, 4.0])
    best: tuple[float, NDArray[np.float64]] | None = None
    for sigma in np.linspace(0.0, 4.0, 5):
        for q_sigma in np.linspace(0.0, 4.0, 5):
            theta = np.array([sigma, q_sigma])
            res = residuals(theta)
            if best is None or float(res @ res) < best[0]:
                best = (float(res @ res), theta)
    assert best is not None
    theta = _levenberg_marquardt(residuals, best[1], lower, upper, iterations=30)
    return float(theta[0]), float(theta[1])


def fit_attention(
    attention: NDArray[np.float64],
    *,
    sink_tokens: int = 1,
    max_distance: int = 256,
    warmup: int = 64,
    seed: int = 0,
    heavy_decay: float | None = None,
) -> AttentionModel:
    """Fit :class:`AttentionModel` to a recorded attention matrix.

    1. ``s``, ``r``, ``alpha``, ``gamma`` (with ``h = 1``): least squares in log space over
       two families of row averages, each weighted to equal total weight: the mean attention
       at each of ~40 distances ``d = 0 .. max_distance`` (log-spaced, sink keys excluded)
       and the sink share in 8 groups of query rows (how it changes with the row fixes
       ``gamma``). The model's means use ``E z = 1`` and its exact normaliser per row;
       Levenberg-Marquardt from the best of a grid over ``alpha`` and ``gamma``.
    2. ``sigma``, ``query_sigma``: least squares of the per-query and the accumulated
       top 1/5/10% attention mass against a matrix drawn from the model (see
       :func:`_heavy_sigmas`): persistent scores concentrate the accumulated mass, per-query
       noise only each query's.

    Args:
        attention: (T, T) float64 causal row-stochastic attention, averaged over heads and
            layers (row t: query t over keys 0..t), or a (K, T, T) stack of K recordings
            fitted jointly (their statistics averaged); ``T > max_distance + warmup``.
        sink_tokens: ``n_sink`` to assume.
        max_distance: largest query-key distance of the recency fit.
        warmup: first query row used (earlier rows have few keys).
        seed: seed of the draws that step 2 compares against.
        heavy_decay: hold ``gamma`` at this value instead of fitting it (0 gives a
            heavy-hitter weight that does not depend on the context).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``attention`` is not square, causal, row-stochastic or long enough, or an
            argument is out of range.
    """
    sinks = _check_int(sink_tokens, "sink_tokens", 0)
    max_distance = _check_int(max_distance, "max_distance", 8)
    warmup = _check_int(warmup, "warmup", 1)
    seed = _check_int(seed, "seed", 0)
    if heavy_decay is not None:
        if isinstance(heavy_decay, bool) or not isinstance(heavy_decay, int | float):
            raise TypeError(f"'heavy_decay' must be a number or None: {heavy_decay!r}")
        if not 0.0 <= heavy_decay <= 2.0:
            raise ValueError(f"'heavy_decay' must be in [0, 2]: {heavy_decay!r}")
    if sinks >= warmup:
        raise ValueError(f"'sink_tokens' must be < warmup = {warmup}: {sinks}")
    raw = np.asarray(attention, dtype=np.float64)
    stack = raw[None] if raw.ndim == 2 else raw
    if stack.ndim != 3 or len(stack) == 0:
        raise ValueError(
            f"'attention' must be a (T, T) matrix or a (K, T, T) stack: got shape {raw.shape}"
        )
    a = np.stack([_check_matrix(m) for m in stack])
    n = a.shape[1]
    if n <= max_distance + warmup:
        raise ValueError(
            f"'attention' must have T > max_distance + warmup = {max_distance + warmup}: "
            f"got T = {n}"
        )
    targets = _Targets(a, sinks, max_distance, warmup)
    if np.any(targets.by_dist <= 0):
        raise ValueError("'attention' has zero mean attention at some distance: cannot fit")
    # Starting point per alpha: r from the near/far ratio, s from the sink share.
    far = float(targets.by_dist[-1])
    r0 = max(float(targets.by_dist[1]) / far - 1.0, 1e-3)
    s0 = max(float(targets.sink_share.mean()) / far, 1e-3) if sinks else 1.0
    gammas = (0.0, 0.5, 1.0) if heavy_decay is None else (float(heavy_decay),)
    lower = np.array([math.log(1e-6), math.log(1e-6), 0.0, min(gammas)])
    upper = np.array([math.log(1e9), math.log(1e9), 4.0, 2.0 if heavy_decay is None else gammas[0]])
    best: tuple[float, NDArray[np.float64]] | None = None
    for alpha, gamma in itertools.product(np.linspace(0.1, 2.5, 9), gammas):
        theta = _levenberg_marquardt(
            targets.residuals,
            np.array(
                [
                    math.log(s0) - gamma * math.log(n),
                    math.log(r0) - gamma * math.log(n),
                    alpha,
                    gamma,
                ]
            ),
            lower,
            upper,
            iterations=6,
        )
        res = targets.residuals(theta)
        if best is None or float(res @ res) < best[0]:
            best = (float(res @ res), theta)
    assert best is not None
    theta = _levenberg_marquardt(targets.residuals, best[1], lower, upper)
    s = math.exp(theta[0]) if sinks else 0.0
    r = math.exp(theta[1])
    alpha = float(theta[2])
    gamma = float(theta[3])
    sigma, q_sigma = _heavy_sigmas(a, s, r, alpha, gamma, sinks, warmup, seed)
    return AttentionModel(
        sink_tokens=sinks,
        sink_weight=s,
        recency_weight=r,
        recency_alpha=alpha,
        heavy_weight=1.0,
        heavy_decay=gamma,
        heavy_sigma=sigma,
        query_sigma=q_sigma,
    )


# ---------------------------------------------------------------------- goodness of fit
_DISTANCES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def attention_summary(attention: NDArray[np.float64], warmup: int = 64) -> dict[str, float]:
    """The statistics kvpolicy-evict's ``attention_statistics`` reports, of any matrix.

    The same definitions as ``kvpolicy evict stats`` (sink key 0 and keys 0-3, the 16 newest
    keys, mean attention at distances 1..256 with the 4 leading keys excluded, per-query and
    accumulated top 1/5/10% mass), so a recorded matrix and a synthetic one compare, plus
    ``persistence``: the correlation of the log attention two queries ``T/8`` apart pay the
    same far keys (see :func:`fit_attention`).

    Args:
        attention: (T, T) float64 causal row-stochastic matrix.
        warmup: queries before this row are left out of the per-query statistics.

    Raises:
        ValueError: ``attention`` is not a causal row-stochastic matrix longer than
            ``warmup + 8``.
    """
    warmup = _check_int(warmup, "warmup", 0)
    a = _check_matrix(attention)
    n = a.shape[0]
    if n <= warmup + 8:
        raise ValueError(f"'attention' must be longer than warmup + 8 = {warmup + 8}: {n}")
    queries = np.arange(warmup, n)
    out = {
        "sink_mass_first_token": float(a[queries, 0].mean()),
        "sink_mass_first_4": float(a[queries, :4].sum(axis=1).mean()),
    }
    cum = np.cumsum(a, axis=1)
    lo = np.maximum(queries - 16, -1)
    before = np.where(lo >= 0, cum[queries, np.maximum(lo, 0)], 0.0)
    out["recent_mass_last_16"] = float((cum[queries, queries] - before).mean())
    for d in _DISTANCES:
        qs = np.arange(max(warmup, d + 4), n)
        if len(qs):
            out[f"attention_at_distance_{d}"] = float(a[qs, qs - d].mean())
    conc = _concentration(a, warmup)
    for i, p in enumerate((1, 5, 10)):
        out[f"per_query_top_{p}pct_mass"] = float(conc[i])
        out[f"accumulated_top_{p}pct_mass"] = float(conc[3 + i])
    out["persistence"] = float(conc[6])
    return out


# ---------------------------------------------------------------------- eviction check
def attention_recall(
    attention: NDArray[np.float64], policy: EvictionPolicy, budget_tokens: int
) -> float:
    """Attention recall of ``policy`` replayed on an attention matrix, at a token budget.

    Query ``t`` inserts token ``t`` (signal: the attention ``a[t, t]`` the token pays itself
    on arrival, the main input of kvpolicy-evict's compact return predictor), the policy
    observes the query's attention on the resident keys, and evicts down to
    ``budget_tokens``; the decode loop of kvpolicy-evict's quality harness, on one stream.
    The recall of query ``t`` is ``sum_{p resident} a[t, p]`` over the keys it saw.

    Args:
        attention: (T, T) float64 causal row-stochastic matrix.
        policy: a fresh eviction policy.
        budget_tokens: keys kept, 1 <= budget < T.

    Returns:
        Mean recall over the queries ``t >= budget_tokens`` (the ones after the first
        eviction); in [0, 1].
    """
    a = _check_matrix(attention)
    n = a.shape[0]
    budget = _check_int(budget_tokens, "budget_tokens", 1)
    if budget >= n:
        raise ValueError(f"'budget_tokens' must be < T = {n}: {budget}")
    resident = np.empty(0, dtype=np.int64)
    stream = "attention"
    total = 0.0
    for t in range(n):
        pos = np.array([t], dtype=np.int64)
        policy.insert(stream, pos, np.array([[a[t, t]]]))
        resident = np.append(resident, np.int64(t))
        got = a[t, resident]
        if t >= budget:
            total += float(got.sum())
        policy.observe(stream, resident, got)
        evicted = policy.evict(budget).get(stream)
        if evicted is not None and len(evicted):
            resident = resident[~np.isin(resident, evicted)]
        if policy.resident_tokens() != len(resident):
            raise RuntimeError(
                f"policy reports {policy.resident_tokens()} resident tokens, "
                f"the replay holds {len(resident)}"
            )
    return float(total / (n - budget))
