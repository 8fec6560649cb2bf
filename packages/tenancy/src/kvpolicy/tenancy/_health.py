"""Whether a backend takes requests: active health checks and passive ejection with backoff.

A backend is *ejected* when a request to it fails as a dead server fails (it cannot be
reached, it times out, it answers 5xx) ``failures`` times in a row, or when an active check
fails. Its k-th ejection in a row lasts ``min(backoff_s * 2**(k-1), max_backoff_s)``; once
that has passed an active check that succeeds re-admits it (without active checks, the
next request tries it: a success re-admits it, a failure ejects it for twice as long).
Draining is the operator's: a draining backend finishes what it has and gets nothing new.
"""

from __future__ import annotations

import math

from attrs import define, field, frozen
from attrs.validators import ge, gt, instance_of

__all__ = ["BackendHealth", "HealthConfig", "backoff_s"]


def _finite(_inst: object, attribute: object, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{getattr(attribute, 'name', '?')}' must be finite: {value!r}")


@frozen
class HealthConfig:
    """Active checks and passive ejection of the backends."""

    interval_s: float = field(default=2.0, converter=float, validator=[_finite, ge(0.0)])
    """Seconds between active checks of each backend (0: none, passive ejection only)."""
    timeout_s: float = field(default=1.0, converter=float, validator=[_finite, gt(0.0)])
    """The longest an active check waits for its answer."""
    path: str = field(default="/health", validator=instance_of(str))
    """Path answered 200 by a healthy backend (vLLM's ``/health``)."""
    failures: int = field(default=1, validator=[instance_of(int), ge(1)])
    """Consecutive failed requests that eject a backend."""
    backoff_s: float = field(default=1.0, converter=float, validator=[_finite, gt(0.0)])
    """The first ejection's length; each further one in a row doubles it."""
    max_backoff_s: float = field(default=30.0, converter=float, validator=[_finite, gt(0.0)])
    """The longest ejection."""

    def __attrs_post_init__(self) -> None:
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"'max_backoff_s' must be >= 'backoff_s' ({self.backoff_s}): {self.max_backoff_s!r}"
            )


def backoff_s(ejections: int, config: HealthConfig) -> float:
    """Length of the ``ejections``-th ejection in a row (1: the first)."""
    if ejections < 1:
        raise ValueError(f"'ejections' must be >= 1: {ejections!r}")
    return min(config.backoff_s * 2.0 ** min(ejections - 1, 60), config.max_backoff_s)


@define
class BackendHealth:
    """One backend's health as the gateway judges it (times: the gateway's monotonic clock)."""

    config: HealthConfig
    """The thresholds and backoff."""
    failures: int = 0
    """Failures in a row since the last success."""
    ejections: int = 0
    """Ejections in a row since the last re-admission."""
    ejected_until: float = 0.0
    """End of the current ejection (0: not ejected)."""
    ejected: bool = False
    """Whether the backend is out of the rotation."""
    draining: bool = False
    """Whether the operator drains it (nothing new is sent)."""
    last_error: str = ""
    """Why it last failed (empty: never)."""

    def failed(self, now: float, why: str) -> bool:
        """Record a failure at ``now``; whether it ejected the backend just now."""
        self.failures += 1
        self.last_error = why
        if self.ejected:  # a probe of an ejected backend failed: eject it for longer
            if now >= self.ejected_until:
                self.ejections += 1
                self.ejected_until = now + backoff_s(self.ejections, self.config)
            return False
        if self.failures < self.config.failures:
            return False
        self.ejected = True
        self.ejections += 1
        self.ejected_until = now + backoff_s(self.ejections, self.config)
        return True

    def succeeded(self) -> bool:
        """Record a success; whether it re-admitted the backend just now."""
        self.failures = 0
        if not self.ejected:
            return False
        self.ejected = False
        self.ejections = 0
        self.ejected_until = 0.0
        return True

    def probe_due(self, now: float) -> bool:
        """Whether an ejected backend's backoff has passed (a check or a request may try it)."""
        return self.ejected and now >= self.ejected_until

    def routable(self, now: float, active_checks: bool) -> bool:
        """Whether new requests may go to it: up and not draining; an ejected one only after
        its backoff when no active check will re-admit it."""
        if self.draining:
            return False
        return not self.ejected or (not active_checks and now >= self.ejected_until)

    @property
    def state(self) -> str:
        """``up``, ``ejected`` or ``draining``."""
        if self.ejected:
            return "ejected"
        return "draining" if self.draining else "up"
