"""The continuous-batching engine: timing, batching, prefix cache, preemption, eviction."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpolicy.evict import Periodic
from kvpolicy.kvmodel import Request, SchedulerState, get_gpu, get_model
from kvpolicy.sim import (
    ConfigError,
    Engine,
    EngineConfig,
    EvictionConfig,
    PreemptionConfig,
    SimError,
    Stack,
    TimingModel,
)
from kvpolicy.sim._recorder import Recorder


class TestSingleRequest:
    def test_times_follow_the_roofline(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """TTFT is one prefill iteration; each further token one decode iteration."""
        rec = Engine(tm, EngineConfig()).run([kit.request(0, prompt=100, decode=5, t=1.0)])
        prefill = tm.iteration_time(100, 100, 100 * 101 // 2)
        assert rec.first_token[0] == pytest.approx(1.0 + prefill, rel=1e-12)
        decode = tm.decode_times(1, 100, 100, 4).sum()
        assert rec.finish[0] == pytest.approx(1.0 + prefill + decode, rel=1e-12)
        assert rec.iterations == 5

    def test_chunked_prefill_splits_the_prompt(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A 100-token prompt under a 32-token budget takes four prefill iterations."""
        rec = Engine(tm, EngineConfig(token_budget=32)).run([kit.request(0, 100, 2)])
        assert rec.iterations == 4 + 1

    def test_kv_memory_is_released(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """The last sample holds no blocks once every request finished."""
        reqs = [kit.request(i, 40, 10, t=0.01 * i) for i in range(5)]
        rec = Engine(tm, kit.engine(4096)).run(reqs)
        assert np.isfinite(rec.finish).all()
        assert rec.series_kv_tokens[-1] == 0


class TestMacroSteps:
    @settings(max_examples=25, deadline=None)
    @given(
        st.lists(
            st.tuples(st.integers(1, 300), st.integers(1, 60), st.floats(0, 0.5)),
            min_size=1,
            max_size=12,
        )
    )
    def test_equal_to_single_steps(self, rows: list[tuple[int, int, float]]) -> None:
        """Advancing k decode iterations at once gives the times of k single iterations."""
        rows = sorted(rows, key=lambda r: r[2])
        reqs = [Request(f"r{i}", p, d, t) for i, (p, d, t) in enumerate(rows)]
        tm = TimingModel(get_model("Llama-3-8B"), get_gpu("H100-SXM"))
        fast = Engine(tm, EngineConfig(kv_capacity_tokens=2048)).run(reqs)
        slow = Engine(tm, EngineConfig(kv_capacity_tokens=2048, max_macro_steps=1)).run(reqs)
        np.testing.assert_allclose(fast.finish, slow.finish, rtol=1e-9)
        np.testing.assert_allclose(fast.first_token, slow.first_token, rtol=1e-9)
        assert fast.iterations == slow.iterations
        np.testing.assert_array_equal(fast.preemptions, slow.preemptions)


class TestPrefixCache:
    def test_shared_prefix_is_not_recomputed(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """The second request's three cached prompt blocks count as hits."""
        hashes = (11, 12, 13)
        reqs = [
            kit.request(0, 56, 4, 0.0, prefix_hashes=hashes),
            kit.request(1, 56, 4, 1.0, prefix_hashes=hashes),
        ]
        rec = Engine(tm, EngineConfig(block_size=16)).run(reqs)
        assert rec.prefix_hit_tokens == 48

    def test_off_means_no_hits(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """With prefix caching off, nothing is shared."""
        hashes = (11, 12, 13)
        reqs = [
            kit.request(0, 56, 4, 0.0, prefix_hashes=hashes),
            kit.request(1, 56, 4, 1.0, prefix_hashes=hashes),
        ]
        rec = Engine(tm, EngineConfig(prefix_caching=False)).run(reqs)
        assert rec.prefix_hit_tokens == 0


class TestAdmission:
    def test_policy_count_is_obeyed(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """One admission per iteration staggers four simultaneous arrivals."""

        class OnePerStep:
            def admit(self, state: SchedulerState, waiting: object) -> int:
                return 1

        rec = Engine(tm, EngineConfig(), Stack(admission=OnePerStep())).run(
            [kit.request(i, 16, 20) for i in range(4)]
        )
        assert len(set(rec.first_admitted.tolist())) == 4
        assert np.all(np.diff(rec.first_admitted) > 0)

    def test_out_of_range_count_raises(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A count larger than the queue is a SimError naming the count."""

        class TooMany:
            def admit(self, state: SchedulerState, waiting: object) -> int:
                return 7

        with pytest.raises(SimError, match="returned 7"):
            Engine(tm, EngineConfig(), Stack(admission=TooMany())).run([kit.request(0)])

    def test_non_policy_is_a_type_error(self, tm: TimingModel) -> None:
        """An object without admit() is refused when the engine is built."""
        with pytest.raises(TypeError, match="'admission' must implement AdmissionPolicy"):
            Engine(tm, EngineConfig(), Stack(admission=object()))  # type: ignore[arg-type]


class TestPreemption:
    def _reqs(self, kit: SimpleNamespace) -> list[Request]:
        return [kit.request(i, 64, 200, 0.001 * i) for i in range(3)]

    def test_default_preempts_last_admitted(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Without a policy the youngest request is preempted and recomputed."""
        rec = Engine(tm, kit.engine(512)).run(self._reqs(kit))
        assert rec.preemptions.tolist()[0] == 0
        assert rec.preemptions.sum() > 0
        assert rec.recomputed_tokens > 0
        assert np.isfinite(rec.finish).all()

    def test_policy_order_is_followed(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Preempting the oldest first preempts request r0."""
        rec = Engine(tm, kit.engine(512), Stack(preemption=kit.OldestFirst())).run(self._reqs(kit))
        assert rec.preemptions[0] > 0

    def test_swap_moves_kv_instead_of_recomputing(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Swap mode preempts without recomputation and counts the tokens moved."""
        rec = Engine(tm, kit.engine(512), preemption_config=PreemptionConfig(mode="swap")).run(
            self._reqs(kit)
        )
        assert rec.preemptions.sum() > 0
        assert rec.swapped_tokens > 0
        assert rec.recomputed_tokens == 0
        assert np.isfinite(rec.finish).all()


class TestTokenEviction:
    def _run(self, kit: SimpleNamespace, tm: TimingModel) -> tuple[object, object]:
        ev = kit.FifoEviction()
        reqs = [kit.request(i, 300, 400, 0.002 * i) for i in range(6)]
        eng = Engine(
            tm,
            kit.engine(8192, token_budget=256),
            Stack(eviction=Periodic(ev, interval=8)),
            eviction_config=EvictionConfig(budget_fraction=0.25),
        )
        return eng.run(reqs), ev

    def test_budget_is_never_exceeded(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Resident tokens stay within the budget at every sample, and tokens were evicted."""
        rec, _ = self._run(kit, tm)
        assert rec.eviction_budget == 2048
        assert int(rec.series_resident.max()) <= 2048
        assert rec.evicted_tokens > 0
        assert np.isfinite(rec.finish).all()

    def test_policy_sees_attention(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """The policy observes attention and the recall reflects the evicted mass."""
        rec, ev = self._run(kit, tm)
        assert ev.observed > 0
        assert 0.0 < rec.attention_recall < 1.0
        assert ev.resident_tokens() == 0

    def test_small_budget_is_a_config_error(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A budget below two iterations' tokens is refused when the engine is built."""
        with pytest.raises(ConfigError, match="eviction budget"):
            Engine(
                tm,
                kit.engine(1024),
                Stack(eviction=kit.FifoEviction()),
                eviction_config=EvictionConfig(budget_fraction=0.5),
            )


class TestBadInput:
    def test_no_request_fits(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Requests longer than the pool are refused before anything runs."""
        with pytest.raises(ConfigError, match="no request fits"):
            Engine(tm, kit.engine(64)).run([kit.request(0, 100, 10)])

    def test_too_long_requests_are_rejected(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A request past the model's context is rejected; the others run."""
        rec = Engine(tm, EngineConfig()).run([kit.request(0, 9000, 10), kit.request(1, 10, 10)])
        assert rec.rejected.tolist() == [True, False]
        assert math.isnan(rec.finish[0])
        assert np.isfinite(rec.finish[1])

    def test_unsorted_arrivals(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Requests out of arrival order are a ValueError."""
        with pytest.raises(ValueError, match="sorted by arrival_time"):
            Engine(tm, EngineConfig()).run([kit.request(0, t=1.0), kit.request(1, t=0.0)])


class TestInvariants:
    # ``kit`` only hands out factories and classes, so sharing it across examples is safe.
    @settings(
        max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        rows=st.lists(
            st.tuples(st.integers(1, 200), st.integers(1, 120), st.floats(0, 0.2)),
            min_size=1,
            max_size=10,
        ),
        mode=st.sampled_from(["recompute", "swap", "restart"]),
        evicting=st.booleans(),
        block_size=st.sampled_from([1, 16]),
    )
    def test_every_request_finishes_within_memory(
        self,
        kit: SimpleNamespace,
        rows: list[tuple[int, int, float]],
        mode: str,
        evicting: bool,
        block_size: int,
    ) -> None:
        """Under a small pool, any mode, with or without eviction: every request that fits
        finishes, the budget holds, and the pool is empty at the end."""
        rows = sorted(rows, key=lambda r: r[2])
        reqs = [Request(f"r{i}", p, d, t) for i, (p, d, t) in enumerate(rows)]
        tm = TimingModel(get_model("Llama-3-8B"), get_gpu("H100-SXM"))
        rec = Engine(
            tm,
            EngineConfig(block_size=block_size, kv_capacity_tokens=1024, token_budget=128),
            Stack(eviction=Periodic(kit.FifoEviction(), interval=4) if evicting else None),
            eviction_config=EvictionConfig(budget_fraction=0.5),
            preemption_config=PreemptionConfig(mode=mode, cpu_swap_bytes=2**40),
        ).run(reqs)
        assert np.isfinite(rec.finish[~rec.rejected]).all()
        assert rec.series_kv_tokens[-1] == 0
        assert int(rec.series_kv_tokens.max()) <= rec.capacity_tokens
        if evicting:
            assert int(rec.series_resident.max()) <= 512


class TestPrefixHashBlockSize:
    @pytest.mark.parametrize("name", ["mooncake-like", "multi-tenant", "azure-conv-like"])
    def test_hits_never_rise_with_block_size(self, name: str) -> None:
        """Prefix hashes are re-chunked to the engine's block size, so a coarser block can
        only lose hits (a partial block is never shared), on every workload with prefixes."""
        from kvpolicy.sim import StackConfig, simulate
        from kvpolicy.sim.workloads import get_workload

        w = get_workload(name, num_requests=300)
        hits = []
        for bs in (16, 32, 64):
            cfg = StackConfig(engine=EngineConfig(block_size=bs))
            res = simulate(w.requests, get_model("Llama-3-8B"), get_gpu("L40S"), cfg)
            hits.append(res.record.prefix_hit_tokens)
        assert hits == sorted(hits, reverse=True)
        if any(r.prefix_hashes for r in w.requests):
            assert hits[0] > 0

    def test_block_size_not_a_multiple_of_the_hashes(self, tm: TimingModel) -> None:
        """An engine whose blocks don't end on hashed boundaries refuses the request."""
        req = Request("r", 64, 4, prefix_hashes=(1, 2, 3, 4), hash_block_size=16)
        with pytest.raises(ConfigError, match="not a multiple of the prefix hashes' block size"):
            Engine(tm, EngineConfig(block_size=24, kv_capacity_tokens=4800)).run([req])


class TestFinishSteps:
    def test_finish_step_counts_iterations(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A lone request of prompt P and D outputs finishes after one prefill iteration
        and D - 1 decode iterations; the last iteration of the run is the last finish."""
        rec = Engine(tm, kit.engine(4096)).run(
            [kit.request(0, 100, 10), kit.request(1, 50, 3, 5.0)]
        )
        assert rec.finish_step is not None
        assert rec.finish_step.tolist() == [10, 13]
        assert int(rec.finish_step.max()) == rec.iterations


class TestServer:
    def test_stepped_by_hand_equals_run(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A server given each request at its arrival and stepped one iteration at a time
        finishes every request at the times :meth:`Engine.run` gives."""
        reqs = [kit.request(i, 40 + 7 * i, 6 + i, t=0.004 * i) for i in range(8)]
        engine = Engine(tm, kit.engine(4096))
        expected = engine.run(reqs)
        tuple_reqs, _, rejected = engine.check_workload(reqs)
        rec = Recorder(tuple_reqs, rejected)
        released: list[int] = []
        server = engine.server(rec, lambda i, now: released.append(i))
        nxt = 0
        while rec.done < len(reqs):
            if server.idle:
                server.advance_to(reqs[nxt].arrival_time)
            while nxt < len(reqs) and reqs[nxt].arrival_time <= server.now:
                server.accept(nxt, reqs[nxt])
                nxt += 1
            server.iterate(reqs[nxt].arrival_time if nxt < len(reqs) else math.inf)
        got = server.record()
        assert got.finish.tolist() == expected.finish.tolist()
        assert got.first_token.tolist() == expected.first_token.tolist()
        assert got.iterations == expected.iterations
        assert sorted(released) == list(range(8))

    def test_view_reports_load_and_resident_prefix(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """The view counts running and waiting requests and the prefix blocks in the pool."""
        engine = Engine(tm, kit.engine(4096, block_size=16))
        reqs = [
            kit.request(0, 48, 4, prefix_hashes=(11, 12, 13), hash_block_size=16),
            kit.request(1, 32, 4),
        ]
        tuple_reqs, _, rejected = engine.check_workload(reqs)
        server = engine.server(Recorder(tuple_reqs, rejected), lambda i, now: None)
        server.accept(0, reqs[0])
        server.accept(1, reqs[1])
        assert server.view("a").waiting == 2
        assert server.iterate(math.inf) is not None
        view = server.view("a", draining=True)
        assert (view.replica_id, view.running, view.waiting, view.draining) == ("a", 2, 0, True)
        assert view.free_blocks == 4096 // 16 - 3 - 2  # 48 and 32 prompt tokens
        assert view.resident("gpu") == frozenset({11, 12, 13})
        assert server.view("a", among=(12, 99)).resident("gpu") == frozenset({12})
        assert (view.model, view.gpu) == ("Llama-3-8B", "H100-SXM")
