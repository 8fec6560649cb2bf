"""Conformance of every implementation of the Protocols this package implements."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from kvpolicy.kvmodel import PrefixStore, TierFetch
from kvpolicy.tiers import FixedTTL, GroupTTL, TieredPrefixStore, TierSpec, TTLPolicy


def _group() -> GroupTTL:
    policy = GroupTTL({1: 30.0}, residual=2.0, base=FixedTTL({"dram": 100.0}))
    policy.assign([1, 2, 3])
    return policy


TTL_POLICIES: dict[str, Callable[[], TTLPolicy]] = {
    "fixed-default": FixedTTL,
    "fixed-per-tier": lambda: FixedTTL({"dram": 5.0, "disk": 0.0}),
    "group": _group,
}

STORES: dict[str, Callable[[], PrefixStore]] = {
    "dram+disk": lambda: TieredPrefixStore(
        (TierSpec("dram", 20, 10.0, 10.0), TierSpec("disk", 40, 1.0, 1.0)), block_bytes=10
    ),
    "disk-only-group-ttl": lambda: TieredPrefixStore(
        (TierSpec("disk", 40, 1.0, 1.0),), block_bytes=10, ttl=_group()
    ),
}


@pytest.mark.parametrize("make", TTL_POLICIES.values(), ids=TTL_POLICIES.keys())
class TestTTLPolicyConformance:
    def test_is_a_ttl_policy(self, make: Callable[[], TTLPolicy]) -> None:
        """The implementation satisfies the runtime-checkable Protocol."""
        assert isinstance(make(), TTLPolicy)

    def test_ttls_are_non_negative_seconds(self, make: Callable[[], TTLPolicy]) -> None:
        """Any block in any tier gets a float >= 0 (inf allowed), never NaN."""
        policy = make()
        for h in (1, 2, 3, 99, -5):
            for tier in ("dram", "disk", "other"):
                ttl = policy.ttl(h, tier)
                assert isinstance(ttl, float)
                assert ttl >= 0
                assert not math.isnan(ttl)


@pytest.mark.parametrize("make", STORES.values(), ids=STORES.keys())
class TestPrefixStoreConformance:
    def test_is_a_prefix_store(self, make: Callable[[], PrefixStore]) -> None:
        """The implementation satisfies kvmodel's Protocol."""
        assert isinstance(make(), PrefixStore)

    def test_empty_store_finds_nothing(self, make: Callable[[], PrefixStore]) -> None:
        """A fetch from an empty store is an empty TierFetch."""
        assert make().fetch([1, 2], 0.0) == TierFetch()

    def test_offloaded_run_comes_back_with_a_cost(self, make: Callable[[], PrefixStore]) -> None:
        """What was just offloaded is found from the first block, and costs time."""
        store = make()
        store.offload([1, 2], 0.0)
        got = store.fetch([1, 2, 7], 0.5)
        assert got.blocks == 2
        assert got.seconds > 0
        assert got.tier in {"dram", "disk"}

    def test_time_never_goes_backwards(self, make: Callable[[], PrefixStore]) -> None:
        """A call earlier than the last one is misuse."""
        store = make()
        store.offload([1], 3.0)
        with pytest.raises(ValueError, match="'time' must not go backwards"):
            store.fetch([1], 2.0)
