"""Seed 004's capacity model sizing the fleet: the token pool's autoscaler (§4.2).

A token pool is "an autoscaling group of GPU workers" whose entitlements "authorize both
admission and autoscaling from the same capacity model": the pool needs the replicas that
fund what its entitlements committed, in each of the three dimensions (tokens/s, KV bytes,
concurrency), plus the burst observed above those commitments, between the pool's
``scaling: {minReplicas, maxReplicas}``.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import instance_of

from kvpolicy.kvmodel import FleetView, ServerContext
from kvpolicy.tenancy._entitlements import Resources, TokenPool
from kvpolicy.tenancy._gate import _fraction
from kvpolicy.tenancy._manifest import _resources, load_manifest
from kvpolicy.tenancy._measured import MeasuredReplica

__all__ = ["TokenPoolAutoscaler"]


def _replicas(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")
    if value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1: {value!r}")


def _decay(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (0.0 <= value < 1.0):
        raise ValueError(f"'{attribute.name}' must be in [0, 1): {value!r}")


def _seconds(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"'{attribute.name}' must be finite and >= 0: {value!r}")


@frozen
class TokenPoolAutoscaler:
    """Replicas that fund the entitlements' commitments and the observed burst.

    Committed is the sum of the reserved baselines (dedicated and guaranteed: held even
    when idle, seed 004's Table 1). An elastic baseline is time-averaged (honoured over time
    through the debt mechanism, not held while idle): what an elastic tenant asks for, up to
    its baseline and above it, is funded as observed demand, as is what spot and
    preemptible tenants (promised nothing) use. Observed is what the tenants ask for now: tokens/s
    the larger of those served and those arriving (each arrival's token budget, its prompt
    and output, as the gateway charges it: a fleet short of replicas serves no more than
    its capacity, so what it serves alone never shows a burst above it), the KV bytes in
    use on the replicas up (KV usage times a replica's KV bytes) and their running and
    waiting requests plus those queued at the front door. Each dimension needs
    ``max(committed, observed)`` (the commitment plus the burst above it) ÷ one replica's
    capacity, rounded up (what is observed averaged over the decisions with
    ``burst_decay``, as seed 004 averages an entitlement's burst: the tokens/s served and
    those arriving each averaged before the larger is taken, as the larger of two noisy
    estimates of one demand overstates it); the target is the largest
    (the largest of the decisions within ``stabilisation_s``), clamped to
    ``[min_replicas, max_replicas]``. With ``measured``, one replica's tokens/s and
    concurrency are the larger of ``replica``'s and what the replicas online were seen to
    carry within the SLO (:class:`MeasuredReplica`). A replica counts for ``kv_fill`` of
    its KV bytes in the KV dimension (the share its requests hold at its rate at the SLO:
    a pool filled to the last block preempts and queues), while the KV in use is read as a
    share of all of it.
    """

    pool: TokenPool = field(validator=instance_of(TokenPool))
    """The pool and its entitlements."""
    replica: Resources = field(validator=instance_of(Resources))
    """What one replica serves: tokens/s, KV bytes and concurrent sequences."""
    min_replicas: int = field(default=1, validator=_replicas)
    """Fewest replicas (the pool's ``minReplicas``, >= 1)."""
    max_replicas: int = field(default=10, validator=_replicas)
    """Most replicas (the pool's ``maxReplicas``, >= ``min_replicas``)."""
    stabilisation_s: float = field(default=0.0, converter=float, validator=_seconds)
    """Seconds of past decisions whose largest need sets the target (Kubernetes' HPA
    scale-down stabilisation, which the pool's Deployment scales under): it rises at once
    and falls only once the window has passed. 0: the latest decision only (the paper
    gives no rule for scale-down)."""
    burst_decay: float = field(default=0.0, converter=float, validator=_decay)
    """``gamma_b`` of seed 004's burst EWMA (``b(k) = gamma_b * b(k-1) + (1 - gamma_b) *
    delta(k)``), applied here to what each decision observes in each dimension, so that a
    brief burst moves the target less than a sustained one (in [0, 1); 0: the latest
    observation alone). The first decision starts the average at what it observes."""
    measured: MeasuredReplica | None = field(
        default=None, validator=attrs.validators.optional(instance_of(MeasuredReplica))
    )
    """Measures one replica's rate at the SLO on the fleet (``replica`` bounds it from
    below); None: ``replica`` as given."""
    kv_fill: float = field(default=1.0, converter=float, validator=_fraction)
    """The share of a replica's KV bytes the KV dimension sizes by: what its requests hold
    at its rate at the SLO (in (0, 1]; 1: the whole KV cache). The simulator gives the time
    model's (:func:`kvpolicy.sim.autoscaler_sizing`: the SLO's requests in flight times
    the KV a request holds over its time in the batch, over the pool)."""
    _history: deque[tuple[float, int]] = field(init=False, factory=deque, eq=False, repr=False)
    _smoothed: list[float] = field(init=False, factory=list, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"'min_replicas' must be <= 'max_replicas' ({self.max_replicas}): "
                f"{self.min_replicas!r}"
            )

    @classmethod
    def for_pool(
        cls,
        pool: TokenPool | Mapping[str, Any] | str | os.PathLike[str],
        replica: Resources | Mapping[str, Any] | None = None,
        min_replicas: int = 1,
        max_replicas: int = 10,
        stabilisation_s: float = 0.0,
        burst_decay: float = 0.0,
        measure_rate: bool = False,
        saturation: Resources | Mapping[str, Any] | None = None,
        queue_budget_s: float = 0.0,
        kv_fill: float = 1.0,
        *,
        context: ServerContext | None = None,
    ) -> TokenPoolAutoscaler:
        """The autoscaler of a pool given as a :class:`TokenPool` or a manifest (a mapping
        or a file), each replica sized as ``replica`` (:class:`Resources` or a manifest's
        mapping of them: ``tokens_per_s``, ``kv_bytes`` or ``kv_cache_gib``,
        ``concurrency``) or, without it, as the server of
        ``context`` (its tokens/s, KV pool in bytes and batch size). The ``token-pool``
        entry point of ``kvpolicy.autoscaling``. With ``measure_rate``, one replica's
        tokens/s and concurrency are measured on the fleet (:class:`MeasuredReplica`,
        sustained with no request waiting), between ``replica``'s and ``saturation``'s (given
        as ``replica`` is, or the server of ``context`` at saturation: its tokens/s and
        batch size), a decision's load counting with requests waiting for at most
        ``queue_budget_s`` by Little's law (:attr:`MeasuredReplica.queue_budget_s`);
        ``kv_fill`` is :attr:`kv_fill`.

        Raises:
            ValueError: neither ``replica`` nor ``context`` is given, or ``measure_rate``
                without ``saturation`` or ``context``.
        """
        if not isinstance(pool, TokenPool):
            pool = load_manifest(pool)
        if isinstance(replica, Mapping):  # a stack file's {tokens_per_s, kv_bytes, ...}
            replica = _resources(replica, "replica")
        if replica is None:
            if context is None:
                raise ValueError("'replica' is required without the server's context")
            replica = Resources(
                tokens_per_s=context.tokens_per_s,
                kv_bytes=context.kv_capacity_tokens * context.model.kv_bytes_per_token(),
                concurrency=context.max_batch,
            )
        measured = None
        if measure_rate is not False:
            if measure_rate is not True:
                raise TypeError(f"'measure_rate' must be a bool: {measure_rate!r}")
            if isinstance(saturation, Mapping):
                saturation = _resources(saturation, "saturation")
            if saturation is None:
                if context is None:
                    raise ValueError(
                        "'saturation' is required to measure the rate without the server's context"
                    )
                saturation = Resources(
                    tokens_per_s=context.tokens_per_s,
                    kv_bytes=replica.kv_bytes,
                    concurrency=context.max_batch,
                )
            measured = MeasuredReplica(saturation, queue_budget_s)
        return cls(
            pool,
            replica,
            min_replicas,
            max_replicas,
            stabilisation_s,
            burst_decay,
            measured,
            kv_fill,
        )

    @property
    def committed(self) -> tuple[float, int, int]:
        """``(tokens_per_s, kv_bytes, concurrency)`` the reserved baselines commit (those of
        dedicated and guaranteed entitlements)."""
        tps, kv, conc = 0.0, 0, 0
        for ent in self.pool.entitlements:
            if ent.service_class.protected:
                tps += ent.baseline.tokens_per_s
                kv += ent.baseline.kv_bytes
                conc += ent.baseline.concurrency
        return tps, kv, conc

    @property
    def capacity(self) -> Resources:
        """What one replica serves now: ``replica``, or as :attr:`measured` raises it."""
        if self.measured is None:
            return self.replica
        return self.measured.capacity(self.replica)

    def observed(self, fleet: FleetView) -> tuple[float, float, int]:
        """``(tokens_per_s, kv_bytes, concurrency)`` the fleet uses or asks for now."""
        served, arriving, kv, conc = self._signals(fleet)
        return max(served, arriving), kv, int(conc)

    def _signals(self, fleet: FleetView) -> tuple[float, float, float, float]:
        """Tokens/s served, tokens/s arriving, KV bytes in use and requests in flight."""
        arriving = fleet.arrival_rate * (fleet.mean_prompt_tokens + fleet.mean_output_tokens)
        kv = math.fsum(r.kv_usage for r in fleet.up) * self.replica.kv_bytes
        conc = sum(r.running + r.waiting for r in fleet.up) + fleet.queued
        return fleet.tokens_per_s, arriving, kv, float(conc)

    def target(self, fleet: FleetView) -> int:
        """The replicas the busiest dimension needs (the most it needed within
        ``stabilisation_s``), clamped to the bounds.

        Raises:
            ValueError: ``fleet.time`` is earlier than the previous decision's.
        """
        if not isinstance(fleet, FleetView):
            raise TypeError(f"'fleet' must be a FleetView: {fleet!r}")
        history = self._history
        if history and fleet.time < history[-1][0]:
            raise ValueError(
                f"'time' must not go back (last decision at {history[-1][0]}): {fleet.time!r}"
            )
        if self.measured is not None:
            self.measured.observe(fleet)
        replica = self.capacity
        capacity = (replica.tokens_per_s, replica.kv_bytes * self.kv_fill, replica.concurrency)
        signals = list(self._signals(fleet))
        smoothed = self._smoothed
        if smoothed:
            g = self.burst_decay
            signals = [
                g * old + (1.0 - g) * new for old, new in zip(smoothed, signals, strict=True)
            ]
        smoothed[:] = signals
        served, arriving, kv, conc = signals
        observed = (max(served, arriving), kv, conc)  # each averaged before the larger is taken
        need = max(
            math.ceil(max(committed, seen) / per_replica)
            for committed, seen, per_replica in zip(self.committed, observed, capacity, strict=True)
        )
        history.append((fleet.time, need))
        while history[0][0] < fleet.time - self.stabilisation_s:
            history.popleft()
        need = max(count for _, count in history)
        return max(self.min_replicas, min(self.max_replicas, need))
