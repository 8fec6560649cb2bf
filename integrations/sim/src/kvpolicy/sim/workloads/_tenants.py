"""Tenants of a workload and seed 004's service classes."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import instance_of, min_len, optional

from kvpolicy.sim.workloads._lengthdist import LengthDistribution

__all__ = ["SERVICE_CLASSES", "TenantSpec", "is_lengths"]

SERVICE_CLASSES: MappingProxyType[str, int] = MappingProxyType(
    {"dedicated": 3, "guaranteed": 3, "elastic": 2, "spot": 1, "preemptible": 0}
)
"""Seed 004's five service classes and the ``Request.priority`` each maps to.

The order is seed 004's protection order (Table 1: weights 1000, 1000, 100, 1, 0.1):
dedicated and guaranteed are never shrunk, elastic may be, spot is throttled first and
preemptible may be evicted.
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
