"""``RedisLeaseGate`` against a real ``redis-server``: exact limits across replica processes,
leases that expire, idempotent releases, and what happens while Redis is away."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    OutagePolicy,
    RedisLeaseGate,
    Resources,
    TokenEntitlement,
    TokenPool,
)

pytestmark = pytest.mark.redis

CONCURRENCY = 8


def _pool(rate: float = 1e6) -> TokenPool:
    return TokenPool(
        "p",
        Resources(2e6, 10**12, 64),
        [
            TokenEntitlement(
                "g", "guaranteed", Resources(rate, 10**9, CONCURRENCY), max_output_tokens=16
            ),
            TokenEntitlement("s", "spot", Resources(1e5, 10**9, 4), max_output_tokens=16),
        ],
    )


def _gate(url: str, ns: str = "t", **kwargs: Any) -> RedisLeaseGate:
    return RedisLeaseGate.from_url(kwargs.pop("pool", _pool()), 1, url, namespace=ns, **kwargs)


def _req(i: int | str, tenant: str = "g", prompt_len: int = 16) -> Request:
    return Request(f"r{i}", prompt_len, 1, tenant=tenant)


class TestDecisions:
    def test_concurrency_is_exact_and_release_frees(self, redis_proc: Any) -> None:
        gate = _gate(redis_proc.url)
        for i in range(CONCURRENCY):
            assert gate.check(_req(i)).admitted
        denied = gate.check(_req("x"))
        assert (denied.admitted, denied.reason) == (False, "entitlement-concurrency")
        assert denied.retry_after > 0
        assert gate.usage("g") == {"in_flight": 8, "kv_bytes": 8 * 32, "tokens": 8 * 32}
        out = gate.release(_req(0), 20)
        assert (out.released, out.charged_tokens, out.clamped) == (True, 20, False)
        assert gate.check(_req("x")).admitted
        for i in [*range(1, CONCURRENCY), "x"]:
            assert gate.release(_req(i)).released
        assert gate.usage("g")["in_flight"] == gate.usage()["in_flight"] == 0

    def test_token_budget_and_oversized(self, redis_proc: Any) -> None:
        """Bucket depth 60 s x 1 token/s = 60 tokens: one 32-token request fits, the second
        does not; a request larger than the depth can never be funded."""
        gate = _gate(redis_proc.url, pool=_pool(rate=1.0))
        assert gate.max_request_tokens("g") == 60
        assert gate.check(_req(0)).admitted
        denied = gate.check(_req(1))
        assert (denied.admitted, denied.reason) == (False, "entitlement-tokens")
        big = gate.check(_req(2, prompt_len=50))
        assert (big.admitted, big.reason) == (False, "oversized")
        assert gate.check(_req(3, tenant="nobody")).reason == "unknown-tenant"

    def test_twice_unknown_and_clamped_releases_change_nothing(self, redis_proc: Any) -> None:
        gate = _gate(redis_proc.url)
        assert gate.check(_req(0)).admitted
        assert gate.check(_req(1)).admitted
        out = gate.release(_req(0), 10**9)
        assert (out.released, out.charged_tokens, out.clamped) == (True, 32, True)
        before = gate.usage("g")
        for again in (gate.release(_req(0)), gate.release("never-admitted", 5)):
            assert (again.released, again.charged_tokens) == (False, 0)
        assert gate.usage("g") == before == {"in_flight": 1, "kv_bytes": 32, "tokens": 32}

    @pytest.mark.parametrize(
        ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
    )
    def test_bad_counts_name_the_field(
        self, redis_proc: Any, value: object, error: type[Exception]
    ) -> None:
        gate = _gate(redis_proc.url)
        assert gate.check(_req(0)).admitted
        with pytest.raises(error, match="produced_tokens"):
            gate.release(_req(0), value)  # type: ignore[arg-type]
        with pytest.raises(error, match="max_output_tokens"):
            gate.check(_req(1), max_output_tokens=value)  # type: ignore[arg-type]
        assert gate.usage("g")["in_flight"] == 1
        assert gate.release(_req(0)).released


class TestFaults:
    def test_expired_leases_come_back_and_late_release_is_void(self, redis_proc: Any) -> None:
        crashed = _gate(redis_proc.url, lease_ttl_s=0.3)
        for i in range(4):
            assert crashed.check(_req(i)).admitted
        time.sleep(0.4)
        survivor = _gate(redis_proc.url, lease_ttl_s=0.3)
        assert survivor.renew() == (0, 0, 4)
        assert survivor.usage("g")["in_flight"] == 0
        assert not crashed.release(_req(0)).released
        assert survivor.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}

    def test_sigkill_of_a_replica_holding_requests(self, redis_proc: Any) -> None:
        ready = mp.get_context("fork").Event()

        def hold() -> None:
            gate = _gate(redis_proc.url, lease_ttl_s=0.5)
            for i in range(4):
                assert gate.check(_req(f"k{i}")).admitted
            ready.set()
            time.sleep(60)

        child = mp.get_context("fork").Process(target=hold)
        child.start()
        assert ready.wait(20)
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join()
        gate = _gate(redis_proc.url, lease_ttl_s=0.5)
        assert gate.usage("g")["in_flight"] == 4
        time.sleep(0.6)
        assert gate.renew()[2] == 4
        assert gate.usage("g")["in_flight"] == gate.usage()["in_flight"] == 0

    def test_redis_restart_mid_run_readopts_running_leases(self, redis_proc: Any) -> None:
        gate = _gate(redis_proc.url)
        for i in range(3):
            assert gate.check(_req(i)).admitted
        redis_proc.stop()
        redis_proc.start()
        assert gate.usage("g")["in_flight"] == 0  # Redis lost everything
        assert gate.renew() == (0, 3, 0)
        assert gate.usage("g")["in_flight"] == 3
        for i in range(3):
            assert gate.release(_req(i)).released
        assert gate.usage("g") == gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}

    def test_outage_per_service_class_then_reconciled(self, redis_proc: Any) -> None:
        """Redis away: guaranteed ``g`` keeps half its baseline (4 of 8) locally, spot fails
        closed; when Redis returns, running leases are adopted and tokens charged once."""
        gate = _gate(redis_proc.url, outage=OutagePolicy(timeout_s=0.2))
        assert gate.check(_req("before")).admitted
        redis_proc.stop()
        spot = gate.check(_req("s0", tenant="s"))
        assert (spot.admitted, spot.reason) == (False, "state-unavailable")
        assert all(gate.check(_req(i)).admitted for i in range(4))
        assert gate.check(_req(4)).reason == "state-unavailable"
        assert gate.release(_req(0), 20).released  # local: charged when Redis returns
        assert gate.release(_req("before"), 30).released  # replayed when Redis returns
        redis_proc.start()
        gate.renew()
        assert gate.usage("g")["in_flight"] == 3
        for i in (1, 2, 3):
            assert gate.release(_req(i)).released
        assert gate.usage("g") == gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}


def _replica(url: str, index: int, decisions: int, out: Any) -> None:
    """Each replica keeps up to 4 requests in flight, so 4 replicas want 16 slots of 8."""
    import random

    import redis

    rng = random.Random(index)
    gate = _gate(url, lease_ttl_s=30)
    probe = redis.Redis.from_url(url)
    held: list[Request] = []
    admitted = violations = peak = 0
    for n in range(decisions):
        req = _req(f"{index}-{n}", prompt_len=8)
        if gate.check(req).admitted:
            admitted += 1
            seen = int(probe.incr("probe"))  # an independent count of requests held
            peak = max(peak, seen)
            violations += seen > CONCURRENCY
            held.append(req)
        if len(held) >= 4 or (held and rng.random() < 0.3):
            done = held.pop(rng.randrange(len(held)))
            probe.decr("probe")
            gate.release(done, 8 + n % 17)
    for done in held:
        probe.decr("probe")
        gate.release(done)
    out.put((admitted, violations, peak))


def _budget_replica(url: str, index: int, decisions: int, out: Any) -> None:
    """Admit and release at once (charging in full): only the token bucket binds."""
    gate = _gate(url, pool=_pool(rate=200.0), window_s=1.0)
    admitted = 0
    for n in range(decisions):
        req = _req(f"b{index}-{n}", prompt_len=8)  # 24 tokens charged
        if gate.check(req).admitted:
            admitted += 24
            gate.release(req)
    out.put(admitted)


class TestReplicas:
    def test_four_replicas_never_exceed_the_token_budget(self, redis_proc: Any) -> None:
        """Bucket depth 200 tokens (1 s at 200 tokens/s): over the run the replicas together
        admit at most depth + rate x elapsed tokens, and nearly all of it."""
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_budget_replica, args=(redis_proc.url, i, 1_500, out))
            for i in range(4)
        ]
        start = time.monotonic()
        for p in procs:
            p.start()
        tokens = sum(out.get(timeout=120) for _ in procs)
        for p in procs:
            p.join()
        elapsed = time.monotonic() - start
        assert tokens <= 200 + 200 * elapsed
        assert tokens >= 200  # the first full bucket at least
        gate = _gate(redis_proc.url)
        assert gate.usage("g") == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}

    def test_four_replica_processes_never_exceed_the_limit(self, redis_proc: Any) -> None:
        """4 processes x 10,000 decisions on one entitlement of concurrency 8: an independent
        probe counter, raised after each admission and lowered before its release, never
        passes 8, and every counter ends at exactly 0."""
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_replica, args=(redis_proc.url, i, 10_000, out)) for i in range(4)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        assert sum(r[1] for r in results) == 0
        assert sum(r[0] for r in results) > 0
        assert max(r[2] for r in results) == CONCURRENCY  # the limit was reached, not passed
        gate = _gate(redis_proc.url)
        assert gate.usage("g") == gate.usage() == {"in_flight": 0, "kv_bytes": 0, "tokens": 0}
