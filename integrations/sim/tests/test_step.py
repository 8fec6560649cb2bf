"""A planned decode run: its iterations' ends and the KV blocks they take, without applying it."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.kvmodel import Request, get_gpu, get_model
from kvpolicy.sim import TimingModel
from kvpolicy.sim._batch import blocks_to_grow
from kvpolicy.sim._seq import Seq
from kvpolicy.sim._step import DecodeRun


def _run(tokens: list[int], kmax: int, block_size: int) -> DecodeRun:
    seqs = []
    for i, p in enumerate(tokens):
        s = Seq(i, Request(f"r{i}", 32, 8, 0.0, "default"), ())
        s.pool_tokens = p
        seqs.append(s)
    times = np.linspace(0.01, 0.02, kmax)
    return DecodeRun(3.0, seqs, times, block_size)


class TestDecodeRun:
    @settings(max_examples=200, deadline=None)
    @given(
        tokens=st.lists(st.integers(0, 200), min_size=1, max_size=12),
        block_size=st.sampled_from([1, 4, 16]),
        kmax=st.integers(1, 70),
    )
    def test_blocks_after_counts_what_the_batch_counts(
        self, tokens: list[int], block_size: int, kmax: int
    ) -> None:
        """For every k, the blocks the run's requests take equal the batch's count
        (``Batch.blocks_for``)."""
        run = _run(tokens, kmax, block_size)
        for k in range(kmax + 1):
            assert run.blocks_after(k) == blocks_to_grow(run.run, k, block_size)

    @settings(max_examples=200, deadline=None)
    @given(
        tokens=st.lists(st.integers(0, 200), min_size=1, max_size=12),
        block_size=st.sampled_from([1, 4, 16]),
        kmax=st.integers(1, 70),
    )
    def test_next_growth_is_the_next_iteration_that_takes_a_block(
        self, tokens: list[int], block_size: int, kmax: int
    ) -> None:
        """After k iterations, next_growth is the end of the first later iteration whose
        block count differs (inf when none does)."""
        run = _run(tokens, kmax, block_size)
        ends = run.ends.tolist()
        for k in range(kmax + 1):
            later = [
                j for j in range(k + 1, kmax + 1) if run.blocks_after(j) != run.blocks_after(k)
            ]
            want = ends[later[0] - 1] if later else float("inf")
            assert run.next_growth(k) == want

    def test_done_by_and_steps_until(self) -> None:
        """Iterations over by a time, the last end and the next; a cut at an event ends
        with the first iteration that ends at or after it; end(k) is the clock commit sets."""
        run = DecodeRun(1.0, [], np.array([0.5, 0.25, 0.25]), 16)
        assert run.ends.tolist() == [1.5, 1.75, 2.0]
        assert run.done_by(1.0) == (0, 1.0, 1.5)
        assert run.done_by(1.75) == (2, 1.75, 2.0)
        assert run.done_by(9.0) == (3, 2.0, float("inf"))
        assert [run.steps_until(t) for t in (1.2, 1.5, 1.6, float("inf"))] == [1, 1, 2, 3]
        assert run.end(2) == 1.0 + float(np.array([0.5, 0.25]).sum())


class TestLazyDecodeRun:
    @settings(max_examples=150, deadline=None)
    @given(
        kmax=st.integers(1, 300),
        batch=st.integers(1, 64),
        delay=st.sampled_from([0.0, 0.0125]),
        queries=st.lists(
            st.tuples(st.sampled_from(["until", "done", "end"]), st.floats(0.0, 1.0)),
            max_size=6,
        ),
    )
    def test_answers_as_the_whole_array(
        self,
        kmax: int,
        batch: int,
        delay: float,
        queries: list[tuple[str, float]],
    ) -> None:
        """A run drawing its times on demand answers every question, in any order, with
        the same floats as one given them all at once (numpy's cumsum and sum)."""
        tm = TimingModel(get_model("Llama-3-8B"), get_gpu("H100-SXM"))
        kv = 1000 * batch
        whole = tm.decode_times(batch, kv, kv, kmax)
        whole[0] += delay
        eager = DecodeRun(2.0, [], whole, 16)
        lazy = DecodeRun(
            2.0,
            [],
            lambda first, count: tm.decode_series(batch, kv, kv, first, count),
            16,
            kmax,
            delay,
        )
        span = float(eager.ends[-1]) - 2.0
        for what, x in queries:
            t = 2.0 + x * span * 1.1
            if what == "until":
                k = eager.steps_until(t)
                assert lazy.steps_until(t) == k
                assert lazy.end(k) == 2.0 + float(whole[:k].sum())
            elif what == "done":
                assert lazy.done_by(t) == eager.done_by(t)
            else:
                k = min(kmax, int(x * kmax) + 1)
                assert lazy.elapsed(k) == float(whole[:k].sum())
        assert lazy.ends.tolist() == (2.0 + np.cumsum(whole)).tolist()
