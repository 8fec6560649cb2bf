"""Per-entitlement and per-pool gate state, and where an in-process gate keeps it (§4.3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from attrs import frozen

from kvpolicy.tenancy._entitlements import Resources

__all__ = ["EntitlementState", "Holding", "InMemoryStateStore", "PoolState", "StateStore"]


@frozen
class EntitlementState:
    """What the gate knows of one entitlement (the per-entitlement record of §4.3).

    Built by the gate, which checks every value; kept unvalidated so that a check stays cheap.
    """

    in_flight: int = 0
    """Admitted requests not yet released (concurrency ``r-hat_e``)."""
    kv_bytes: int = 0
    """KV bytes charged to those requests (``chi-hat_e``)."""
    tokens: int = 0
    """Tokens charged to those requests (``prompt_len + max_output_tokens`` each)."""
    bucket: float = 0.0
    """Token-bucket level in tokens at ``bucket_time`` (the throughput window)."""
    bucket_time: float = 0.0
    """Time of the last refill of ``bucket``, seconds."""
    burst: float = 0.0
    """Smoothed burst intensity ``b_e`` (§3.3)."""
    debt: float = 0.0
    """Service debt ``d_e`` (eq. 2)."""
    served: float = 0.0
    """Tokens served during the current control interval (admitted, corrected on release)."""
    contended: int = 0
    """Decisions of the current control interval that met a contended pool: denials by the
    pool (``pool-full``, ``priority``) and admissions over it on priority."""


@frozen
class PoolState:
    """What the gate knows of the whole pool."""

    capacity: Resources
    """Current capacity (shrinks during an outage)."""
    in_flight: int = 0
    """Admitted requests of every entitlement."""
    kv_bytes: int = 0
    """Their KV bytes."""
    tokens: int = 0
    """Their charged tokens."""
    bucket: float = 0.0
    """Pool token-bucket level in tokens at ``bucket_time``; negative after over-commit."""
    bucket_time: float = 0.0
    """Time of the last refill of ``bucket``, seconds."""
    protected_in_flight: int = 0
    """Requests of reserved (dedicated, guaranteed) entitlements."""
    protected_kv_bytes: int = 0
    """Their KV bytes."""
    reserved_used_slots: int = 0
    """``sum_e min(in_flight_e, baseline r_e)`` over reserved entitlements."""
    reserved_used_kv_bytes: int = 0
    """``sum_e min(kv_bytes_e, baseline chi_e)`` over reserved entitlements."""
    next_tick: float = 0.0
    """Time of the next debt and burst update."""


@frozen
class Holding:
    """What one admitted request holds until it is released."""

    tenant: str
    """The entitlement it was charged to."""
    tokens: int
    """Tokens charged at admission."""
    kv_bytes: int
    """KV bytes charged at admission."""


@runtime_checkable
class StateStore(Protocol):
    """Where a :class:`TokenPoolGate` keeps its state.

    The in-memory store serves one gateway process (several gates in it may share one). A
    gate reads, computes every new value, then writes, so a store sees no partial update of
    one decision; that read-decide-write is atomic only within one process, so replicas in
    several processes share a :class:`~kvpolicy.tenancy.RedisLeaseGate` instead, whose
    decisions are Lua scripts atomic inside Redis.
    """

    def entitlement(self, tenant: str) -> EntitlementState | None:
        """The state of ``tenant``'s entitlement, or ``None`` before its first request."""
        ...

    def put_entitlement(self, tenant: str, state: EntitlementState) -> None:
        """Replace the state of ``tenant``'s entitlement."""
        ...

    def tenants(self) -> Iterator[str]:
        """Every tenant that has a state."""
        ...

    def pool(self) -> PoolState | None:
        """The pool's state, or ``None`` before the first request."""
        ...

    def put_pool(self, state: PoolState) -> None:
        """Replace the pool's state."""
        ...

    def holding(self, request_id: str) -> Holding | None:
        """What the admitted request ``request_id`` holds, or ``None``."""
        ...

    def put_holding(self, request_id: str, holding: Holding | None) -> None:
        """Record what ``request_id`` holds; ``None`` forgets it."""
        ...


class InMemoryStateStore:
    """The default :class:`StateStore`: dictionaries in this process."""

    __slots__ = ("_entitlements", "_holdings", "_pool")

    def __init__(self) -> None:
        self._entitlements: dict[str, EntitlementState] = {}
        self._holdings: dict[str, Holding] = {}
        self._pool: PoolState | None = None

    def entitlement(self, tenant: str) -> EntitlementState | None:
        """The state of ``tenant``'s entitlement, or ``None`` before its first request."""
        return self._entitlements.get(tenant)

    def put_entitlement(self, tenant: str, state: EntitlementState) -> None:
        """Replace the state of ``tenant``'s entitlement."""
        self._entitlements[tenant] = state

    def tenants(self) -> Iterator[str]:
        """Every tenant that has a state."""
        return iter(list(self._entitlements))

    def pool(self) -> PoolState | None:
        """The pool's state, or ``None`` before the first request."""
        return self._pool

    def put_pool(self, state: PoolState) -> None:
        """Replace the pool's state."""
        self._pool = state

    def holding(self, request_id: str) -> Holding | None:
        """What the admitted request ``request_id`` holds, or ``None``."""
        return self._holdings.get(request_id)

    def put_holding(self, request_id: str, holding: Holding | None) -> None:
        """Record what ``request_id`` holds; ``None`` forgets it."""
        if holding is None:
            self._holdings.pop(request_id, None)
        else:
            self._holdings[request_id] = holding
