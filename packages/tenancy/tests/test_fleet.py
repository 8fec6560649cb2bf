"""The gateway's fleet: candidates, views, in-flight counts, ejection and the pool share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import attrs
import pytest
from prometheus_client import CollectorRegistry

from kvpolicy.kvmodel import ReplicaView, RoutingRequest
from kvpolicy.tenancy import (
    BackendSpec,
    HealthConfig,
    Resources,
    RoutingConfig,
    TokenEntitlement,
    TokenPool,
    TokenPoolGate,
    text_block_hashes,
)
from kvpolicy.tenancy._fleet import Fleet, with_blocks
from kvpolicy.tenancy._fleet_pool import PoolFollower
from kvpolicy.tenancy._prefix_index import FleetPrefixIndex
from kvpolicy.tenancy._signals import ScrapedMetrics
from kvpolicy.tenancy.gateway import LocalGate

URLS = ("http://a:1", "http://b:1", "http://c:1")


class Fewest:
    """The replica with the fewest outstanding requests, the most prefix blocks first
    (a router of this test: kvpolicy-admit's are not installed with tenancy alone)."""

    def __init__(self) -> None:
        self.seen: list[tuple[RoutingRequest, tuple[ReplicaView, ...]]] = []

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        self.seen.append((request, tuple(replicas)))
        live = [r for r in replicas if not r.draining]
        if not live:
            return None
        return min(live, key=lambda r: (-len(r.resident("gpu")), r.outstanding)).replica_id


def _load(view: ReplicaView) -> tuple[object, ...]:
    """What a view shows but its prefix blocks."""
    return tuple(
        getattr(view, f.name) for f in attrs.fields(ReplicaView) if f.name != "prefix_blocks"
    )


def _fleet(router: Fewest | None = None, **kw: object) -> tuple[Fleet, LocalGate]:
    pool = TokenPool(
        "p",
        Resources(300, 10**9, 30),
        [TokenEntitlement("a", "guaranteed", Resources(150, 10**8, 10))],
    )
    gate = LocalGate(TokenPoolGate(pool, 1))
    health = HealthConfig(interval_s=0.0, backoff_s=60.0, max_backoff_s=60.0)
    config = RoutingConfig(health=health, **kw)  # type: ignore[arg-type]
    fleet = Fleet(
        [BackendSpec(u) for u in URLS],
        config,
        router or Fewest(),
        CollectorRegistry(),
        follower=PoolFollower(gate),
    )
    return fleet, gate


class TestFleet:
    def test_in_flight_counts_are_exact(self) -> None:
        """begin/end count requests and tokens per backend; the router sees them."""
        router = Fewest()
        fleet, _ = _fleet(router)
        a = fleet.pick("r1", 10)
        assert a is not None
        fleet.begin(a, 100)
        b = fleet.pick("r2", 10)
        assert b is not None
        assert b is not a
        fleet.begin(b, 50)
        assert [x.in_flight for x in fleet.backends] == [1, 1, 0]
        assert [x.tokens for x in fleet.backends] == [100, 50, 0]
        assert [v.outstanding for v in router.seen[-1][1]] == [1, 0, 0]
        fleet.end(a, 100)
        fleet.end(b, 50)
        assert [(x.in_flight, x.tokens) for x in fleet.backends] == [(0, 0)] * 3

    def test_prefix_holders_get_their_blocks(self) -> None:
        """A prompt's blocks go with it; the next prompt sharing them sees them on that
        backend's view (its whole index, live), and only there."""
        router = Fewest()
        fleet, _ = _fleet(router)
        h = text_block_hashes("shared system prompt " * 20, 64)
        first = fleet.pick("r1", 100, h)
        assert first is not None
        fleet.begin(first, 10, h)
        fleet.end(first, 10)
        for b in fleet.backends[:2]:  # the others are busier than ``first``
            fleet.begin(b, 1)
        again = fleet.pick("r2", 100, h[:3])
        assert again is first
        views = router.seen[-1][1]
        assert [set(h[:3]) <= v.resident("gpu") for v in views] == [
            b is first for b in fleet.backends
        ]
        assert [len(v.resident("gpu")) for v in views] == [
            len(h) if b is first else 0 for b in fleet.backends
        ]
        fleet.prefix.remove(first.id, h[1:])  # the index is shown live, not copied
        assert set(views[fleet.backends.index(first)].resident("gpu")) == {h[0]}

    def test_views_say_what_changed_since_the_last_shown(self) -> None:
        """To a router that follows them, each decision's views over 16 backends or more
        name the views shown before and a superset of the positions whose view shows
        another load since (counts, a refresh: every field but the prefix blocks), and the
        positions whose view shows prefix blocks (the holders, each another object with the
        same load); after the candidates change they name nothing; over fewer backends, or
        to another router, they say nothing."""

        class Keeping(Fewest):
            follows_changed_since = True

            def __init__(self) -> None:
                super().__init__()
                self.shown: list[tuple[Sequence[ReplicaView], object]] = []

            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                # (the hint as the router sees it: the fleet drops it once views go on)
                self.shown.append((replicas, getattr(replicas, "changed_since", "absent")))
                return super().route(request, replicas)

        small = Keeping()
        _fleet(small)[0].pick("r", 10)
        assert small.shown[-1][1] == "absent"
        specs = [BackendSpec(f"http://h{i}:1") for i in range(20)]
        config = RoutingConfig(health=HealthConfig(interval_s=0.0))

        class NotFollowing(Keeping):
            follows_changed_since = False

        plain = NotFollowing()
        Fleet(specs, config, plain, CollectorRegistry()).pick("r", 10)
        assert plain.shown[-1][1] == "absent"
        router = Keeping()
        fleet = Fleet(specs, config, router, CollectorRegistry())
        h = text_block_hashes("shared system prompt " * 20, 64)
        held = []
        holders = 0
        for i in range(30):
            hashes = h if i % 3 else ()
            b = fleet.pick(f"r{i}", 10, hashes)
            assert b is not None
            fleet.begin(b, 10, hashes)
            held.append(b)
            if i % 4 == 3:
                fleet.end(held.pop(0), 10)
            if i == 10:  # a scrape, then its age shown again by a refresh
                scraped = fleet.backends[3]
                scraped.scraped = ScrapedMetrics(5, 2, 0.25, 1000, 16)
                scraped.scraped_at = time.monotonic() - 5.0
                asyncio.run(fleet.refresh())
            if i == 20:
                fleet.drain(fleet.backends[0].id)
        for k in range(1, len(router.shown)):
            (now, said), (before, _) = router.shown[k], router.shown[k - 1]
            if len(now) != len(before):  # the candidates changed (the drain)
                assert said is None
                continue
            assert isinstance(said, tuple)
            assert said[0] is before
            moved = {i for i in range(len(now)) if _load(now[i]) != _load(before[i])}
            assert moved <= set(said[1])
            shown = now.prefix_shown  # type: ignore[attr-defined]
            assert set(shown) == {i for i in range(len(now)) if now[i].prefix_blocks}
            holders += len(shown)
        assert sum(len(v) == 20 for v, _ in router.shown) > 15
        assert holders > 10

    def test_ejected_and_draining_backends_get_nothing(self) -> None:
        """An ejected or draining backend is no candidate; the pool's rates follow the
        healthy share, and come back with the backend."""
        fleet, gate = _fleet()
        full = gate.tokens_per_s
        a, b, c = fleet.backends
        fleet.failed(a, "connect", "refused")
        assert a.health.ejected
        assert fleet.share() == pytest.approx(2 / 3)
        assert gate.tokens_per_s == pytest.approx(full * 2 / 3)
        assert fleet.drain(b.id)
        assert not fleet.drain("http://nowhere:1")
        assert {fleet.pick(f"r{i}", 10) for i in range(5)} == {c}
        assert fleet.pick("r", 10, exclude=c) is None
        assert fleet.retry_after_s() > 1.0
        fleet.succeeded(a)
        fleet.drain(b.id, False)
        assert fleet.share() == 1.0
        assert gate.tokens_per_s == pytest.approx(full)
        assert [s["state"] for s in fleet.state()] == ["up", "up", "up"]

    def test_a_lone_backend_is_always_tried(self) -> None:
        """With one backend there is nothing to fail over to: it is tried even ejected."""
        config = RoutingConfig(health=HealthConfig(interval_s=0.0))
        fleet = Fleet([BackendSpec(URLS[0])], config, None, CollectorRegistry())
        only = fleet.backends[0]
        fleet.failed(only, "connect", "refused")
        assert fleet.pick("r", 10) is only
        assert fleet.pick("r", 10, exclude=only) is None

    def test_a_stale_scrape_falls_back(self) -> None:
        """A fresh scrape shapes the view; once older than max_signal_age_s it is dropped
        for the gateway's own count."""
        fleet, _ = _fleet(max_signal_age_s=0.5)
        b = fleet.backends[0]
        b.scraped, b.scraped_at = ScrapedMetrics(5, 2, 0.25, 1000, 16), time.monotonic()
        b.version += 1
        fleet.begin(b, 10)
        now = time.monotonic()
        view = b.view(now, fleet.config)
        assert (view.running, view.waiting, view.kv_usage, view.free_blocks) == (5, 2, 0.25, 750)
        stale = b.view(now + 1.0, fleet.config)
        assert (stale.running, stale.waiting, stale.signal_age_s) == (0, 1, 0.0)

    def test_unchecked_views_equal_validated_ones(self) -> None:
        """The views built without validation equal those built with it."""
        fleet, _ = _fleet()
        b = fleet.backends[0]
        first = b.view(time.monotonic(), fleet.config)
        fleet.begin(b, 7)
        again = b.view(time.monotonic(), fleet.config)
        assert again == ReplicaView(URLS[0], 0, 1, 0.0, 0, 16)  # unscraped: waiting
        assert again != first
        blocks = frozenset({1, 2})
        assert with_blocks(again, blocks) == ReplicaView(
            URLS[0], 0, 1, 0.0, 0, 16, prefix_blocks={"gpu": blocks}
        )

    def test_a_failing_router_is_replaced(self, caplog: pytest.LogCaptureFixture) -> None:
        """A router that raises or names no candidate is logged; least in-flight instead."""

        class Broken(Fewest):
            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str:
                return "http://elsewhere:1"

        fleet, _ = _fleet(Broken())
        fleet.begin(fleet.backends[0], 1)
        assert fleet.pick("r", 10) is fleet.backends[1]
        assert "not a candidate" in caplog.text


class TestFleetPrefixIndex:
    def test_leading_runs(self) -> None:
        """Each holder's match is the leading run of the request's blocks it holds."""
        idx = FleetPrefixIndex(["a", "b"], 100)
        idx.add("a", [1, 2, 3])
        idx.add("b", [1, 2])
        idx.add("b", [9])
        assert idx.matching([1, 2, 3, 4]) == {
            "a": frozenset({1, 2, 3}),
            "b": frozenset({1, 2}),
        }
        assert idx.matching([9, 1]) == {"b": frozenset({9, 1})}
        assert idx.matching([2, 3]) == {"a": frozenset({2, 3}), "b": frozenset({2})}
        idx.remove("a", [2])
        assert idx.matching([1, 2, 3]) == {"a": frozenset({1}), "b": frozenset({1, 2})}
        idx.clear("b")
        assert idx.matching([1, 2]) == {"a": frozenset({1})}

    def test_evicted_from_the_tail(self) -> None:
        """Beyond capacity a prefix is forgotten from its last block, as an engine frees."""
        idx = FleetPrefixIndex(["a"], 3)
        idx.add("a", [1, 2, 3])
        idx.add("a", [7])
        assert idx.matching([1, 2, 3]) == {"a": frozenset({1, 2})}
        idx.resize("a", 1)
        assert len(idx["a"]) == 1
