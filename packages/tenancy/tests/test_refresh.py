"""SharedThroughputRefresh: the throughput estimate of replicas sharing one Redis, refreshed
from what all of them observe, the same on every replica."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.tenancy import (
    RedisLeaseGate,
    RefreshConfig,
    SharedThroughputRefresh,
    TokenPool,
)


class Clock:
    """A clock the replicas share (seconds), moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _replicas(
    pool: TokenPool, url: str, ns: str, closing: contextlib.ExitStack, clock: Clock, n: int = 2
) -> list[tuple[RedisLeaseGate, SharedThroughputRefresh]]:
    import redis

    config = RefreshConfig(window_s=1.0, min_completions=10)
    out = []
    for _ in range(n):
        gate = RedisLeaseGate.from_url(pool, 1, url, namespace=ns, clock="request")
        closing.callback(gate.close)
        client = redis.Redis.from_url(url)
        closing.callback(client.close)
        out.append((gate, SharedThroughputRefresh(gate, config, client, namespace=ns, clock=clock)))
    return out


class TestSharedThroughputRefresh:
    def test_replicas_pool_their_observations_and_agree(
        self, small_pool: TokenPool, redis_url: str, closing: contextlib.ExitStack
    ) -> None:
        """Two replicas each see 6 completions of 15 tokens in a saturated 1 s window: too
        few alone (10 needed), 180 tokens/s pooled. One decision for both moves the
        estimate from 240 to 180 tokens/s, and both gates then charge the scaled rates."""
        clock = Clock()
        replicas = _replicas(small_pool, redis_url, "refresh-pool", closing, clock)
        replicas[0][0]._client.flushdb()
        clock.now = 0.5
        for _, refresh in replicas:
            refresh.iteration(0.0, 0.5, True)
            for _ in range(6):
                refresh.completed(15, 0.1, 0.01)
        clock.now = 1.0
        for _, refresh in replicas:
            refresh.iteration(0.5, 1.0, True)  # window 0 pushed; nothing to decide yet
        assert [g.tokens_per_s for g, _ in replicas] == [240.0, 240.0]
        clock.now = 2.0
        for _, refresh in replicas:
            refresh.iteration(1.0, 2.0, True)  # window 0 decided once, followed by both
        assert [g.tokens_per_s for g, _ in replicas] == [pytest.approx(180.0)] * 2
        assert [[(t, round(v, 9)) for t, v in r.refreshes] for _, r in replicas] == [
            [(2.0, 180.0)]
        ] * 2
        state = replicas[0][0]._client.hgetall("{refresh-pool}:refresh")
        assert float(state[b"decided"]) == 0.0
        assert float(state[b"estimate"]) == pytest.approx(180.0)
        for gate, _ in replicas:
            ent = gate.entitlement("g")
            assert ent is not None
            assert ent.baseline.tokens_per_s == pytest.approx(45.0)
            # 3,064 tokens fit g's bucket of 60/s x 60 s, not one of 45/s x 60 s.
            big = gate.check(Request(f"big-{id(gate)}", 3000, 1, tenant="g"), 2.0)
            assert (big.admitted, big.reason) == (False, "oversized")
        clock.now = 3.0
        for _, refresh in replicas:
            refresh.iteration(2.0, 3.0, False)  # window 1: no completions, nothing changes
        assert [g.tokens_per_s for g, _ in replicas] == [pytest.approx(180.0)] * 2

    def test_a_replica_that_joins_late_follows_the_estimate(
        self, small_pool: TokenPool, redis_url: str, closing: contextlib.ExitStack
    ) -> None:
        """A replica started after a decision takes the stored estimate at its first new
        window; its own state is never pushed twice."""
        clock = Clock()
        (first, r1), (late, r2) = _replicas(small_pool, redis_url, "refresh-late", closing, clock)
        first._client.flushdb()
        r1.iteration(0.0, 0.0, True)
        for _ in range(20):
            r1.completed(30, 0.1, 0.01)
        for t in (1.0, 2.0):
            clock.now = t
            r1.iteration(t - 1.0, t, True)
        assert first.tokens_per_s == pytest.approx(480.0)  # 600 tokens/s, clamped to 2x
        r2.iteration(2.0, 2.0, False)
        clock.now = 3.0
        r1.iteration(2.0, 3.0, False)
        r2.iteration(2.0, 3.0, False)
        assert late.tokens_per_s == pytest.approx(480.0)

    def test_redis_away_changes_nothing(
        self, small_pool: TokenPool, redis_proc: Any, closing: contextlib.ExitStack
    ) -> None:
        """While Redis is away a window's end is logged and skipped; the gate keeps its
        rates."""
        clock = Clock()
        [(gate, refresh)] = _replicas(small_pool, redis_proc.url, "refresh-away", closing, clock, 1)
        refresh.iteration(0.0, 0.0, True)
        redis_proc.stop()
        try:
            clock.now = 1.0
            refresh.iteration(0.0, 1.0, True)
        finally:
            redis_proc.start()
        assert gate.tokens_per_s == 240.0
