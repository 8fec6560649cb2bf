"""The synthetic workload generator: tenants, arrivals and lengths from a validated config.

Each tenant is an independent renewal process (ServeGen's model of a client) whose rate is
the config's rate times the tenant's ``share`` times its ``rate_multiplier``; the workload is
the superposition of the tenants' processes, cut at ``num_requests`` arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of, min_len, optional

from kvpolicy.kvmodel import Request
from kvpolicy.sim.workloads._arrivals import ArrivalProcess, GammaArrivals, Saturated
from kvpolicy.sim.workloads._calibration import AZURE_CONV_ARRIVALS, AZURE_CONV_QUANTILES
from kvpolicy.sim.workloads._lengthdist import LengthDistribution
from kvpolicy.sim.workloads._prefix import PrefixSharing, assign_prefix_hashes
from kvpolicy.sim.workloads._tenants import TenantSpec, is_lengths
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["SyntheticConfig", "generate"]


def _is_arrivals(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, ArrivalProcess):
        raise TypeError(f"'{attr.name}' must be an ArrivalProcess: {value!r}")


def _to_tenants(value: Iterable[TenantSpec]) -> tuple[TenantSpec, ...]:
    return tuple(value)


def _check_tenants(_inst: object, _attr: object, value: tuple[TenantSpec, ...]) -> None:
    if not value:
        raise ValueError("'tenants' must not be empty")
    names: set[str] = set()
    for i, tenant in enumerate(value):
        if not isinstance(tenant, TenantSpec):
            raise TypeError(f"'tenants[{i}]' must be a TenantSpec: {tenant!r}")
        if tenant.name in names:
            raise ValueError(f"'tenants' must have unique names: {tenant.name!r} repeats")
        names.add(tenant.name)
    total = math.fsum(t.share for t in value)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"'tenants' shares must sum to 1: {total!r}")


@frozen
class SyntheticConfig:
    """What :func:`generate` draws: arrivals, lengths and tenants.

    The defaults are the Azure conversation trace's statistics (see
    :mod:`kvpolicy.sim.workloads._calibration`): Gamma arrivals at 5.53 req/s with CV 1.09,
    its lengths (quantile table), one tenant.
    """

    name: str = field(default="synthetic", validator=[instance_of(str), min_len(1)])
    """Name of the workload (its ``source`` is ``"synthetic:<name>"``)."""
    num_requests: int = field(default=1000, validator=[instance_of(int), ge(1)])
    """Requests to generate."""
    arrivals: ArrivalProcess = field(default=AZURE_CONV_ARRIVALS, validator=_is_arrivals)
    """The base arrival process; each tenant runs it scaled to its rate."""
    lengths: LengthDistribution = field(default=AZURE_CONV_QUANTILES, validator=is_lengths)
    """Lengths of tenants that set none."""
    tenants: tuple[TenantSpec, ...] = field(
        default=(TenantSpec("default"),), converter=_to_tenants, validator=_check_tenants
    )
    """The tenants; shares sum to 1."""
    prefix: PrefixSharing | None = field(
        default=None, validator=optional(instance_of(PrefixSharing))
    )
    """Prefix reuse (system prompts, conversation follow-ups); ``None``: no prefix hashes."""

    def __attrs_post_init__(self) -> None:
        if isinstance(self.arrivals, Saturated):
            for t in self.tenants:
                if t.cv is not None:
                    raise ValueError(
                        f"'tenants' cannot set a cv with saturated arrivals: "
                        f"{t.name!r} has cv={t.cv!r}"
                    )

    def tenant_arrivals(self, tenant: TenantSpec) -> ArrivalProcess:
        """The arrival process of one tenant."""
        process = self.arrivals.scaled(tenant.share * tenant.rate_multiplier)
        if tenant.cv is not None:
            return GammaArrivals(rate=process.rate, cv=tenant.cv)
        return process


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"'seed' must be int: {seed!r}")
    if seed < 0:
        raise ValueError(f"'seed' must be >= 0: {seed}")
    return seed


def generate(config: SyntheticConfig, seed: int = 0) -> Workload:
    """Draw a workload from ``config``; the same config and seed give the same workload.

    Each tenant's arrivals are drawn until they pass the time of the workload's
    ``num_requests``-th arrival, so the superposition is exact up to that time (no tenant
    runs dry early). Ties (saturated arrivals) are ordered at random.

    Args:
        config: what to draw.
        seed: seed of the ``numpy.random.Generator`` (>= 0).

    Returns:
        A workload named ``config.name`` with ``source == "synthetic:<name>"``.
    """
    if not isinstance(config, SyntheticConfig):
        raise TypeError(f"'config' must be a SyntheticConfig: {config!r}")
    rng = np.random.default_rng(_check_seed(seed))
    n = config.num_requests
    tenants = config.tenants
    processes = [config.tenant_arrivals(t) for t in tenants]
    weights = np.array([t.share * t.rate_multiplier for t in tenants])
    expected = n * weights / weights.sum()
    times = [
        p.sample(math.ceil(e * 1.1) + 8, rng) for p, e in zip(processes, expected, strict=True)
    ]
    while True:
        merged = np.concatenate(times)
        horizon = np.partition(merged, n - 1)[n - 1] if merged.size >= n else math.inf
        short = [i for i, t in enumerate(times) if t[-1] < horizon]
        if not short:
            break
        for i in short:
            extra = processes[i].sample(max(16, times[i].size // 2), rng)
            times[i] = np.concatenate((times[i], times[i][-1] + extra))
    owner = np.concatenate([np.full(t.size, i, dtype=np.int64) for i, t in enumerate(times)])
    tiebreak = rng.random(merged.size)
    order = np.lexsort((tiebreak, merged))[:n]
    chosen_owner = owner[order]
    chosen_time = merged[order]
    lengths = np.empty((n, 2), dtype=np.int64)
    for i, tenant in enumerate(tenants):
        mask = chosen_owner == i
        dist = tenant.lengths if tenant.lengths is not None else config.lengths
        lengths[mask] = dist.sample(int(mask.sum()), rng)
    hashes: list[tuple[int, ...]] = (
        assign_prefix_hashes(lengths[:, 0], chosen_owner, config.prefix, rng)
        if config.prefix is not None
        else [()] * n
    )
    hash_block = config.prefix.block_size if config.prefix is not None else 16
    counters = [0] * len(tenants)
    requests: list[Request] = []
    for t, i, (p, d), h in zip(
        chosen_time.tolist(), chosen_owner.tolist(), lengths.tolist(), hashes, strict=True
    ):
        tenant = tenants[i]
        requests.append(
            Request(
                request_id=f"{tenant.name}-{counters[i]}",
                prompt_len=p,
                decode_len=d,
                arrival_time=t,
                tenant=tenant.name,
                priority=tenant.request_priority,
                prefix_hashes=h,
                hash_block_size=hash_block,
            )
        )
        counters[i] += 1
    return Workload(
        name=config.name,
        requests=tuple(requests),
        source=f"synthetic:{config.name}",
        tenant_specs=config.tenants,
    )
