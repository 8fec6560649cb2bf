"""Token pools and entitlements in seed 004's three inference-native dimensions (§3.1)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import instance_of

from kvpolicy.tenancy._classes import ServiceClass, service_class

__all__ = ["Resources", "TokenEntitlement", "TokenPool"]


# Bounds on what a pool can describe: beyond them a value is a mistake, and arithmetic in
# Redis's Lua (IEEE doubles, exact to 2**53) would lose counts.
MAX_TOKENS_PER_S = 1e12
MAX_KV_BYTES = 2**53
MAX_CONCURRENCY = 10**7
MAX_OUTPUT_TOKENS = 10**8
MAX_SLO_S = 86_400.0 * 365
MAX_NAME = 253  # a Kubernetes object name
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BOUNDS = {
    "tokens_per_s": MAX_TOKENS_PER_S,
    "kv_bytes": MAX_KV_BYTES,
    "concurrency": MAX_CONCURRENCY,
    "max_output_tokens": MAX_OUTPUT_TOKENS,
    "slo_target_s": MAX_SLO_S,
}


def _positive_finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= _BOUNDS[attribute.name]):
        raise ValueError(
            f"'{attribute.name}' must be finite, > 0 and <= {_BOUNDS[attribute.name]:g}: {value!r}"
        )


def _positive_int(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be int: {_short(value)}")
    if not 0 < value <= _BOUNDS[attribute.name]:
        raise ValueError(
            f"'{attribute.name}' must be > 0 and <= {_BOUNDS[attribute.name]}: {_short(value)}"
        )


def _name(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be str: {_short(value)}")
    if not 0 < len(value) <= MAX_NAME:
        raise ValueError(
            f"'{attribute.name}' must have 1 to {MAX_NAME} characters: {_short(value)}"
        )
    if _CONTROL.search(value):
        raise ValueError(f"'{attribute.name}' must not contain control characters: {_short(value)}")


def _short(value: object) -> str:
    """``repr(value)``, cut to 80 characters: an error never renders a huge value."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**18 else "<huge int>"
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"must be a number: {_short(value)}")
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: the bound check names it
        return math.inf


@frozen
class Resources:
    """An amount of capacity in the three dimensions of seed 004 §3.1.

    Used for a pool's capacity ``(Lambda_p, X_p, R_p)`` and for an entitlement's baseline
    ``(lambda_e, chi_e, r_e)`` and burst limits.
    """

    tokens_per_s: float = field(converter=_number, validator=_positive_finite)
    """Token throughput ``lambda`` in tokens per second (input plus output tokens)."""
    kv_bytes: int = field(validator=_positive_int)
    """KV-cache capacity ``chi`` in bytes."""
    concurrency: int = field(validator=_positive_int)
    """Active sequences ``r`` (decode slots)."""

    def fits_in(self, other: Resources) -> bool:
        """Whether every dimension is at most ``other``'s."""
        return (
            self.tokens_per_s <= other.tokens_per_s
            and self.kv_bytes <= other.kv_bytes
            and self.concurrency <= other.concurrency
        )


def _to_class(value: str | ServiceClass) -> ServiceClass:
    return service_class(value)


def _is_resources(_inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Resources):
        raise TypeError(f"'{attribute.name}' must be Resources: {value!r}")


@frozen
class TokenEntitlement:
    """One tenant's right to a token pool's capacity (seed 004 §3.1-§3.2, the
    ``TokenEntitlement`` resource of §4.2).

    A gateway does not know how many tokens a request will generate, so it charges each
    request ``prompt_len + max_output_tokens`` tokens and that many tokens of KV (the
    ``max_tokens`` default of §4.3 check 2).
    """

    tenant: str = field(validator=_name)
    """Tenant name (1 to 253 characters, no control characters); requests carry it in
    ``Request.tenant``."""
    service_class: ServiceClass = field(converter=_to_class)
    """Service class ``kappa_e`` (a :class:`ServiceClass` or its name)."""
    baseline: Resources = field(validator=_is_resources)
    """Baseline ``(lambda_e, chi_e, r_e)``: reserved for dedicated and guaranteed, honoured over
    time for elastic, a plain cap for spot and preemptible (which have no guarantee)."""
    burst: Resources | None = field(default=None, validator=_is_resources)
    """Burst limits, at least the baseline in every dimension; ``None`` means the baseline.
    Classes that cannot burst (guaranteed) must leave it ``None`` or equal to the baseline."""
    slo_target_s: float = field(default=1.0, converter=_number, validator=_positive_finite)
    """SLO latency target ``l*_e`` in seconds (tighter targets raise priority, eq. 1)."""
    max_output_tokens: int = field(default=256, validator=_positive_int)
    """Output tokens charged per request at admission (the request's ``max_tokens``)."""

    def __attrs_post_init__(self) -> None:
        if self.burst is None:
            return
        if not self.baseline.fits_in(self.burst):
            raise ValueError(
                f"'burst' must be at least 'baseline' in every dimension: {self.burst!r} "
                f"< {self.baseline!r}"
            )
        if not self.service_class.can_burst and self.burst != self.baseline:
            raise ValueError(
                f"'burst' must equal 'baseline' for service class "
                f"{self.service_class.name!r}, which cannot burst: {self.burst!r}"
            )

    @property
    def limits(self) -> Resources:
        """What the entitlement may hold at most: its burst limits, or its baseline."""
        return self.baseline if self.burst is None else self.burst

    def request_tokens(self, prompt_len: int) -> int:
        """Tokens charged at admission: ``prompt_len + max_output_tokens`` (§3.1 cost)."""
        return prompt_len + self.max_output_tokens


_TENANT = attrs.fields(TokenEntitlement).tenant
_FIELDS = tuple(a.name for a in attrs.fields(TokenEntitlement) if a.name != "tenant")


def renamed(ent: TokenEntitlement, tenant: str) -> TokenEntitlement:
    """``ent`` for another ``tenant``: what ``attrs.evolve(ent, tenant=tenant)`` gives,
    validating only the name (the rest was when ``ent`` was built), for manifests of many
    entitlements that differ only in their tenant.

    Raises:
        TypeError, ValueError: ``tenant`` is not a valid name.
    """
    _name(ent, _TENANT, tenant)
    new = object.__new__(TokenEntitlement)
    setattr_ = object.__setattr__  # frozen: as attrs's own __init__ sets its fields
    setattr_(new, "tenant", tenant)
    for name in _FIELDS:
        setattr_(new, name, getattr(ent, name))
    return new


def _entitlements(value: Iterable[TokenEntitlement]) -> tuple[TokenEntitlement, ...]:
    return tuple(value)


@frozen
class TokenPool:
    """A pool's capacity and the entitlements bound to it (the ``TokenPool`` of §4.2).

    The reserved baselines (dedicated and guaranteed) must fit the capacity in every
    dimension, since the pool promises them even when other tenants are busy.
    """

    name: str = field(validator=_name)
    """Pool name, e.g. the model it serves (1 to 253 characters, no control characters)."""
    capacity: Resources = field(validator=instance_of(Resources))
    """Pool capacity ``(Lambda_p, X_p, R_p)``."""
    entitlements: tuple[TokenEntitlement, ...] = field(converter=_entitlements)
    """Entitlements bound to the pool, one per tenant."""
    _by_tenant: MappingProxyType[str, TokenEntitlement] = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        seen: dict[str, TokenEntitlement] = {}
        for i, ent in enumerate(self.entitlements):
            if not isinstance(ent, TokenEntitlement):
                raise TypeError(f"'entitlements[{i}]' must be TokenEntitlement: {ent!r}")
            if ent.tenant in seen:
                raise ValueError(f"'entitlements' has tenant {ent.tenant!r} twice")
            seen[ent.tenant] = ent
        check_reserved_fit(self.entitlements, self.capacity)
        object.__setattr__(self, "_by_tenant", MappingProxyType(seen))

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement of ``tenant``, or ``None`` when the pool has none."""
        return self._by_tenant.get(tenant)

    @property
    def mean_slo_s(self) -> float:
        """Pool-average SLO ``l-bar*`` of eq. (1): the mean SLO target over the entitlements
        (1.0 for a pool without entitlements)."""
        if not self.entitlements:
            return 1.0
        return sum(e.slo_target_s for e in self.entitlements) / len(self.entitlements)

    @property
    def reserved(self) -> tuple[float, int, int]:
        """Sum of the reserved baselines: ``(tokens_per_s, kv_bytes, concurrency)``."""
        return _reserved(self.entitlements)


def over_capacity(i: int, ent: TokenEntitlement, cap: Resources) -> None:
    """Raise ``ValueError`` naming the field when ``ent``'s limits exceed ``cap`` (a
    manifest's check: an entitlement can never use more than its pool)."""
    if ent.limits.fits_in(cap):
        return
    lim = ent.limits
    for dim, mine, pools in (
        ("concurrency", lim.concurrency, cap.concurrency),
        ("kv_bytes", lim.kv_bytes, cap.kv_bytes),
        ("tokens_per_s", lim.tokens_per_s, cap.tokens_per_s),
    ):
        if mine > pools:
            part = "baseline" if ent.burst is None else "burst"
            raise ValueError(
                f"'entitlements[{i}].{part}.{dim}' ({mine:g}) exceeds the pool's capacity "
                f"({pools:g}): tenant {_short(ent.tenant)}"
            )


def _reserved(entitlements: Iterable[TokenEntitlement]) -> tuple[float, int, int]:
    tps, kv, conc = 0.0, 0, 0
    for ent in entitlements:
        if ent.service_class.protected:
            tps += ent.baseline.tokens_per_s
            kv += ent.baseline.kv_bytes
            conc += ent.baseline.concurrency
    return tps, kv, conc


def fundable_tokens(
    limits: Resources, capacity: Resources, window_s: float, bytes_per_token: int
) -> int:
    """The largest charge (``prompt_len + max_output_tokens``) an entitlement with
    ``limits`` in a pool of ``capacity`` can ever fund: one token-bucket window of either
    rate, and the KV bytes of either."""
    return int(
        min(
            limits.tokens_per_s * window_s,
            capacity.tokens_per_s * window_s,
            limits.kv_bytes // bytes_per_token,
            capacity.kv_bytes // bytes_per_token,
        )
    )


def check_reserved_fit(entitlements: Iterable[TokenEntitlement], capacity: Resources) -> None:
    """Raise ``ValueError`` when the reserved baselines exceed ``capacity`` in some dimension."""
    tps, kv, conc = _reserved(entitlements)
    for dim, need, have in (
        ("tokens_per_s", tps, capacity.tokens_per_s),
        ("kv_bytes", kv, capacity.kv_bytes),
        ("concurrency", conc, capacity.concurrency),
    ):
        if need > have:
            raise ValueError(
                f"reserved baselines need {dim}={need} but 'capacity' has {dim}={have}"
            )
