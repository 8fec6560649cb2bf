"""Invariants of TokenPoolGate under random traffic (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import SERVICE_CLASSES, Resources, TokenEntitlement, TokenPool, TokenPoolGate

BPT = 10


@st.composite
def pools(draw: st.DrawFn) -> TokenPool:
    """A pool of 1-4 entitlements whose reservations fit its capacity."""
    n = draw(st.integers(1, 4))
    ents = []
    for i in range(n):
        cls = SERVICE_CLASSES[draw(st.sampled_from(sorted(SERVICE_CLASSES)))]
        conc = draw(st.integers(1, 4))
        base = Resources(draw(st.integers(50, 400)), conc * 100 * BPT, conc)
        burst = None
        if cls.can_burst and draw(st.booleans()):
            extra = draw(st.integers(1, 4))
            burst = Resources(base.tokens_per_s * 2, (conc + extra) * 100 * BPT, conc + extra)
        ents.append(
            TokenEntitlement(
                f"t{i}",
                cls,
                base,
                burst,
                slo_target_s=draw(st.floats(0.1, 30)),
                max_output_tokens=draw(st.integers(1, 40)),
            )
        )
    reserved = TokenPool("probe", Resources(1e9, 10**12, 10**6), ents).reserved
    slots = reserved[2] + draw(st.integers(1, 8))
    kv = reserved[1] + draw(st.integers(100, 2000)) * BPT
    tps = reserved[0] + draw(st.integers(1, 1000))
    return TokenPool("p", Resources(tps, kv, slots), ents)


ops = st.lists(
    st.tuples(
        st.sampled_from(["check", "check", "release"]),
        st.integers(0, 4),  # tenant index (4 is unknown)
        st.integers(1, 60),  # prompt_len
        st.integers(1, 60),  # decode_len
        st.floats(0, 3),  # time step
    ),
    max_size=80,
)


def _check_invariants(gate: TokenPoolGate, tenants: list[str]) -> None:
    ps = gate.pool_state()
    cap = ps.capacity
    totals = [0, 0, 0]
    for tenant in tenants:
        u = gate.usage(tenant)
        ent = gate.entitlement(tenant)
        assert ent is not None
        assert 0 <= u.in_flight <= ent.limits.concurrency
        assert 0 <= u.kv_bytes <= ent.limits.kv_bytes
        if ent.service_class.protected and not ent.service_class.can_burst:
            assert u.in_flight <= ent.baseline.concurrency
        totals[0] += u.in_flight
        totals[1] += u.kv_bytes
        totals[2] += u.tokens
    assert [ps.in_flight, ps.kv_bytes, ps.tokens] == totals
    _, res_kv, res_slots = gate.pool.reserved
    # Protected holdings plus the reservations not in use never exceed the capacity.
    assert ps.protected_in_flight + res_slots - ps.reserved_used_slots <= cap.concurrency
    assert ps.protected_kv_bytes + res_kv - ps.reserved_used_kv_bytes <= cap.kv_bytes


class TestGateInvariants:
    @settings(max_examples=100, deadline=None)
    @given(pools(), ops)
    def test_counters_bounded_and_conserved(
        self, pool: TokenPool, steps: list[tuple[str, int, int, int, float]]
    ) -> None:
        """Limits and protected capacity hold after every step; all counters return to zero."""
        gate = TokenPoolGate(pool, BPT)
        tenants = [e.tenant for e in pool.entitlements]
        held: list[Request] = []
        now = 0.0
        for i, (op, who, prompt, decode, dt) in enumerate(steps):
            now += dt
            if op == "release" and held:
                gate.release(held.pop(who % len(held)), now)
            elif op == "check":
                tenant = tenants[who] if who < len(tenants) else "stranger"
                req = Request(f"r{i}", prompt, decode, now, tenant)
                decision = gate.check(req, now)
                assert decision.admitted or decision.retry_after > 0
                if tenant == "stranger":
                    assert decision.reason == "unknown-tenant"
                if decision.admitted:
                    held.append(req)
            _check_invariants(gate, tenants)
        for req in held:
            gate.release(req, now)
        ps = gate.pool_state()
        assert (ps.in_flight, ps.kv_bytes, ps.tokens) == (0, 0, 0)
        assert (ps.protected_in_flight, ps.protected_kv_bytes) == (0, 0)
        assert (ps.reserved_used_slots, ps.reserved_used_kv_bytes) == (0, 0)
        for tenant in tenants:
            u = gate.usage(tenant)
            assert (u.in_flight, u.kv_bytes, u.tokens) == (0, 0, 0)

    @settings(max_examples=100, deadline=None)
    @given(pools(), ops, st.lists(st.integers(1, 40), min_size=1, max_size=5))
    def test_capacity_changes_conserve(
        self, pool: TokenPool, steps: list[tuple[str, int, int, int, float]], slots: list[int]
    ) -> None:
        """Outages and recoveries never break limits or conservation; a refused change
        changes nothing."""
        gate = TokenPoolGate(pool, BPT)
        tenants = [e.tenant for e in pool.entitlements]
        held: list[Request] = []
        now = 0.0
        for i, (op, who, prompt, decode, dt) in enumerate(steps):
            now += dt
            if i % 7 == 3:
                cap = pool.capacity
                new = Resources(cap.tokens_per_s, cap.kv_bytes, slots[i % len(slots)])
                before = gate.pool_state()
                try:
                    gate.set_capacity(new, now)
                except ValueError:
                    assert gate.pool_state() == before
            if op == "release" and held:
                gate.release(held.pop(who % len(held)), now)
            elif op == "check" and who < len(tenants):
                req = Request(f"r{i}", prompt, decode, now, tenants[who])
                if gate.check(req, now).admitted:
                    held.append(req)
            for tenant in tenants:
                u = gate.usage(tenant)
                ent = gate.entitlement(tenant)
                assert ent is not None
                assert 0 <= u.in_flight <= ent.limits.concurrency
        for req in held:
            gate.release(req, now)
        ps = gate.pool_state()
        assert (ps.in_flight, ps.kv_bytes, ps.tokens, ps.reserved_used_slots) == (0, 0, 0, 0)
