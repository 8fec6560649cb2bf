"""Tensor and pipeline parallelism in the cost model: per-GPU weights, KV heads and budgets."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import (
    GPU_PRESETS,
    CapacityError,
    KVModelError,
    get_gpu,
    get_model,
    kv_budget_bytes,
    plan_capacity,
)

_70B = get_model("Llama-3-70B")


class TestPerGpuShares:
    """Weights, KV heads and bytes per token on one GPU of the group."""

    def test_tp1_pp1_is_the_single_gpu_model(self) -> None:
        """tp = pp = 1 gives exactly the unsplit figures, for every preset."""
        for gpu in GPU_PRESETS.values():
            m = get_model("Llama-3-8B")
            assert m.kv_bytes_per_token_per_gpu() == m.kv_bytes_per_token()
            assert m.weight_bytes_per_gpu() == m.weight_bytes()
            assert kv_budget_bytes(m, gpu, tp=1, pp=1) == kv_budget_bytes(m, gpu)

    def test_kv_heads_split_then_replicated(self) -> None:
        """8 KV heads: 8 / tp per GPU up to tp = 8, then one (replicated) per GPU."""
        assert [_70B.kv_heads_per_gpu(n) for n in (1, 2, 4, 8, 16, 64)] == [8, 4, 2, 1, 1, 1]
        assert _70B.kv_bytes_per_token_per_gpu(4) == 2 * 80 * 2 * 128 * 2
        assert _70B.kv_bytes_per_token_per_gpu(16) == 2 * 80 * 1 * 128 * 2

    def test_pipeline_stage_holds_ceil_layers(self) -> None:
        """80 layers on 3 stages: the first stages hold 27 layers each."""
        assert _70B.kv_bytes_per_token_per_gpu(1, 3) == 2 * 27 * 8 * 128 * 2
        assert _70B.weight_bytes_per_gpu(2, 2) == -(-_70B.weight_bytes() // 4)

    @pytest.mark.parametrize(("tp", "pp"), [(0, 1), (-2, 1), (1, 0), (1, 81)])
    def test_out_of_range_names_the_argument(self, tp: int, pp: int) -> None:
        """Non-positive values, or more stages than layers, name tp or pp."""
        name = "'tp'" if tp != 1 else "'pp'"
        with pytest.raises(ValueError, match=name):
            _70B.check_parallel(tp, pp)

    @pytest.mark.parametrize("tp", [3, 5, 12, 128])
    def test_tp_must_split_the_heads(self, tp: int) -> None:
        """tp must divide the query heads and divide or be a multiple of the KV heads."""
        with pytest.raises(ValueError, match=r"'tp' must divide .* \(one of \[1, 2, 4, 8"):
            kv_budget_bytes(_70B, get_gpu("H100-SXM"), tp=tp)

    def test_tp_must_be_an_int(self) -> None:
        """A float or a bool is a TypeError naming tp."""
        for bad in (2.0, True):
            with pytest.raises(TypeError, match="'tp'"):
                plan_capacity(_70B, get_gpu("H200"), tp=bad)  # type: ignore[arg-type]


class TestPlanning:
    """plan_capacity over a tensor-parallel group."""

    @pytest.mark.parametrize(("gpu", "tp"), [("H100-SXM", 4), ("L40S", 8), ("H200", 2)])
    def test_70b_plans_on_a_group(self, gpu: str, tp: int) -> None:
        """Llama-3-70B fits on 4 x H100, 8 x L40S and 2 x H200, with per-GPU figures."""
        spec = get_gpu(gpu)
        plan = plan_capacity(_70B, spec, 8192, tp=tp)
        assert plan.tp == tp
        assert plan.pp == 1
        assert plan.weight_bytes == -(-_70B.weight_bytes() // tp)
        assert plan.kv_budget_bytes == int(spec.hbm_bytes * 0.9) - plan.weight_bytes
        assert plan.bytes_per_token == _70B.kv_bytes_per_token() // tp
        assert plan.max_sequences == plan.kv_budget_bytes // (8192 * plan.bytes_per_token) > 0
        assert plan.as_dict()["tp"] == tp

    def test_no_fit_is_an_error_that_says_what_fits(self) -> None:
        """70B on one H200 raises CapacityError naming the tp that would fit."""
        with pytest.raises(CapacityError, match=r"needs tp >= 2 on H200") as info:
            plan_capacity(_70B, get_gpu("H200"))
        assert isinstance(info.value, KVModelError)
        assert isinstance(info.value, ValueError)
        assert "tp >= 4 on L40S" in str(info.value)

    def test_no_fit_at_tp_lists_gpus_that_fit(self) -> None:
        """At tp = 2 the 70B does not fit an L40S but fits the 80 GB and larger GPUs."""
        with pytest.raises(CapacityError, match="needs tp >= 4 on L40S; at tp=2 it fits on"):
            plan_capacity(_70B, get_gpu("L40S"), tp=2)

    def test_replication_costs_memory(self) -> None:
        """Past tp = H_kv the per-GPU KV per token stops shrinking while weights still do."""
        at8 = plan_capacity(_70B, get_gpu("H100-SXM"), 8192, tp=8)
        at16 = plan_capacity(_70B, get_gpu("H100-SXM"), 8192, tp=16)
        assert at16.bytes_per_token == at8.bytes_per_token
        assert at16.weight_bytes < at8.weight_bytes
