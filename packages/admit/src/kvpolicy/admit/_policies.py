"""Admission policies for a real server loop: greedy and rate-limited (seed 002 §5.1).

Both implement kvmodel's :class:`~kvpolicy.kvmodel.AdmissionPolicy`; the rate-limited one is
also a :class:`~kvpolicy.kvmodel.CompletionObserver` that learns the decode-length mix from
finished requests, because real requests do not declare their decode length.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
from attrs import define, field, frozen
from attrs.validators import ge, gt, instance_of, optional
from numpy.typing import NDArray

from kvpolicy.kvmodel import Request, SchedulerState

__all__ = ["GreedyAdmission", "RateEstimate", "RateLimitedAdmission", "RequestClass"]


def _greedy_count(state: SchedulerState, waiting: Sequence[Request]) -> int:
    free = state.free_tokens
    count = 0
    for request in waiting:
        free -= request.prompt_len
        if free < 0:
            break
        count += 1
    return count


@frozen
class GreedyAdmission:
    """Admit from the head of the queue while the prompts fit in free memory (the baseline).

    This is the one-step feasibility check of seed 002 §2.2: it reserves nothing for the
    growth of the KV caches it admits, which is what makes the eviction-free state unstable.
    It stops at the first request that does not fit (no skipping ahead).
    """

    def admit(self, state: SchedulerState, waiting: Sequence[Request]) -> int:
        """Count of head requests whose prompt lengths sum to at most ``state.free_tokens``."""
        return _greedy_count(state, waiting)


def _positive_int(_inst: object, attribute: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{getattr(attribute, 'name', '?')}' must be an int: {value!r}")
    if value <= 0:
        raise ValueError(f"'{getattr(attribute, 'name', '?')}' must be positive: {value!r}")


def _optional_tuple(value: object) -> tuple[RequestClass, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'classes' must be a sequence of RequestClass: {value!r}")
    return tuple(value)


@frozen
class RequestClass:
    """One known request class: lengths in tokens and its share of arrivals."""

    input_len: int = field(validator=_positive_int)
    """Prompt length ``l0``."""
    decode_len: int = field(validator=_positive_int)
    """Decode length ``l1``."""
    share: float = field(converter=float, validator=[gt(0.0)])
    """Share of arrivals; shares of a mix sum to 1."""


@frozen
class RateEstimate:
    """What the rate limiter currently believes (for logs and dashboards)."""

    x_star: float
    """Eviction-free rate ``M / E[C]`` (eq. 8) for the estimated mix."""
    cap: float
    """Admissions per iteration actually allowed: ``x*`` shrunk by the integer margin."""
    margin_tokens: float
    """Memory held back for integer and mix fluctuations, in tokens."""
    samples: int
    """Completions behind the estimate (0 when a known mix or the prior is used)."""


def _mix_moments(
    l0: NDArray[np.int64], l1: NDArray[np.int64], weights: NDArray[np.float64]
) -> tuple[float, float, float, float]:
    """``E[C]``, memory variance per unit admission rate, peak footprint, longest decode.

    Args:
        l0: (n,) int64 prompt lengths; l1: (n,) int64 decode lengths;
        weights: (n,) float64 probabilities summing to 1.

    At the eviction-free state with ``x`` admissions per iteration whose classes are drawn
    independently from the mix, the memory is a sum over ages ``j`` of ``x`` draws of
    ``w(j) = (l0 + 1 + j) 1[j < l1]``, so its variance is ``x sum_j Var w(j)``.
    """
    c = l1 * (l0 + (l1 + 1) / 2.0)
    mean_c = float(np.dot(weights, c))
    # sum_j E[w(j)^2]: each class contributes the squares of l0+1 .. l0+l1, in closed form.
    a = l0.astype(np.float64)
    b = a + l1

    def sum_sq(n: NDArray[np.float64]) -> NDArray[np.float64]:
        return n * (n + 1.0) * (2.0 * n + 1.0) / 6.0

    e_w2 = float(np.dot(weights, sum_sq(b) - sum_sq(a)))
    # sum_j E[w(j)]^2 with E[w(j)] = A(j) + j B(j), where A and B sum p (l0 + 1) and p over
    # the classes still alive at age j (l1 > j): suffix sums over decode lengths, so the cost
    # is O(n + max l1) rather than the O(n · max l1) of a class-by-age matrix.
    longest = int(l1.max())
    ends_a = np.bincount(l1, weights=weights * (a + 1.0), minlength=longest + 1)
    ends_b = np.bincount(l1, weights=weights, minlength=longest + 1)
    alive_a = np.cumsum(ends_a[::-1])[::-1][1:]
    alive_b = np.cumsum(ends_b[::-1])[::-1][1:]
    mean_w = alive_a + np.arange(longest) * alive_b
    var = e_w2 - float(np.dot(mean_w, mean_w))
    return mean_c, max(var, 0.0), float(np.max(l0 + l1)), float(np.max(l1))


@define
class RateLimitedAdmission:
    """Cap admissions at the eviction-free rate ``x*`` (seed 002 §5.1), for integer requests.

    Each iteration earns ``cap`` admission credits (credit is capped at ``cap + 1`` so idle
    periods do not bank a burst); the policy admits ``min(greedy, floor(credit))`` and spends
    the credit. This error-diffusion dither makes the admissions of any window of iterations
    differ from ``cap`` times its length by less than one request.

    The cap is ``x*`` computed on a reduced memory ``M - margin``. Admitting exactly ``x*``
    on average overflows: with dithered cohorts the memory departs from the fluid profile by
    ``sum_j w_j e_j`` where the partial sums of the cohort errors ``e_j`` stay in ``(-1, 1)``,
    which by Abel summation is less than ``max(l0 + l1) + max(l1)`` tokens; when classes mix
    at random, their memory has variance ``x sum_j Var w(j)``, and ``margin_sigmas`` standard
    deviations of it are held back too.

    The mix comes from ``classes`` when known. Otherwise it is estimated online from the last
    ``window`` completions (:meth:`observe_completion`) and ``x*`` is recomputed as the mix
    drifts: after a change of mix the estimate is entirely the new mix after ``window``
    completions, i.e. ``window / x*`` iterations (plus one decode length for the first new
    requests to finish). Until ``min_samples`` completions have been seen it assumes every
    waiting prompt will decode ``prior_decode_len`` tokens, or, with no prior, admits
    greedily. It never admits more than :class:`GreedyAdmission` would.
    """

    classes: tuple[RequestClass, ...] | None = field(default=None, converter=_optional_tuple)
    """Known request classes; None to estimate the mix online."""
    window: int = field(default=512, validator=_positive_int)
    """Completions in the moving window of the online estimate."""
    min_samples: int = field(default=32, validator=_positive_int)
    """Completions needed before the online estimate replaces the prior."""
    margin_sigmas: float = field(default=3.0, converter=float, validator=ge(0.0))
    """Standard deviations of mix-driven memory fluctuation held back."""
    prior_decode_len: int | None = field(default=None, validator=optional(instance_of(int)))
    """Decode length assumed before enough completions (None: greedy until then)."""
    _samples: deque[tuple[int, int]] = field(init=False, factory=deque)
    _credit: float = field(init=False, default=0.0)
    _cached: tuple[float, float, float, float] | None = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.classes is not None:
            if not self.classes:
                raise ValueError(f"'classes' must not be empty: {self.classes!r}")
            for c in self.classes:
                if not isinstance(c, RequestClass):
                    raise TypeError(f"'classes' must hold RequestClass values: {c!r}")
            total = math.fsum(c.share for c in self.classes)
            if abs(total - 1.0) > 1e-9:
                raise ValueError(f"'classes' shares must sum to 1: they sum to {total}")
        if self.prior_decode_len is not None and self.prior_decode_len <= 0:
            raise ValueError(f"'prior_decode_len' must be positive: {self.prior_decode_len!r}")
        self._samples = deque(maxlen=self.window)

    def observe_completion(self, request: Request, time: float) -> None:
        """Record a finished request's prompt and decode lengths in the window."""
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be a Request: {request!r}")
        self._samples.append((request.prompt_len, request.decode_len))
        if self.classes is None:
            self._cached = None

    def _moments(self, waiting: Sequence[Request]) -> tuple[float, float, float, float, int] | None:
        if self.classes is not None:
            if self._cached is None:
                self._cached = _mix_moments(
                    np.array([c.input_len for c in self.classes]),
                    np.array([c.decode_len for c in self.classes]),
                    np.array([c.share for c in self.classes]),
                )
            return (*self._cached, 0)
        if len(self._samples) >= self.min_samples:
            if self._cached is None:
                arr = np.array(self._samples, dtype=np.int64)
                weights = np.full(len(arr), 1.0 / len(arr))
                self._cached = _mix_moments(arr[:, 0], arr[:, 1], weights)
            return (*self._cached, len(self._samples))
        if self.prior_decode_len is None or not waiting:
            return None
        head = waiting[: max(1, min(len(waiting), 256))]
        l0 = np.array([r.prompt_len for r in head])
        l1 = np.full(len(head), self.prior_decode_len)
        return (*_mix_moments(l0, l1, np.full(len(head), 1.0 / len(head))), 0)

    def estimate(
        self, capacity_tokens: int, waiting: Sequence[Request] = ()
    ) -> RateEstimate | None:
        """The current ``x*`` and cap for a GPU of ``capacity_tokens``; None without a mix."""
        moments = self._moments(waiting)
        if moments is None:
            return None
        mean_c, var_per_rate, peak, l1_max, samples = moments
        x_star = capacity_tokens / mean_c
        margin = peak + l1_max + self.margin_sigmas * math.sqrt(var_per_rate * x_star)
        cap = max(capacity_tokens - margin, 0.0) / mean_c
        return RateEstimate(x_star=x_star, cap=cap, margin_tokens=margin, samples=samples)

    def admit(self, state: SchedulerState, waiting: Sequence[Request]) -> int:
        """``min(greedy, floor(credit))`` head requests, the credit earning ``cap`` per call."""
        greedy = _greedy_count(state, waiting)
        estimate = self.estimate(state.capacity_tokens, waiting)
        if estimate is None:
            return greedy
        self._credit = min(self._credit + estimate.cap, estimate.cap + 1.0)
        allowed = math.floor(self._credit)
        if allowed == 0 and state.used_tokens == 0 and greedy > 0:
            allowed = 1  # an empty server always takes one request: never starve
        count = min(greedy, allowed)
        self._credit = max(self._credit - count, 0.0)
        return count
