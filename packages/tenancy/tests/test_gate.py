"""TokenPoolGate: the ordered checks of seed 004 §4.3, state, debt and burst updates."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import attrs
import pytest

from kvpolicy.kvmodel import GateDecision, Request, RequestGate, get_model
from kvpolicy.tenancy import (
    EntitlementState,
    GateConfig,
    PoolState,
    Resources,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
    UnknownRequestError,
    admission_decision,
    priority_weight,
)

MakeRequest = Callable[..., Request]
BPT = 100  # KV bytes per token: a 64-token prompt is charged 128 tokens and 12,800 bytes
PAPER = GateConfig(overcommit=True)  # seed 004: priority over-commits a full pool


def _pool(*ents: TokenEntitlement, slots: int = 16, tps: float = 240) -> TokenPool:
    return TokenPool("p", Resources(tps, 10**7, slots), ents)


def _decisions(gate: TokenPoolGate, reqs: list[Request], time: float = 0.0) -> list[str]:
    return [gate.check(r, time).reason or "ok" for r in reqs]


class TestOrderedChecks:
    def test_is_a_request_gate(self, small_pool: TokenPool) -> None:
        """The gate implements kvmodel's RequestGate Protocol."""
        assert isinstance(TokenPoolGate(small_pool, BPT), RequestGate)

    def test_unknown_tenant(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """A tenant without entitlement is denied, with the longest Retry-After."""
        gate = TokenPoolGate(small_pool, BPT)
        decision = gate.check(make_request("nobody"), 0.0)
        assert decision == GateDecision(admitted=False, retry_after=60.0, reason="unknown-tenant")
        assert gate.pool_state().in_flight == 0

    def test_default_entitlement(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """With a default entitlement each unknown tenant gets its own copy of it."""
        default = TokenEntitlement("*", "spot", Resources(100, 10**6, 1), max_output_tokens=64)
        gate = TokenPoolGate(small_pool, BPT, default_entitlement=default)
        assert _decisions(gate, [make_request("x"), make_request("y"), make_request("x")]) == [
            "ok",
            "ok",
            "concurrency",
        ]
        assert gate.entitlement("x") == TokenEntitlement(
            "x", "spot", Resources(100, 10**6, 1), max_output_tokens=64
        )

    def test_default_entitlement_cannot_reserve(self, small_pool: TokenPool) -> None:
        """A guaranteed default entitlement is refused."""
        default = TokenEntitlement("*", "guaranteed", Resources(1, 1, 1))
        with pytest.raises(ValueError, match="'default_entitlement' must not reserve capacity"):
            TokenPoolGate(small_pool, BPT, default_entitlement=default)

    def test_oversized(self, make_request: MakeRequest) -> None:
        """A request that can never fit its entitlement is denied as oversized."""
        ent = TokenEntitlement("a", "spot", Resources(1, 10**6, 4), max_output_tokens=10)
        gate = TokenPoolGate(_pool(ent), BPT)
        decision = gate.check(make_request("a", prompt_len=51), 0.0)  # 61 tokens > 60 s * 1/s
        assert (decision.reason, decision.retry_after) == ("oversized", 60.0)
        assert gate.usage("a") == EntitlementState()

    def test_concurrency(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Spot's ninth request finds its 8 slots taken; one completes in 1024 / (120 * 8) s."""
        gate = TokenPoolGate(small_pool, BPT)
        reqs = [make_request("s") for _ in range(9)]
        assert _decisions(gate, reqs) == ["ok"] * 8 + ["concurrency"]
        assert gate.check(make_request("s"), 0.0).retry_after == pytest.approx(1024 / 960)

    def test_tokens(self, make_request: MakeRequest) -> None:
        """A bucket of 60 tokens at 1 token/s funds two 30-token requests, then waits 30 s."""
        ent = TokenEntitlement("a", "spot", Resources(1, 10**6, 100), max_output_tokens=10)
        gate = TokenPoolGate(_pool(ent), BPT)
        reqs = [make_request("a", prompt_len=20) for _ in range(3)]
        assert _decisions(gate, reqs) == ["ok", "ok", "tokens"]
        assert gate.check(make_request("a", prompt_len=20), 0.0).retry_after == 30.0
        assert _decisions(gate, [make_request("a", prompt_len=20)], time=30.0) == ["ok"]

    def test_kv_cache(self, make_request: MakeRequest) -> None:
        """30,000 KV bytes hold two requests of 12,800; the third waits for 8,400 bytes."""
        ent = TokenEntitlement("a", "spot", Resources(128, 30_000, 10), max_output_tokens=64)
        gate = TokenPoolGate(_pool(ent), BPT)
        reqs = [make_request("a") for _ in range(3)]
        assert _decisions(gate, reqs) == ["ok", "ok", "kv-cache"]
        # Two requests of 128 tokens drain at 128 tokens/s: one completion a second, each
        # freeing 12,800 bytes.
        assert gate.check(make_request("a"), 0.0).retry_after == pytest.approx(8400 / 12800)

    def test_checks_in_order(self, make_request: MakeRequest) -> None:
        """Concurrency is checked before tokens and tokens before KV."""
        ent = TokenEntitlement("a", "spot", Resources(2.2, 12_800, 1), max_output_tokens=64)
        gate = TokenPoolGate(_pool(ent), BPT)
        assert _decisions(gate, [make_request("a"), make_request("a")]) == ["ok", "concurrency"]

    def test_priority_under_contention(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """Unused reservations are held; spot is denied on a full pool, elastic displaces it."""
        gate = TokenPoolGate(small_pool, BPT, config=PAPER)
        es = [make_request("e") for _ in range(8)]
        ss = [make_request("s") for _ in range(4)]
        assert _decisions(gate, es + ss) == ["ok"] * 12  # 12 + g's 4 reserved = 16
        decision = gate.check(make_request("s"), 0.0)
        # 12 requests of 128 tokens drain at 240 tokens/s: 1.875 completions a second, and
        # one must complete before a slot is free.
        assert decision == GateDecision(False, 1 / 1.875, "priority")
        assert _decisions(gate, [make_request("g") for _ in range(4)]) == ["ok"] * 4
        assert gate.threshold() == 0.25  # spot: 1 / (1 + 2 * 3 / 2)
        gate.release(es[0], 0.0)
        assert _decisions(gate, [make_request(t) for t in "ses"]) == ["ok", "ok", "priority"]
        assert gate.pool_state().in_flight == 17  # elastic (33.3 > 0.25) over-commits

    def test_priorities(self, small_pool: TokenPool) -> None:
        """Weights follow eq. (1) with the pool mean SLO of 2 s."""
        gate = TokenPoolGate(small_pool, BPT)
        assert [gate.priority(t) for t in "ges"] == [500.0, pytest.approx(100 / 3), 0.25]
        with pytest.raises(KeyError, match="'tenant' has no entitlement: 'x'"):
            gate.priority("x")

    def test_threshold_is_infinite_when_idle(self, small_pool: TokenPool) -> None:
        """With nothing in flight nothing can be displaced."""
        assert TokenPoolGate(small_pool, BPT).threshold() == float("inf")

    def test_bytes_per_token_from_model(self, small_pool: TokenPool) -> None:
        """A ModelSpec gives its KV bytes per token."""
        model = get_model("Llama-3-8B")
        gate = TokenPoolGate(small_pool, model)
        assert gate.bytes_per_token == model.kv_bytes_per_token() == 131072


class TestStateConsistency:
    def test_denied_holds_nothing(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """A denied request changes no in-flight counter."""
        gate = TokenPoolGate(small_pool, BPT)
        _decisions(gate, [make_request("s") for _ in range(8)])
        before = gate.pool_state()
        assert not gate.check(make_request("s"), 0.0).admitted
        assert gate.pool_state() == before
        assert gate.usage("s").in_flight == 8

    def test_release_returns_everything(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """After every admitted request is released the counters are zero."""
        gate = TokenPoolGate(small_pool, BPT)
        reqs = [make_request(t) for t in "gggesse"]
        assert _decisions(gate, reqs) == ["ok"] * 7
        assert gate.pool_state().reserved_used_slots == 3
        for r in reqs:
            gate.release(r, 1.0)
        ps = gate.pool_state()
        assert (ps.in_flight, ps.kv_bytes, ps.tokens) == (0, 0, 0)
        assert (ps.protected_in_flight, ps.protected_kv_bytes) == (0, 0)
        assert (ps.reserved_used_slots, ps.reserved_used_kv_bytes) == (0, 0)
        for t in "ges":
            u = gate.usage(t)
            assert (u.in_flight, u.kv_bytes, u.tokens) == (0, 0, 0)

    def test_release_refunds_unused_tokens(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """A request charged 128 tokens that used 80 gives 48 back to the bucket."""
        gate = TokenPoolGate(small_pool, BPT)
        req = make_request("s", prompt_len=64, decode_len=16)
        gate.check(req, 0.0)
        assert gate.usage("s").bucket == 7200 - 128
        gate.release(req, 0.0)
        assert gate.usage("s").bucket == 7200 - 80
        assert gate.usage("s").served == 80

    def test_release_unknown(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Releasing a request never admitted, or twice, raises and changes nothing."""
        gate = TokenPoolGate(small_pool, BPT)
        req = make_request("s")
        gate.check(req, 0.0)
        gate.release(req, 0.0)
        before = (gate.pool_state(), gate.usage("s"))
        with pytest.raises(UnknownRequestError, match=re.escape(f"'request' {req.request_id!r}")):
            gate.release(req, 0.0)
        with pytest.raises(UnknownRequestError, match="never admitted, or released already"):
            gate.release(make_request("s"), 0.0)
        assert (gate.pool_state(), gate.usage("s")) == before

    def test_check_twice(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Checking a request that is in flight raises and changes nothing."""
        gate = TokenPoolGate(small_pool, BPT)
        req = make_request("s")
        gate.check(req, 0.0)
        before = gate.usage("s")
        with pytest.raises(ValueError, match="is already admitted and not released"):
            gate.check(req, 0.0)
        assert gate.usage("s") == before

    def test_bad_arguments(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Bad times, requests and settings name the parameter."""
        gate = TokenPoolGate(small_pool, BPT)
        with pytest.raises(ValueError, match="'time' must be finite and >= 0: -1"):
            gate.check(make_request("s"), -1)
        with pytest.raises(TypeError, match="'time' must be a number: None"):
            gate.check(make_request("s"), None)  # type: ignore[arg-type]
        held = make_request("s")
        assert gate.check(held, 0.0).admitted
        before = (gate.usage("s"), gate.pool_state())
        for bad in (math.nan, math.inf):
            with pytest.raises(ValueError, match=f"'time' must be finite and >= 0: {bad}"):
                gate.check(make_request("s"), bad)
            with pytest.raises(ValueError, match=f"'time' must be finite and >= 0: {bad}"):
                gate.release(held, bad)
        assert (gate.usage("s"), gate.pool_state()) == before  # no counter changed
        gate.release(held, 0.0)
        with pytest.raises(TypeError, match="'request' must be Request: 'r'"):
            gate.check("r", 0.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'bytes_per_token' must be > 0: 0"):
            TokenPoolGate(small_pool, 0)
        with pytest.raises(TypeError, match="'store' must implement StateStore"):
            TokenPoolGate(small_pool, 1, store={})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'max_retry_s' must be >= 'min_retry_s'"):
            GateConfig(min_retry_s=2, max_retry_s=1)
        assert gate.pool_state().in_flight == 0


class TestCapacity:
    def test_shrink_contends(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """After an outage halves the slots spot is denied; higher classes displace it."""
        gate = TokenPoolGate(small_pool, BPT, config=PAPER)
        assert _decisions(gate, [make_request("s") for _ in range(6)]) == ["ok"] * 6
        gate.set_capacity(Resources(120, 10**6, 8), 1.0)
        decisions = _decisions(gate, [make_request(t) for t in "eeseg"], 1.0)
        assert decisions == ["ok", "ok", "priority", "ok", "ok"]
        assert gate.pool_state().in_flight == 10

    def test_reserved_must_fit(self, small_pool: TokenPool) -> None:
        """Capacity below the reserved baselines is refused and nothing changes."""
        gate = TokenPoolGate(small_pool, BPT)
        before = gate.pool_state()
        with pytest.raises(ValueError, match="reserved baselines need concurrency=4"):
            gate.set_capacity(Resources(240, 10**6, 3), 1.0)
        assert gate.pool_state() == before


class TestDebtAndBurst:
    def _two_elastic(self) -> TokenPoolGate:
        hi = TokenEntitlement(
            "hi", "elastic", Resources(120, 10**6, 2), slo_target_s=0.5, max_output_tokens=64
        )
        lo = TokenEntitlement(
            "lo", "elastic", Resources(120, 10**6, 2), slo_target_s=30.0, max_output_tokens=64
        )
        return TokenPoolGate(_pool(hi, lo, slots=2), BPT, config=PAPER)

    def test_debt_accrues_and_decays(self, make_request: MakeRequest) -> None:
        """Denied by the pool and served nothing, lo has gap 1 and debt 0.3; then 0.7 a step."""
        gate = self._two_elastic()
        his = [make_request("hi"), make_request("hi")]
        assert _decisions(gate, [*his, make_request("lo")]) == ["ok", "ok", "priority"]
        gate.release(his[0], 5.0)  # runs the update due at t = 5
        assert gate.usage("lo").debt == pytest.approx(0.3)
        assert gate.priority("lo") == pytest.approx(priority_weight(100, 30.0, 15.25, debt=0.3))
        gate.release(his[1], 30.0)  # five more updates without contention
        assert gate.usage("lo").debt == pytest.approx(0.3 * 0.7**5)

    def test_burst_accrues(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Elastic holding 8 slots on a 4-slot baseline bursts (eq. 3) and loses priority."""
        gate = TokenPoolGate(small_pool, BPT)
        es = [make_request("e") for _ in range(8)]
        assert _decisions(gate, es) == ["ok"] * 8
        assert gate.check(make_request("s"), 5.0).admitted  # runs the update due at t = 5
        # served 1024 tokens in 5 s: 204.8 / 60 - 1; KV 102,400 of 250,000; 8 / 4 - 1
        delta = 204.8 / 60 - 1 + 0 + 1
        assert gate.usage("e").burst == pytest.approx(0.3 * delta)
        assert gate.usage("e").debt == pytest.approx(0.3 * -1.0)  # served over 3x baseline
        expected = priority_weight(100, 2.0, 2.0, burst=0.3 * delta, debt=-0.3)
        assert gate.priority("e") == pytest.approx(expected)

    def test_spot_has_no_debt(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """Spot denials accrue no debt."""
        gate = TokenPoolGate(small_pool, BPT)
        _decisions(gate, [make_request("s") for _ in range(12)])
        gate.check(make_request("g"), 10.0)
        assert gate.usage("s").debt == 0.0


class TestBindUnbind:
    def test_join_and_leave(self, small_pool: TokenPool, make_request: MakeRequest) -> None:
        """A bound tenant is admitted and shifts the mean SLO; unbound, it is unknown again."""
        gate = TokenPoolGate(small_pool, BPT)
        late = TokenEntitlement("late", "elastic", Resources(60, 250_000, 2), slo_target_s=6.0)
        gate.bind(late, 1.0)
        assert gate.priority("e") == pytest.approx(100 / (1 + 2 * 2.0 / 3.0))  # mean 3 s
        req = make_request("late")
        assert gate.check(req, 1.0).admitted
        with pytest.raises(ValueError, match="'tenant' 'late' has 1 requests in flight"):
            gate.unbind("late", 2.0)
        gate.release(req, 2.0)
        gate.unbind("late", 2.0)
        assert gate.check(make_request("late"), 2.0).reason == "unknown-tenant"
        assert [e.tenant for e in gate.entitlements] == ["g", "e", "s"]

    def test_bind_reservation_must_fit(self, small_pool: TokenPool) -> None:
        """A guaranteed entitlement beyond the unreserved capacity is refused."""
        gate = TokenPoolGate(small_pool, BPT)
        big = TokenEntitlement("big", "guaranteed", Resources(60, 250_000, 13))
        with pytest.raises(ValueError, match="reserved baselines need concurrency=17"):
            gate.bind(big, 0.0)
        with pytest.raises(ValueError, match="'entitlement' tenant 'g' is bound already"):
            gate.bind(small_pool.entitlements[0], 0.0)
        with pytest.raises(ValueError, match="'tenant' is not bound: 'x'"):
            gate.unbind("x", 0.0)
        assert gate.entitlements == small_pool.entitlements

    def test_reservation_held_when_idle(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """Spot cannot use the idle guaranteed reservation: 16 slots less 4 leave 12."""
        gate = TokenPoolGate(small_pool, BPT, config=PAPER)
        reqs = [make_request("e") for _ in range(8)] + [make_request("s") for _ in range(5)]
        assert _decisions(gate, reqs) == ["ok"] * 12 + ["priority"]


class TestDedicatedBurst:
    def test_burst_stops_at_the_reservations(self, make_request: MakeRequest) -> None:
        """Dedicated bursts over spot but never into guaranteed's reservation."""
        d = TokenEntitlement(
            "d", "dedicated", Resources(40, 10**6, 4), Resources(100, 2 * 10**6, 10)
        )
        g = TokenEntitlement("g", "guaranteed", Resources(80, 10**6, 8))
        s = TokenEntitlement("s", "spot", Resources(80, 10**6, 8))
        gate = TokenPoolGate(_pool(d, g, s, slots=16, tps=10_000), BPT, config=PAPER)
        assert _decisions(gate, [make_request("s") for _ in range(5)]) == ["ok"] * 4 + ["priority"]
        # 4 within d's baseline, 4 bursting over spot, the 9th would eat g's reservation.
        assert _decisions(gate, [make_request("d") for _ in range(9)]) == ["ok"] * 8 + ["priority"]
        assert _decisions(gate, [make_request("g") for _ in range(8)]) == ["ok"] * 8
        ps = gate.pool_state()
        assert (ps.in_flight, ps.protected_in_flight, ps.reserved_used_slots) == (20, 16, 12)


class TestReleaseClamp:
    def test_more_tokens_than_possible_are_clamped(self, caplog: pytest.LogCaptureFixture) -> None:
        """A release claiming 10^9 output tokens refunds nothing and charges nothing more:
        the bucket ends where a release of exactly max_output_tokens leaves it; logged."""
        ent = TokenEntitlement("a", "elastic", Resources(1000, 10**7, 4), max_output_tokens=64)

        def bucket_after(decode_len: int) -> float:
            gate = TokenPoolGate(_pool(ent, tps=10_000), BPT)
            req = Request("r", 64, 1, tenant="a")
            assert gate.check(req, 0.0).admitted
            gate.release(Request("r", 64, decode_len, tenant="a"), 0.0)
            return gate.usage("a").bucket

        with caplog.at_level("INFO", logger="kvpolicy.tenancy"):
            huge = bucket_after(10**9)
        assert huge == bucket_after(64)
        assert huge > 0
        assert "more than the 128 it could produce: clamped" in caplog.text


class TestPoolHardLimit:
    """By default the pool's capacity binds like an entitlement's, whatever the priority."""

    def test_full_pool_denies_every_priority(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """Where seed 004 lets elastic over-commit (17 in flight), the default says pool-full."""
        gate = TokenPoolGate(small_pool, BPT)
        es = [make_request("e") for _ in range(8)]
        ss = [make_request("s") for _ in range(4)]
        assert _decisions(gate, es + ss) == ["ok"] * 12  # 12 + g's 4 reserved = 16
        before = gate.usage("e")
        decision = gate.check(make_request("s"), 0.0)
        assert decision == GateDecision(False, 1 / 1.875, "pool-full")
        assert _decisions(gate, [make_request("g") for _ in range(4)]) == ["ok"] * 4
        gate.release(es[0], 0.0)
        decisions = _decisions(gate, [make_request(t) for t in "ses"])
        assert decisions == ["ok", "pool-full", "pool-full"]
        assert gate.pool_state().in_flight == 16
        after = gate.usage("e")
        assert (after.in_flight, after.contended) == (before.in_flight - 1, 1)

    def test_contention_level_keeps_headroom_for_priority(self, make_request: MakeRequest) -> None:
        """From 3 of 4 slots on only the higher priority is admitted; the 4th slot is its."""
        hi = TokenEntitlement(
            "hi", "elastic", Resources(120, 10**6, 4), slo_target_s=0.5, max_output_tokens=64
        )
        lo = TokenEntitlement(
            "lo", "elastic", Resources(120, 10**6, 4), slo_target_s=30.0, max_output_tokens=64
        )
        config = GateConfig(contention_level=0.75)
        gate = TokenPoolGate(_pool(hi, lo, slots=4, tps=10_000), BPT, config=config)
        assert _decisions(gate, [make_request("lo") for _ in range(4)]) == [
            "ok",
            "ok",
            "ok",
            "priority",
        ]
        assert _decisions(gate, [make_request("hi") for _ in range(2)]) == ["ok", "pool-full"]
        assert gate.pool_state().in_flight == 4

    def test_random_traffic_never_exceeds_the_pool(self, make_request: MakeRequest) -> None:
        """Slots and KV (idle reservations counted) and the token bucket stay within capacity."""
        import random

        rng = random.Random(7)
        ents = [
            TokenEntitlement(
                "d", "dedicated", Resources(40, 10**6, 3), Resources(100, 2 * 10**6, 8)
            ),
            TokenEntitlement("g", "guaranteed", Resources(80, 10**6, 4), slo_target_s=1.0),
            TokenEntitlement("e", "elastic", Resources(80, 10**6, 4), Resources(160, 10**6, 9)),
            TokenEntitlement("s", "spot", Resources(80, 10**6, 12), slo_target_s=30.0),
        ]
        pool = _pool(*ents, slots=16, tps=400)
        for config in (GateConfig(), GateConfig(contention_level=0.8)):
            gate = TokenPoolGate(pool, BPT, config=config)
            held: list[Request] = []
            now = 0.0
            for _ in range(3_000):
                now += rng.expovariate(50.0)
                req = make_request(rng.choice("dges"), prompt_len=rng.randint(1, 200))
                if gate.check(req, now).admitted:
                    held.append(req)
                while held and (len(held) > 14 or rng.random() < 0.4):
                    gate.release(held.pop(rng.randrange(len(held))), now)
                ps = gate.pool_state()
                _, res_kv, res_slots = gate._reserved
                assert ps.in_flight + res_slots - ps.reserved_used_slots <= 16
                assert ps.kv_bytes + res_kv - ps.reserved_used_kv_bytes <= pool.capacity.kv_bytes
                assert ps.bucket >= -1e-9

    @pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, math.nan])
    def test_contention_level_must_be_a_fraction(self, bad: float) -> None:
        message = f"'contention_level' must be in (0, 1]: {bad!r}"
        with pytest.raises(ValueError, match=re.escape(message)):
            GateConfig(contention_level=bad)

    def test_overcommit_must_be_bool(self) -> None:
        with pytest.raises(TypeError, match="overcommit"):
            GateConfig(overcommit="yes")  # type: ignore[arg-type]


class TestReleaseTokens:
    def test_tokens_counted_elsewhere_are_booked(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """``tokens`` overrides ``total_len`` (a gateway counts them in the response)."""
        gate = TokenPoolGate(small_pool, BPT)
        a, b = make_request("s"), make_request("s")
        assert gate.check(a, 0.0).admitted
        assert gate.check(b, 0.0).admitted
        before = gate.usage("s").bucket
        gate.release(a, 0.0, tokens=70)  # charged 128: 58 come back
        assert gate.usage("s").bucket == pytest.approx(before + 58)
        gate.release(b, 0.0, tokens=10**9)  # clamped to the charge: nothing comes back
        assert gate.usage("s").bucket == pytest.approx(before + 58)

    @pytest.mark.parametrize(
        ("bad", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
    )
    def test_bad_tokens_change_nothing(
        self, small_pool: TokenPool, make_request: MakeRequest, bad: object, error: type
    ) -> None:
        gate = TokenPoolGate(small_pool, BPT)
        req = make_request("s")
        assert gate.check(req, 0.0).admitted
        before = (gate.usage("s"), gate.pool_state())
        with pytest.raises(error, match="'tokens' must be"):
            gate.release(req, 1.0, tokens=bad)  # type: ignore[arg-type]
        assert (gate.usage("s"), gate.pool_state()) == before
        gate.release(req, 1.0)
        assert gate.pool_state().in_flight == 0


class TestConfigBounds:
    @pytest.mark.parametrize("name", ["window_s", "update_interval_s", "max_retry_s"])
    def test_absurd_windows_are_refused(self, name: str) -> None:
        """A window of 10^30 s would fund years of traffic at once: refused, named."""
        with pytest.raises(ValueError, match=f"'{name}' must be finite, > 0 and <= 86400: 1e"):
            GateConfig(**{name: 1e30})


class TestAdmissionDecision:
    """The spec as a pure function: same inputs, same outputs, inputs untouched."""

    def test_pure_over_value_objects(self, small_pool: TokenPool) -> None:
        ent = small_pool.entitlement("g")
        assert ent is not None
        s = EntitlementState(bucket=3600.0, bucket_time=0.0)
        ps = PoolState(small_pool.capacity, bucket=14_400.0, bucket_time=0.0)
        args = (ent, s, ps, GateConfig(), small_pool.reserved, 80, 80, 0.0, lambda: True)
        first = admission_decision(*args)
        assert first == admission_decision(*args)
        decision, new_s, new_ps = first
        assert decision.admitted
        assert new_s is not None
        assert new_ps is not None
        assert (new_s.in_flight, new_s.tokens, new_s.bucket) == (1, 80, 3520.0)
        assert (new_ps.in_flight, new_ps.reserved_used_slots) == (1, 1)
        assert (s.in_flight, ps.in_flight) == (0, 0)  # the inputs are values, untouched
        full = attrs.evolve(s, in_flight=4)
        assert admission_decision(ent, full, *args[2:]) == (
            GateDecision(False, 60.0, "concurrency"),
            None,
            None,
        )
