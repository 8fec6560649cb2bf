"""Autoscalers: how many replicas a fleet should have (kvmodel's :class:`Autoscaler`).

Each returns a target in ``[min_replicas, max_replicas]`` (the static one, its count). The
threshold autoscaler scales as Kubernetes' HPA does on KEDA's metrics (KV usage and queue
depth against targets, a tolerance, a scale-down stabilisation window); the planner sizes
the fleet as Dynamo's planner does, ``ceil(demand / per-replica rate at the SLO)``, with the
per-replica rate a parameter or from seed 002's eviction-free rate
(:func:`replica_token_rate`).
"""

from __future__ import annotations

import math
from collections import deque

import attrs
import numpy as np
from attrs import define, field, frozen

from kvpolicy.admit._analysis import eviction_free_rate
from kvpolicy.admit._workload import StabilityWorkload
from kvpolicy.kvmodel import FleetView

__all__ = [
    "PlannerAutoscaler",
    "StaticAutoscaler",
    "ThresholdAutoscaler",
    "replica_token_rate",
]


def _replicas(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")
    if value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1: {value!r}")


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"must be a number: {value!r}")
    return float(value)


def _positive(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{attribute.name}' must be finite and > 0: {value!r}")


def _non_negative(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"'{attribute.name}' must be finite and >= 0: {value!r}")


def _fleet(fleet: FleetView) -> FleetView:
    if not isinstance(fleet, FleetView):
        raise TypeError(f"'fleet' must be a FleetView: {fleet!r}")
    return fleet


def _check_bounds(min_replicas: int, max_replicas: int) -> None:
    if min_replicas > max_replicas:
        raise ValueError(
            f"'min_replicas' must be <= 'max_replicas' ({max_replicas}): {min_replicas!r}"
        )


def _clamp(count: int, min_replicas: int, max_replicas: int) -> int:
    return max(min_replicas, min(max_replicas, count))


@frozen
class StaticAutoscaler:
    """A fixed replica count, whatever the fleet does."""

    replicas: int = field(default=1, validator=_replicas)
    """The replica count (>= 1)."""

    def target(self, fleet: FleetView) -> int:
        """``replicas``."""
        _fleet(fleet)
        return self.replicas


@define
class ThresholdAutoscaler:
    """KV usage and queue depth against targets, as Kubernetes' HPA scales on KEDA metrics.

    With ``n`` replicas up, the ratio is the larger of mean KV usage ÷ ``kv_usage_target``
    and queued requests per replica (those waiting on the replicas and at the front door)
    ÷ ``queue_target``; the desired count is ``ceil(n * ratio)``, or the current count
    (up plus provisioning) while the ratio is within ``tolerance`` of 1 or no replica is up.
    The target is the largest desired count of the last ``stabilisation_s`` seconds, so it
    rises at once and falls only after the window has passed (HPA's scale-down
    stabilisation), clamped to ``[min_replicas, max_replicas]``.
    """

    min_replicas: int = field(default=1, validator=_replicas)
    """Fewest replicas (>= 1)."""
    max_replicas: int = field(default=10, validator=_replicas)
    """Most replicas (>= ``min_replicas``)."""
    kv_usage_target: float = field(default=0.8, converter=_number, validator=_positive)
    """Mean KV usage per replica to hold, in (0, 1]."""
    queue_target: float = field(default=4.0, converter=_number, validator=_positive)
    """Waiting requests per replica to hold (> 0)."""
    tolerance: float = field(default=0.1, converter=_number, validator=_non_negative)
    """No change while the ratio is within this of 1 (HPA's default 0.1)."""
    stabilisation_s: float = field(default=300.0, converter=_number, validator=_non_negative)
    """Seconds of past decisions whose largest sets the target (HPA's scale-down default
    300 s; 0: the latest decision only)."""
    _history: deque[tuple[float, int]] = field(init=False, factory=deque)

    def __attrs_post_init__(self) -> None:
        _check_bounds(self.min_replicas, self.max_replicas)
        if self.kv_usage_target > 1.0:
            raise ValueError(f"'kv_usage_target' must be <= 1: {self.kv_usage_target!r}")

    def desired(self, fleet: FleetView) -> int:
        """The count this decision alone asks for, before the window and the bounds."""
        up = len(fleet.up)
        if up == 0:
            return fleet.replicas
        kv = math.fsum(r.kv_usage for r in fleet.up) / up
        queue = (sum(r.waiting for r in fleet.up) + fleet.queued) / up
        ratio = max(kv / self.kv_usage_target, queue / self.queue_target)
        if abs(ratio - 1.0) <= self.tolerance:
            return fleet.replicas
        return math.ceil(up * ratio)

    def target(self, fleet: FleetView) -> int:
        """The largest desired count within the window, clamped to the bounds.

        Raises:
            ValueError: ``fleet.time`` is earlier than the previous decision's.
        """
        _fleet(fleet)
        if self._history and fleet.time < self._history[-1][0]:
            raise ValueError(
                f"'time' must not go back (last decision at {self._history[-1][0]}): {fleet.time!r}"
            )
        self._history.append((fleet.time, self.desired(fleet)))
        while self._history[0][0] < fleet.time - self.stabilisation_s:
            self._history.popleft()
        best = max(count for _, count in self._history)
        return _clamp(best, self.min_replicas, self.max_replicas)


def replica_token_rate(workload: StabilityWorkload, iteration_s: float) -> float:
    """Tokens per second one replica serves eviction-free: seed 002's ``x*`` in seconds.

    ``x*`` (eq. 8) requests finish per iteration at the eviction-free fixed point, each
    ``l0 + l1`` tokens on average over the mix, and an iteration takes ``iteration_s``.

    Args:
        workload: the replica's classes, mix and memory ``M`` in tokens.
        iteration_s: seconds one iteration (one decode step of the batch) takes.
    """
    if not isinstance(workload, StabilityWorkload):
        raise TypeError(f"'workload' must be a StabilityWorkload: {workload!r}")
    iteration_s = _number(iteration_s)
    if not (math.isfinite(iteration_s) and iteration_s > 0):
        raise ValueError(f"'iteration_s' must be finite and > 0: {iteration_s!r}")
    lens = np.add(workload.input_lens, workload.decode_lens, dtype=np.float64)
    tokens = float(np.dot(workload.mix, lens))
    return eviction_free_rate(workload) * tokens / iteration_s


@frozen
class PlannerAutoscaler:
    """``ceil(demand / per_replica_tokens_per_s)``, as Dynamo's planner sizes a fleet.

    The demand in tokens per second is the arrival rate times the tokens of a mean request,
    its prompt discounted by the prefix-cache hit rate
    (``arrival_rate * (mean_prompt_tokens * (1 - prefix_hit_rate) + mean_output_tokens)``);
    where the fleet's view knows no request lengths (both means 0) it is the observed
    ``tokens_per_s``. The requests already waiting (at the front door and in the replicas'
    queues) add their tokens over ``backlog_s`` seconds, so that a backlog a ramp has built
    is drained rather than carried (Dynamo's planner sizes for the arrivals alone:
    ``backlog_s=0``). The target is clamped to ``[min_replicas, max_replicas]``.
    """

    per_replica_tokens_per_s: float = field(converter=_number, validator=_positive)
    """Tokens per second one replica serves within the SLO (:func:`replica_token_rate`
    gives it from seed 002's model)."""
    min_replicas: int = field(default=1, validator=_replicas)
    """Fewest replicas (>= 1)."""
    max_replicas: int = field(default=10, validator=_replicas)
    """Most replicas (>= ``min_replicas``)."""

    backlog_s: float = field(default=60.0, converter=_number, validator=_non_negative)
    """Seconds in which to serve the requests already waiting: their tokens over this join
    the demand (0: the arrivals alone)."""

    def __attrs_post_init__(self) -> None:
        _check_bounds(self.min_replicas, self.max_replicas)

    @staticmethod
    def demand(fleet: FleetView) -> float:
        """Tokens per second the arrivals ask for (see the class)."""
        if fleet.mean_prompt_tokens == 0.0 and fleet.mean_output_tokens == 0.0:
            return fleet.tokens_per_s
        prompt = fleet.mean_prompt_tokens * (1.0 - fleet.prefix_hit_rate)
        return fleet.arrival_rate * (prompt + fleet.mean_output_tokens)

    def backlog(self, fleet: FleetView) -> float:
        """Tokens per second that serve the waiting requests in ``backlog_s`` seconds: the
        front door's ``queued`` plus each serving replica's ``waiting``, each of the mean
        request's tokens (or the observed tokens per arrival where no lengths are known;
        0 where neither is)."""
        if self.backlog_s == 0.0:
            return 0.0
        waiting = fleet.queued + sum(view.waiting for view in fleet.up)
        if waiting == 0:
            return 0.0
        if fleet.mean_prompt_tokens or fleet.mean_output_tokens:
            prompt = fleet.mean_prompt_tokens * (1.0 - fleet.prefix_hit_rate)
            per_request = prompt + fleet.mean_output_tokens
        elif fleet.arrival_rate > 0.0:
            per_request = fleet.tokens_per_s / fleet.arrival_rate
        else:
            return 0.0
        return waiting * per_request / self.backlog_s

    def target(self, fleet: FleetView) -> int:
        """The replicas the demand and the backlog need, clamped to the bounds."""
        fleet = _fleet(fleet)
        need = math.ceil((self.demand(fleet) + self.backlog(fleet)) / self.per_replica_tokens_per_s)
        return _clamp(need, self.min_replicas, self.max_replicas)
