"""Admission policies: the AdmissionPolicy conformance suite, greedy, rate-limited, online."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.admit import (
    GreedyAdmission,
    RateLimitedAdmission,
    RequestClass,
    StabilityWorkload,
    eviction_free_rate,
    simulate_model,
)
from kvpolicy.kvmodel import AdmissionPolicy, CompletionObserver, Request, SchedulerState

MakeRequest = Callable[..., Request]
MakeState = Callable[..., SchedulerState]

POLICIES: list[Callable[[], AdmissionPolicy]] = [
    GreedyAdmission,
    RateLimitedAdmission,
    lambda: RateLimitedAdmission(classes=[RequestClass(10, 5, 1.0)]),
    lambda: RateLimitedAdmission(prior_decode_len=8),
]


@pytest.mark.parametrize("factory", POLICIES)
class TestAdmissionConformance:
    """Every policy honours the AdmissionPolicy contract."""

    def test_is_an_admission_policy(self, factory: Callable[[], AdmissionPolicy]) -> None:
        """The runtime-checkable Protocol recognises it."""
        assert isinstance(factory(), AdmissionPolicy)

    def test_empty_queue_admits_nothing(
        self, factory: Callable[[], AdmissionPolicy], make_state: MakeState
    ) -> None:
        """No waiting requests: 0."""
        assert factory().admit(make_state(0, 100), []) == 0

    @settings(max_examples=40, deadline=None)
    @given(
        used=st.integers(0, 200),
        prompts=st.lists(st.integers(1, 40), max_size=20),
        steps=st.integers(1, 5),
    )
    def test_count_in_range_and_never_above_greedy(
        self, factory: Callable[[], AdmissionPolicy], used: int, prompts: list[int], steps: int
    ) -> None:
        """0 <= count <= greedy count <= len(waiting), at every call."""
        policy = factory()
        waiting = [
            Request(request_id=str(i), prompt_len=p, decode_len=5) for i, p in enumerate(prompts)
        ]
        for step in range(steps):
            state = SchedulerState(
                step=step, time=float(step), used_tokens=used, capacity_tokens=200
            )
            count = policy.admit(state, waiting)
            assert 0 <= count <= GreedyAdmission().admit(state, waiting) <= len(waiting)


class TestGreedy:
    """Greedy admission from the head of the queue."""

    def test_admits_what_fits(self, make_state: MakeState, make_request: MakeRequest) -> None:
        """Prompts 30, 30, 30 in 70 free tokens: 2."""
        waiting = [make_request(30) for _ in range(3)]
        assert GreedyAdmission().admit(make_state(30, 100), waiting) == 2

    def test_stops_at_first_that_does_not_fit(
        self, make_state: MakeState, make_request: MakeRequest
    ) -> None:
        """Head-of-line: 50 does not fit in 40, so the 10 behind it waits."""
        waiting = [make_request(50), make_request(10)]
        assert GreedyAdmission().admit(make_state(60, 100), waiting) == 0

    def test_exact_fit(self, make_state: MakeState, make_request: MakeRequest) -> None:
        """Prompts summing exactly to free memory are all admitted."""
        waiting = [make_request(25) for _ in range(4)]
        assert GreedyAdmission().admit(make_state(0, 100), waiting) == 4


class TestRateLimited:
    """Rate-limited admission with a known mix and online estimation."""

    def test_cap_dithers_to_the_rate(self, make_request: MakeRequest) -> None:
        """Over 1000 calls with room to spare it admits floor(1000 * cap) requests."""
        policy = RateLimitedAdmission(classes=[RequestClass(20, 20, 1.0)])
        est = policy.estimate(1000)
        assert est is not None
        assert est.x_star == pytest.approx(1000 / 610)
        assert est.margin_tokens == pytest.approx(60.0)
        assert est.cap == pytest.approx(940 / 610)
        waiting = [make_request(1) for _ in range(10)]
        states = [
            SchedulerState(step=n, time=n, used_tokens=0, capacity_tokens=1000) for n in range(1000)
        ]
        total = sum(policy.admit(state, waiting) for state in states)
        assert total == int(1000 * 940 / 610)

    def test_no_credit_banked_when_idle(self, make_request: MakeRequest) -> None:
        """After 100 idle calls the first busy call admits at most cap + 1."""
        policy = RateLimitedAdmission(classes=[RequestClass(20, 20, 1.0)])
        state = SchedulerState(step=0, time=0.0, used_tokens=0, capacity_tokens=1000)
        for _ in range(100):
            policy.admit(state, [])
        assert policy.admit(state, [make_request(1) for _ in range(50)]) <= 2

    def test_greedy_before_samples_without_prior(self, make_request: MakeRequest) -> None:
        """With no mix and no completions it behaves as greedy."""
        policy = RateLimitedAdmission()
        state = SchedulerState(step=0, time=0.0, used_tokens=0, capacity_tokens=100)
        waiting = [make_request(10) for _ in range(20)]
        assert policy.admit(state, waiting) == 10
        assert policy.estimate(100) is None

    def test_online_estimate_matches_known_mix(self) -> None:
        """After a full window of (20, 20) completions it estimates x* exactly."""
        policy = RateLimitedAdmission(window=64, min_samples=16)
        for i in range(64):
            policy.observe_completion(Request(request_id=str(i), prompt_len=20, decode_len=20), i)
        est = policy.estimate(1000)
        assert est is not None
        assert (est.x_star, est.samples) == (pytest.approx(1000 / 610), 64)

    def test_online_estimate_adapts_within_one_window(self) -> None:
        """After a shift from l1 = 20 to l1 = 60, x* is the new mix's after `window` completions."""
        policy = RateLimitedAdmission(window=100, min_samples=10)
        for i in range(100):
            policy.observe_completion(Request(request_id=f"a{i}", prompt_len=20, decode_len=20), i)
        new_x = eviction_free_rate(StabilityWorkload.homogeneous(20, 60, 5000))
        for i in range(99):
            policy.observe_completion(Request(request_id=f"b{i}", prompt_len=20, decode_len=60), i)
            est = policy.estimate(5000)
            assert est is not None
            assert est.x_star != pytest.approx(new_x)
        policy.observe_completion(Request(request_id="b99", prompt_len=20, decode_len=60), 99)
        est = policy.estimate(5000)
        assert est is not None
        assert est.x_star == pytest.approx(new_x)

    def test_is_a_completion_observer(self) -> None:
        """It implements CompletionObserver."""
        assert isinstance(RateLimitedAdmission(), CompletionObserver)

    def test_server_loop_with_online_estimation(self) -> None:
        """In a saturated integer server, online estimation ends eviction-free near x*."""
        w = StabilityWorkload((20, 20), (19, 23), 2000, (0.5, 0.5))
        policy = RateLimitedAdmission(window=256, min_samples=32, prior_decode_len=32)
        r = simulate_model(w, steps=3000, mode="integer", policy=policy)
        tail = slice(1500, None)
        assert float(r.evicted[tail].sum()) == 0.0
        assert float(r.completed[tail].mean()) > 0.85 * eviction_free_rate(w)

    def test_bad_config(self) -> None:
        """Shares not summing to 1 and non-positive windows raise."""
        with pytest.raises(ValueError, match="'classes' shares must sum to 1"):
            RateLimitedAdmission(classes=[RequestClass(5, 5, 0.5)])
        with pytest.raises(ValueError, match="'window' must be positive"):
            RateLimitedAdmission(window=0)
        with pytest.raises(TypeError, match="'classes'"):
            RateLimitedAdmission(classes=[(5, 5, 1.0)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="'prior_decode_len'"):
            RateLimitedAdmission(prior_decode_len=0)

    def test_random_mix_integer_no_evictions(self) -> None:
        """A known four-class mix drawn at random: no eviction after the first pipeline."""
        w = StabilityWorkload((50, 50, 50, 50), (100, 125, 200, 250), 60000, (0.25,) * 4)
        r = simulate_model(w, steps=3000, mode="integer", policy="rate-limited", seed=3)
        assert float(r.evicted.sum()) == 0.0
        assert float(np.mean(r.completed[1500:])) > 0.85 * eviction_free_rate(w)


class TestMixMoments:
    def test_suffix_sum_form_matches_class_by_age_matrix(self) -> None:
        """The O(n + max l1) variance equals the direct sum over a class-by-age matrix."""
        from kvpolicy.admit._policies import _mix_moments

        rng = np.random.default_rng(7)
        l0 = rng.integers(1, 3000, 64)
        l1 = rng.integers(1, 700, 64)
        weights = rng.random(64)
        weights /= weights.sum()
        ages = np.arange(int(l1.max()))
        w = np.where(ages[None, :] < l1[:, None], l0[:, None] + 1.0 + ages[None, :], 0.0)
        direct = float(np.sum(weights @ (w * w) - (weights @ w) ** 2))
        mean_c, var, peak, longest = _mix_moments(l0, l1, weights)
        assert var == pytest.approx(direct, rel=1e-9)
        assert mean_c == pytest.approx(float(weights @ (l1 * (l0 + (l1 + 1) / 2.0))))
        assert (peak, longest) == (float(np.max(l0 + l1)), float(np.max(l1)))
