"""The step: one iteration of prefill chunks and decodes (or several decode-only ones), KV
growth, and the clock.

Prefill chunks fill the token budget left after one token per decoding request; the
roofline gives the iteration's time; tokens are produced, and finished requests leave.
When only decoding requests run and nobody waits, nothing but KV growth changes between
iterations, so :meth:`Step.decode` advances ``k`` iterations at once, with ``k`` the distance
to the next arrival, completion, eviction round or block shortage. Each of those ``k``
iterations keeps its own roofline time, so the result equals ``k`` single steps.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from numpy.typing import NDArray

from kvpolicy.sim._batch import Batch
from kvpolicy.sim._config import EngineConfig
from kvpolicy.sim._residency import Residency
from kvpolicy.sim._seq import Seq
from kvpolicy.sim._timing import TimingModel, pairwise_sum

__all__ = ["DecodeRun", "Step"]


class DecodeRun:
    """A run of decode-only iterations planned from a batch, not yet applied.

    The iterations' times are drawn only as far as a question about the run needs them
    (most runs end at the next arrival long before ``kmax``), and summed as numpy sums an
    array, so that the clock is the same float whatever was asked.

    Args:
        start: the clock at its start, seconds.
        run: the running requests, in order.
        times: the seconds of its iterations: all of them, or ``times(first, count)`` giving
            those of iterations ``first .. first + count - 1``.
        block_size: tokens per KV block.
        kmax: iterations in the whole run (``len(times)`` when they are given).
        delay: seconds of transfers added to its first iteration.
    """

    __slots__ = (
        "_acc",
        "_draw",
        "_ends",
        "_offsets",
        "_suffix",
        "_summed",
        "_times",
        "block_size",
        "delay",
        "kmax",
        "run",
        "start",
    )

    def __init__(
        self,
        start: float,
        run: list[Seq],
        times: Sequence[float] | Callable[[int, int], list[float]],
        block_size: int,
        kmax: int | None = None,
        delay: float = 0.0,
    ) -> None:
        self.start = start
        self.run = run
        self.block_size = block_size
        if callable(times):
            if kmax is None:
                raise ValueError("'kmax' must be given with times drawn on demand")
            self._draw = times
        else:
            given = [float(t) for t in times]
            self._draw = lambda first, count: given[first : first + count]
            kmax = len(given) if kmax is None else min(kmax, len(given))
        self.kmax = kmax
        """Iterations in the whole run."""
        self.delay = delay
        self._times: list[float] = []
        self._ends: list[float] = []
        self._acc = 0.0
        self._summed = (0, 0.0)
        self._suffix: list[int] | None = None
        self._offsets: list[int] | None = None

    def _more(self, count: int) -> float:
        """Draw ``count`` more iterations (within ``kmax``); returns the last end."""
        times, ends = self._times, self._ends
        have = len(times)
        count = min(count, self.kmax - have)
        new = self._draw(have, count)
        if not have:
            new[0] += self.delay
        times.extend(new)
        start, acc = self.start, self._acc
        for t in new:
            acc += t  # numpy's cumsum: one running sum
            ends.append(start + acc)
        self._acc = acc
        return ends[-1]

    def _extend(self, n: int) -> None:
        """Draw the times of its first ``n`` iterations (at most ``kmax``)."""
        more = min(n, self.kmax) - len(self._times)
        if more > 0:
            self._more(more)

    def _draw_past(self, t: float, strict: bool) -> list[float]:
        """Its ends drawn up to the first at or after ``t`` (after ``t`` when ``strict``),
        or all of them."""
        ends = self._ends
        last = ends[-1] if ends else -math.inf
        kmax = self.kmax
        while (last < t or (strict and last == t)) and len(ends) < kmax:
            last = self._more(max(8, len(ends)))
        return ends

    @property
    def ends(self) -> NDArray[np.float64]:
        """(kmax,) float64 clock at the end of each of its iterations."""
        self._extend(self.kmax)
        return np.array(self._ends, dtype=np.float64)

    @property
    def times(self) -> NDArray[np.float64]:
        """(kmax,) float64 seconds of each of its iterations."""
        self._extend(self.kmax)
        return np.array(self._times, dtype=np.float64)

    def steps_until(self, event: float) -> int:
        """Iterations up to the first that ends at or after ``event`` (all of them when
        ``event`` is ``inf`` or comes later)."""
        kmax = self.kmax
        if event < math.inf and kmax > 1:
            ends = self._draw_past(event, False)
            return min(kmax, bisect.bisect_left(ends, event) + 1)
        return kmax

    def elapsed(self, k: int) -> float:
        """Seconds of its first ``k`` iterations, summed as ``np.sum`` sums them."""
        if self._summed[0] == k:
            return self._summed[1]
        self._extend(k)
        total = pairwise_sum(self._times, k)
        self._summed = (k, total)
        return total

    def end(self, k: int) -> float:
        """The clock after its first ``k`` iterations (as :meth:`Step.commit` sets it)."""
        return self.start + self.elapsed(k)

    def done_by(self, t: float) -> tuple[int, float, float]:
        """Its iterations that have ended by ``t``, when the last of them ended (its start:
        none), and when the next one ends (``inf``: none is left)."""
        if not self.kmax:
            return 0, self.start, math.inf
        ends = self._draw_past(t, True)
        k = bisect.bisect_right(ends, t)
        return k, ends[k - 1] if k else self.start, ends[k] if k < len(ends) else math.inf

    def blocks_after(self, k: int) -> int:
        """New KV blocks its requests hold after ``k`` of its iterations (what
        :meth:`Batch.blocks_for` counts, in constant time).

        A request holding ``p`` tokens takes a new block at each token that starts one:
        after ``k`` more, ``(u + k) // bs`` new blocks with ``u = (p + bs - 1) % bs``. Over
        the run that is ``len(run) * (k // bs)`` plus the requests with
        ``u >= bs - k % bs``, counted once from a histogram of ``u``.
        """
        bs = self.block_size
        suffix = self._suffix
        if suffix is None:
            suffix = self._histogram()
        q, r = divmod(k, bs)
        return len(self.run) * q + (suffix[bs - r] if r else 0)

    def next_growth(self, k: int) -> float:
        """When, after ``k`` of its iterations, the next one that takes a new block ends
        (``inf``: none does in the run): the view of its KV is the same until then.

        A request with ``u`` (as in :meth:`blocks_after`) takes its blocks at the
        iterations ``k`` with ``k % bs == (bs - u) % bs``.
        """
        if self._offsets is None:
            self._histogram()
        offsets = self._offsets
        assert offsets is not None
        if not offsets:
            return math.inf
        bs = self.block_size
        r = k % bs
        i = bisect.bisect_right(offsets, r)
        nxt = k - r + (offsets[i] if i < len(offsets) else bs + offsets[0])
        if nxt > self.kmax:
            return math.inf
        self._extend(nxt)
        return self._ends[nxt - 1]

    def growth_by(self, t: float) -> tuple[int, float]:
        """New KV blocks its requests hold after its iterations that have ended by ``t``
        (:meth:`blocks_after`), and when the next iteration that takes one ends
        (:meth:`next_growth`), in one call: what a fresh view of the replica reads."""
        if not self.kmax:
            return 0, math.inf
        ends = self._draw_past(t, True)
        suffix, offsets = self._suffix, self._offsets
        if suffix is None or offsets is None:
            suffix = self._histogram()
            offsets = self._offsets
            assert offsets is not None
        k = bisect.bisect_right(ends, t)
        bs = self.block_size
        q, r = divmod(k, bs)
        grown = len(self.run) * q + (suffix[bs - r] if r else 0)
        if not offsets:
            return grown, math.inf
        i = bisect.bisect_right(offsets, r)
        nxt = k - r + (offsets[i] if i < len(offsets) else bs + offsets[0])
        if nxt > self.kmax:
            return grown, math.inf
        self._extend(nxt)
        return grown, self._ends[nxt - 1]

    def _histogram(self) -> list[int]:
        bs = self.block_size
        count = [0] * (bs + 1)
        for s in self.run:
            count[(s.pool_tokens + bs - 1) % bs] += 1
        suffix = [0] * (bs + 1)  # suffix[j]: requests with u >= j
        acc = 0
        for j in range(bs - 1, -1, -1):
            acc += count[j]
            suffix[j] = acc
        self._suffix = suffix
        # Offsets in 1..bs of the iterations (mod bs) at which some request takes a block.
        self._offsets = sorted(bs - u for u in range(bs) if count[u])
        return suffix


class Step:
    """Advances the batch and the clock.

    Args:
        config: engine limits (token budget, most iterations advanced at once).
        timing: the roofline time model.
        batch: the batch it advances.
        residency: token residency (eviction rounds before an iteration that needs room).
        on_finish: called with each request that produced its last token, the time and the
            iteration count at its end.
    """

    def __init__(
        self,
        config: EngineConfig,
        timing: TimingModel,
        batch: Batch,
        residency: Residency,
        on_finish: Callable[[Seq, float, int], None],
    ) -> None:
        self._token_budget = config.token_budget
        self._max_macro = config.max_macro_steps
        self._tm = timing
        self._batch = batch
        self._res = residency
        self._on_finish = on_finish
        self.now = 0.0
        """Simulated time, seconds."""
        self.step = 0
        """Iterations so far."""
        self.last_tokens = 0
        """Tokens computed by the last iteration (its token budget used)."""

    def prepare(self) -> tuple[bool, int, int, bool | None]:
        """Before admission, as vLLM schedules its running requests first: preempt until
        every decoding request's next token fits. Returns whether anyone was preempted, the
        token budget left for new prompts, the blocks the decodes need and whether every
        running request decodes (None: not known, the budget ran out before the last)."""
        batch = self._batch
        preempted = False
        budget, need, decoding = self._demand(batch.running)
        if budget <= 0 and batch.order_running(self.now):  # who waits depends on the order
            budget, need, decoding = self._demand(batch.running)
        if need > batch.free_blocks:
            before = len(batch.running)
            batch.preempt_until(self._decodes_fit, self.now)
            preempted = len(batch.running) < before
            budget, need, decoding = self._demand(batch.running)
        return preempted, budget, need, decoding

    def _decodes_fit(self) -> bool:
        """Whether every decoding request's next token fits in the free blocks."""
        return self._demand(self._batch.running)[1] <= self._batch.free_blocks

    def _demand(self, running: list[Seq]) -> tuple[int, int, bool | None]:
        """(token budget left after the running requests' tokens, blocks their decodes need
        for one more token: one for each whose last block is full, and whether all of them
        decode: None when the budget ran out before the last). As in vLLM, requests get the
        budget in the running list's order; those after it runs out wait."""
        bs = self._batch.block_size
        budget = self._token_budget
        need = 0
        decoding: bool | None = True
        for s in running:
            if budget <= 0:
                return budget, need, decoding and None
            left = s.target - s.computed
            if left <= 0:
                budget -= 1
                if s.pool_tokens % bs == 0:
                    need += 1
            else:
                budget -= min(left, budget)
                decoding = False
        return budget, need, decoding

    def run(self, next_event: float, first_output: Callable[[int, float], None]) -> None:
        """One mixed iteration, or ``k >= 1`` decode-only ones when every running request
        decodes; ``next_event`` (the next arrival or retry) bounds ``k``."""
        if all(s.computed >= s.target for s in self._batch.running):  # all decoding
            self.decode(next_event)
        else:
            self.mixed(first_output)

    def mixed(self, first_output: Callable[[int, float], None], need: int | None = None) -> None:
        """One iteration with prefill chunks (and any decodes); ``need``: the blocks the
        decodes need, when known (:meth:`prepare`'s, with no request swapped in since)."""
        batch = self._batch
        if need is None or need > batch.free_blocks:
            batch.preempt_until(self._decodes_fit, self.now)
        running = batch.running
        # Tokens in the running list's order, as vLLM gives them; the rest wait.
        budget = self._token_budget
        dec: list[Seq] = []
        chunks: list[tuple[Seq, int]] = []
        dec_pairs = chunk_pairs = 0
        for s in running:
            if budget <= 0:
                break
            computed = s.computed
            left = s.target - computed
            if left <= 0:  # decoding
                dec.append(s)
                dec_pairs += s.pool_tokens
                budget -= 1
                continue
            c = left if left < budget else budget
            budget -= c
            chunks.append((s, c))
            chunk_pairs += c * computed + c * (c + 1) // 2
        n_tok = self._token_budget - budget
        self.last_tokens = n_tok
        if self._res.maybe_round(self.step, running, n_tok):  # evictions shrank the KV
            dec_pairs = sum(s.pool_tokens for s in dec)
        kv_read = sum(s.pool_tokens for s in running)
        pairs = dec_pairs + chunk_pairs
        crossing: list[Seq] = []
        dec_done: list[Seq] = []
        for s in dec:
            new = s.pool_tokens + 1
            if new > s.pool_reserved:
                crossing.append(s)  # crosses into a block the pool has not recorded yet
            else:
                s.pool_tokens = new
            s.generated += 1
            if s.generated >= s.req.decode_len:
                dec_done.append(s)
        if crossing:
            batch.grow_all(crossing, 1)
        self.now += self._tm.iteration_time(n_tok, kv_read, pairs) + batch.take_delay()
        self.step += 1
        finished: list[Seq] = []
        self._res.wrote(n_tok)
        for s, c in chunks:
            s.computed += c
            if s.decoding:
                s.generated += 1
                first_output(s.idx, self.now)
                if s.generated >= s.req.decode_len:
                    finished.append(s)
        finished.extend(dec_done)
        self._finish(finished)

    def decode(self, next_event: float) -> None:
        """``k >= 1`` decode-only iterations of an unchanged batch; ``next_event`` (the next
        arrival or retry) bounds ``k``."""
        run = self.plan_decode()
        self.commit(run, run.steps_until(next_event))

    def plan_decode(self, need: int | None = None) -> DecodeRun:
        """The decode-only run the batch would make from now, its preemptions and eviction
        round done but its iterations not yet applied (:meth:`commit` applies them);
        ``need``: the blocks the decodes need, when known (as for :meth:`mixed`).

        Nothing else may change the batch between the two: the run's iterations depend only
        on the batch at its start.
        """
        batch = self._batch
        run = batch.running
        free = batch.free_blocks
        if need is None:
            need = self._demand(run)[1]
        if need > free:  # every running request decodes here
            batch.preempt_until(self._decodes_fit, self.now)
            run = batch.running
            free = batch.free_blocks
            kmax = 1
            if not run:
                return DecodeRun(self.now, [], (), batch.block_size)
        else:
            kmax = self._max_macro
        if batch.waiting or batch.swapped or batch.has_delay:
            kmax = 1
        else:  # a run ends with the first request to finish (at least one iteration left)
            kmax = min(kmax, min(s.req.decode_len - s.generated for s in run))
        self._res.maybe_round(self.step, run, len(run))
        free_steps = self._res.steps_free(self.step, len(run))
        if free_steps is not None:
            kmax = min(kmax, free_steps)
        if kmax > 1 and batch.blocks_for(run, kmax) > free:
            lo, hi = 1, kmax  # largest k whose blocks fit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if batch.blocks_for(run, mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            kmax = lo
        kv = sum(s.pool_tokens for s in run)
        times = partial(self._tm.decode_series, len(run), kv, kv)
        return DecodeRun(self.now, list(run), times, batch.block_size, kmax, batch.take_delay())

    def commit(self, plan: DecodeRun, k: int) -> None:
        """Apply the first ``k`` iterations of ``plan`` (made by :meth:`plan_decode` from
        the state the batch is still in)."""
        run = plan.run
        if not run:
            return
        batch = self._batch
        self.now += plan.elapsed(k)
        self.step += k
        self._res.wrote(len(run) * k)
        self.last_tokens = len(run)
        finished: list[Seq] = []
        crossing: list[Seq] = []
        for s in run:
            new = s.pool_tokens + k
            if new > s.pool_reserved:
                crossing.append(s)  # crosses into blocks the pool has not recorded yet
            else:
                s.pool_tokens = new
            s.generated += k
            if s.generated >= s.req.decode_len:
                finished.append(s)
        if crossing:
            batch.grow_all(crossing, k)
        self._finish(finished)

    def _finish(self, finished: list[Seq]) -> None:
        for s in finished:
            self._on_finish(s, self.now, self.step)
        self._batch.retire(finished)
