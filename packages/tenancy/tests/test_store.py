"""Conformance of every StateStore implementation."""

from __future__ import annotations

from collections.abc import Callable

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    EntitlementState,
    Holding,
    PoolState,
    Resources,
    StateStore,
    TokenPool,
    TokenPoolGate,
)


class TestStateStore:
    """Every store, through the ``store_factory`` fixture."""

    def test_is_a_state_store(self, store_factory: Callable[[], StateStore]) -> None:
        """The store implements the Protocol."""
        assert isinstance(store_factory(), StateStore)

    def test_entitlements(self, store_factory: Callable[[], StateStore]) -> None:
        """States are stored per tenant and replaced whole."""
        store = store_factory()
        assert store.entitlement("a") is None
        store.put_entitlement("a", EntitlementState(in_flight=2, debt=0.5))
        store.put_entitlement("b", EntitlementState(burst=1.5))
        store.put_entitlement("a", EntitlementState(in_flight=1, debt=0.25))
        assert store.entitlement("a") == EntitlementState(in_flight=1, debt=0.25)
        assert sorted(store.tenants()) == ["a", "b"]

    def test_pool(self, store_factory: Callable[[], StateStore]) -> None:
        """The pool state round-trips."""
        store = store_factory()
        assert store.pool() is None
        state = PoolState(Resources(240, 10**6, 16), in_flight=3, bucket=-5.5, next_tick=10.0)
        store.put_pool(state)
        assert store.pool() == state

    def test_holdings(self, store_factory: Callable[[], StateStore]) -> None:
        """Holdings are kept until forgotten."""
        store = store_factory()
        store.put_holding("r1", Holding("a", 128, 12_800))
        assert store.holding("r1") == Holding("a", 128, 12_800)
        store.put_holding("r1", None)
        assert store.holding("r1") is None
        store.put_holding("r1", None)  # forgetting twice is harmless

    def test_two_gates_share_counters(
        self, store_factory: Callable[[], StateStore], small_pool: TokenPool
    ) -> None:
        """Two gates over one store see each other's admissions and releases."""
        store = store_factory()
        left = TokenPoolGate(small_pool, 100, store=store)
        right = TokenPoolGate(small_pool, 100, store=store)
        reqs = [Request(f"q{i}", 64, 64, 0.0, "s") for i in range(9)]
        decisions = [(left if i % 2 else right).check(r, 0.0) for i, r in enumerate(reqs)]
        assert [d.reason for d in decisions] == [""] * 8 + ["concurrency"]
        right.release(reqs[1], 1.0)  # admitted by the left gate
        assert left.usage("s").in_flight == 7
        assert left.pool_state() == right.pool_state()
