"""One table of admission cases (§4.3's checks, pass and fail, contention, over-commit on
and off, releases) run over both gates: the in-process ``TokenPoolGate`` and the Redis
``RedisLeaseGate`` (``clock="request"``). Each case lists its steps and the reason each
check must give (``""``: admitted)."""

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
    "refund-over-idle-gap": (  # a report over the charge is clamped to it; 60 s later the
        # bucket is full again
        GateConfig(),
        [C("g0", "g", 2000), R("g0", 1.0, 2074), C("g1", "g", 2000, 2.0), C("g2", "g", 2000, 61.0)],
        ["", "tokens", ""],
    ),
}


class _InProcess:
    def __init__(self, pool: TokenPool, config: GateConfig, _: Any) -> None:
        self.gate = TokenPoolGate(pool, BPT, config=config)

    def check(self, req: Request, t: float) -> str:
        return self.gate.check(req, t).reason

    def release(self, req: Request, t: float, tokens: int | None) -> None:
        self.gate.release(req, t, tokens=tokens)

    def in_flight(self) -> int:
        return self.gate.pool_state().in_flight


class _Redis:
    def __init__(self, pool: TokenPool, config: GateConfig, request: Any) -> None:
        url = request.getfixturevalue("redis_url")
        ns = f"conf-{request.node.callspec.id}"
        self.gate = RedisLeaseGate.from_url(
            pool, BPT, url, namespace=ns, clock="request", config=config
        )
        self.gate._client.flushdb()
        request.addfinalizer(self.gate.close)

    def check(self, req: Request, t: float) -> str:
        return self.gate.check(req, t).reason

    def release(self, req: Request, t: float, tokens: int | None) -> None:
        assert self.gate.release(req, tokens, time=t).released

    def in_flight(self) -> int:
        return self.gate.usage()["in_flight"]


@pytest.mark.parametrize("impl", [_InProcess, _Redis], ids=["in-process", "redis"])
@pytest.mark.parametrize("case", list(CASES))
def test_conformance(case: str, impl: type, small_pool: TokenPool, request: Any) -> None:
    """Both gates give every check of the case the reason the table says."""
    config, steps, want = CASES[case]
    gate = impl(small_pool, config, request)
    got: list[str] = []
    reqs: dict[str, Request] = {}
    for step in steps:
        if step[0] == "check":
            _, rid, tenant, prompt, t = step
            reqs[rid] = Request(rid, prompt, 64, tenant=tenant)
            reason = gate.check(reqs[rid], t)
            got.append(reason)
            if reason:
                del reqs[rid]
        else:
            _, rid, t, tokens = step
            gate.release(reqs.pop(rid), t, tokens)
    assert got == want
    for req in reqs.values():
        gate.release(req, 100.0, None)
    assert gate.in_flight() == 0
