"""One table of admission cases (§4.3's checks, pass and fail, contention, over-commit on
and off, releases, debt and burst over idle gaps) run over both gates: the in-process
``TokenPoolGate`` and the Redis ``RedisLeaseGate`` (``clock="request"``). Each case lists its
steps and the reason each check must give (``""``: admitted). Lease expiries have their own
table, run over the Redis gate (the in-process gate holds no leases)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import GateConfig, RedisLeaseGate, TokenPool, TokenPoolGate

BPT = 100  # KV bytes per token: 250,000 bytes hold 2,500 tokens


def C(rid: str, tenant: str, prompt: int = 16, t: float = 0.0) -> tuple[Any, ...]:  # noqa: N802
    return ("check", rid, tenant, prompt, t)


def R(rid: str, t: float = 0.0, tokens: int | None = None) -> tuple[Any, ...]:  # noqa: N802
    return ("release", rid, t, tokens)


def S(tenant: str, t: float, debt: float, burst: float) -> tuple[Any, ...]:  # noqa: N802
    """The tenant's debt (eq. 2) and burst intensity (eq. 3) as of ``t``."""
    return ("state", tenant, t, debt, burst)


def X(rid: str, t: float) -> tuple[Any, ...]:  # noqa: N802
    """The lease of ``rid`` has expired by ``t`` (its holder stopped renewing it): a
    renewal at ``t`` by a replica that holds nothing reclaims it."""
    return ("expire", rid, t)


# Debt and burst after interval 0 (5 s, gamma 0.7) and ``n`` idle intervals, in closed form:
# d = 0.3 g 0.7^n; b = steady + (0.3 delta - steady) 0.7^n, steady the KV and concurrency
# held over the baseline through the idle intervals.
_E_SERVED = 6 * 80 / 5  # e admits 6 requests of 80 tokens in interval 0: 96 tokens/s
_E_GAP = (60 - _E_SERVED) / 60  # over its baseline of 60: credit -0.6
_E_STEADY = 6 / 4 - 1  # 6 in flight of a baseline of 4 (48,000 of 250,000 KV bytes)
_E_DELTA = (_E_SERVED / 60 - 1) + _E_STEADY


# small_pool: 16 slots, 240 tokens/s, 1 MB; g guaranteed 4 slots 60/s 250 kB; e elastic 4
# (burst 8) 60/s (120); s spot 8 120/s 500 kB; each request charged prompt + 64 tokens.
CASES: dict[str, tuple[GateConfig, list[tuple[Any, ...]], list[str]]] = {
    "concurrency": (
        GateConfig(),
        [C(f"g{i}", "g") for i in range(5)],
        ["", "", "", "", "concurrency"],
    ),
    "tokens": (  # g's bucket: 60/s x 60 s = 3,600 tokens; 1,064 charged (and kept) each
        GateConfig(),
        [*(s for i in range(3) for s in (C(f"g{i}", "g", 1000), R(f"g{i}"))), C("g3", "g", 1000)],
        ["", "", "", "tokens"],
    ),
    "kv-cache": (  # 1,064 tokens x 100 bytes; g holds 250,000 bytes
        GateConfig(),
        [C("g0", "g", 1000), C("g1", "g", 1000), C("g2", "g", 400)],
        ["", "", "kv-cache"],
    ),
    "unknown-and-oversized": (
        GateConfig(),
        [C("x0", "nobody"), C("g0", "g", 10**6)],
        ["unknown-tenant", "oversized"],
    ),
    "pool-full-hard": (  # 12 unreserved slots: s takes 8, e 4, e's 5th finds the pool full
        GateConfig(),
        [C(f"s{i}", "s") for i in range(8)] + [C(f"e{i}", "e") for i in range(5)],
        [""] * 12 + ["pool-full"],
    ),
    "reservation-held": (  # g's 4 reserved slots stay free for g over a full pool
        GateConfig(),
        [C(f"s{i}", "s") for i in range(8)]
        + [C(f"e{i}", "e") for i in range(4)]
        + [C(f"g{i}", "g") for i in range(4)],
        [""] * 16,
    ),
    "overcommit-priority": (  # over a full pool elastic outranks spot; spot stops at 8
        GateConfig(overcommit=True),
        [C(f"s{i}", "s") for i in range(8)] + [C(f"e{i}", "e") for i in range(5)] + [C("s8", "s")],
        [""] * 13 + ["concurrency"],
    ),
    "contention-level": (  # past half the pool (g's 4 reserved slots count as taken) only
        # a priority above the threshold (the least in flight: spot's) is admitted
        GateConfig(contention_level=0.5),
        [C(f"s{i}", "s") for i in range(5)] + [C("e0", "e")],
        ["", "", "", "", "priority", ""],
    ),
    "release-frees": (
        GateConfig(),
        [*(C(f"g{i}", "g") for i in range(4)), C("g4", "g"), R("g0", 1.0, 20), C("g5", "g", t=1.0)],
        ["", "", "", "", "concurrency", ""],
    ),
    "debt-over-idle-gap": (  # e denied by the full pool (12 unreserved slots) and served
        # nothing (its 4 requests report 0 tokens): gap 1, debt 0.3; then 3 idle intervals
        GateConfig(),
        [C(f"s{i}", "s") for i in range(8)]
        + [C(f"e{i}", "e") for i in range(5)]
        + [R(f"e{i}", 1.0, 0) for i in range(4)]
        + [S("e", 5.0, 0.3, 0.0), C("g0", "g", t=21.0), S("e", 21.0, 0.3 * 0.7**3, 0.0)],
        [""] * 12 + ["pool-full", ""],
    ),
    "debt-when-admitted-over-contention": (  # over a full pool e outranks spot and is
        # admitted on priority: it met a contended pool, so serving nothing is debt 0.3
        GateConfig(overcommit=True),
        [C(f"s{i}", "s") for i in range(8)]
        + [C(f"e{i}", "e") for i in range(5)]
        + [R(f"e{i}", 1.0, 0) for i in range(5)]
        + [S("e", 5.0, 0.3, 0.0)],
        [""] * 13,
    ),
    "burst-over-idle-gap": (  # e holds 6 requests (2 over its baseline) through 3 idle
        # intervals: its burst tends to the 0.5 it holds over the baseline, its credit to 0
        GateConfig(),
        [C(f"e{i}", "e") for i in range(6)]
        + [
            S("e", 5.0, 0.3 * _E_GAP, 0.3 * _E_DELTA),
            C("g0", "g", t=21.0),
            S("e", 21.0, 0.3 * _E_GAP * 0.7**3, _E_STEADY + (0.3 * _E_DELTA - _E_STEADY) * 0.7**3),
        ],
        [""] * 7,
    ),
    "no-debt-when-never-denied": (  # served under its baseline but never denied: no debt
        GateConfig(),
        [C("e0", "e"), R("e0", 1.0), S("e", 5.0, 0.0, 0.0), S("e", 31.0, 0.0, 0.0)],
        [""],
    ),
    "refund-over-idle-gap": (  # a report over the charge is clamped to it; 60 s later the
        # bucket is full again
        GateConfig(),
        [C("g0", "g", 2000), R("g0", 1.0, 2074), C("g1", "g", 2000, 2.0), C("g2", "g", 2000, 61.0)],
        ["", "tokens", ""],
    ),
}

# Leases: what a gate holds for a request whose holder stopped renewing it is reclaimed
# after ``lease_ttl_s`` (10 s here). Only the Redis gate has leases: the in-process gate's
# holder is its own process, which cannot vanish and leave the gate running.
LEASE_CASES: dict[str, tuple[GateConfig, list[tuple[Any, ...]], list[str]]] = {
    "expiry-frees-the-slot": (  # g's 4 slots held, the leases expire: g is admitted again
        GateConfig(),
        [C(f"g{i}", "g") for i in range(4)]
        + [C("g4", "g", t=1.0), X("g0", 10.5), C("g5", "g", t=10.5)],
        ["", "", "", "", "concurrency", ""],
    ),
    "late-release-of-an-expired-lease-changes-nothing": (
        GateConfig(),
        [C("g0", "g"), C("g1", "g"), X("g0", 11.0), R("g0", 11.0), C("g2", "g", t=11.0)],
        ["", "", ""],
    ),
    "expiry-refunds-nothing": (  # an expired lease keeps its whole charge (2,464 of g's
        # 3,600 tokens): 10.2 s later the bucket holds 1,748, short of a second one until 30 s
        GateConfig(),
        [C("g0", "g", 2400), X("g0", 10.2), C("g1", "g", 2400, 10.2), C("g2", "g", 2400, 30.0)],
        ["", "tokens", ""],
    ),
}


class _InProcess:
    def __init__(self, pool: TokenPool, config: GateConfig, _: Any) -> None:
        self.gate = TokenPoolGate(pool, BPT, config=config)

    def check(self, req: Request, t: float) -> str:
        return self.gate.check(req, t).reason

    def release(self, req: Request, t: float, tokens: int | None) -> bool:
        self.gate.release(req, t, tokens=tokens)
        return True

    def state(self, tenant: str, t: float) -> tuple[float, float]:
        # Any check brings every entitlement up to its time (one of nobody's here).
        assert self.gate.check(Request("probe", 1, 1, tenant="nobody"), t).reason
        s = self.gate.usage(tenant)
        return s.debt, s.burst

    def in_flight(self) -> int:
        return self.gate.pool_state().in_flight


class _Redis:
    def __init__(self, pool: TokenPool, config: GateConfig, request: Any) -> None:
        url = request.getfixturevalue("redis_url")
        ns = f"conf-{request.node.callspec.id}"
        self.gate = RedisLeaseGate.from_url(
            pool, BPT, url, namespace=ns, clock="request", config=config, lease_ttl_s=10.0
        )
        # A second replica on the same state: it holds nothing, so its renewals only
        # reclaim what expired.
        self.other = RedisLeaseGate.from_url(
            pool, BPT, url, namespace=ns, clock="request", config=config, lease_ttl_s=10.0
        )
        self.gate._client.flushdb()
        request.addfinalizer(self.gate.close)
        request.addfinalizer(self.other.close)

    def check(self, req: Request, t: float) -> str:
        return self.gate.check(req, t).reason

    def release(self, req: Request, t: float, tokens: int | None) -> bool:
        return self.gate.release(req, tokens, time=t).released

    def state(self, tenant: str, t: float) -> tuple[float, float]:
        debt, burst, _ = self.gate.state(tenant, t)
        return debt, burst

    def expire(self, rid: str, t: float) -> None:
        self.other.renew(t)
        # The holder has lost its lease: it no longer renews it (a stalled replica).
        self.gate._held.pop(rid, None)

    def in_flight(self) -> int:
        return self.gate.usage()["in_flight"]


def _run(gate: Any, steps: list[tuple[Any, ...]]) -> tuple[list[str], dict[str, Request]]:
    got: list[str] = []
    reqs: dict[str, Request] = {}
    expired: set[str] = set()
    for step in steps:
        if step[0] == "check":
            _, rid, tenant, prompt, t = step
            reqs[rid] = Request(rid, prompt, 64, tenant=tenant)
            reason = gate.check(reqs[rid], t)
            got.append(reason)
            if reason:
                del reqs[rid]
        elif step[0] == "release":
            _, rid, t, tokens = step
            released = gate.release(reqs.pop(rid), t, tokens)
            assert released == (rid not in expired), rid
        elif step[0] == "state":
            _, tenant, t, debt, burst = step
            assert gate.state(tenant, t) == (
                pytest.approx(debt, abs=1e-12),
                pytest.approx(burst, abs=1e-12),
            ), (tenant, t)
        else:
            _, rid, t = step
            gate.expire(rid, t)
            expired.add(rid)
    for rid in expired:
        reqs.pop(rid, None)
    return got, reqs


@pytest.mark.parametrize("impl", [_InProcess, _Redis], ids=["in-process", "redis"])
@pytest.mark.parametrize("case", list(CASES))
def test_conformance(case: str, impl: type, small_pool: TokenPool, request: Any) -> None:
    """Both gates give every check of the case the reason the table says, and the same debt
    and burst."""
    config, steps, want = CASES[case]
    gate = impl(small_pool, config, request)
    got, held = _run(gate, steps)
    assert got == want
    for req in held.values():
        gate.release(req, 100.0, None)
    assert gate.in_flight() == 0


@pytest.mark.parametrize("case", list(LEASE_CASES))
def test_lease_conformance(case: str, small_pool: TokenPool, request: Any) -> None:
    """The Redis gate reclaims expired leases as the table says, and nothing leaks."""
    config, steps, want = LEASE_CASES[case]
    gate = _Redis(small_pool, config, request)
    got, held = _run(gate, steps)
    assert got == want
    for req in held.values():
        gate.release(req, 100.0, None)
    gate.other.renew(200.0)
    assert gate.in_flight() == 0
