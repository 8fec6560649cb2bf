"""Early warning: has the server left the eviction-free region? (seed 002 §5.3)

Theorem 2 makes the move from zero to persistent eviction a structural transition, not a
gradual one, and Theorem 3 ties it to the common divisor of the decode lengths. The monitor
watches both over sliding windows and returns typed alerts when either crosses its
threshold, and again when the server recovers.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, deque

from attrs import define, field, frozen
from attrs.validators import ge, gt, instance_of, le

from kvpolicy.kvmodel import Request, SchedulerState

__all__ = ["AlertKind", "EvictionAlert", "EvictionMonitor"]


class AlertKind(enum.Enum):
    """What an :class:`EvictionAlert` reports."""

    EVICTING = "evicting"
    """The windowed eviction rate went above the tolerated rate."""
    RECOVERED = "recovered"
    """The windowed eviction rate came back to or below the tolerated rate."""
    SYNCHRONISED = "synchronised"
    """The common divisor of the frequent decode lengths became greater than 1."""
    DESYNCHRONISED = "desynchronised"
    """The common divisor of the frequent decode lengths came back to 1."""


@frozen
class EvictionAlert:
    """A change of regime seen by :class:`EvictionMonitor`."""

    kind: AlertKind = field(validator=instance_of(AlertKind))
    """What changed."""
    step: int = field(validator=instance_of(int))
    """Iteration at which it was seen."""
    eviction_rate: float
    """Evictions per iteration over the window."""
    effective_gcd: int | None
    """Common divisor of the frequent decode lengths (None before any completion)."""
    message: str
    """Human-readable summary."""


@define
class EvictionMonitor:
    """Sliding-window eviction rate and effective GCD of decode lengths, with typed alerts.

    Call :meth:`observe_step` once per iteration with the evictions of that iteration, and
    :meth:`observe_completion` for every finished request (it is a
    :class:`~kvpolicy.kvmodel.CompletionObserver`).
    """

    window_steps: int = field(default=256, validator=[instance_of(int), gt(0)])
    """Iterations in the eviction-rate window."""
    max_eviction_rate: float = field(default=0.0, converter=float, validator=ge(0.0))
    """Evictions per iteration tolerated before alerting (0: any eviction in the window)."""
    window_completions: int = field(default=1024, validator=[instance_of(int), gt(0)])
    """Completions in the decode-length window."""
    min_share: float = field(default=0.02, converter=float, validator=[ge(0.0), le(1.0)])
    """Decode lengths rarer than this share of the window do not count in the GCD."""
    _evictions: deque[int] = field(init=False, factory=deque)
    _total: int = field(init=False, default=0)
    _lengths: deque[int] = field(init=False, factory=deque)
    _counts: Counter[int] = field(init=False, factory=Counter)
    _evicting: bool = field(init=False, default=False)
    _synchronised: bool = field(init=False, default=False)

    @property
    def eviction_rate(self) -> float:
        """Evictions per iteration over the last ``window_steps`` iterations."""
        return self._total / max(len(self._evictions), 1)

    @property
    def effective_gcd(self) -> int | None:
        """GCD of the decode lengths holding at least ``min_share`` of the window."""
        if not self._lengths:
            return None
        threshold = self.min_share * len(self._lengths)
        frequent = [length for length, n in self._counts.items() if n >= threshold]
        if not frequent:
            frequent = list(self._counts)
        return math.gcd(*frequent)

    def observe_completion(self, request: Request, time: float) -> None:
        """Add a finished request's decode length to the window."""
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be a Request: {request!r}")
        if len(self._lengths) == self.window_completions:
            old = self._lengths.popleft()
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]
        self._lengths.append(request.decode_len)
        self._counts[request.decode_len] += 1

    def observe_step(self, state: SchedulerState, evictions: int) -> tuple[EvictionAlert, ...]:
        """Record one iteration; return the alerts it triggers (usually none)."""
        if not isinstance(state, SchedulerState):
            raise TypeError(f"'state' must be a SchedulerState: {state!r}")
        if isinstance(evictions, bool) or not isinstance(evictions, int):
            raise TypeError(f"'evictions' must be an int: {evictions!r}")
        if evictions < 0:
            raise ValueError(f"'evictions' must be non-negative: {evictions!r}")
        if len(self._evictions) == self.window_steps:
            self._total -= self._evictions.popleft()
        self._evictions.append(evictions)
        self._total += evictions
        rate = self.eviction_rate
        gcd = self.effective_gcd
        alerts: list[EvictionAlert] = []
        evicting = rate > self.max_eviction_rate
        if evicting != self._evicting:
            self._evicting = evicting
            kind = AlertKind.EVICTING if evicting else AlertKind.RECOVERED
            where = "left" if evicting else "is back in"
            alerts.append(
                EvictionAlert(
                    kind=kind,
                    step=state.step,
                    eviction_rate=rate,
                    effective_gcd=gcd,
                    message=(
                        f"step {state.step}: {rate:.3g} evictions/iteration over the last "
                        f"{len(self._evictions)} iterations; the server {where} the "
                        "eviction-free region"
                    ),
                )
            )
        synchronised = gcd is not None and gcd > 1
        if synchronised != self._synchronised:
            self._synchronised = synchronised
            kind = AlertKind.SYNCHRONISED if synchronised else AlertKind.DESYNCHRONISED
            alerts.append(
                EvictionAlert(
                    kind=kind,
                    step=state.step,
                    eviction_rate=rate,
                    effective_gcd=gcd,
                    message=(
                        f"step {state.step}: decode lengths share the divisor {gcd}; "
                        + (
                            f"completions synchronise every {gcd} iterations (Theorem 3: unstable)"
                            if synchronised
                            else "completions are desynchronised"
                        )
                    ),
                )
            )
        return tuple(alerts)
