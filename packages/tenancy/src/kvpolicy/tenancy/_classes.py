"""Seed 004's five service classes (Table 1)."""

from __future__ import annotations

import math
from types import MappingProxyType

import attrs
from attrs import field, frozen
from attrs.validators import in_, instance_of, min_len

__all__ = [
    "DEDICATED",
    "ELASTIC",
    "GUARANTEED",
    "PREEMPTIBLE",
    "SERVICE_CLASSES",
    "SPOT",
    "ServiceClass",
    "service_class",
]


def _positive_weight(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{attribute.name}' must be finite and > 0: {value!r}")


@frozen
class ServiceClass:
    """A service class ``kappa_e`` of seed 004 §3.2: protection, burst rights and base weight.

    The five classes the paper defines are the module constants :data:`DEDICATED`,
    :data:`GUARANTEED`, :data:`ELASTIC`, :data:`SPOT` and :data:`PREEMPTIBLE`; a deployment may
    define its own with other weights.
    """

    name: str = field(validator=[instance_of(str), min_len(1)])  # type: ignore[arg-type]
    """Class name as a manifest spells it, e.g. ``"guaranteed"``."""
    weight: float = field(converter=float, validator=_positive_weight)
    """Base weight ``w_kappa`` of eq. (1) (Table 1: 1000, 1000, 100, 1, 0.1)."""
    baseline: str = field(validator=in_(("reserved", "time-averaged", "none")))
    """How the baseline is honoured: ``reserved`` (held even when idle, never shrunk),
    ``time-averaged`` (through the debt mechanism) or ``none`` (surplus only)."""
    can_burst: bool = field(validator=instance_of(bool))
    """Whether the entitlement may use its burst limits above its baseline."""
    accumulates_debt: bool = field(validator=instance_of(bool))
    """Whether underservice accrues debt ``d_e`` (eq. 2); only elastic in the paper."""
    preemptible: bool = field(default=False, validator=instance_of(bool))
    """Whether running work may be evicted (requests terminated, KV reclaimed)."""

    @property
    def protected(self) -> bool:
        """Reserved baseline that is never shrunk (dedicated and guaranteed)."""
        return self.baseline == "reserved"


DEDICATED = ServiceClass("dedicated", 1000.0, "reserved", can_burst=True, accumulates_debt=False)
"""Reserved baseline, may burst into idle capacity, never shrunk; weight 1000."""
GUARANTEED = ServiceClass("guaranteed", 1000.0, "reserved", can_burst=False, accumulates_debt=False)
"""Reserved baseline without burst (rate-limit semantics), never shrunk; weight 1000."""
ELASTIC = ServiceClass("elastic", 100.0, "time-averaged", can_burst=True, accumulates_debt=True)
"""Baseline honoured over time through debt; may burst, may be shrunk; weight 100."""
SPOT = ServiceClass("spot", 1.0, "none", can_burst=True, accumulates_debt=False)
"""Surplus capacity only, no debt, throttled first; weight 1."""
PREEMPTIBLE = ServiceClass(
    "preemptible", 0.1, "none", can_burst=True, accumulates_debt=False, preemptible=True
)
"""Surplus capacity only, may be evicted outright; weight 0.1."""

SERVICE_CLASSES: MappingProxyType[str, ServiceClass] = MappingProxyType(
    {c.name: c for c in (DEDICATED, GUARANTEED, ELASTIC, SPOT, PREEMPTIBLE)}
)
"""The paper's five classes by name, in protection order (Table 1)."""


def service_class(name: str | ServiceClass) -> ServiceClass:
    """The service class called ``name`` (a :class:`ServiceClass` is returned as it is).

    Raises:
        TypeError: ``name`` is neither a string nor a :class:`ServiceClass`.
        ValueError: ``name`` is not one of :data:`SERVICE_CLASSES`.
    """
    if isinstance(name, ServiceClass):
        return name
    if not isinstance(name, str):
        raise TypeError(f"'service_class' must be str or ServiceClass: {name!r}")
    try:
        return SERVICE_CLASSES[name]
    except KeyError:
        known = ", ".join(SERVICE_CLASSES)
        raise ValueError(f"'service_class' must be one of {known}: {name!r}") from None
