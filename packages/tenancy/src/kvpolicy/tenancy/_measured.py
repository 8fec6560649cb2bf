"""One replica's rate at the SLO measured on the replicas serving: a feedback on the model's.

The token pool's autoscaler converts tokens/s and requests in flight into replicas by what
one replica serves within the SLO. A model gives that rate before anything runs (from
below: a queueing model's assumptions are cautious where a trace's bursts are shorter than
its requests); the replicas online show what they carry. A load they carried while no
request waited met the time-to-first-token target for every request admitted (each one's
prefill alone), so a replica serves at least that within the SLO.
"""

from __future__ import annotations

import math
from collections import deque

import attrs
from attrs import define, field
from attrs.validators import instance_of

from kvpolicy.kvmodel import FleetView
from kvpolicy.tenancy._entitlements import Resources

__all__ = ["MeasuredReplica"]


def _budget(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"'{attribute.name}' must be finite and >= 0: {value!r}")


@define
class MeasuredReplica:
    """The largest load one replica was seen to carry, sustained with no request waiting.

    At each decision with replicas serving (up or draining) their load per replica is the
    tokens/s served and the requests running, each ÷ the serving replicas. A load counts
    once it was carried for as long as a request stays in the system (the requests in
    flight ÷ the arrival rate, Little's law: the time over which the KV in use comes to
    reflect the load; at least the time since the previous decision) with no request
    waiting, on the replicas or at the front door (or those waiting within
    ``queue_budget_s``), at any decision of that time nor at the one before it: it counts
    as the smallest load of those decisions, each carried with every request admitted at
    once. The measured rate is the largest such load (0 before any); :meth:`capacity`
    bounds it by a model's rate from below and ``ceiling`` (the saturation rate) from
    above.
    """

    ceiling: Resources = field(validator=instance_of(Resources))
    """What one replica serves at saturation: no measure counts above its tokens/s and
    concurrency."""
    queue_budget_s: float = field(default=0.0, converter=float, validator=_budget)
    """Seconds a request may wait before its prefill within the SLO: a decision counts as
    met when the requests waiting (on the replicas and at the front door) ÷ the arrival
    rate, Little's law's mean wait, is at most this (0: only with nothing waiting). The
    time-to-first-token target less a prefill's time is the budget the SLO leaves."""
    tokens_per_s: float = field(init=False, default=0.0)
    """The most tokens/s one replica carried with no request waiting (0: none seen yet)."""
    concurrency: float = field(init=False, default=0.0)
    """The most requests one replica ran with no request waiting (0: none seen yet)."""
    _recent: deque[tuple[float, float, float, bool]] = field(
        init=False, factory=deque, eq=False, repr=False
    )

    def observe(self, fleet: FleetView) -> None:
        """Take one decision's view of the fleet (see the class)."""
        if not isinstance(fleet, FleetView):
            raise TypeError(f"'fleet' must be a FleetView: {fleet!r}")
        recent = self._recent
        if recent and fleet.time < recent[-1][0]:
            raise ValueError(
                f"'time' must not go back (last decision at {recent[-1][0]}): {fleet.time!r}"
            )
        views = fleet.up + fleet.draining
        if not views:
            recent.clear()  # nothing carried: a sustained load starts afresh
            return
        serving = len(views)
        running = sum(v.running for v in views)
        waiting = sum(v.waiting for v in views) + fleet.queued
        if waiting == 0:
            met = True
        elif fleet.arrival_rate > 0.0:
            met = waiting / fleet.arrival_rate <= self.queue_budget_s
        else:
            met = False  # requests waiting and none arriving: no wait to bound
        recent.append((fleet.time, fleet.tokens_per_s / serving, running / serving, met))
        in_system_s = 0.0
        if fleet.arrival_rate > 0.0:
            in_system_s = (running + waiting) / fleet.arrival_rate
        start = fleet.time - in_system_s
        if len(recent) > 1:
            start = min(start, recent[-2][0])  # at least the window since the last decision
        while len(recent) > 1 and recent[1][0] <= start:
            recent.popleft()  # keep one decision at or before the start
        if len(recent) < 2 or recent[0][0] > start or not all(q for *_, q in recent):
            return
        carried = list(recent)[1:]
        tokens = min(load for _, load, _, _ in carried)
        running_load = min(conc for _, _, conc, _ in carried)
        self.tokens_per_s = max(self.tokens_per_s, min(tokens, self.ceiling.tokens_per_s))
        self.concurrency = max(self.concurrency, min(running_load, float(self.ceiling.concurrency)))

    def capacity(self, modelled: Resources) -> Resources:
        """One replica's resources: ``modelled``'s tokens/s and concurrency raised to what was
        measured (concurrency rounded down; each no more than ``ceiling``'s and no less
        than ``modelled``'s) and its KV bytes."""
        if not isinstance(modelled, Resources):
            raise TypeError(f"'modelled' must be Resources: {modelled!r}")
        return Resources(
            tokens_per_s=max(modelled.tokens_per_s, self.tokens_per_s),
            kv_bytes=modelled.kv_bytes,
            concurrency=max(modelled.concurrency, math.floor(self.concurrency)),
        )
