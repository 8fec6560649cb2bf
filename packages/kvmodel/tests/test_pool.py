"""The paged block pool: allocation, sharing, copy-on-write, prefix caching."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from kvpolicy.kvmodel import BlockPool, BlockPoolError, chain_block_hashes, rechunk_hashes


def make_pool(num_blocks: int = 8, block_size: int = 4) -> BlockPool:
    return BlockPool(num_blocks=num_blocks, block_size=block_size)


class TestAllocation:
    def test_blocks_at_boundaries(self) -> None:
        """10 tokens in blocks of 4 take 3 blocks; the 13th token takes a 4th."""
        pool = make_pool()
        alloc = pool.allocate("a", 10)
        assert alloc is not None
        assert alloc.block_ids == (0, 1, 2)
        assert pool.append("a", 2)
        assert pool.block_table("a") == (0, 1, 2)
        assert pool.append("a", 1)
        assert pool.block_table("a") == (0, 1, 2, 3)
        assert pool.num_tokens("a") == 13

    def test_out_of_blocks_is_a_return_value(self) -> None:
        """Allocation that does not fit returns None and changes nothing."""
        pool = make_pool(num_blocks=2)
        assert pool.allocate("a", 9) is None
        assert pool.num_free_blocks == 2
        assert not pool.has_request("a")
        assert pool.stats().failed_allocations == 1

    def test_append_out_of_blocks_changes_nothing(self) -> None:
        """An append that needs a missing block returns False and keeps the request as it was."""
        pool = make_pool(num_blocks=1)
        pool.allocate("a", 4)
        assert pool.append("a", 1) is False
        assert pool.num_tokens("a") == 4
        assert pool.block_table("a") == (0,)

    def test_free_returns_blocks(self) -> None:
        """Freed blocks go back to the free list."""
        pool = make_pool()
        pool.allocate("a", 8)
        pool.free("a")
        assert pool.num_free_blocks == 8
        assert pool.requests() == []

    def test_double_free_raises(self) -> None:
        """Freeing twice is misuse."""
        pool = make_pool()
        pool.allocate("a", 1)
        pool.free("a")
        with pytest.raises(BlockPoolError, match="unknown request 'a'"):
            pool.free("a")

    def test_unknown_request_raises(self) -> None:
        """Appending to a request that holds nothing is misuse."""
        with pytest.raises(BlockPoolError, match="unknown request 'x'"):
            make_pool().append("x")

    def test_allocate_twice_raises(self) -> None:
        """A request cannot be allocated twice."""
        pool = make_pool()
        pool.allocate("a", 1)
        with pytest.raises(BlockPoolError, match="already holds"):
            pool.allocate("a", 1)

    @pytest.mark.parametrize(("n", "b"), [(0, 4), (-1, 4), (4, 0)])
    def test_bad_sizes(self, n: int, b: int) -> None:
        """Zero or negative pool sizes are rejected."""
        with pytest.raises(ValueError, match="must be > 0"):
            BlockPool(n, b)

    def test_negative_tokens_rejected(self) -> None:
        """A negative token count names the field."""
        with pytest.raises(ValueError, match="'num_tokens' must be >= 0: -1"):
            make_pool().allocate("a", -1)


class TestSharing:
    def test_fork_shares_and_cow_copies_partial_block(self) -> None:
        """A forked request shares blocks; appending copies only the partial last block."""
        pool = make_pool()
        pool.allocate("a", 6, token_ids=[1, 2, 3, 4, 5, 6])
        pool.fork("a", "b")
        assert pool.stats().shared_blocks == 2
        assert pool.append("b", 1, token_ids=[70])
        assert pool.read("a") == [1, 2, 3, 4, 5, 6]
        assert pool.read("b") == [1, 2, 3, 4, 5, 6, 70]
        assert pool.block_table("a")[0] == pool.block_table("b")[0]
        assert pool.block_table("a")[1] != pool.block_table("b")[1]
        assert pool.stats().cow_copies == 1

    def test_write_to_shared_block_raises(self) -> None:
        """Writing a shared block without a copy is refused."""
        pool = make_pool()
        pool.allocate("a", 4)
        pool.fork("a", "b")
        with pytest.raises(BlockPoolError, match="shared by 2 requests"):
            pool.check_writable("b", 0)
        assert pool.copy_on_write("b", 0) is not None
        pool.check_writable("b", 0)

    def test_shared_blocks_survive_one_free(self) -> None:
        """Freeing one owner keeps the block for the other."""
        pool = make_pool()
        pool.allocate("a", 4)
        pool.fork("a", "b")
        pool.free("a")
        assert pool.ref_count(pool.block_table("b")[0]) == 1
        assert pool.num_free_blocks == 7


class TestPrefixCache:
    def test_prefix_hit_reuses_blocks(self) -> None:
        """A second request with the same prompt shares its full blocks."""
        pool = make_pool()
        tokens = list(range(10))
        hashes = chain_block_hashes(tokens, 4)
        assert len(hashes) == 2
        pool.allocate("a", 10, prefix_hashes=hashes)
        alloc = pool.allocate("b", 10, prefix_hashes=hashes)
        assert alloc is not None
        assert alloc.cached_tokens == 8
        assert alloc.block_ids[:2] == pool.block_table("a")[:2]
        assert pool.stats().prefix_hit_rate == 0.5

    def test_freed_cached_blocks_are_reused(self) -> None:
        """A freed prompt's blocks stay cached until their slots are needed."""
        pool = make_pool(num_blocks=4)
        hashes = chain_block_hashes(list(range(8)), 4)
        pool.allocate("a", 8, prefix_hashes=hashes)
        pool.free("a")
        alloc = pool.allocate("b", 8, prefix_hashes=hashes)
        assert alloc is not None
        assert alloc.cached_tokens == 8

    def test_cached_blocks_evicted_lru(self) -> None:
        """When free blocks run short, the least recently freed cached block goes first."""
        pool = make_pool(num_blocks=2, block_size=4)
        ha = chain_block_hashes([1, 1, 1, 1], 4)
        hb = chain_block_hashes([2, 2, 2, 2], 4)
        pool.allocate("a", 4, prefix_hashes=ha)
        pool.allocate("b", 4, prefix_hashes=hb)
        pool.free("a")
        pool.free("b")
        pool.allocate("c", 4)  # takes a's block, freed first
        alloc_b = pool.allocate("b2", 4, prefix_hashes=hb)
        assert alloc_b is not None
        assert alloc_b.cached_tokens == 4
        pool.free("c")
        alloc_a = pool.allocate("a2", 4, prefix_hashes=ha)
        assert alloc_a is not None
        assert alloc_a.cached_tokens == 0

    def test_a_hit_from_the_middle_keeps_the_free_order(self) -> None:
        """A cached block taken back from the middle of the free list leaves the others in
        least-recently-freed order, and returns to the tail when freed again."""
        pool = BlockPool(num_blocks=4, block_size=1, record_dropped=True)
        for i in range(4):
            pool.allocate(f"p{i}", 1, prefix_hashes=[100 + i])
        for i in range(4):
            pool.free(f"p{i}")  # free list: p0 p1 p2 p3
        hit = pool.allocate("h", 1, prefix_hashes=[101])  # takes p1's block from the middle
        assert hit is not None
        assert hit.cached_tokens == 1
        assert (pool.num_free_blocks, pool.ref_count(1), pool.is_free(1)) == (3, 1, False)
        pool.free("h")  # free list: p0 p2 p3 p1
        assert pool.is_free(1)
        assert pool.ref_count(1) == 0
        for i in range(4):
            assert pool.allocate(f"n{i}", 1) is not None
            assert pool.pop_dropped_hashes() == [[100, 102, 103, 101][i]]
        assert pool.allocate("full", 1) is None

    def test_chain_hashes_depend_on_prefix(self) -> None:
        """Equal blocks after different prefixes hash differently."""
        h1 = chain_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
        h2 = chain_block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
        assert h1[1] != h2[1]
        assert chain_block_hashes([1, 2, 3], 4) == ()

    def test_chain_hashes_agree_between_processes(self) -> None:
        """Two processes name the same prompt's blocks alike (no hash of an object's
        address in the chain), so hashes saved by one are found by another."""
        code = (
            "from kvpolicy.kvmodel import chain_block_hashes;"
            "print(list(chain_block_hashes(list(range(12)), 4)))"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        runs = [
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
            ).stdout
            for _ in range(2)
        ]
        assert runs[0] == runs[1] == f"{list(chain_block_hashes(list(range(12)), 4))}\n"


class TestTruncate:
    def test_rollback_frees_blocks(self) -> None:
        """Truncating speculative tokens frees the blocks past the new end."""
        pool = make_pool()
        pool.allocate("a", 3, token_ids=[1, 2, 3])
        pool.append("a", 6, token_ids=[4, 5, 6, 7, 8, 9])
        pool.truncate("a", 5)
        assert pool.read("a") == [1, 2, 3, 4, 5]
        assert len(pool.block_table("a")) == 2
        assert pool.num_free_blocks == 6

    def test_truncate_beyond_length_rejected(self) -> None:
        """Truncating to more tokens than held is a ValueError."""
        pool = make_pool()
        pool.allocate("a", 3)
        with pytest.raises(ValueError, match="'num_tokens' must be <= 3"):
            pool.truncate("a", 4)


class TestDroppedHashes:
    def test_reused_cached_blocks_are_reported_once_in_order(self) -> None:
        """A cached block taken for new content reports its hash, once; the tail block of a
        freed request is reused first (freed in reverse, as vLLM does)."""
        pool = BlockPool(2, 4, record_dropped=True)
        hashes = chain_block_hashes(list(range(8)), 4)
        assert pool.allocate("a", 8, hashes) is not None
        pool.free("a")
        assert pool.pop_dropped_hashes() == []
        assert pool.allocate("b", 8) is not None
        assert pool.pop_dropped_hashes() == list(reversed(hashes))
        assert pool.pop_dropped_hashes() == []

    def test_not_recorded_by_default(self) -> None:
        """Without ``record_dropped`` the pool keeps no list of drops."""
        pool = BlockPool(1, 4)
        assert pool.allocate("a", 4, chain_block_hashes([1, 2, 3, 4], 4)) is not None
        pool.free("a")
        assert pool.allocate("b", 4) is not None
        assert pool.pop_dropped_hashes() == []

    def test_truncation_is_not_a_drop(self) -> None:
        """A block invalidated by truncate is not offered as a dropped prefix."""
        pool = BlockPool(2, 4, record_dropped=True)
        assert pool.allocate("a", 4, chain_block_hashes([1, 2, 3, 4], 4)) is not None
        pool.truncate("a", 2)
        assert pool.pop_dropped_hashes() == []


class TestCachedPrefixBlocks:
    def test_counts_the_leading_run(self) -> None:
        """Only the run from the first block counts, and the query changes nothing."""
        pool = make_pool(8, 4)
        hashes = chain_block_hashes(list(range(12)), 4)
        assert pool.allocate("a", 8, hashes[:2]) is not None
        before = pool.stats()
        assert pool.cached_prefix_blocks(hashes) == 2
        assert pool.cached_prefix_blocks(hashes[1:]) == 1
        assert pool.cached_prefix_blocks([99, *hashes]) == 0
        assert pool.stats() == before

    def test_cached_hashes_are_the_full_blocks_held(self) -> None:
        """The cache holds the hashes of the full prompt blocks allocated (all, or those
        among some asked for), none before."""
        pool = make_pool(8, 4)
        hashes = chain_block_hashes(list(range(12)), 4)
        assert pool.cached_hashes() == frozenset()
        assert pool.allocate("a", 8, hashes[:2]) is not None
        assert pool.cached_hashes() == frozenset(hashes[:2])
        assert pool.cached_hashes([hashes[1], hashes[2], 7]) == frozenset({hashes[1]})

    def test_zero_without_prefix_caching(self) -> None:
        """A pool without prefix caching never reports cached blocks."""
        pool = BlockPool(4, 4, enable_prefix_caching=False)
        hashes = chain_block_hashes(list(range(8)), 4)
        assert pool.allocate("a", 8, hashes) is not None
        assert pool.cached_prefix_blocks(hashes) == 0


class TestHashGranularity:
    def test_rechunk_takes_the_last_small_block_of_each_large_one(self) -> None:
        """A chained hash names its prefix: 32-token block j is 16-token block 2j + 1."""
        tokens = list(range(100))
        small = chain_block_hashes(tokens, 16)
        assert rechunk_hashes(small, 16, 32) == (small[1], small[3], small[5])
        assert rechunk_hashes(small, 16, 16) == small
        assert rechunk_hashes(small, 16, 64) == (small[3],)

    def test_rechunk_refuses_a_finer_or_unaligned_block(self) -> None:
        """Hashes mark no boundary inside their blocks."""
        with pytest.raises(ValueError, match="not a multiple"):
            rechunk_hashes((1, 2), 16, 24)
        with pytest.raises(ValueError, match="not a multiple"):
            rechunk_hashes((1, 2), 16, 8)

    def test_pool_refuses_hashes_of_another_block_size(self) -> None:
        """allocate refuses hashes said to cover another block size, and changes nothing."""
        pool = BlockPool(num_blocks=8, block_size=32)
        with pytest.raises(BlockPoolError, match="16-token blocks given to a pool of 32"):
            pool.allocate("r", 64, (1, 2, 3, 4), hash_block_size=16)
        assert pool.num_free_blocks == 8
        assert pool.allocate("r", 64, (2, 4), hash_block_size=32) is not None


class TestBounds:
    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            (
                {"num_blocks": 8, "block_size": 10**30},
                "'block_size' must be > 0 and <= 1048576: <huge int>",
            ),
            ({"num_blocks": 2**40}, "'num_blocks' must be > 0 and <= 67108864: 1099511627776"),
            ({"num_blocks": 0}, "'num_blocks' must be > 0 and <= 67108864: 0"),
        ],
    )
    def test_absurd_sizes_are_refused(self, kwargs: dict[str, int], message: str) -> None:
        """A block size or block count that would overflow or exhaust memory is an error,
        raised before anything is allocated."""
        with pytest.raises(ValueError, match=re.escape(message)):
            BlockPool(**kwargs)


class TestAppendMany:
    @staticmethod
    def _pools() -> tuple[BlockPool, BlockPool]:
        pools = []
        for _ in range(2):
            pool = BlockPool(num_blocks=40, block_size=4)
            pool.allocate("a", 6, chain_block_hashes(list(range(6)), 4))
            pool.allocate("b", 8)
            pool.allocate("c", 3)
            pool.free("b")  # its blocks go to the tail of the free list
            pool.allocate("b", 4, chain_block_hashes(list(range(6)), 4))  # a prefix hit
            pools.append(pool)
        return pools[0], pools[1]

    def test_equals_appends_one_after_another(self) -> None:
        """The same block tables, token counts and free list as one append per request."""
        one, many = self._pools()
        growth = [("a", 7), ("c", 1), ("b", 9)]
        for rid, n in growth:
            assert one.append(rid, n)
        assert many.append_many(growth)
        for rid in ("a", "b", "c"):
            assert many.block_table(rid) == one.block_table(rid)
            assert many.num_tokens(rid) == one.num_tokens(rid)
        assert many.stats() == one.stats()
        assert many.allocate("d", 40) == one.allocate("d", 40)

    def test_copies_a_shared_partial_block_as_append_does(self) -> None:
        """A forked request's shared partial block is copied in turn, as by append."""
        one, many = self._pools()
        for pool in (one, many):
            pool.fork("c", "f")
        for rid, n in (("f", 2), ("a", 5)):
            assert one.append(rid, n)
        assert many.append_many([("f", 2), ("a", 5)])
        assert many.block_table("f") == one.block_table("f")
        assert many.block_table("a") == one.block_table("a")
        assert many.stats() == one.stats()

    def test_all_or_nothing(self) -> None:
        """When the blocks needed together are not free, nothing changes."""
        pool, _ = self._pools()
        before = pool.stats()
        tables = {rid: pool.block_table(rid) for rid in ("a", "b", "c")}
        assert not pool.append_many([("c", 1), ("a", 4 * before.free_blocks + 4)])
        assert {rid: pool.block_table(rid) for rid in ("a", "b", "c")} == tables
        assert pool.stats().failed_allocations == before.failed_allocations + 1

    def test_bad_input_is_refused(self) -> None:
        """An unknown request, one named twice or a negative count raises, changing nothing."""
        pool, _ = self._pools()
        before = pool.stats()
        with pytest.raises(BlockPoolError, match="unknown request 'zz'"):
            pool.append_many([("a", 1), ("zz", 1)])
        with pytest.raises(BlockPoolError, match="twice"):
            pool.append_many([("a", 1), ("a", 1)])
        with pytest.raises(ValueError, match="'num_tokens' must be >= 0: -1"):
            pool.append_many([("a", 1), ("c", -1)])
        assert pool.stats() == before
