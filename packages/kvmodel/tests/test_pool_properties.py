"""Hypothesis state machine over random block-pool operations."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpolicy.kvmodel import BlockPool, chain_block_hashes

BLOCK = 4


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/append/fork/truncate/free sequences against a model of each request."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks=24, block_size=BLOCK)
        self.views: dict[str, list[int]] = {}
        self.next_id = 0
        self.next_token = 0

    def _tokens(self, n: int) -> list[int]:
        out = list(range(self.next_token, self.next_token + n))
        self.next_token += n
        return out

    @rule(n=st.integers(0, 20), shared_prompt=st.booleans())
    def allocate(self, n: int, shared_prompt: bool) -> None:
        rid = f"r{self.next_id}"
        self.next_id += 1
        tokens = [7] * n if shared_prompt else self._tokens(n)
        before = self.pool.stats()
        alloc = self.pool.allocate(rid, n, chain_block_hashes(tokens, BLOCK), token_ids=tokens)
        if alloc is None:
            after = self.pool.stats()
            assert after.used_blocks == before.used_blocks
            assert not self.pool.has_request(rid)
        else:
            self.views[rid] = tokens

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data(), n=st.integers(1, 9))
    def append(self, data: st.DataObject, n: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.views)))
        tokens = self._tokens(n)
        if self.pool.append(rid, n, token_ids=tokens):
            self.views[rid] = self.views[rid] + tokens

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.views)))
        child = f"r{self.next_id}"
        self.next_id += 1
        self.pool.fork(rid, child)
        self.views[child] = list(self.views[rid])

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.views)))
        keep = data.draw(st.integers(0, len(self.views[rid])))
        shared_partial = keep % BLOCK != 0 and self.pool.num_free_blocks == 0
        if shared_partial:
            return
        self.pool.truncate(rid, keep)
        self.views[rid] = self.views[rid][:keep]

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.views)))
        self.pool.free(rid)
        del self.views[rid]

    @invariant()
    def blocks_conserved(self) -> None:
        """Free plus owned blocks is the pool size; no block is both."""
        owned = {b for _, table in self.pool.iter_owned() for b in table}
        free = {b for b in range(self.pool.num_blocks) if self.pool.is_free(b)}
        assert not owned & free
        assert len(owned) + len(free) == self.pool.num_blocks

    @invariant()
    def ref_counts_match_tables(self) -> None:
        """Each block's count equals the tables that hold it, never negative."""
        counts = [0] * self.pool.num_blocks
        for _, table in self.pool.iter_owned():
            for b in table:
                counts[b] += 1
        assert counts == [self.pool.ref_count(b) for b in range(self.pool.num_blocks)]

    @invariant()
    def views_unchanged_by_others(self) -> None:
        """Every request reads back exactly what it wrote (copy-on-write isolates)."""
        for rid, view in self.views.items():
            assert self.pool.read(rid) == view
            assert self.pool.num_tokens(rid) == len(view)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
