"""Tenants of a workload and seed 004's service classes."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import instance_of, min_len, optional

from kvpolicy import tenancy as _classes
from kvpolicy.sim.workloads._lengthdist import LengthDistribution

__all__ = ["SERVICE_CLASSES", "TenantSpec", "is_lengths"]


def _priorities() -> MappingProxyType[str, int]:
    # The rank of each class's base weight among kvpolicy-tenancy's classes (seed 004
    # Table 1: 1000, 1000, 100, 1, 0.1), so that the order is tenancy's, not a second table.
    weights = sorted({c.weight for c in _classes.SERVICE_CLASSES.values()})
    return MappingProxyType(
        {name: weights.index(c.weight) for name, c in _classes.SERVICE_CLASSES.items()}
    )


SERVICE_CLASSES: MappingProxyType[str, int] = _priorities()
"""Seed 004's five service classes (kvpolicy-tenancy's) and the ``Request.priority`` each
maps to: the rank of the class's base weight, so dedicated and guaranteed (never shrunk)
rank above elastic (may be), spot (throttled first) and preemptible (may be evicted).
"""


def _check_class(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'service_class' must be str: {value!r}")
    if value not in SERVICE_CLASSES:
        raise ValueError(f"'service_class' must be one of {', '.join(SERVICE_CLASSES)}: {value!r}")


def _positive_finite(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{attr.name}' must be a number: {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{attr.name}' must be finite and > 0: {value!r}")


def _optional_positive(inst: object, attr: attrs.Attribute[float], value: float | None) -> None:
    if value is not None:
        _positive_finite(inst, attr, value)


def is_lengths(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, LengthDistribution):
        raise TypeError(f"'{attr.name}' must be a LengthDistribution: {value!r}")


@frozen
class TenantSpec:
    """One tenant (client) of a synthetic workload."""

    name: str = field(validator=[instance_of(str), min_len(1)])  # type: ignore[arg-type]
    """Tenant name, copied to ``Request.tenant``."""
    share: float = field(default=1.0, validator=_positive_finite)
    """Fraction of the config's base rate this tenant is entitled to; shares sum to 1."""
    service_class: str = field(default="elastic", validator=_check_class)
    """Seed 004 service class (one of :data:`SERVICE_CLASSES`)."""
    priority: int | None = field(default=None, validator=optional(instance_of(int)))
    """``Request.priority``; ``None`` takes the service class's (:data:`SERVICE_CLASSES`)."""
    rate_multiplier: float = field(default=1.0, validator=_positive_finite)
    """Demand over entitlement: the tenant sends at ``share * rate_multiplier`` of the base
    rate (2.0 models a noisy neighbour sending twice its share)."""
    cv: float | None = field(default=None, validator=_optional_positive)
    """Inter-arrival CV of this tenant's Gamma process; ``None`` keeps the config's process."""
    lengths: LengthDistribution | None = field(default=None, validator=is_lengths)
    """This tenant's lengths; ``None`` uses the config's."""

    @property
    def request_priority(self) -> int:
        """The priority its requests carry."""
        return SERVICE_CLASSES[self.service_class] if self.priority is None else self.priority
