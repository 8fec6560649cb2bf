"""The discrete-time model of §2.2 against the paper's examples, Table 8 and Figure 4."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.admit import (
    PoissonArrivals,
    StabilityWorkload,
    TraceArrivals,
    detect_limit_cycle,
    eviction_free_rate,
    simulate_model,
    worst_cycle_throughput,
)
from kvpolicy.kvmodel import Request


class TestProtocolTrace:
    """Example 1: two iterations of execute, arrive, evict, admit."""

    def test_example_1_integer(self) -> None:
        """From X=(1,1,2), Q=8, A=5 then 0: X -> (5,1,1) -> (1,4,1), one eviction."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        arrivals = TraceArrivals(steps=[0] * 13, classes=[0] * 13)  # 8 waiting + 5 new
        r = simulate_model(
            w,
            steps=2,
            mode="integer",
            initial=np.array([[1, 1, 2]]),
            arrivals=arrivals,
            record_stages=True,
        )
        assert r.stages is not None
        assert r.stages.tolist() == [[5, 1, 1], [1, 4, 1]]
        assert r.completed.tolist() == [2, 1]
        assert r.evicted.tolist() == [0, 1]
        assert r.admitted.tolist() == [5, 1]
        assert r.memory.tolist() == [24, 24]
        assert r.queue.tolist() == [8, 8]


class TestInstabilitySpiral:
    """Example 3: the perturbed fixed point spirals into the worst cycle."""

    def test_example_3_trajectory(self) -> None:
        """The first six iterations match the exact fractions of the paper's table."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        r = simulate_model(w, steps=7, initial=np.array([[2.5, 2.0, 1.7]]), record_stages=True)
        assert r.stages is not None
        expected = [
            (Fraction(4, 3), Fraction(5, 2), Fraction(2)),
            (Fraction(37, 18), Fraction(4, 3), Fraction(5, 2)),
            (Fraction(82, 27), Fraction(37, 18), Fraction(4, 3)),
            (Fraction(85, 162), Fraction(82, 27), Fraction(37, 18)),
            (Fraction(544, 243), Fraction(85, 162), Fraction(82, 27)),
            (Fraction(6037, 1458), Fraction(544, 243), Fraction(85, 162)),
            (Fraction(0), Fraction(778, 243), Fraction(544, 243)),
        ]
        np.testing.assert_allclose(r.stages, np.array(expected, dtype=float), atol=1e-12)
        assert r.evicted[:6].tolist() == [0.0] * 6
        assert r.evicted[6] == pytest.approx(1369 / 1458)

    def test_example_3_ends_in_worst_cycle(self) -> None:
        """By n = 17 it cycles (8,0,0) -> (0,6,0) -> (0,0,4.8) with throughput 8/5."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        r = simulate_model(w, steps=60, initial=np.array([[2.5, 2.0, 1.7]]), record_stages=True)
        assert r.stages is not None
        np.testing.assert_allclose(r.stages[16], [8.0, 0.0, 0.0], atol=1e-9)
        cycle = detect_limit_cycle(r.stages, r.completed, r.evicted)
        assert cycle is not None
        assert (cycle.period, cycle.eviction_level) == (3, 2)
        assert cycle.throughput == pytest.approx(worst_cycle_throughput(w))


class TestEquilibria:
    """Example 2: the three equilibria of l0=2, l1=3, M=24."""

    def test_level_0_fixed_point(self) -> None:
        """(2, 2, 2) is a fixed point with throughput x* = 2."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        r = simulate_model(w, steps=30, initial=np.array([[2.0, 2.0, 2.0]]), record_stages=True)
        assert r.stages is not None
        cycle = detect_limit_cycle(r.stages, r.completed, r.evicted)
        assert cycle is not None
        assert (cycle.period, cycle.eviction_level) == (1, 0)
        assert cycle.throughput == pytest.approx(2.0)

    def test_level_1_cycle(self) -> None:
        """(72/13, 24/13, 0) is a period-3 level-1 cycle with throughput 24/13."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        r = simulate_model(
            w, steps=30, initial=np.array([[72 / 13, 24 / 13, 0.0]]), record_stages=True
        )
        assert r.stages is not None
        cycle = detect_limit_cycle(r.stages, r.completed, r.evicted)
        assert cycle is not None
        assert (cycle.period, cycle.eviction_level) == (3, 1)
        assert cycle.throughput == pytest.approx(24 / 13)
        states = sorted(map(tuple, np.round(cycle.states * 13, 9).tolist()))
        assert states == [(0.0, 48.0, 24.0), (24.0, 0.0, 48.0), (72.0, 24.0, 0.0)]

    def test_level_2_cycle(self) -> None:
        """(8, 0, 0) is the maximal-eviction cycle with throughput 8/5."""
        w = StabilityWorkload.homogeneous(2, 3, 24)
        r = simulate_model(w, steps=30, initial=np.array([[8.0, 0.0, 0.0]]), record_stages=True)
        assert r.stages is not None
        cycle = detect_limit_cycle(r.stages, r.completed, r.evicted)
        assert cycle is not None
        assert (cycle.period, cycle.eviction_level) == (3, 2)
        assert cycle.throughput == pytest.approx(1.6)


class TestTable8:
    """Greedy against rate-limited admission, M=1000, l0=l1=20, 4000 steps."""

    def test_fluid(self) -> None:
        """Greedy falls to the worst cycle with evictions; capping at x* evicts nothing."""
        w = StabilityWorkload.homogeneous(20, 20, 1000)
        greedy = simulate_model(w, steps=4000)
        limited = simulate_model(w, steps=4000, policy="rate-limited")
        assert greedy.steady_throughput == pytest.approx(1.25)
        assert greedy.evictions > 4000
        assert limited.evictions == 0.0
        assert limited.steady_throughput == pytest.approx(eviction_free_rate(w))
        assert limited.throughput / greedy.throughput > 1.3

    def test_integer(self) -> None:
        """Whole requests: the margin-capped policy never evicts and keeps 94% of x*."""
        w = StabilityWorkload.homogeneous(20, 20, 1000)
        greedy = simulate_model(w, steps=4000, mode="integer")
        limited = simulate_model(w, steps=4000, mode="integer", policy="rate-limited")
        assert greedy.evictions > 4000
        assert limited.evictions == 0
        assert float(limited.memory.max()) <= 1000
        assert limited.steady_throughput == pytest.approx(940 / 610, rel=2e-3)


class TestOpenArrivals:
    """Figure 4: M=2000, l0=10, l1=40, Poisson arrivals under greedy admission."""

    def test_below_worst_cycle_is_stable(self) -> None:
        """lambda = 0.8 < 1.0: no eviction, the queue stays empty, throughput = lambda."""
        w = StabilityWorkload.homogeneous(10, 40, 2000)
        r = simulate_model(w, steps=4000, arrivals=PoissonArrivals(0.8), seed=1)
        assert r.evictions == 0.0
        assert r.steady_throughput == pytest.approx(0.8, abs=0.05)
        assert abs(r.queue_growth) < 0.01

    @pytest.mark.parametrize("mode", ["fluid", "integer"])
    def test_between_worst_cycle_and_x_star_backlogs(self, mode: str) -> None:
        """lambda = 1.4 in (1.0, 1.64): throughput pinned at 1.0, the queue grows ~0.4/step."""
        w = StabilityWorkload.homogeneous(10, 40, 2000)
        r = simulate_model(w, steps=4000, arrivals=PoissonArrivals(1.4), seed=1, mode=mode)  # type: ignore[arg-type]
        assert r.steady_throughput == pytest.approx(1.0, abs=0.05)
        assert r.eviction_rate > 1.0
        assert r.queue_growth == pytest.approx(0.4, abs=0.08)

    def test_rate_limit_keeps_up_at_1_4(self) -> None:
        """The same load under rate-limited admission is served without eviction."""
        w = StabilityWorkload.homogeneous(10, 40, 2000)
        r = simulate_model(
            w,
            steps=4000,
            arrivals=PoissonArrivals(1.4),
            seed=1,
            mode="integer",
            policy="rate-limited",
        )
        assert r.evictions == 0
        assert r.steady_throughput == pytest.approx(1.4, abs=0.05)
        assert abs(r.queue_growth) < 0.01


class TestFastPath:
    """Saturated fluid runs use scalar cohorts; they must match the general (K, L) path."""

    @pytest.mark.parametrize("policy", ["greedy", "rate-limited"])
    def test_cohort_path_matches_general_path(self, policy: str) -> None:
        """Same series to 1e-9 relative for a three-class workload over 1500 iterations."""
        w = StabilityWorkload((20, 35, 8), (19, 23, 40), 3000, (0.3, 0.5, 0.2))
        fast = simulate_model(w, steps=1500, policy=policy)  # type: ignore[arg-type]
        general = simulate_model(w, steps=1500, policy=policy, record_stages=True)  # type: ignore[arg-type]
        assert fast.stages is None
        for name in ("memory", "admitted", "evicted", "completed"):
            np.testing.assert_allclose(
                getattr(fast, name), getattr(general, name), rtol=1e-9, atol=1e-9 * 3000
            )


class TestTraceReplay:
    """Replay of a request list."""

    def test_trace_from_requests(self) -> None:
        """Arrival times map to iterations and classes to distinct length pairs."""
        reqs = [
            Request(request_id=str(i), prompt_len=p, decode_len=d, arrival_time=t)
            for i, (p, d, t) in enumerate([(5, 2, 0.0), (5, 3, 0.05), (5, 2, 0.25)])
        ]
        arrivals, w = TraceArrivals.from_requests(reqs, iteration_s=0.1, memory=100)
        assert arrivals.steps == (0, 0, 2)
        assert arrivals.classes == (0, 1, 0)
        r = simulate_model(w, steps=10, arrivals=arrivals, mode="integer")
        assert r.completed.sum() == 3
        assert r.admitted.tolist()[:3] == [2, 0, 1]


class TestBadInput:
    """Misuse raises a clear error."""

    def test_steps_must_be_positive(self) -> None:
        """steps = 0 names 'steps'."""
        with pytest.raises(ValueError, match="'steps'"):
            simulate_model(StabilityWorkload.homogeneous(2, 3, 24), steps=0)

    def test_initial_must_fit(self) -> None:
        """An initial state over memory names 'initial'."""
        with pytest.raises(ValueError, match="'initial' must fit"):
            simulate_model(
                StabilityWorkload.homogeneous(2, 3, 24), steps=1, initial=np.array([[9.0, 0, 0]])
            )

    def test_policy_object_needs_integer_mode(self) -> None:
        """An AdmissionPolicy object in fluid mode is rejected."""
        from kvpolicy.admit import GreedyAdmission

        with pytest.raises(ValueError, match="'policy'"):
            simulate_model(
                StabilityWorkload.homogeneous(2, 3, 24), steps=1, policy=GreedyAdmission()
            )  # type: ignore[arg-type]

    def test_unknown_policy_name(self) -> None:
        """An unknown policy name is rejected."""
        with pytest.raises(ValueError, match="'policy'"):
            simulate_model(StabilityWorkload.homogeneous(2, 3, 24), steps=1, policy="fifo")  # type: ignore[arg-type]


class TestInvariants:
    """Memory after admission never exceeds M."""

    @settings(max_examples=15, deadline=None)
    @given(
        l0=st.lists(st.integers(1, 30), min_size=1, max_size=3),
        l1=st.integers(1, 25),
        extra=st.integers(1, 400),
        rate=st.floats(0.0, 5.0),
        mode=st.sampled_from(["fluid", "integer"]),
    )
    def test_memory_within_budget(
        self, l0: list[int], l1: int, extra: int, rate: float, mode: str
    ) -> None:
        """Post-admission memory <= M at every iteration, under any arrivals."""
        k = len(l0)
        lens = tuple(l1 + i for i in range(k))
        mix = tuple([1.0 / k] * k)
        memory = max(a + b for a, b in zip(l0, lens, strict=True)) + extra
        w = StabilityWorkload(tuple(l0), lens, memory, mix)
        r = simulate_model(w, steps=120, arrivals=PoissonArrivals(rate), mode=mode)  # type: ignore[arg-type]
        assert float(r.memory.max()) <= memory * (1 + 1e-9)
        assert float(r.memory.min()) >= -1e-9


def test_simulate_model_refuses_unbounded_runs() -> None:
    """10^7 steps is refused with the bound named, before anything runs."""
    workload = StabilityWorkload.homogeneous(20, 20, 1000)
    with pytest.raises(ValueError, match=r"'steps' must be in \[1, 1000000\]: 10000000"):
        simulate_model(workload, steps=10**7)
