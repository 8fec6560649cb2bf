"""Figures of a run: latencies, throughput, memory, tenants and cost."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from kvpolicy.kvmodel import get_gpu
from kvpolicy.sim import Engine, EngineConfig, SLOConfig, TimingModel, summarize


class TestSummarize:
    def test_single_request(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """One request: its TTFT, TPOT and E2E are the percentiles; cost is duration x price."""
        rec = Engine(tm, EngineConfig()).run([kit.request(0, 100, 11, t=2.0)])
        s = summarize(rec, SLOConfig(), get_gpu("H100-SXM"))
        ttft = rec.first_token[0] - 2.0
        assert s.ttft == {"mean": ttft, "p50": ttft, "p95": ttft, "p99": ttft}
        assert s.tpot["p50"] == pytest.approx((rec.finish[0] - rec.first_token[0]) / 10)
        assert s.duration_s == pytest.approx(rec.finish[0] - 2.0)
        assert s.throughput_rps == pytest.approx(1 / s.duration_s)
        assert s.throughput_tps == pytest.approx(11 / s.duration_s)
        assert s.cost_usd == pytest.approx(3.0 * s.duration_s / 3600)
        assert s.cost_per_1k_completed_usd == pytest.approx(1000 * s.cost_usd)
        assert s.cost_per_1k_slo_met_usd == pytest.approx(1000 * s.cost_usd)
        assert s.peak_kv_tokens == 112  # 7 blocks of 16 held at the last decode
        assert s.slo_attainment == 1.0
        assert (s.slo_met, s.goodput_rps) == (1, s.throughput_rps)
        assert s.goodput_tps == pytest.approx(11 / s.duration_s)

    def test_tenants(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Per-tenant rows count arrivals, admissions, rejections and token shares."""
        reqs = [
            kit.request(0, 10, 30, 0.0, tenant="a"),
            kit.request(1, 9000, 10, 0.0, tenant="b"),
            kit.request(2, 10, 10, 0.1, tenant="b"),
        ]
        s = summarize(Engine(tm, EngineConfig()).run(reqs), SLOConfig(), get_gpu("H100-SXM"))
        rows = {t.tenant: t for t in s.tenants}
        assert (rows["a"].requests, rows["a"].admissions, rows["a"].rejected) == (1, 1, 0)
        assert (rows["b"].requests, rows["b"].admissions, rows["b"].rejected) == (2, 1, 1)
        assert (rows["b"].denials, rows["b"].gave_up, s.gate_denials) == (0, 0, 0)
        assert rows["a"].share_of_tokens == pytest.approx(0.75)
        assert rows["b"].slo_attainment == 0.5
        assert s.rejected == 1
        assert (s.rejected_context, s.rejected_memory) == (1, 0)
        assert (rows["b"].rejected_context, rows["b"].slo_met) == (1, 1)

    def test_slo_misses(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """A TTFT target below the prefill time fails every request."""
        rec = Engine(tm, EngineConfig()).run([kit.request(0, 2000, 4)])
        assert summarize(rec, SLOConfig(ttft_s=1e-4), get_gpu("H100-SXM")).slo_attainment == 0.0

    def test_json_has_no_nan(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """NaN figures become null so the JSON is standard."""
        rec = Engine(tm, EngineConfig()).run([kit.request(0, 9000, 4), kit.request(1, 10, 4)])
        s = summarize(rec, SLOConfig(), get_gpu("L40S"))
        doc = json.loads(json.dumps(s.as_dict(), allow_nan=False))
        assert doc["requests"] == 2
        assert [t["tenant"] for t in doc["tenants"]] == ["default"]
        assert math.isfinite(doc["e2e"]["p99"])

    def test_mean_memory_is_time_weighted(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """The mean KV lies between zero and the peak."""
        reqs = [kit.request(i, 200, 50, 0.05 * i) for i in range(10)]
        s = summarize(Engine(tm, EngineConfig()).run(reqs), SLOConfig(), get_gpu("H100-SXM"))
        assert 0 < s.mean_kv_tokens < s.peak_kv_tokens
        assert np.isfinite(s.iterations_per_s)


class TestAccounting:
    def test_every_request_ends_one_way(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Completed, rejected by reason, given up and unfinished add up to the arrivals."""
        reqs = [
            kit.request(0, 9000, 4),  # longer than Llama-3-8B's 8,192-token context
            kit.request(1, 3000, 4),  # fits the context, not a 2,048-token pool
            kit.request(2, 100, 10, 0.1),
            kit.request(3, 100, 10, 0.2),
        ]
        rec = Engine(tm, kit.engine(2048)).run(reqs)
        s = summarize(rec, SLOConfig(), get_gpu("H100-SXM"))
        assert (s.requests, s.completed, s.rejected) == (4, 2, 2)
        assert (s.rejected_context, s.rejected_memory, s.gave_up, s.unfinished) == (1, 1, 0, 0)

    def test_a_stopped_run_counts_its_unfinished(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Requests still running when the run stops are unfinished, and the run's GPU time
        lasts until it stops."""
        reqs = [kit.request(i, 100, 2000, 0.01 * i) for i in range(4)]
        rec = Engine(tm, EngineConfig()).run(reqs, max_time=1.0)
        s = summarize(rec, SLOConfig(), get_gpu("H100-SXM"))
        assert (s.completed, s.unfinished) == (0, 4)
        assert s.duration_s == pytest.approx(rec.end_time)
        assert s.cost_usd > 0
        assert math.isnan(s.cost_per_1k_completed_usd)
        assert math.isnan(s.ttft["p50"])  # latency covers completed requests only

    def test_goodput_counts_only_requests_within_the_slo(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """A TTFT target only the short prompt meets: goodput is one request's worth, and
        cost per SLO-met request is the whole run's cost."""
        reqs = [kit.request(0, 50, 5, 0.0), kit.request(1, 8000, 5, 0.0)]
        rec = Engine(tm, EngineConfig()).run(reqs)
        ttft = rec.first_token - np.array([0.0, 0.0])
        s = summarize(rec, SLOConfig(ttft_s=float(ttft.min()) * 1.01), get_gpu("H100-SXM"))
        assert (s.completed, s.slo_met) == (2, 1)
        assert s.goodput_rps == pytest.approx(1 / s.duration_s)
        assert s.goodput_tps == pytest.approx(5 / s.duration_s)
        assert s.cost_per_1k_slo_met_usd == pytest.approx(2 * s.cost_per_1k_completed_usd)
