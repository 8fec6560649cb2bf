"""The cost model of seed 003: eq. (2) and the TTL storage cost of §4.3.

Eq. (2): ``C(x) = c_GPU · GPU-Hours(x) + Σ_k φ_k(s_k(x))``: compute bought by the hour
plus each resource's price applied to its use. Storage is billed per provisioned GiB and
hour (:meth:`TierSpec.cost`), so φ is linear in capacity here; a caller with tiered
billing passes its own prices per configuration. §4.3 prices a TTL by the storage it
occupies, ``Σ_block Capacity_block · TTL_block``: that is the byte-seconds a store
accumulates (:attr:`TierStats.byte_seconds`), which :func:`usage_cost` prices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvpolicy.tiers._check import is_sequence
from kvpolicy.tiers._spec import GIB, TierSpec

__all__ = ["recompute_seconds_saved", "serving_cost", "usage_cost"]


def _nonneg(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number: {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"'{name}' must be finite and >= 0: {value!r}")
    return float(value)


def serving_cost(
    gpu_hours: float, gpu_price_per_hour: float, tiers: Sequence[TierSpec], hours: float
) -> float:
    """Eq. (2): GPU-hours at their price plus every tier's provisioned capacity for ``hours``.

    Example:
        >>> from kvpolicy.tiers import get_tier
        >>> round(serving_cost(8.0, 2.0, [get_tier("dram")], 1.0), 3)  # 16 + 1024 * 0.005
        21.12
    """
    g = _nonneg("gpu_hours", gpu_hours)
    p = _nonneg("gpu_price_per_hour", gpu_price_per_hour)
    h = _nonneg("hours", hours)
    if not is_sequence(tiers):
        raise TypeError(f"'tiers' must be a sequence of TierSpec: {tiers!r}")
    storage = 0.0
    for t in tiers:
        if not isinstance(t, TierSpec):
            raise TypeError(f"'tiers' must hold TierSpec values: {t!r}")
        storage += t.cost(h)
    return g * p + storage


def usage_cost(byte_seconds: float, tier: TierSpec) -> float:
    """Price of ``byte_seconds`` of occupancy in ``tier`` (the §4.3 storage cost)."""
    b = _nonneg("byte_seconds", byte_seconds)
    if not isinstance(tier, TierSpec):
        raise TypeError(f"'tier' must be a TierSpec: {tier!r}")
    return b / GIB / 3600.0 * tier.price_per_gib_hour


def recompute_seconds_saved(
    hit_blocks: int, prefill_seconds_per_block: float, load_seconds: float
) -> float:
    """GPU seconds a cache hit saves: the prefill it skips minus the load it costs.

    Negative when loading is slower than recomputing (Observation 2 of seed 003: disk
    "often makes KV reloading slower than recomputation" unless the load hides in the
    request's queueing time).
    """
    if isinstance(hit_blocks, bool) or not isinstance(hit_blocks, int):
        raise TypeError(f"'hit_blocks' must be an int: {hit_blocks!r}")
    if hit_blocks < 0:
        raise ValueError(f"'hit_blocks' must be >= 0: {hit_blocks!r}")
    p = _nonneg("prefill_seconds_per_block", prefill_seconds_per_block)
    s = _nonneg("load_seconds", load_seconds)
    return hit_blocks * p - s
