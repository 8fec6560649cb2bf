"""Tensor parallelism in the roofline time model: per-GPU reads, split FLOPs, all-reduces."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import TimingModel
from kvpolicy.sim._timing import DEFAULT_INTERCONNECT_BANDWIDTH, INTERCONNECT_BANDWIDTH

_70B = get_model("Llama-3-70B")
_8B = get_model("Llama-3-8B")


def _single_gpu_time(tm: TimingModel, n: float, kv: float, pairs: float) -> float:
    """The tp = 1 formula written out, to check tp = 1 is unchanged bit for bit."""
    m, g = tm.model, tm.gpu
    mem = m.weight_bytes() + m.kv_bytes_per_token() * kv
    flops = 2.0 * m.num_params * n + 4.0 * m.num_layers * m.num_attention_heads * m.head_dim * pairs
    t_mem = mem / (tm.bandwidth_efficiency * g.hbm_bandwidth)
    t_flops = flops / (tm.flops_efficiency * g.peak_flops)
    return tm.overhead_s + max(t_mem, t_flops)


class TestTensorParallelTime:
    """TimingModel(tp=N)."""

    @pytest.mark.parametrize(("n", "kv"), [(1, 0), (64, 300_000), (2048, 10_000)])
    def test_tp1_is_the_single_gpu_model(self, n: int, kv: int) -> None:
        """tp = 1 (the default) gives exactly the single-GPU roofline; no all-reduce."""
        tm = TimingModel(_8B, get_gpu("H100-SXM"), tp=1)
        assert tm.iteration_time(n, kv, kv) == _single_gpu_time(tm, n, kv, kv)
        assert tm.allreduce_time(n) == 0.0
        assert tm.kv_bytes_per_token == _8B.kv_bytes_per_token()

    def test_decode_reads_a_quarter_at_tp4(self) -> None:
        """Memory-bound decode at tp = 4 reads W/4 + KV/4 per GPU, plus the all-reduces."""
        gpu = get_gpu("H100-SXM")
        tm = TimingModel(_70B, gpu, tp=4)
        kv = 100_000
        mem = -(-_70B.weight_bytes() // 4) + _70B.kv_bytes_per_token() // 4 * kv
        expected = tm.overhead_s + mem / (0.75 * gpu.hbm_bandwidth) + tm.allreduce_time(8)
        assert tm.iteration_time(8, kv, kv) == pytest.approx(expected, rel=1e-12)
        assert tm.kv_bytes_per_token == _70B.kv_bytes_per_token() // 4

    def test_allreduce_is_ring_cost_over_the_link(self) -> None:
        """2 L all-reduces of n · H_q · d_h · 2 bytes, ring factor 2 (tp-1)/tp, NVLink."""
        tm = TimingModel(_70B, get_gpu("H200"), tp=8, allreduce_latency_s=0.0)
        n = 1000
        size = n * 64 * 128 * 2
        expected = 2 * 80 * (2 * 7 / 8 * size / INTERCONNECT_BANDWIDTH["H200"])
        assert tm.allreduce_time(n) == pytest.approx(expected, rel=1e-12)

    def test_pcie_is_slower_than_nvlink(self) -> None:
        """L40S all-reduces over PCIe cost more than over an explicit NVLink figure."""
        pcie = TimingModel(_70B, get_gpu("L40S"), tp=8)
        nvlink = TimingModel(_70B, get_gpu("L40S"), tp=8, interconnect_bandwidth=450e9)
        assert pcie.link_bandwidth == INTERCONNECT_BANDWIDTH["L40S"]
        assert pcie.allreduce_time(2048) > 5 * nvlink.allreduce_time(2048)
        assert INTERCONNECT_BANDWIDTH["L40S"] == DEFAULT_INTERCONNECT_BANDWIDTH

    def test_prefill_compute_splits(self) -> None:
        """A compute-bound prefill is about tp times faster, less the all-reduces."""
        one = TimingModel(_8B, get_gpu("H100-SXM"))
        two = TimingModel(_8B, get_gpu("H100-SXM"), tp=2)
        assert two.compute_time(4096, 4096**2 / 2) == pytest.approx(
            one.compute_time(4096, 4096**2 / 2) / 2 + two.allreduce_time(4096), rel=1e-12
        )

    def test_decode_times_match_iteration_time(self) -> None:
        """The vectorised decode series equals iteration_time step by step at tp = 4."""
        tm = TimingModel(_70B, get_gpu("H100-SXM"), tp=4)
        series = tm.decode_times(16, 1000, 1000, 5)
        single = [tm.iteration_time(16, 1000 + 16 * i, 1000 + 16 * i) for i in range(5)]
        np.testing.assert_allclose(series, single, rtol=1e-12)

    @pytest.mark.parametrize("tp", [0, 3, 128])
    def test_bad_tp_names_tp(self, tp: int) -> None:
        """tp must be positive and split the heads."""
        with pytest.raises(ValueError, match="'tp'"):
            TimingModel(_70B, get_gpu("H100-SXM"), tp=tp)

    def test_tp_must_be_int(self) -> None:
        """A float tp is a TypeError naming tp."""
        with pytest.raises(TypeError, match="'tp'"):
            TimingModel(_70B, get_gpu("H100-SXM"), tp=2.0)  # type: ignore[arg-type]
