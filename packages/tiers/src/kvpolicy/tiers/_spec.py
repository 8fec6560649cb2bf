"""Storage tiers below (and including) HBM: capacity, bandwidth, latency and price.

Seed 003 (Kareto) treats the storage medium as decision variable X3 ("latency profile,
bandwidth limits, pricing tiers", §3.1.1) and prices it per provisioned capacity and hour
(the second term of eq. (2)). A :class:`TierSpec` is that description for one tier.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt

from kvpolicy.tiers._errors import UnknownTierError

__all__ = ["GIB", "TIER_PRESETS", "TierSpec", "get_tier", "provisioned_bandwidth"]

GIB = 1 << 30
"""Bytes in one GiB; capacities in presets and prices are per GiB."""


def _finite(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{attribute.name}' must be finite: {value!r}")


def _int_not_bool(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")


def _number(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{attribute.name}' must be a number: {value!r}")


def _name(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be a str: {value!r}")
    if not value:
        raise ValueError(f"'{attribute.name}' must not be empty: {value!r}")


@frozen
class TierSpec:
    """One storage tier: how much it holds, how fast it moves blocks, what it costs.

    Example:
        >>> dram = get_tier("dram").with_capacity(256 * GIB)
        >>> round(dram.read_seconds(2 * 1024 * 1024), 6)  # one 2 MiB block
        0.000115
    """

    name: str = field(validator=_name)
    """Name reported in :class:`kvpolicy.kvmodel.TierFetch` and in statistics ("dram")."""
    capacity_bytes: int = field(validator=[_int_not_bool, ge(0)])
    """Provisioned capacity in bytes; 0 turns the tier off."""
    read_bandwidth: float = field(validator=[_number, _finite, gt(0)])
    """Bytes per second when loading blocks back towards HBM."""
    write_bandwidth: float = field(validator=[_number, _finite, gt(0)])
    """Bytes per second when storing blocks into this tier."""
    latency: float = field(default=0.0, validator=[_number, _finite, ge(0)])
    """Seconds of fixed access latency paid once per block transfer."""
    price_per_gib_hour: float = field(default=0.0, validator=[_number, _finite, ge(0)])
    """Price of one provisioned GiB for one hour (cloud list-price style, eq. (2))."""

    def read_seconds(self, nbytes: int) -> float:
        """Seconds to read one transfer of ``nbytes`` bytes: latency + bytes / bandwidth."""
        return self.latency + nbytes / self.read_bandwidth

    def write_seconds(self, nbytes: int) -> float:
        """Seconds to write one transfer of ``nbytes`` bytes: latency + bytes / bandwidth."""
        return self.latency + nbytes / self.write_bandwidth

    def with_capacity(self, capacity_bytes: int) -> TierSpec:
        """The same tier provisioned with another capacity (validated)."""
        return attrs.evolve(self, capacity_bytes=capacity_bytes)

    def cost(self, hours: float) -> float:
        """Price of holding this tier's provisioned capacity for ``hours`` hours."""
        if isinstance(hours, bool) or not isinstance(hours, int | float):
            raise TypeError(f"'hours' must be a number: {hours!r}")
        if not math.isfinite(hours) or hours < 0:
            raise ValueError(f"'hours' must be finite and >= 0: {hours!r}")
        return self.capacity_bytes / GIB * self.price_per_gib_hour * hours


def provisioned_bandwidth(
    capacity_bytes: int, base: float, per_gib: float, maximum: float
) -> float:
    """Bandwidth of a cloud disk whose throughput grows with its provisioned size.

    Observation 5 of seed 003: "providers typically scale disk bandwidth linearly with
    allocated storage capacity" (AWS gp3, Alibaba ESSD), up to a cap. Returns
    ``min(base + per_gib * capacity_gib, maximum)`` bytes per second.
    """
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
        raise TypeError(f"'capacity_bytes' must be an int: {capacity_bytes!r}")
    if capacity_bytes < 0:
        raise ValueError(f"'capacity_bytes' must be >= 0: {capacity_bytes!r}")
    for label, value in (("base", base), ("per_gib", per_gib), ("maximum", maximum)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"'{label}' must be finite and >= 0: {value!r}")
    if maximum <= 0:
        raise ValueError(f"'maximum' must be > 0: {maximum!r}")
    return min(base + per_gib * capacity_bytes / GIB, maximum)


# Bandwidths follow seed 003: Table 1 sweeps DRAM bandwidth from 350 MB/s (the
# throughput ceiling of the enterprise SSD of §5.1, Alibaba ESSD PL1) to 100 GB/s and
# shows TTFT flattening beyond 20-40 GB/s, a PCIe host-to-device rate. The paper prices
# with "mainstream cloud pricing" but prints no prices: the prices here are order-of-
# magnitude list prices (DRAM about $0.005 per GiB-hour, cloud SSD about $0.0002),
# meant to be replaced by the caller's own. HBM is billed with the GPU (first term of
# eq. (2)), hence price 0. Capacities: 80 GiB of HBM, the 1024 GiB DRAM baseline of §5.2,
# and 2400 GiB of disk (the top of the coarse grid of §5.3.1).
TIER_PRESETS: MappingProxyType[str, TierSpec] = MappingProxyType(
    {
        "hbm": TierSpec(
            name="hbm",
            capacity_bytes=80 * GIB,
            read_bandwidth=3.35e12,
            write_bandwidth=3.35e12,
            latency=0.0,
            price_per_gib_hour=0.0,
        ),
        "dram": TierSpec(
            name="dram",
            capacity_bytes=1024 * GIB,
            read_bandwidth=20e9,
            write_bandwidth=20e9,
            latency=10e-6,
            price_per_gib_hour=0.005,
        ),
        "disk": TierSpec(
            name="disk",
            capacity_bytes=2400 * GIB,
            read_bandwidth=350e6,
            write_bandwidth=350e6,
            latency=200e-6,
            price_per_gib_hour=0.0002,
        ),
    }
)
"""Preset tiers by name: ``hbm``, ``dram`` and ``disk`` (enterprise cloud SSD)."""


def get_tier(name: str) -> TierSpec:
    """The preset tier called ``name``; raises :class:`UnknownTierError` listing the names."""
    if not isinstance(name, str):
        raise TypeError(f"'name' must be a str: {name!r}")
    try:
        return TIER_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(TIER_PRESETS))
        raise UnknownTierError(f"unknown tier {name!r}; known tiers: {known}") from None
