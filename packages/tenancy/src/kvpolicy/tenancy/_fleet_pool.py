"""The token pool follows the fleet: its token rates are those of the healthy backends.

The pool manifest's capacity is the whole fleet's; each backend brings its weight's share
(:attr:`~kvpolicy.tenancy._backends.BackendSpec.weight`). When a backend is ejected the
gate's token rates (the pool's and every entitlement's, so each tenant keeps its share)
are scaled to the healthy backends' share, so the pool admits less and a denied request's
Retry-After (the time its token bucket takes to refill) grows; when it comes back both are
restored. The gate is scaled through kvmodel's ``ThroughputScalable``; KV bytes and
concurrency stay the manifest's. With no healthy backend the gate keeps its last rates:
the gateway answers 503 itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from kvpolicy.kvmodel import ThroughputScalable

__all__ = ["PoolFollower", "healthy_share"]

_log = logging.getLogger("kvpolicy.tenancy")


def healthy_share(weights: Iterable[tuple[float, bool]]) -> float:
    """The fleet's capacity the healthy backends bring: ``sum(healthy weights) /
    sum(weights)`` over ``(weight, healthy)`` pairs, in [0, 1] (0 for no backend)."""
    total = healthy = 0.0
    for weight, up in weights:
        total += weight
        if up:
            healthy += weight
    return healthy / total if total > 0 else 0.0


class PoolFollower:
    """Scales a gate's token rates as the healthy share of the fleet changes.

    Args:
        gate: the gateway's gate; one that is not ``ThroughputScalable`` (a gate whose
            rates live in Redis) is left alone, logged once.
    """

    def __init__(self, gate: object) -> None:
        """See the class docstring."""
        self._gate = gate if isinstance(gate, ThroughputScalable) else None
        if self._gate is None:
            _log.warning(
                "the gate %s cannot scale its token rates: its pool will not follow the "
                "healthy backends",
                type(gate).__name__,
            )
        self.share = 1.0
        """The healthy share the gate's rates stand for now."""

    def follow(self, share: float, time: float = 0.0) -> float:
        """Scale the gate to ``share`` of the fleet (a share of 0 keeps the last rates);
        the factor applied (1.0: nothing changed)."""
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"'share' must be in [0, 1]: {share!r}")
        if share == 0.0 or share == self.share or self._gate is None:
            return 1.0
        factor = share / self.share
        self._gate.scale_throughput(factor, time)
        _log.warning("the pool follows the fleet: %.0f%% of its capacity is healthy", share * 100)
        self.share = share
        return factor
