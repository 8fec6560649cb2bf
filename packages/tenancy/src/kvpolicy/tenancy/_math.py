"""Seed 004's priority, debt and burst math (§3.3) and the Retry-After capacity model.

Pure functions of floats: the gate calls them; tests check them against the paper's numbers.
"""

from __future__ import annotations

import math

from attrs import field, frozen
from attrs.validators import ge, lt

__all__ = [
    "PriorityCoefficients",
    "burst_intensity",
    "ewma",
    "priority_weight",
    "retry_after",
    "service_gap",
    "update_debt",
]


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"'{name}' must be finite: {value!r}")
    return float(value)


def _positive(name: str, value: float) -> float:
    value = _finite(name, value)
    if value <= 0:
        raise ValueError(f"'{name}' must be > 0: {value!r}")
    return value


def _nonnegative(name: str, value: float) -> float:
    value = _finite(name, value)
    if value < 0:
        raise ValueError(f"'{name}' must be >= 0: {value!r}")
    return value


@frozen
class PriorityCoefficients:
    """Sensitivities of eq. (1); the defaults are the paper's "typical values" (§3.3)."""

    alpha_slo: float = field(default=2.0, converter=float, validator=ge(0.0))
    """Weight of the SLO term ``l*_e / l-bar*``."""
    alpha_burst: float = field(default=1.0, converter=float, validator=ge(0.0))
    """Weight of the burst intensity ``b_e``."""
    alpha_debt: float = field(default=4.0, converter=float, validator=ge(0.0))
    """Weight of the service debt ``d_e``."""
    gamma_d: float = field(default=0.7, converter=float, validator=[ge(0.0), lt(1.0)])
    """EWMA decay of the debt (eq. 2); 0.7 in the paper's experiment 2."""
    gamma_b: float = field(default=0.7, converter=float, validator=[ge(0.0), lt(1.0)])
    """EWMA decay of the burst intensity; the paper gives no value, 0.7 matches ``gamma_d``."""


def priority_weight(
    class_weight: float,
    slo_target_s: float,
    mean_slo_s: float,
    burst: float = 0.0,
    debt: float = 0.0,
    coefficients: PriorityCoefficients | None = None,
) -> float:
    """Priority weight ``w_e`` of eq. (1) of seed 004.

    ``w_e = w_kappa / (1 + a_slo * l*_e / l-bar*) / (1 + a_burst * b_e) * D(d_e)`` where the
    debt factor is the paper's ``D(d) = 1 + a_debt * d`` for ``d >= 0``. For credit (``d < 0``)
    the paper's factor reaches 0 at ``d = -1 / a_debt`` and turns negative below, which would
    rank an overserved dedicated tenant under spot; this function uses the reciprocal
    ``D(d) = 1 / (1 - a_debt * d)`` there instead, which agrees with the paper to first order
    and stays positive.

    Args:
        class_weight: base weight ``w_kappa`` of the service class (> 0).
        slo_target_s: the entitlement's SLO target ``l*_e`` in seconds (> 0).
        mean_slo_s: pool-average SLO ``l-bar*`` in seconds (> 0).
        burst: burst intensity ``b_e`` (>= 0).
        debt: service debt ``d_e`` (any finite value; negative is credit).
        coefficients: ``alpha`` values; the paper's defaults when ``None``.

    Returns:
        The weight, > 0.

    Example: experiment 2's synth (elastic, 30 s SLO, pool mean 15.25 s) has
    ``100 / (1 + 2 * 30 / 15.25) = 20.3`` and at debt 0.775 ``20.3 * (1 + 4 * 0.775) = 83.2``.
    """
    c = PriorityCoefficients() if coefficients is None else coefficients
    class_weight = _positive("class_weight", class_weight)
    slo_target_s = _positive("slo_target_s", slo_target_s)
    mean_slo_s = _positive("mean_slo_s", mean_slo_s)
    burst = _nonnegative("burst", burst)
    debt = _finite("debt", debt)
    slo = 1.0 + c.alpha_slo * slo_target_s / mean_slo_s
    bursting = 1.0 + c.alpha_burst * burst
    owed = 1.0 + c.alpha_debt * debt if debt >= 0 else 1.0 / (1.0 - c.alpha_debt * debt)
    return class_weight / slo / bursting * owed


def service_gap(baseline: float, allocation: float, contended: bool = True) -> float:
    """Instantaneous service gap ``g_e = (lambda_e - lambda-hat_e) / lambda_e`` (§3.3).

    Positive is underservice, negative is overservice (bursting). The paper measures the gap
    against the baseline alone, so an idle tenant, or one that asks for less than its
    baseline, would accrue debt for capacity it never wanted. With ``contended=False`` (the
    tenant did not meet a contended pool during the interval: capacity was plentiful when
    it asked, so it got all it asked for) only the negative part is kept, so debt is what
    scarcity withheld from it (§3.3: entitlements "temporarily shrunk" accumulate debt,
    the tenants of experiment 2 "both" during the outage). The result is clamped to
    ``[-1, 1]``: bursting to more than twice the baseline earns no more credit than twice.

    Args:
        baseline: ``lambda_e`` in tokens/s (> 0).
        allocation: served rate ``lambda-hat_e`` in tokens/s (>= 0).
        contended: whether the tenant met a contended pool during the interval (was
            denied by it, or admitted over it on priority).
    """
    baseline = _positive("baseline", baseline)
    allocation = _nonnegative("allocation", allocation)
    if not isinstance(contended, bool):
        raise TypeError(f"'contended' must be bool: {contended!r}")
    gap = max(-1.0, min(1.0, (baseline - allocation) / baseline))
    return gap if contended else min(0.0, gap)


def ewma(previous: float, sample: float, gamma: float) -> float:
    """``gamma * previous + (1 - gamma) * sample`` (eq. 2 and the burst update of §3.3)."""
    gamma = _finite("gamma", gamma)
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"'gamma' must be in [0, 1): {gamma!r}")
    return gamma * _finite("previous", previous) + (1.0 - gamma) * _finite("sample", sample)


def update_debt(debt: float, gap: float, gamma_d: float = 0.7) -> float:
    """Eq. (2): ``d_e(k) = gamma_d * d_e(k-1) + (1 - gamma_d) * g_e(k)``."""
    return ewma(debt, gap, gamma_d)


def burst_intensity(
    used_tokens_per_s: float,
    used_kv_bytes: float,
    used_concurrency: float,
    baseline_tokens_per_s: float,
    baseline_kv_bytes: float,
    baseline_concurrency: float,
) -> float:
    """Eq. (3): ``delta_e``, the summed relative overconsumption above baseline.

    ``max(0, lambda-hat/lambda - 1) + max(0, chi-hat/chi - 1) + max(0, r-hat/r - 1)``; the
    smoothed ``b_e`` is :func:`ewma` of it with ``gamma_b``.
    """
    used = (
        _nonnegative("used_tokens_per_s", used_tokens_per_s),
        _nonnegative("used_kv_bytes", used_kv_bytes),
        _nonnegative("used_concurrency", used_concurrency),
    )
    base = (
        _positive("baseline_tokens_per_s", baseline_tokens_per_s),
        _positive("baseline_kv_bytes", baseline_kv_bytes),
        _positive("baseline_concurrency", baseline_concurrency),
    )
    return sum(max(0.0, u / b - 1.0) for u, b in zip(used, base, strict=True))


def retry_after(
    *,
    slots_needed: float = 0.0,
    kv_bytes_needed: float = 0.0,
    tokens_needed: float = 0.0,
    in_flight: int,
    in_flight_tokens: float,
    in_flight_kv_bytes: float,
    drain_tokens_per_s: float,
    min_s: float = 0.05,
    max_s: float = 60.0,
) -> float:
    """Seconds until enough capacity frees up, from the capacity model of §3.1.

    In-flight work of ``in_flight_tokens`` tokens is drained at ``drain_tokens_per_s``, so
    requests complete at ``mu = drain * in_flight / in_flight_tokens`` per second (mean
    request cost ``in_flight_tokens / in_flight``), and each completion frees a slot and on
    average ``in_flight_kv_bytes / in_flight`` bytes of KV. The wait is the longest of

    * ``slots_needed / mu`` for concurrency,
    * ``kv_bytes_needed / (mu * in_flight_kv_bytes / in_flight)`` for KV bytes,
    * ``tokens_needed / drain_tokens_per_s`` for throughput (a token bucket refilling at the
      drain rate),

    clamped to ``[min_s, max_s]``: never 0 (an instant retry would only be denied again) and
    at most ``max_s`` (the estimate uses admission-time costs and ignores arrivals, so a long
    wait is a guess; a client should come back and ask). When something is needed that
    nothing in flight can free (no work in flight), the answer is ``max_s``.

    Args:
        slots_needed: concurrency slots that must free up (>= 0).
        kv_bytes_needed: KV bytes that must free up (>= 0).
        tokens_needed: tokens the bucket lacks (>= 0).
        in_flight: requests in flight (>= 0).
        in_flight_tokens: their charged tokens (>= 0).
        in_flight_kv_bytes: their charged KV bytes (>= 0).
        drain_tokens_per_s: rate at which in-flight work is served (> 0).
        min_s: smallest answer (>= 0).
        max_s: largest answer (>= ``min_s``).
    """
    slots_needed = _nonnegative("slots_needed", slots_needed)
    kv_bytes_needed = _nonnegative("kv_bytes_needed", kv_bytes_needed)
    tokens_needed = _nonnegative("tokens_needed", tokens_needed)
    if isinstance(in_flight, bool) or not isinstance(in_flight, int):
        raise TypeError(f"'in_flight' must be int: {in_flight!r}")
    if in_flight < 0:
        raise ValueError(f"'in_flight' must be >= 0: {in_flight!r}")
    in_flight_tokens = _nonnegative("in_flight_tokens", in_flight_tokens)
    in_flight_kv_bytes = _nonnegative("in_flight_kv_bytes", in_flight_kv_bytes)
    drain = _positive("drain_tokens_per_s", drain_tokens_per_s)
    min_s = _nonnegative("min_s", min_s)
    max_s = _finite("max_s", max_s)
    if max_s < min_s:
        raise ValueError(f"'max_s' must be >= 'min_s' ({min_s}): {max_s!r}")
    wait = tokens_needed / drain
    if slots_needed > 0 or kv_bytes_needed > 0:
        if in_flight == 0 or in_flight_tokens == 0:
            return max_s
        rate = drain * in_flight / in_flight_tokens
        wait = max(wait, slots_needed / rate)
        if kv_bytes_needed > 0:
            if in_flight_kv_bytes == 0:
                return max_s
            wait = max(wait, kv_bytes_needed * in_flight / (rate * in_flight_kv_bytes))
    return min(max_s, max(min_s, wait))
