"""Trace replay and the built-in evaluator."""

from __future__ import annotations

import pytest

from kvpolicy.tiers import FixedTTL, GroupTTL, ReplayEvaluator, TieredPrefixStore, TierSpec, replay

DRAM = TierSpec("dram", 20, read_bandwidth=10.0, write_bandwidth=10.0, latency=0.0)
DISK = TierSpec("disk", 100, read_bandwidth=1.0, write_bandwidth=1.0, latency=0.0)
TRACE = [(0.0, [1, 2]), (10.0, [1, 2, 3]), (20.0, [4]), (3600.0, [1, 2])]


class TestReplay:
    def test_fetch_then_offload_per_request(self) -> None:
        """Each request is served its leading run, then offers all its blocks back."""
        store = TieredPrefixStore((DRAM, DISK), block_bytes=10, ttl=FixedTTL({"disk": 100.0}))
        r = replay(TRACE, store)
        # DRAM holds 2 blocks (1 s per read), disk 10 (10 s per read, 100 s TTL). At 3600 s
        # block 1 is still in DRAM (no TTL there) but block 2 expired on disk long ago.
        assert r.hits_per_request.tolist() == [0, 2, 0, 1]
        assert r.seconds_per_request.tolist() == [0.0, 2.0, 0.0, 1.0]
        assert (r.requests, r.blocks, r.hit_blocks, r.span_seconds) == (4, 8, 3, 3600.0)
        assert r.hit_ratio == 3 / 8

    def test_on_request_sees_every_chain_first(self) -> None:
        """The hook (e.g. GroupTTL.assign) is called with each request's hashes."""
        policy = GroupTTL({1: 5000.0}, residual=1.0)
        store = TieredPrefixStore((DISK,), block_bytes=10, ttl=policy)
        r = replay(TRACE, store, on_request=policy.assign)
        assert r.hits_per_request.tolist() == [0, 2, 0, 2]


class TestReplayEvaluator:
    def make(self) -> ReplayEvaluator:
        return ReplayEvaluator(
            TRACE,
            block_bytes=10,
            prefill_seconds_per_block=5.0,
            decode_seconds_per_request=1.0,
            gpu_price_per_hour=3600.0,
            dram=DRAM,
            disk=DISK,
        )

    def test_objectives_follow_the_documented_model(self) -> None:
        """Latency, throughput and eq. (2) cost of a DRAM-only configuration."""
        ev = self.make()
        got = ev({"dram_gib": 0.0, "disk_gib": 0.0})
        # No cache: 8 blocks recomputed at 5 s, 4 requests decode 1 s each.
        assert got.latency == 8 * 5.0 / 4
        assert got.throughput == 4 / (40.0 + 4.0)
        assert got.cost == pytest.approx(44.0)  # $3600 per GPU-hour = $1 per GPU-second

    def test_slow_loads_are_recomputed(self) -> None:
        """A cached prefix slower to load than to recompute is recomputed instead."""
        ev = ReplayEvaluator(
            TRACE,
            10,
            prefill_seconds_per_block=1.5,
            decode_seconds_per_request=1.0,
            gpu_price_per_hour=0.0,
            dram=DRAM.with_capacity(0),
            disk=DISK,
        )
        r = ev.run({"ttl_s": 100.0})
        assert r.hits_per_request.tolist() == [0, 2, 0, 0]
        # Loading 2 disk blocks takes 20 s, recomputing them 3 s: recompute wins.
        assert ev({"ttl_s": 100.0}).latency == 8 * 1.5 / 4

    def test_unknown_configuration_keys_raise(self) -> None:
        """Only dram_gib, disk_gib and ttl_s are understood."""
        with pytest.raises(ValueError, match="'config' has unknown keys: \\['hbm_gib'\\]"):
            self.make()({"hbm_gib": 1.0})
        with pytest.raises(ValueError, match="'dram_gib' must be finite and >= 0: -1"):
            self.make()({"dram_gib": -1})
