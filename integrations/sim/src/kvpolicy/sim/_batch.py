"""The batch: who runs. Swap-in, admission (with prefix-cache and tier hits), preemption.

Swapped requests come back first, as in vLLM; then the admission policy says how many
waiting requests join, and each must get blocks for its prompt (prefix-cache hits are
shared), else admission stops at it (vLLM's head-of-line rule). When the pool cannot give
every decoding request its next slot, the preemption policy orders the running requests and
the first ones are preempted: recomputation drops their KV and puts them back at the head of
the queue, swap moves it to a CPU tier at PCIe speed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import attrs
import numpy as np

from kvpolicy.kvmodel import (
    AdmissionPolicy,
    BlockPool,
    CompletionObserver,
    PreemptionPolicy,
    PrefixStore,
    PromptObserver,
    SchedulerState,
    SequenceView,
)
from kvpolicy.sim._config import EngineConfig, PreemptionConfig
from kvpolicy.sim._errors import SimError
from kvpolicy.sim._recorder import Recorder
from kvpolicy.sim._residency import Residency
from kvpolicy.sim._seq import Seq, WaitingView
from kvpolicy.sim._timing import TimingModel

__all__ = ["Batch", "blocks_to_grow"]


class _LazyViews(Sequence[SequenceView]):
    """The running batch's views, built when a policy first reads them."""

    __slots__ = ("_batch", "_now", "_views")

    def __init__(self, batch: Batch, now: float) -> None:
        self._batch = batch
        self._now = now
        self._views: tuple[SequenceView, ...] | None = None

    def _get(self) -> tuple[SequenceView, ...]:
        if self._views is None:
            self._views = self._batch.views(self._now)
        return self._views

    def __len__(self) -> int:
        return len(self._batch.running) if self._views is None else len(self._views)

    @overload
    def __getitem__(self, i: int) -> SequenceView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[SequenceView]: ...
    def __getitem__(self, i: int | slice) -> SequenceView | Sequence[SequenceView]:
        return self._get()[i]

    def __iter__(self) -> Iterator[SequenceView]:
        return iter(self._get())


class Batch:
    """The waiting, swapped and running requests of one engine, and the moves between them.

    Args:
        config: engine limits (``max_batch``).
        pool: the KV block pool.
        residency: token residency (keeps the eviction ledger in step with the moves).
        recorder: where admissions, preemptions and hits are counted.
        timing: the time model (transfer and recompute times).
        admission: how many waiting requests join, or None (while blocks last).
        preemption: preemption order, or None (the last admitted first, as vLLM does).
        preemption_config: recomputation or swap, and the CPU tier.
        store: prefix tiers below HBM, or None.
    """

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        residency: Residency,
        recorder: Recorder,
        timing: TimingModel,
        admission: AdmissionPolicy | None,
        preemption: PreemptionPolicy | None,
        preemption_config: PreemptionConfig,
        store: PrefixStore | None,
    ) -> None:
        self._max_batch = config.max_batch
        self._pool = pool
        self._bs = pool.block_size
        self._res = residency
        self._rec = recorder
        self._tm = timing
        self._admission = admission
        adm: object = admission
        self.observer: CompletionObserver | None = (
            adm if isinstance(adm, CompletionObserver) else None
        )
        """The admission policy, when it learns from completions."""
        self._preemption = preemption
        self._pre = preemption_config
        self._store = store
        st: object = store
        self._prompt_observer: PromptObserver | None = (
            st if isinstance(st, PromptObserver) else None
        )
        self.waiting: deque[Seq] = deque()
        self.swapped: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._admit_counter = 0
        self._swap_used = 0
        self._delay = 0.0

    # ------------------------------------------------------------------- queries
    @property
    def idle(self) -> bool:
        """No request is running, waiting or swapped out."""
        return not self.running and not self.waiting and not self.swapped

    def used_tokens(self) -> int:
        """KV slots held in used blocks."""
        pool = self._pool
        return (pool.num_blocks - pool.num_free_blocks) * self._bs

    def take_delay(self) -> float:
        """Seconds of transfers (swap, tier loads) the next iteration waits for; resets."""
        d, self._delay = self._delay, 0.0
        return d

    @property
    def has_delay(self) -> bool:
        """Whether transfers are waiting to be charged to the next iteration."""
        return bool(self._delay)

    def views(self, now: float) -> tuple[SequenceView, ...]:
        """The running requests as policies see them."""
        # Every field comes from the engine's own checked state; validating each of the
        # batch's views at every iteration would cost more than the iteration itself.
        # KV resident is what has been computed (blocks reserved for a prompt's later
        # chunks hold nothing yet): the prompt and every output fed back, not the last
        # one (vLLM's num_computed_tokens); "admitted" is the last admission, as in vLLM.
        with attrs.validators.disabled():
            return tuple(
                SequenceView(
                    request_id=s.rid,
                    prompt_len=s.req.prompt_len,
                    generated=s.generated,
                    kv_tokens=min(s.pool_tokens, s.written),
                    tenant=s.req.tenant,
                    priority=s.req.priority,
                    arrival_time=s.req.arrival_time,
                    admitted_time=s.admitted_at,
                    computed_tokens=s.written,
                )
                for s in self.running
            )

    # ------------------------------------------------------------------ admission
    def admit(
        self, now: float, step: int, token_budget: int | None = None, reserve_blocks: int = 0
    ) -> None:
        """Swapped requests come back, then the admission policy's count of waiting ones
        join while blocks and ``max_batch`` allow, and, as in vLLM's scheduler, while the
        iteration's ``token_budget`` has room for their first prefill tokens and the pool
        keeps ``reserve_blocks`` free for the running requests' next tokens."""
        cap = self._max_batch
        while self.swapped and len(self.running) < cap:
            s = self.swapped[0]
            if self._pool.allocate(s.rid, s.pool_tokens) is None:
                return
            s.pool_reserved = s.pool_tokens
            self.swapped.popleft()
            self._swap_used -= s.pool_tokens
            self._rec.swapped += s.pool_tokens
            self._delay += self._tm.transfer_time(s.pool_tokens, self._pre.pcie_bandwidth)
            s.order = self._admit_counter
            self._admit_counter += 1
            s.admitted_at = now
            self.running.append(s)
            self._res.resume(s, step)
        if not self.waiting or self.swapped:
            return
        n = self._count(now, step)
        budget = token_budget
        for _ in range(n):
            if len(self.running) >= cap or (budget is not None and budget <= 0):
                break
            s = self.waiting[0]
            if reserve_blocks:
                pool = self._pool
                fresh = pool.blocks_needed(s.target) - pool.cached_prefix_blocks(s.hashes)
                if fresh + reserve_blocks > pool.num_free_blocks:
                    break
            if not self._allocate(s, now):
                break
            if budget is not None:
                budget -= s.target - s.computed
            self.waiting.popleft()
            s.order = self._admit_counter
            self._admit_counter += 1
            s.admitted_at = now
            self._rec.admitted(s.idx, now)
            self.running.append(s)
            self._res.join(s, step)

    def _count(self, now: float, step: int) -> int:
        if self._admission is None:
            return len(self.waiting)
        capacity = self._pool.num_blocks * self._bs
        # Built from the engine's own checked state before every admission, like the
        # views: validating it each time costs more than the admission policy.
        was = attrs.validators.get_disabled()
        attrs.validators.set_disabled(True)
        try:
            state = SchedulerState(
                step=step,
                time=now,
                used_tokens=min(self.used_tokens(), capacity),
                capacity_tokens=capacity,
                running=_LazyViews(self, now),
            )
        finally:
            attrs.validators.set_disabled(was)
        n = self._admission.admit(state, WaitingView(self.waiting))
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise SimError(f"admission policy returned a non-integer count: {n!r}")
        if not 0 <= n <= len(self.waiting):
            raise SimError(f"admission policy returned {n}, outside [0, {len(self.waiting)}]")
        return int(n)

    def _allocate(self, s: Seq, now: float) -> bool:
        hashes = s.hashes
        if (
            self._prompt_observer is not None
            and hashes
            and math.isnan(self._rec.first_admitted[s.idx])
        ):
            # A store that places blocks by prefix group learns the chain first.
            self._prompt_observer.observe_prompt(hashes, now)
        alloc = self._pool.allocate(s.rid, s.target, hashes, hash_block_size=self._bs)
        if alloc is None:
            return False
        s.pool_tokens = s.pool_reserved = s.target
        # The last token is always computed, to produce logits (as vLLM does).
        s.computed = min(alloc.cached_tokens, s.target - 1)
        self._rec.prefix_hit += s.computed
        if self._store is not None:
            self.offload(now)
            self._fetch(s, alloc.cached_tokens // self._bs, now)
        return True

    def _fetch(self, s: Seq, hbm: int, now: float) -> None:
        """Look up below HBM the prompt blocks HBM missed; load them when the transfer
        beats recomputing them (a slow disk can lose to a fast GPU)."""
        assert self._store is not None
        bs = self._bs
        full = min(len(s.hashes), s.target // bs)
        if hbm >= full:
            return
        # The pool has already registered these blocks as cached (they are written now).
        got = self._store.fetch(s.hashes[hbm:full], now)
        loaded = min((hbm + got.blocks) * bs, s.target - 1) - s.computed
        start = s.computed
        pairs = loaded * start + loaded * (loaded + 1) // 2
        if loaded > 0 and got.seconds < self._tm.compute_time(loaded, pairs):
            s.computed += loaded
            self._rec.tier_hit += loaded
            self._rec.tier_load += got.seconds
            self._delay += got.seconds

    def offload(self, now: float) -> None:
        """Offer the prefix store the cached blocks the pool reused since the last call."""
        if self._store is None:
            return
        dropped = self._pool.pop_dropped_hashes()
        if dropped:
            self._store.offload(dropped, now)

    # ----------------------------------------------------------------- preemption
    def _order(self, now: float) -> list[Seq]:
        if self._preemption is None:
            return sorted(self.running, key=lambda s: -s.order)
        by_id = {s.rid: s for s in self.running}
        out = []
        for rid in self._preemption.order(self.views(now)):
            s = by_id.pop(rid, None)
            if s is None:
                raise SimError(f"preemption policy ordered an unknown or repeated id {rid!r}")
            out.append(s)
        return out

    def order_running(self, now: float) -> bool:
        """With a preemption order, put the running requests in the order vLLM serves them
        under it: the order's first victim last (vLLM preempts the last of its running
        list), so the order also decides who gets the iteration's token budget first when
        it runs out. Returns whether the order changed anything."""
        if self._preemption is None or all(s.decoding for s in self.running):
            return False
        self.running[:] = self._order(now)[::-1]
        return True

    def preempt_until(self, fits: Callable[[], bool], now: float) -> None:
        """Preempt running requests in policy order until ``fits()`` holds."""
        if fits():
            return
        for s in self._order(now):
            self._preempt(s)
            if fits():
                return

    def _preempt(self, s: Seq) -> None:
        self.running.remove(s)
        self._rec.preemptions[s.idx] += 1
        pre = self._pre
        tm = self._tm
        swap_bytes = s.pool_tokens * tm.kv_bytes_per_token
        if (
            pre.mode == "swap"
            and s.decoding
            and self._swap_used * tm.kv_bytes_per_token + swap_bytes <= pre.cpu_swap_bytes
        ):
            self._res.suspend(s)
            self._pool.free(s.rid)
            self._swap_used += s.pool_tokens
            self._rec.swapped += s.pool_tokens
            self._delay += tm.transfer_time(s.pool_tokens, pre.pcie_bandwidth)
            self.swapped.appendleft(s)
            return
        self._res.drop(s)
        self._pool.free(s.rid)
        # Recomputation: the prompt and every output fed back so far are computed again.
        self._rec.recomputed += s.written
        if pre.mode == "restart":
            s.generated = 0  # the outputs are lost too: decode starts over
        s.target = s.req.prompt_len + s.generated
        s.computed = 0
        s.pool_tokens = s.pool_reserved = 0
        self.waiting.appendleft(s)

    # ------------------------------------------------------------------ finishing
    def retire(self, finished: Sequence[Seq]) -> None:
        """Remove finished requests from the running batch and free their blocks."""
        if not finished:
            return
        gone = set()
        for s in finished:
            self._pool.free(s.rid)
            self._res.close(s)
            gone.add(id(s))
        self.running = [s for s in self.running if id(s) not in gone]

    def abort(self, s: Seq) -> bool:
        """Drop ``s`` wherever it is (its client went away): its blocks and its place in the
        eviction ledger are given back. Returns False when it was not in the batch."""
        if s in self.waiting:  # holds no blocks (a preempted request gave them back)
            self.waiting.remove(s)
            return True
        if s in self.swapped:
            self.swapped.remove(s)
            self._swap_used -= s.pool_tokens
            self._res.resume(s, 0)  # back in the ledger's accounts, to be closed
            self._res.close(s)
            return True
        if s in self.running:
            self.running.remove(s)
            self._pool.free(s.rid)
            self._res.close(s)
            return True
        return False

    def blocks_for(self, seqs: Sequence[Seq], k: int) -> int:
        """Blocks ``seqs`` need to grow by ``k`` tokens each (:func:`blocks_to_grow`)."""
        return blocks_to_grow(seqs, k, self._bs)

    def grow_all(self, seqs: Sequence[Seq], k: int) -> None:
        """Add ``k`` tokens of KV to each of ``seqs`` (distinct requests), with one call to
        the pool for all of them. The pool is told a block at a time: it records tokens up
        to the end of a request's last block, so one call serves ``block_size`` decode
        steps; its block count (the memory) is the same as with one call per token."""
        bs = self._bs
        growth: list[tuple[str, int]] = []
        for s in seqs:
            new = s.pool_tokens + k
            if new > s.pool_reserved:
                end = -(-new // bs) * bs
                growth.append((s.rid, end - s.pool_reserved))
                s.pool_reserved = end
            s.pool_tokens = new
        if growth:
            ok = self._pool.append_many(growth)
            assert ok, "blocks were counted before the step"

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._bs

    @property
    def free_blocks(self) -> int:
        """Free blocks of the pool."""
        return self._pool.num_free_blocks


def blocks_to_grow(seqs: Sequence[Seq], k: int, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that ``seqs`` need to grow by ``k`` tokens each."""
    bs = block_size
    # Block j of a sequence is needed once it holds token j*bs: growing from p tokens to
    # p + k needs ceil((p + k) / bs) - ceil(p / bs) new blocks.
    need = 0
    for s in seqs:
        p = s.pool_tokens
        need += (p + k + bs - 1) // bs - (p + bs - 1) // bs
    return need
