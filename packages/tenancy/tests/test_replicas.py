"""Several gateway replicas over one shared store see one another's admissions."""

from __future__ import annotations

from collections.abc import Callable

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import StateStore, TokenPool, TokenPoolGate


class TestReplicas:
    def test_two_gates_share_one_concurrency_limit(
        self,
        small_pool: TokenPool,
        store_factory: Callable[[], StateStore],
        make_request: Callable[..., Request],
    ) -> None:
        """Guaranteed ``g`` has 4 slots in all: two replicas admit 2 each, then both deny;
        a release on one replica frees the slot for the other."""
        store = store_factory()
        a = TokenPoolGate(small_pool, 1, store=store)
        b = TokenPoolGate(small_pool, 1, store=store)
        held = []
        for i, gate in enumerate((a, b, a, b)):
            r = make_request(tenant="g", prompt_len=8, arrival_time=0.01 * i)
            assert gate.check(r, 0.01 * i).admitted
            held.append(r)
        for gate in (a, b):
            denied = gate.check(make_request(tenant="g", prompt_len=8), 0.1)
            assert (denied.admitted, denied.reason) == (False, "concurrency")
        a.release(held[0], 0.2)
        assert b.check(make_request(tenant="g", prompt_len=8), 0.3).admitted
        assert a.usage("g").in_flight == b.usage("g").in_flight == 4

    def test_a_release_on_another_replica_is_refused_nowhere(
        self,
        small_pool: TokenPool,
        store_factory: Callable[[], StateStore],
        make_request: Callable[..., Request],
    ) -> None:
        """A request admitted by one replica may finish on another (holdings live in the
        store), and the counters return to zero."""
        store = store_factory()
        a = TokenPoolGate(small_pool, 1, store=store)
        b = TokenPoolGate(small_pool, 1, store=store)
        r = make_request(tenant="e", prompt_len=8)
        assert a.check(r, 0.0).admitted
        b.release(r, 1.0)
        assert a.usage("e").in_flight == 0
        assert a.usage("e").kv_bytes == 0
