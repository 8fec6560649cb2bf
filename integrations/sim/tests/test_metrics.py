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
        assert s.cost_per_1k_requests_usd == pytest.approx(1000 * s.cost_usd)
        assert s.peak_kv_tokens == 112  # 7 blocks of 16 held at the last decode
        assert s.slo_attainment == 1.0

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
