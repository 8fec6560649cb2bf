"""Tests of kvpolicy.sim.workloads: the Workload type, describe, generators and presets."""

from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpolicy.sim.workloads as wl
from kvpolicy.kvmodel import BlockPool, Request
from kvpolicy.sim.workloads import (
    SERVICE_CLASSES,
    WORKLOAD_NAMES,
    EmpiricalLengths,
    FixedLengths,
    GammaArrivals,
    LogNormalLengths,
    PMFLengths,
    Poisson,
    PrefixSharing,
    QuantileLengths,
    Saturated,
    SyntheticConfig,
    TenantSpec,
    Workload,
    describe,
    generate,
    get_workload,
    workload_config,
)
from kvpolicy.sim.workloads._lengthdist import QUANTILE_GRID, normal_cdf


def make_request(i: int, t: float, prompt: int = 10, decode: int = 5, **kw: object) -> Request:
    return Request(request_id=f"r{i}", prompt_len=prompt, decode_len=decode, arrival_time=t, **kw)  # type: ignore[arg-type]


def make_workload(times: list[float], **kw: object) -> Workload:
    reqs = tuple(make_request(i, t) for i, t in enumerate(times))
    return Workload(name="w", requests=reqs, source="synthetic:w", **kw)  # type: ignore[arg-type]


class TestExports:
    def test_all_is_sorted_and_complete(self) -> None:
        """__all__ is sorted, unique, and exactly the public names of the package."""
        public = {n for n in dir(wl) if not n.startswith("_")} - {"annotations"}
        modules = {n for n in public if type(getattr(wl, n)).__name__ == "module"}
        assert public - modules == set(wl.__all__)
        assert list(wl.__all__) == sorted(wl.__all__, key=lambda n: (not n.isupper(), n))
        assert len(wl.__all__) == len(set(wl.__all__))


class TestWorkload:
    def test_properties(self) -> None:
        """Duration, start, rate and tenants come from the requests."""
        reqs = (
            make_request(0, 1.0, tenant="b"),
            make_request(1, 2.0, tenant="a"),
            make_request(2, 5.0, tenant="b"),
        )
        w = Workload(name="w", requests=reqs, source="x")
        assert w.num_requests == 3
        assert w.start_time == 1.0
        assert w.duration == 4.0
        assert w.mean_rate == 0.5
        assert w.tenants == ("a", "b")
        assert w.arrival_times().tolist() == [1.0, 2.0, 5.0]
        assert w.max_total_len == 15

    def test_empty_workload(self) -> None:
        """An empty workload is valid and spans no time."""
        w = make_workload([])
        assert (w.num_requests, w.duration, w.start_time, w.tenants) == (0, 0.0, 0.0, ())
        assert w.max_total_len == 0

    def test_mean_rate_needs_two_requests(self) -> None:
        """mean_rate of a single request is an error naming the count."""
        with pytest.raises(ValueError, match="at least 2 requests: 1"):
            _ = make_workload([0.0]).mean_rate

    def test_unsorted_requests_rejected(self) -> None:
        """Requests out of arrival order are rejected, naming the index."""
        with pytest.raises(ValueError, match=r"requests\[1\] arrives at 1.0"):
            make_workload([2.0, 1.0])

    def test_duplicate_ids_rejected(self) -> None:
        """Two requests with one id are rejected, naming the id."""
        reqs = (make_request(0, 0.0), make_request(0, 1.0))
        with pytest.raises(ValueError, match="'r0' repeats"):
            Workload(name="w", requests=reqs, source="x")

    def test_non_request_rejected(self) -> None:
        """A request that is not a kvmodel.Request is a TypeError naming the index."""
        with pytest.raises(TypeError, match=r"requests\[0\]"):
            Workload(name="w", requests=("nope",), source="x")  # type: ignore[arg-type]

    def test_negative_counts_rejected(self) -> None:
        """skipped_rows and clamped_rows must be >= 0."""
        with pytest.raises(ValueError, match="skipped_rows"):
            make_workload([0.0], skipped_rows=-1)
        with pytest.raises(ValueError, match="clamped_rows"):
            make_workload([0.0], clamped_rows=-2)

    def test_empty_name_rejected(self) -> None:
        """The name must not be empty."""
        with pytest.raises(ValueError, match="name"):
            Workload(name="", requests=(), source="x")

    def test_tenant_specs_must_cover_every_tenant(self) -> None:
        """Given tenant specs must name every request's tenant, once each."""
        reqs = (make_request(0, 0.0, tenant="a"), make_request(1, 1.0, tenant="b"))
        with pytest.raises(ValueError, match=r"requests\[1\] has tenant 'b'"):
            Workload(name="w", requests=reqs, source="x", tenant_specs=(TenantSpec("a"),))
        with pytest.raises(ValueError, match="'a' repeats"):
            Workload(
                name="w", requests=(), source="x", tenant_specs=(TenantSpec("a"), TenantSpec("a"))
            )
        with pytest.raises(TypeError, match=r"'tenant_specs\[0\]' must be a TenantSpec"):
            Workload(name="w", requests=(), source="x", tenant_specs=("a",))  # type: ignore[arg-type]

    def test_head(self) -> None:
        """head keeps the first n requests, and the whole workload when n is larger."""
        w = make_workload([0.0, 1.0, 2.0])
        assert [r.request_id for r in w.head(2).requests] == ["r0", "r1"]
        assert w.head(10) is w
        with pytest.raises(ValueError, match="'num_requests' must be >= 0: -1"):
            w.head(-1)
        with pytest.raises(TypeError, match="'num_requests' must be int"):
            w.head(1.5)  # type: ignore[arg-type]

    def test_with_rate_rescales_about_the_first_arrival(self) -> None:
        """with_rate stretches time so the mean rate is the one asked, and notes it."""
        w = make_workload([10.0, 11.0, 12.0, 14.0])  # 3 gaps over 4 s: 0.75 req/s
        fast = w.with_rate(1.5)
        assert fast.arrival_times().tolist() == [10.0, 10.5, 11.0, 12.0]
        assert fast.mean_rate == 1.5
        assert fast.notes == ("arrival times scaled by 0.5 to a mean rate of 1.5 req/s",)

    def test_with_context_limit(self) -> None:
        """Requests over the context lose prompt tokens first, then output; counted."""
        reqs = (
            make_request(0, 0.0, prompt=100, decode=20, prefix_hashes=(1, 2, 3)),
            make_request(1, 1.0, prompt=10, decode=500),
            make_request(2, 2.0, prompt=30, decode=10, prefix_hashes=(7,)),
        )
        w = Workload(name="w", requests=reqs, source="s").with_context_limit(64)
        assert [(r.prompt_len, r.decode_len) for r in w.requests] == [(44, 20), (1, 63), (30, 10)]
        assert [r.prefix_hashes for r in w.requests] == [(), (), (7,)]
        assert w.notes == ("2 requests cut to the 64-token context (prompt cut first)",)
        assert w.max_total_len == 64
        untouched = Workload(name="w", requests=reqs[2:], source="s")
        assert untouched.with_context_limit(64) is untouched
        with pytest.raises(ValueError, match="'context_len' must be >= 2: 1"):
            untouched.with_context_limit(1)

    @pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
    def test_with_rate_rejects_bad_rates(self, rate: float) -> None:
        """A rate that is not finite and positive is a ValueError naming 'rate'."""
        with pytest.raises(ValueError, match="'rate' must be finite and > 0"):
            make_workload([0.0, 1.0]).with_rate(rate)

    def test_with_rate_rejects_a_timeless_workload(self) -> None:
        """A workload whose requests all arrive at once has no rate to rescale."""
        with pytest.raises(ValueError, match="spans no time"):
            make_workload([0.0, 0.0]).with_rate(2.0)


class TestDescribe:
    def test_exact_figures(self) -> None:
        """describe gives exact counts, rate, CV, length statistics and tenant shares."""
        reqs = (
            make_request(0, 0.0, prompt=10, decode=1, tenant="a", priority=2),
            make_request(1, 1.0, prompt=20, decode=3, tenant="b"),
            make_request(2, 3.0, prompt=30, decode=5, tenant="a", priority=2),
        )
        d = describe(Workload(name="w", requests=reqs, source="s", skipped_rows=4))
        assert d["num_requests"] == 3
        assert d["skipped_rows"] == 4
        assert d["duration_s"] == 3.0
        assert d["mean_rate_rps"] == pytest.approx(2 / 3)
        assert d["interarrival_cv"] == pytest.approx(0.5 / 1.5)
        assert d["prompt_tokens"] == {
            "mean": 20.0, "p50": 20.0, "p90": 28.0, "p99": 29.8, "max": 30, "total": 60,
        }  # fmt: skip
        assert d["decode_tokens"]["total"] == 9
        assert d["tenants"]["a"] == {
            "requests": 2, "share": 2 / 3, "priorities": [2],
            "prompt_tokens_mean": 20.0, "decode_tokens_mean": 3.0, "service_class": None,
        }  # fmt: skip
        assert d["prefix"]["block_references"] == 0

    def test_prefix_hit_ratio(self) -> None:
        """The unbounded-cache hit ratio counts every repeat of a hash after its first use."""
        reqs = (
            make_request(0, 0.0, prompt=48, prefix_hashes=(1, 2, 3)),
            make_request(1, 1.0, prompt=48, prefix_hashes=(1, 2, 4)),
            make_request(2, 2.0, prompt=16, prefix_hashes=(1,)),
        )
        prefix = describe(Workload(name="w", requests=reqs, source="s"))["prefix"]
        assert prefix == {
            "requests_with_hashes": 3, "block_references": 7, "unique_blocks": 4,
            "hit_ratio": 3 / 7,
        }  # fmt: skip

    def test_empty(self) -> None:
        """An empty workload describes with nulls where a statistic is undefined."""
        d = describe(make_workload([]))
        assert d["mean_rate_rps"] is None
        assert d["interarrival_cv"] is None
        assert d["prompt_tokens"]["mean"] is None
        assert d["tenants"] == {}

    def test_summary_property_and_type_check(self) -> None:
        """Workload.summary is describe(); describe rejects other objects."""
        w = make_workload([0.0, 1.0])
        assert w.summary == describe(w)
        with pytest.raises(TypeError, match="'workload' must be a Workload"):
            describe("w")  # type: ignore[arg-type]


class TestArrivals:
    def test_gamma_moments(self) -> None:
        """Gamma gaps have the requested mean and CV (200k draws, seed 0)."""
        t = GammaArrivals(rate=4.0, cv=2.5).sample(200_000, np.random.default_rng(0))
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(0.25, rel=0.02)
        assert gaps.std() / gaps.mean() == pytest.approx(2.5, rel=0.03)

    def test_fit_recovers_parameters(self) -> None:
        """GammaArrivals.fit recovers rate and CV of its own samples."""
        t = GammaArrivals(rate=3.0, cv=0.5).sample(100_000, np.random.default_rng(1))
        fit = GammaArrivals.fit(t)
        assert fit.rate == pytest.approx(3.0, rel=0.01)
        assert fit.cv == pytest.approx(0.5, rel=0.02)

    def test_poisson_is_cv_one(self) -> None:
        """Poisson gaps are exponential: CV 1."""
        t = Poisson(rate=10.0).sample(100_000, np.random.default_rng(2))
        gaps = np.diff(t)
        assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)
        assert Poisson(2.0).cv == 1.0

    def test_saturated(self) -> None:
        """Saturated arrivals are all at 0 with an infinite rate."""
        s = Saturated()
        assert s.sample(3, np.random.default_rng(0)).tolist() == [0.0, 0.0, 0.0]
        assert s.rate == math.inf
        assert s.scaled(2.0) is s

    def test_scaled_keeps_cv(self) -> None:
        """Scaling multiplies the rate and keeps the CV."""
        assert GammaArrivals(2.0, 3.0).scaled(0.25) == GammaArrivals(0.5, 3.0)
        assert Poisson(2.0).scaled(3.0) == Poisson(6.0)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"rate": 0.0}, ValueError, "'rate' must be finite and > 0: 0.0"),
            ({"rate": math.inf}, ValueError, "'rate' must be finite and > 0: inf"),
            ({"rate": 1.0, "cv": -1.0}, ValueError, "'cv' must be finite and > 0: -1.0"),
            ({"rate": "1"}, TypeError, "'rate' must be a number: '1'"),
        ],
    )
    def test_validation(self, kwargs: dict[str, object], error: type, match: str) -> None:
        """Bad rate or CV raises naming the parameter and value."""
        with pytest.raises(error, match=match):
            GammaArrivals(**kwargs)  # type: ignore[arg-type]

    def test_fit_rejects_short_or_timeless_input(self) -> None:
        """fit needs three arrivals that span time."""
        with pytest.raises(ValueError, match=">= 3 entries"):
            GammaArrivals.fit(np.array([0.0, 1.0]))
        with pytest.raises(ValueError, match="must span time"):
            GammaArrivals.fit(np.zeros(5))

    @settings(max_examples=50, deadline=None)
    @given(
        rate=st.floats(0.01, 1000.0),
        cv=st.floats(0.05, 10.0),
        n=st.integers(0, 200),
        seed=st.integers(0, 2**32 - 1),
    )
    def test_samples_are_sorted_non_negative(
        self, rate: float, cv: float, n: int, seed: int
    ) -> None:
        """Every process returns n non-decreasing, non-negative times."""
        t = GammaArrivals(rate, cv).sample(n, np.random.default_rng(seed))
        assert t.shape == (n,)
        assert (t >= 0).all()
        assert (np.diff(t) >= 0).all()


class TestLengths:
    def test_fixed(self) -> None:
        """FixedLengths returns the same pair for every request."""
        out = FixedLengths(7, 3).sample(2, np.random.default_rng(0))
        assert out.tolist() == [[7, 3], [7, 3]]
        assert out.dtype == np.int64

    def test_lognormal_fit_recovers_parameters(self) -> None:
        """Fitting a lognormal sample recovers its log-moments and correlation."""
        dist = LogNormalLengths(6.0, 0.8, 4.0, 1.1, correlation=-0.4)
        s = dist.sample(100_000, np.random.default_rng(3))
        fit = LogNormalLengths.fit(s[:, 0].tolist(), s[:, 1].tolist())
        assert fit.prompt_mu == pytest.approx(6.0, abs=0.01)
        assert fit.prompt_sigma == pytest.approx(0.8, abs=0.01)
        assert fit.decode_mu == pytest.approx(4.0, abs=0.01)
        assert fit.decode_sigma == pytest.approx(1.1, abs=0.01)
        assert fit.correlation == pytest.approx(-0.4, abs=0.02)
        assert fit.max_prompt_len == int(s[:, 0].max())

    @settings(max_examples=50, deadline=None)
    @given(
        mu=st.floats(-50.0, 1000.0),
        sigma=st.floats(0.01, 3.0),
        rho=st.floats(-1.0, 1.0),
        cap=st.integers(1, 5000),
        seed=st.integers(0, 2**32 - 1),
    )
    def test_lognormal_within_bounds(
        self, mu: float, sigma: float, rho: float, cap: int, seed: int
    ) -> None:
        """Lognormal lengths are integers in [1, max] whatever the parameters."""
        dist = LogNormalLengths(mu, sigma, mu, sigma, rho, max_prompt_len=cap, max_decode_len=cap)
        out = dist.sample(64, np.random.default_rng(seed))
        assert out.shape == (64, 2)
        assert out.min() >= 1
        assert out.max() <= cap

    def test_lognormal_extreme_mu_does_not_overflow(self) -> None:
        """A huge log-mean saturates at the maximum instead of overflowing."""
        dist = LogNormalLengths(800.0, 1.0, -800.0, 1.0, max_prompt_len=50, max_decode_len=9)
        assert dist.sample(3, np.random.default_rng(0)).tolist() == [[50, 1]] * 3

    def test_lognormal_validation(self) -> None:
        """A correlation outside [-1, 1] or a non-positive sigma is rejected by name."""
        with pytest.raises(ValueError, match=r"'correlation' must be <= 1: 1.5"):
            LogNormalLengths(1.0, 1.0, 1.0, 1.0, correlation=1.5)
        with pytest.raises(ValueError, match=r"'prompt_sigma' must be finite and > 0: 0.0"):
            LogNormalLengths(1.0, 0.0, 1.0, 1.0)

    def test_empirical_keeps_pairs(self) -> None:
        """EmpiricalLengths only draws observed (prompt, output) pairs."""
        dist = EmpiricalLengths((10, 20, 30), (1, 2, 3))
        out = dist.sample(500, np.random.default_rng(4))
        assert {tuple(row) for row in out.tolist()} == {(10, 1), (20, 2), (30, 3)}

    def test_empirical_validation(self) -> None:
        """Mismatched, empty or zero lengths are rejected by name."""
        with pytest.raises(ValueError, match="one length: 2 and 1"):
            EmpiricalLengths((1, 2), (1,))
        with pytest.raises(ValueError, match="'prompt_lens' must be >= 1: 0"):
            EmpiricalLengths((0,), (1,))
        with pytest.raises(ValueError, match="must not be empty"):
            EmpiricalLengths((), ())

    def test_from_workload(self) -> None:
        """Empirical and lognormal lengths can be taken from a workload's requests."""
        w = Workload(
            name="w",
            requests=(make_request(0, 0.0, 10, 2), make_request(1, 1.0, 40, 8)),
            source="s",
        )
        assert EmpiricalLengths.from_workload(w) == EmpiricalLengths((10, 40), (2, 8))
        fit = LogNormalLengths.from_workload(w)
        assert fit.prompt_mu == pytest.approx(math.log(20.0))
        assert fit.correlation == pytest.approx(1.0)
        with pytest.raises(ValueError, match="no requests to resample: 'w'"):
            EmpiricalLengths.from_workload(make_workload([]))

    def test_quantile_fit_reproduces_the_table(self) -> None:
        """A quantile table fitted to data gives back its quantiles and rank correlation."""
        rng = np.random.default_rng(6)
        prompt = rng.integers(1, 5000, size=20_000)
        decode = np.maximum(1, prompt // 10 + rng.integers(0, 50, size=20_000))
        dist = QuantileLengths.fit(prompt.tolist(), decode.tolist())
        assert dist.probabilities == QUANTILE_GRID
        assert dist.prompt_quantiles[0] == prompt.min()
        assert dist.prompt_quantiles[-1] == prompt.max()
        out = dist.sample(20_000, np.random.default_rng(7))
        for col, data in ((0, prompt), (1, decode)):
            for q in (0.1, 0.5, 0.9, 0.99):
                assert np.quantile(out[:, col], q) == pytest.approx(np.quantile(data, q), rel=0.03)
        assert dist.correlation > 0.9

    def test_quantile_sampling_is_interpolation(self) -> None:
        """Samples interpolate the table linearly: a two-point table is uniform."""
        dist = QuantileLengths(
            prompt_quantiles=(100.0, 200.0), decode_quantiles=(5.0, 5.0), probabilities=(0, 1)
        )
        out = dist.sample(10_000, np.random.default_rng(8))
        assert out[:, 0].min() >= 100
        assert out[:, 0].max() <= 200
        assert out[:, 0].mean() == pytest.approx(150.0, rel=0.01)
        assert set(out[:, 1].tolist()) == {5}

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"prompt_quantiles": (1.0, 5.0, 3.0)}, "'prompt_quantiles' must be non-decreasing"),
            ({"decode_quantiles": (0.0, 1.0, 2.0)}, "'decode_quantiles' must be finite and >= 1"),
            (
                {
                    "probabilities": (0.0, 0.5, 0.5, 1.0),
                    "prompt_quantiles": (1.0, 2.0, 3.0, 4.0),
                    "decode_quantiles": (1.0, 2.0, 3.0, 4.0),
                },
                "'probabilities' must increase",
            ),
            ({"probabilities": (0.1, 0.5, 1.0)}, r"'probabilities' must run from 0.0 to 1.0"),
            ({"prompt_quantiles": (1.0, 2.0)}, r"one value per probability \(3\): 2"),
        ],
    )
    def test_quantile_validation(self, kwargs: dict[str, object], match: str) -> None:
        """Bad tables are rejected naming the field."""
        base: dict[str, object] = {
            "prompt_quantiles": (1.0, 2.0, 3.0),
            "decode_quantiles": (1.0, 2.0, 3.0),
            "probabilities": (0.0, 0.5, 1.0),
        }
        with pytest.raises(ValueError, match=match):
            QuantileLengths(**{**base, **kwargs})  # type: ignore[arg-type]

    def test_normal_cdf(self) -> None:
        """normal_cdf agrees with math.erf to 1e-7 from -8 to 8."""
        z = np.linspace(-8.0, 8.0, 321)
        exact = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in z])
        assert np.abs(normal_cdf(z) - exact).max() < 1e-7

    def test_pmf_draws_from_support(self) -> None:
        """PMFLengths draws only values with positive probability, normalising weights."""
        dist = PMFLengths(((5, 6, 7), (2.0, 0.0, 2.0)), ((1,), (0.3,)))
        out = dist.sample(300, np.random.default_rng(5))
        assert set(out[:, 0].tolist()) == {5, 7}
        assert set(out[:, 1].tolist()) == {1}

    def test_pmf_validation(self) -> None:
        """A PMF with zero total weight or values below 1 is rejected by name."""
        with pytest.raises(ValueError, match="'prompt' probabilities"):
            PMFLengths(((5,), (0.0,)), ((1,), (1.0,)))
        with pytest.raises(ValueError, match="'decode' values must be >= 1: 0"):
            PMFLengths(((5,), (1.0,)), ((0,), (1.0,)))


def _two_tenants(**kw: object) -> SyntheticConfig:
    return SyntheticConfig(
        name="t",
        num_requests=4000,
        arrivals=Poisson(10.0),
        lengths=FixedLengths(8, 4),
        tenants=(
            TenantSpec("gold", share=0.25, service_class="guaranteed"),
            TenantSpec("tin", share=0.75, service_class="spot", cv=3.0),
        ),
        **kw,  # type: ignore[arg-type]
    )


class TestGenerate:
    def test_deterministic_by_seed(self) -> None:
        """The same config and seed give equal workloads; another seed another one."""
        config = _two_tenants()
        assert generate(config, seed=7) == generate(config, seed=7)
        assert generate(config, seed=7) != generate(config, seed=8)

    def test_counts_order_and_source(self) -> None:
        """Exactly num_requests sorted requests, with unique per-tenant ids."""
        w = generate(_two_tenants(), seed=0)
        assert w.num_requests == 4000
        assert w.source == "synthetic:t"
        assert (np.diff(w.arrival_times()) >= 0).all()
        assert {r.request_id for r in w.requests if r.tenant == "gold"} == {
            f"gold-{i}" for i in range(sum(r.tenant == "gold" for r in w.requests))
        }

    def test_tenant_rates_and_priorities(self) -> None:
        """Each tenant sends at share x rate with its class's priority."""
        w = generate(_two_tenants(), seed=0)
        gold = [r for r in w.requests if r.tenant == "gold"]
        assert len(gold) / w.num_requests == pytest.approx(0.25, abs=0.03)
        assert {r.priority for r in gold} == {SERVICE_CLASSES["guaranteed"]}
        times = np.array([r.arrival_time for r in gold])
        assert GammaArrivals.fit(times).rate == pytest.approx(2.5, rel=0.1)

    def test_rate_multiplier_adds_demand(self) -> None:
        """A tenant with rate_multiplier 3 sends three times its share."""
        config = SyntheticConfig(
            num_requests=4000,
            arrivals=Poisson(1.0),
            tenants=(TenantSpec("a", 0.5, rate_multiplier=3.0), TenantSpec("b", 0.5)),
        )
        w = generate(config, seed=1)
        share_a = sum(r.tenant == "a" for r in w.requests) / w.num_requests
        assert share_a == pytest.approx(0.75, abs=0.03)

    def test_saturated_all_at_zero(self) -> None:
        """Saturated arrivals put every request at time 0, tenants interleaved."""
        config = SyntheticConfig(
            num_requests=100,
            arrivals=Saturated(),
            tenants=(TenantSpec("a", 0.5), TenantSpec("b", 0.5)),
        )
        w = generate(config, seed=0)
        assert {r.arrival_time for r in w.requests} == {0.0}
        assert set(w.tenants) == {"a", "b"}
        assert [r.tenant for r in w.requests[:20]] != ["a"] * 20

    @settings(max_examples=25, deadline=None)
    @given(
        shares=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=5),
        cvs=st.lists(st.one_of(st.none(), st.floats(0.2, 6.0)), min_size=5, max_size=5),
        n=st.integers(1, 300),
        seed=st.integers(0, 10_000),
    )
    def test_any_config_gives_a_valid_workload(
        self, shares: list[float], cvs: list[float | None], n: int, seed: int
    ) -> None:
        """Any tenants give exactly n sorted requests with their tenants' priorities."""
        total = math.fsum(shares)
        classes = list(SERVICE_CLASSES)
        tenants = tuple(
            TenantSpec(f"t{i}", s / total, service_class=classes[i], cv=cvs[i])
            for i, s in enumerate(shares)
        )
        config = SyntheticConfig(num_requests=n, arrivals=Poisson(3.0), tenants=tenants)
        w = generate(config, seed=seed)
        assert w.num_requests == n
        assert (np.diff(w.arrival_times()) >= 0).all()
        by_name = {t.name: t.request_priority for t in tenants}
        assert all(r.priority == by_name[r.tenant] for r in w.requests)

    def test_explicit_priority_overrides_class(self) -> None:
        """A tenant's explicit priority wins over its service class's."""
        assert TenantSpec("x", service_class="spot", priority=9).request_priority == 9
        assert TenantSpec("x", service_class="spot").request_priority == 1

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"tenants": ()}, ValueError, "'tenants' must not be empty"),
            (
                {"tenants": (TenantSpec("a", 0.5), TenantSpec("a", 0.5))},
                ValueError,
                "'a' repeats",
            ),
            ({"tenants": (TenantSpec("a", 0.5),)}, ValueError, "shares must sum to 1: 0.5"),
            ({"num_requests": 0}, ValueError, "'num_requests' must be >= 1"),
            ({"arrivals": 5.0}, TypeError, "'arrivals' must be an ArrivalProcess"),
            ({"lengths": "x"}, TypeError, "'lengths' must be a LengthDistribution"),
            (
                {"arrivals": Saturated(), "tenants": (TenantSpec("a", cv=2.0),)},
                ValueError,
                "cannot set a cv with saturated arrivals",
            ),
        ],
    )
    def test_config_validation(self, kwargs: dict[str, object], error: type, match: str) -> None:
        """A bad config raises naming the field and the value."""
        with pytest.raises(error, match=match):
            SyntheticConfig(**kwargs)  # type: ignore[arg-type]

    def test_unknown_service_class_lists_the_classes(self) -> None:
        """An unknown service class names the five known ones."""
        with pytest.raises(ValueError, match="dedicated, guaranteed, elastic, spot, preemptible"):
            TenantSpec("a", service_class="gold")

    @pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.0, TypeError)])
    def test_bad_seed(self, seed: object, error: type) -> None:
        """A negative or non-int seed is rejected by name."""
        with pytest.raises(error, match="'seed'"):
            generate(SyntheticConfig(num_requests=1), seed=seed)  # type: ignore[arg-type]


class TestPresets:
    @pytest.mark.parametrize("name", WORKLOAD_NAMES)
    def test_every_preset_generates(self, name: str) -> None:
        """Every named workload generates the requested count under its name."""
        w = get_workload(name, seed=3, num_requests=300)
        assert w.num_requests == 300
        assert w.name == name
        assert w.source == f"synthetic:{name}"

    @pytest.mark.parametrize("name", WORKLOAD_NAMES)
    def test_describe_is_json(self, name: str) -> None:
        """describe() of every preset is plain JSON."""
        d = describe(get_workload(name, num_requests=50))
        assert json.loads(json.dumps(d)) == d

    def test_names(self) -> None:
        """The names are sorted and include the embedded default."""
        assert list(WORKLOAD_NAMES) == sorted(WORKLOAD_NAMES)
        assert {"multi-tenant", "azure-conv-like", "sharegpt-like", "long-context"} <= set(
            WORKLOAD_NAMES
        )

    def test_the_command_lines_list_is_the_presets(self) -> None:
        """The command line lists the names from a light module (its ``--help`` loads no
        workload): they are exactly the presets'."""
        from kvpolicy.sim import _names

        assert _names.WORKLOAD_NAMES == WORKLOAD_NAMES

    def test_unknown_name_lists_known_names(self) -> None:
        """An unknown workload name is a ValueError listing every known name."""
        with pytest.raises(ValueError, match="unknown workload 'nope'; known: azure-conv-like"):
            get_workload("nope")

    def test_bad_num_requests(self) -> None:
        """num_requests must be an int >= 1."""
        with pytest.raises(ValueError, match="'num_requests' must be >= 1: 0"):
            get_workload("multi-tenant", num_requests=0)

    def test_multi_tenant_default(self) -> None:
        """The default has 2,000 requests, five tenants and all five service classes."""
        config = workload_config("multi-tenant")
        assert config.num_requests == 2000
        assert {t.service_class for t in config.tenants} == set(SERVICE_CLASSES)
        w = get_workload("multi-tenant")
        assert w.num_requests == 2000
        assert w.tenants == ("agents", "batch", "chat", "copilot", "long-tail")
        assert len({r.priority for r in w.requests}) == 4

    def test_generated_workload_carries_its_tenant_specs(self) -> None:
        """A generated workload keeps its tenants' specs; describe shows their classes."""
        w = get_workload("multi-tenant", num_requests=400)
        assert w.tenant_specs == workload_config("multi-tenant").tenants
        classes = {n: t["service_class"] for n, t in describe(w)["tenants"].items()}
        assert classes == {
            "agents": "elastic", "batch": "preemptible", "chat": "guaranteed",
            "copilot": "dedicated", "long-tail": "spot",
        }  # fmt: skip

    def test_multi_tenant_rate_is_azure(self) -> None:
        """The tenants' rates add up to the Azure conversation trace's 5.53 req/s."""
        config = workload_config("multi-tenant")
        total = sum(config.tenant_arrivals(t).rate for t in config.tenants)
        assert total == pytest.approx(5.5301)

    def test_congestion_vidur(self) -> None:
        """Seed 002's Table 3 workload: 20k requests, l0 = 512, four decode lengths, 300 req/s."""
        w = get_workload("congestion-vidur")
        assert w.num_requests == 20_000
        assert {r.prompt_len for r in w.requests} == {512}
        assert {r.decode_len for r in w.requests} == {100, 125, 200, 250}
        assert w.mean_rate == pytest.approx(300.0, rel=0.03)

    def test_former_name_still_works(self) -> None:
        """The workload's former name, seed002-vidur, gives the same workload."""
        old = get_workload("seed002-vidur", num_requests=50)
        assert old.requests == get_workload("congestion-vidur", num_requests=50).requests

    def test_config_is_evolvable(self) -> None:
        """A preset's config can be modified and generated."""
        config = attrs.evolve(workload_config("saturated", num_requests=5), name="mine")
        assert generate(config).name == "mine"


class TestPrefixSharing:
    def _workload(self, sharing: PrefixSharing, n: int = 200, **kw: object) -> Workload:
        config = SyntheticConfig(
            num_requests=n,
            arrivals=Poisson(1.0),
            lengths=kw.pop("lengths", LogNormalLengths(6.5, 0.8, 3.0, 0.5)),  # type: ignore[arg-type]
            tenants=kw.pop("tenants", (TenantSpec("default"),)),  # type: ignore[arg-type]
            prefix=sharing,
        )
        return generate(config, seed=5)

    def test_system_prompt_shared_within_a_tenant(self) -> None:
        """Every request shares its tenant's system prompt blocks; tenants differ."""
        w = self._workload(
            PrefixSharing(system_prompt_len=64, block_size=16),
            lengths=FixedLengths(100, 1),
            tenants=(TenantSpec("a", 0.5), TenantSpec("b", 0.5)),
        )
        firsts: dict[str, set[tuple[int, ...]]] = {r.tenant: set() for r in w.requests}
        for r in w.requests:
            assert len(r.prefix_hashes) == 100 // 16
            firsts[r.tenant].add(r.prefix_hashes[:4])
        assert {len(s) for s in firsts.values()} == {1}
        assert firsts["a"] != firsts["b"]
        assert len({r.prefix_hashes[4] for r in w.requests}) == w.num_requests

    def test_follow_up_shares_longest_shorter_parent(self) -> None:
        """A follow-up shares the whole prompt of the longest recent shorter request."""
        lengths = EmpiricalLengths((32, 64, 48, 80), (1, 1, 1, 1))
        w = self._workload(
            PrefixSharing(follow_up_probability=1.0, block_size=16), n=50, lengths=lengths
        )
        for i, r in enumerate(w.requests):
            shorter = [p for p in w.requests[max(0, i - 64) : i] if p.prompt_len <= r.prompt_len]
            if shorter:
                parent = max(shorter, key=lambda p: (p.prompt_len, w.requests.index(p)))
                assert r.prefix_hashes[: len(parent.prefix_hashes)] == parent.prefix_hashes

    def test_block_pool_hits_the_parent_prompt(self) -> None:
        """kvmodel's BlockPool finds a follow-up's inherited blocks in its prefix cache."""
        lengths = EmpiricalLengths((64, 96), (1, 1))
        w = self._workload(
            PrefixSharing(follow_up_probability=1.0, block_size=16), n=20, lengths=lengths
        )
        i = next(i for i, r in enumerate(w.requests) if i > 0 and r.prompt_len == 96)
        child = w.requests[i]
        parent = max(w.requests[:i], key=lambda r: r.prompt_len)
        pool = BlockPool(num_blocks=64, block_size=16)
        assert pool.allocate(parent.request_id, parent.prompt_len, parent.prefix_hashes)
        alloc = pool.allocate(child.request_id, 96, child.prefix_hashes)
        assert alloc is not None
        assert alloc.cached_tokens == parent.prompt_len

    def test_no_sharing_means_unique_blocks(self) -> None:
        """With no system prompt and no follow-ups every block hash is unique."""
        w = self._workload(PrefixSharing())
        assert describe(w)["prefix"]["hit_ratio"] == 0.0

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"follow_up_probability": 1.5}, r"'follow_up_probability' must be in \[0, 1\]: 1.5"),
            ({"block_size": 0}, "'block_size' must be >= 1"),
            ({"system_prompt_len": -1}, "'system_prompt_len' must be >= 0"),
        ],
    )
    def test_validation(self, kwargs: dict[str, object], match: str) -> None:
        """Bad parameters raise naming the field and the value."""
        with pytest.raises(ValueError, match=match):
            PrefixSharing(**kwargs)  # type: ignore[arg-type]

    @settings(max_examples=30, deadline=None)
    @given(
        system=st.integers(0, 200),
        follow=st.floats(0.0, 1.0),
        block_size=st.sampled_from([1, 8, 16, 32]),
        seed=st.integers(0, 1000),
    )
    def test_hashes_are_prefix_closed(
        self, system: int, follow: float, block_size: int, seed: int
    ) -> None:
        """One hash per full block, and requests sharing block k share all blocks before it."""
        config = SyntheticConfig(
            num_requests=30,
            arrivals=Poisson(1.0),
            lengths=LogNormalLengths(4.0, 1.0, 1.0, 0.5),
            prefix=PrefixSharing(system, follow, session_window=8, block_size=block_size),
        )
        w = generate(config, seed=seed)
        position: dict[int, tuple[int, tuple[int, ...]]] = {}
        for r in w.requests:
            assert len(r.prefix_hashes) == r.prompt_len // block_size
            for k, h in enumerate(r.prefix_hashes):
                if h in position:
                    k0, prefix = position[h]
                    assert k0 == k
                    assert r.prefix_hashes[:k] == prefix
                else:
                    position[h] = (k, r.prefix_hashes[:k])

    def test_mooncake_like_preset_has_hashes(self) -> None:
        """The mooncake-like preset carries prefix hashes with reuse."""
        w = get_workload("mooncake-like", num_requests=300)
        prefix = describe(w)["prefix"]
        assert prefix["requests_with_hashes"] == 300
        assert prefix["hit_ratio"] > 0.2
