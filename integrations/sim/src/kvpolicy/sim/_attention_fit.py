"""Fitting the synthetic attention model to recorded attention, and checking the fit.

- :func:`fit_attention`: :class:`~kvpolicy.sim.AttentionModel`'s parameters from a recorded
  (T, T) attention matrix (or a stack of them);
- :func:`attention_summary`: kvpolicy-evict's ``attention_statistics`` (one definition of the
  sink mass, decay with distance and heavy-hitter statistics for recorded and synthetic
  matrices alike);
- :func:`attention_recall`: an eviction policy replayed on a matrix (the eviction check).

The data, the goodness of fit and the eviction check are in ``ATTENTION_FIT.md``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict import (
    attention_statistics,
    heavy_hitter_statistics,
    validate_attention,
)
from kvpolicy.kvmodel import EvictionPolicy
from kvpolicy.sim._attention import AttentionModel, _recency

__all__ = ["attention_recall", "attention_summary", "fit_attention"]

attention_summary = attention_statistics
"""Statistics of a recorded or synthetic attention matrix: kvpolicy-evict's
``attention_statistics`` (the same definitions as ``kvpolicy evict stats``)."""


def _concentration(a: NDArray[np.float64], warmup: int) -> NDArray[np.float64]:
    """(7,) float64 heavy-hitter statistics of the checked matrix ``a``: per-query and
    accumulated top 1/5/10% mass and persistence (kvpolicy-evict's definitions)."""
    return np.array(list(heavy_hitter_statistics(a, warmup, validate=False).values()))


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
    kvpolicy-evict's ``heavy_hitter_statistics`` (per-query and accumulated top 1/5/10% mass,
    persistence over ``T/8`` queries) of ``a`` against those of matrices drawn from the model
    at the same ``T`` (least squares; the draws reuse one set of standard normals, so the
    objective is smooth in the two sigmas).
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
    progress: Callable[[int, int], None] | None = None,
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
        progress: called as ``progress(done, total)`` after each stage (each start of
            the grid, the final fit, the heavy-hitter draws).

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
    a = np.stack([validate_attention(m) for m in stack])
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
    starts = list(itertools.product(np.linspace(0.1, 2.5, 9), gammas))
    total = len(starts) + 2
    done = 0
    for alpha, gamma in starts:
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
        done += 1
        if progress is not None:
            progress(done, total)
    assert best is not None
    theta = _levenberg_marquardt(targets.residuals, best[1], lower, upper)
    if progress is not None:
        progress(done + 1, total)
    s = math.exp(theta[0]) if sinks else 0.0
    r = math.exp(theta[1])
    alpha = float(theta[2])
    gamma = float(theta[3])
    sigma, q_sigma = _heavy_sigmas(a, s, r, alpha, gamma, sinks, warmup, seed)
    if progress is not None:
        progress(total, total)
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
    a = validate_attention(attention)
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
