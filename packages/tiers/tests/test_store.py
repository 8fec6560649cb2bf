"""TieredPrefixStore: placement, demotion, TTL, fetch timing, counters, misuse."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.kvmodel import PrefixStore, PromptObserver, TierFetch
from kvpolicy.tiers import FixedTTL, GroupTTL, TieredPrefixStore, TierSpec, group_cost, group_hits

MakeStore = Callable[..., TieredPrefixStore]
MakeTier = Callable[..., TierSpec]


def where(store: TieredPrefixStore, hashes: range | list[int]) -> list[str | None]:
    return [store.tier_of(h) for h in hashes]


class TestPlacement:
    def test_is_a_prefix_store(self, make_store: MakeStore) -> None:
        """The store satisfies kvmodel's PrefixStore protocol."""
        assert isinstance(make_store(), PrefixStore)

    def test_offload_fills_dram_then_demotes_lru_to_disk_then_drops(
        self, make_store: MakeStore
    ) -> None:
        """DRAM keeps the newest; its LRU goes to disk; disk's LRU leaves the store."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2], time=0.0)
        store.offload([3, 4], time=1.0)
        assert where(store, [1, 2, 3, 4]) == ["disk", "disk", "dram", "dram"]
        store.offload([5, 6, 7], time=2.0)
        # Placed last-first, 7, 6 and 5 push 4, 3 and 7 down; the full disk drops 2 and 1.
        assert where(store, range(1, 8)) == [None, None, "disk", "disk", "dram", "dram", "disk"]
        s = store.stats()
        assert [(t.blocks, t.demotions, t.drops) for t in s.tiers] == [(2, 5, 0), (3, 0, 2)]
        assert s.offloaded == 7

    def test_a_chain_keeps_its_head_in_the_faster_tier(self, make_store: MakeStore) -> None:
        """Blocks of one call are placed last-first, so the first blocks are most recent."""
        store = make_store(dram=2, disk=3)
        store.offload([10, 11, 12, 13], time=0.0)
        assert where(store, [10, 11, 12, 13]) == ["dram", "dram", "disk", "disk"]

    def test_zero_capacity_or_zero_ttl_tiers_are_skipped(self, make_store: MakeStore) -> None:
        """A tier with no room or a TTL of 0 passes blocks to the next; none left: refused."""
        store = make_store(dram=0, disk=2)
        store.offload([1], time=0.0)
        assert where(store, [1]) == ["disk"]
        store = make_store(dram=2, disk=2, dram_ttl=0.0)
        store.offload([1], time=0.0)
        assert where(store, [1]) == ["disk"]
        store = make_store(dram=2, disk=2, dram_ttl=0.0, disk_ttl=0.0)
        store.offload([1, 2], time=0.0)
        assert where(store, [1, 2]) == [None, None]
        assert store.stats().refused == 2

    def test_reoffering_a_held_block_refreshes_it(self, make_store: MakeStore) -> None:
        """Offering a block already in DRAM makes it most recent without a second copy."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2], time=0.0)
        store.offload([1], time=1.0)
        store.offload([3], time=2.0)
        assert where(store, [1, 2, 3]) == ["dram", "disk", "dram"]
        assert len(store) == 3

    @pytest.mark.parametrize("dram", [2, 0])
    def test_refreshing_a_block_in_its_first_tier_writes_nothing(
        self, make_store: MakeStore, dram: int
    ) -> None:
        """A block re-offered or fetched where it already is is not copied again."""
        store = make_store(dram=dram, disk=3)
        store.offload([1], time=0.0)
        store.fetch([1], time=1.0)
        store.offload([1], time=2.0)
        assert [t.bytes_written for t in store.stats().tiers] == ([10, 0] if dram else [0, 10])

    def test_refresh_with_a_group_policy_writes_nothing(self, make_tier: MakeTier) -> None:
        """The same holds for a per-block TTL policy."""
        policy = GroupTTL({1: 100.0}, residual=5.0)
        policy.assign([1, 2])
        store = TieredPrefixStore((make_tier("disk", 10),), block_bytes=10, ttl=policy)
        store.offload([1, 2], time=0.0)
        store.offload([1, 2], time=1.0)
        assert store.stats().tiers[0].bytes_written == 20


class TestFetch:
    def test_leading_run_with_per_block_transfer_time(self, make_store: MakeStore) -> None:
        """Found blocks stop at the first miss; each pays its tier's latency + bytes/bw."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2, 3, 4], time=0.0)  # 1, 2 in DRAM; 3, 4 on disk
        got = store.fetch([1, 2, 3, 99, 4], time=1.0)
        # DRAM: 0.5 + 10/100 = 0.6 s per block; disk: 2.0 + 10/10 = 3.0 s per block.
        assert got == TierFetch(blocks=3, seconds=0.6 + 0.6 + 3.0, tier="disk")
        assert store.fetch([99, 1], time=1.0) == TierFetch(blocks=0, seconds=0.0, tier="")

    def test_hits_and_misses_per_tier(self, make_store: MakeStore) -> None:
        """A disk hit is a DRAM miss; a block found nowhere is a miss in every tier."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2, 3, 4], time=0.0)
        store.fetch([3, 1, 99], time=1.0)
        s = store.stats()
        assert [(t.hits, t.misses) for t in s.tiers] == [(1, 2), (1, 1)]
        assert (s.fetches, s.blocks_requested, s.blocks_found) == (1, 3, 2)
        assert s.hit_ratio == 2 / 3
        assert s.tiers[1].bytes_read == 10

    def test_fetch_promotes_to_dram(self, make_store: MakeStore) -> None:
        """A block fetched from disk moves to DRAM, demoting DRAM's LRU."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2, 3, 4], time=0.0)
        store.fetch([3], time=1.0)
        assert where(store, [1, 2, 3, 4]) == ["dram", "disk", "dram", "disk"]

    def test_only_dram_hits_cost_dram_time(self, make_store: MakeStore) -> None:
        """A run served from DRAM alone reports DRAM as the slowest tier."""
        store = make_store(dram=2, disk=3)
        store.offload([1, 2], time=0.0)
        assert store.fetch([1, 2], time=0.5) == TierFetch(blocks=2, seconds=1.2, tier="dram")


class TestTTL:
    def test_blocks_expire_after_their_ttl(self, make_store: MakeStore) -> None:
        """A block is found up to last use + TTL and gone after; expiry is counted."""
        store = make_store(dram=0, disk=5, disk_ttl=10.0)
        store.offload([1, 2], time=0.0)
        assert store.fetch([1, 2], time=10.0).blocks == 2  # refreshed at 10.0
        assert store.fetch([1, 2], time=20.0).blocks == 2
        assert store.fetch([1, 2], time=30.5).blocks == 0
        s = store.stats()
        assert s.tiers[1].expirations == 2
        assert len(store) == 0

    def test_demotion_keeps_the_last_use(self, make_store: MakeStore) -> None:
        """TTL counts from the last use, so a stale block demoted to disk expires there."""
        store = make_store(dram=1, disk=5, disk_ttl=5.0)
        store.offload([1], time=0.0)
        store.offload([2], time=8.0)  # demotes 1, last used at 0.0: past its 5 s disk TTL
        assert where(store, [1, 2]) == [None, "dram"]
        assert store.stats().tiers[1].expirations == 1

    def test_byte_seconds_stop_at_expiry(self, make_store: MakeStore) -> None:
        """Usage integrates bytes over time and counts expired blocks only until expiry."""
        store = make_store(dram=0, disk=5, disk_ttl=4.0)
        store.offload([1, 2], time=0.0)
        store.offload([3], time=10.0)  # 1 and 2 expired at 4.0, swept now
        assert store.stats().tiers[1].byte_seconds == 2 * 10 * 4.0

    def test_group_ttl_sets_per_group_retention(self, make_tier: MakeTier) -> None:
        """A GroupTTL keeps one group's blocks longer than the residual's."""
        policy = GroupTTL({1: 100.0}, residual=5.0)
        store = TieredPrefixStore((make_tier("disk", 10),), block_bytes=10, ttl=policy)
        for chain in ([1, 11, 12], [2, 21, 22]):
            policy.assign(chain)
            store.offload(chain, time=0.0)
        assert store.fetch([1, 11, 12], time=50.0).blocks == 3
        assert store.fetch([2, 21, 22], time=50.0).blocks == 0

    def test_observe_prompt_teaches_the_group_policy(self, make_tier: MakeTier) -> None:
        """``observe_prompt`` is the store's way to :meth:`GroupTTL.assign` (kvmodel's
        PromptObserver); a fixed-TTL store accepts it and changes nothing."""
        policy = GroupTTL({1: 100.0}, residual=5.0)
        store = TieredPrefixStore((make_tier("disk", 10),), block_bytes=10, ttl=policy)
        assert isinstance(store, PromptObserver)
        store.observe_prompt([1, 11, 12], time=0.0)
        store.offload([1, 11, 12], time=0.0)
        assert policy.group_of(12) == 1
        assert store.fetch([1, 11, 12], time=50.0).blocks == 3
        plain = TieredPrefixStore((make_tier("disk", 10),), block_bytes=10)
        plain.observe_prompt([1, 2], time=0.0)
        assert len(plain) == 0
        with pytest.raises(TypeError, match="block_hashes"):
            store.observe_prompt(["x"], time=1.0)  # type: ignore[list-item]
        with pytest.raises(ValueError, match="backwards"):
            store.observe_prompt([1], time=20.0)  # the last call was at 50


class TestMisuse:
    @pytest.mark.parametrize("method", ["offload", "fetch"])
    def test_time_going_backwards_raises_and_changes_nothing(
        self, make_store: MakeStore, method: str
    ) -> None:
        """An earlier time raises ValueError naming both times; the store is unchanged."""
        store = make_store()
        store.offload([1, 2], time=5.0)
        before = store.stats()
        with pytest.raises(ValueError, match=r"'time' must not go backwards: 4.0 < 5.0"):
            getattr(store, method)([3], 4.0)
        assert store.stats() == before
        assert where(store, [1, 2, 3]) == ["dram", "dram", None]

    @pytest.mark.parametrize(
        ("hashes", "time", "exc", "needle"),
        [
            ([1, "a"], 0.0, TypeError, "'block_hashes' must hold int hashes: 'a'"),
            ([1, 2.0], 0.0, TypeError, "'block_hashes' must hold int hashes: 2.0"),
            ([True], 0.0, TypeError, "'block_hashes' must hold int hashes: True"),
            ("ab", 0.0, TypeError, "'block_hashes' must be a sequence"),
            ([1], -1.0, ValueError, "'time' must be finite and >= 0: -1.0"),
            ([1], math.nan, ValueError, "'time' must be finite and >= 0: nan"),
            ([1], "0", TypeError, "'time' must be a number of seconds: '0'"),
        ],
    )
    def test_bad_input_raises_and_changes_nothing(
        self, make_store: MakeStore, hashes: object, time: object, exc: type[Exception], needle: str
    ) -> None:
        """Non-int hashes and bad times raise a clear error before any change."""
        store = make_store()
        store.offload([7], time=0.0)
        before = store.stats()
        for method in (store.offload, store.fetch):
            with pytest.raises(exc, match=needle):
                method(hashes, time)  # type: ignore[arg-type]
        assert store.stats() == before
        assert len(store) == 1

    @pytest.mark.parametrize(
        ("n", "block_bytes", "exc", "needle"),
        [
            (0, 10, ValueError, "'tiers' must not be empty"),
            (2, 10, ValueError, "'tiers' must have distinct names"),
            (1, 0, ValueError, "'block_bytes' must be > 0: 0"),
            (1, 1.5, TypeError, "'block_bytes' must be an int: 1.5"),
            (-1, 10, TypeError, "'tiers' must hold TierSpec values: 'dram'"),
        ],
    )
    def test_bad_construction_raises(
        self, make_tier: MakeTier, n: int, block_bytes: object, exc: type[Exception], needle: str
    ) -> None:
        """Bad tiers or block sizes are named in the error."""
        tiers: list[object] = ["dram"] if n < 0 else [make_tier("a", 1) for _ in range(n)]
        with pytest.raises(exc, match=needle):
            TieredPrefixStore(tiers, block_bytes)  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["offload", "fetch"]),
        st.lists(st.integers(0, 30), min_size=1, max_size=6),
        st.floats(0.0, 5.0),
    ),
    max_size=60,
)


class TestProperties:
    @settings(max_examples=150, deadline=None)
    @given(
        ops=ops,
        dram=st.integers(0, 4),
        disk=st.integers(0, 6),
        ttl=st.sampled_from([0.0, 1.0, 3.5, math.inf]),
    )
    def test_capacity_of_every_tier_is_never_exceeded(
        self,
        make_tier: MakeTier,
        ops: list[tuple[str, list[int], float]],
        dram: int,
        disk: int,
        ttl: float,
    ) -> None:
        """After any sequence of offloads and fetches, no tier holds more than it has."""
        store = TieredPrefixStore(
            (make_tier("dram", dram), make_tier("disk", disk)), 10, ttl=FixedTTL({"disk": ttl})
        )
        now = 0.0
        for kind, hashes, dt in ops:
            now += dt
            getattr(store, kind)(hashes, now)
            s = store.stats()
            for t in s.tiers:
                assert t.bytes_stored <= t.capacity_bytes
            assert sum(t.blocks for t in s.tiers) == len(store)

    @settings(max_examples=100, deadline=None)
    @given(
        n=st.integers(1, 8),
        ttl=st.floats(0.5, 100.0),
        wait=st.floats(0.0, 1.0),
        dram=st.integers(0, 8),
    )
    def test_a_just_offloaded_run_is_found_within_ttl_and_gone_after(
        self, make_tier: MakeTier, n: int, ttl: float, wait: float, dram: int
    ) -> None:
        """A run that fits is found whole within its TTL, and nothing of it after."""
        store = TieredPrefixStore(
            (make_tier("dram", dram), make_tier("disk", 8)), 10, ttl=FixedTTL(default=ttl)
        )
        chain = list(range(100, 100 + n))
        store.offload(chain, time=1.0)
        assert store.fetch(chain, time=1.0 + wait * ttl).blocks == n
        later = 1.0 + wait * ttl + ttl * 1.001 + 1e-9
        assert store.fetch(chain, time=later).blocks == 0
        assert len(store) == 0

    @settings(max_examples=60, deadline=None)
    @given(
        times=st.lists(st.integers(0, 50), min_size=1, max_size=40).map(sorted),
        blocks=st.lists(st.integers(0, 5), min_size=40, max_size=40),
        ttl=st.integers(1, 20),
    )
    def test_unbounded_store_matches_the_hit_and_cost_curves(
        self, make_tier: MakeTier, times: list[int], blocks: list[int], ttl: int
    ) -> None:
        """With room for all, hits are H(t) and block-seconds are C(t) of §4.3."""
        store = TieredPrefixStore((make_tier("disk", 100),), 10, ttl=FixedTTL(default=float(ttl)))
        last: dict[int, float] = {}
        intervals: list[float] = []
        hits = 0
        for t, b in zip(times, blocks, strict=False):
            if b in last:
                intervals.append(t - last[b])
            last[b] = t
            hits += store.fetch([b], float(t)).blocks
            store.offload([b], float(t))
        end = float(times[-1] + ttl + 1)
        store.fetch([999], end)  # sweep everything at a time past every expiry
        assert hits == group_hits(intervals, float(ttl))
        assert store.stats().tiers[0].byte_seconds == pytest.approx(
            10 * group_cost(intervals, len(last), float(ttl))
        )
