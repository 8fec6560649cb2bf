"""Capacity planning."""

from __future__ import annotations

import math

import pytest

from kvpolicy.kvmodel import (
    get_gpu,
    get_model,
    kv_budget_bytes,
    max_sequences,
    num_blocks,
    plan_capacity,
)


class TestPlanning:
    def test_budget_is_hbm_fraction_minus_weights(self) -> None:
        """KV budget = floor(HBM · fraction) − weights − workspace."""
        m, g = get_model("Llama-3-8B"), get_gpu("H100-SXM")
        expected = int(g.hbm_bytes * 0.9) - m.weight_bytes() - 2**30
        assert kv_budget_bytes(m, g, 0.9, 2**30) == expected

    def test_budget_never_negative(self) -> None:
        """A model larger than the GPU leaves a zero budget, not a negative one."""
        assert kv_budget_bytes(get_model("Llama-3-70B"), get_gpu("L40S")) == 0

    def test_max_sequences_is_floor(self) -> None:
        """floor(budget / (S·c))."""
        assert max_sequences(10_000, 10, 3) == 333

    def test_plan_counts(self) -> None:
        """The plan's counts follow from its budget."""
        plan = plan_capacity(get_model("Llama-3-8B"), get_gpu("H100-SXM"), 4096)
        assert plan.bytes_per_token == 131_072
        assert plan.max_sequences == plan.kv_budget_bytes // (4096 * 131_072)
        assert plan.num_blocks == plan.kv_budget_bytes // (16 * 131_072)
        assert plan.kv_capacity_tokens == plan.kv_budget_bytes // 131_072
        assert math.isclose(plan.as_dict()["gpu_memory_utilization"], 0.9)

    def test_context_defaults_to_max(self) -> None:
        """Without a context the model's maximum is planned for."""
        plan = plan_capacity(get_model("Mistral-7B"), get_gpu("H200"))
        assert plan.context_len == 32768

    def test_context_beyond_max_rejected(self) -> None:
        """A context beyond the model's maximum names the field and the value."""
        with pytest.raises(ValueError, match=r"'context_len' must be <= .* \(8192\): 9000"):
            plan_capacity(get_model("Llama-3-8B"), get_gpu("H100-SXM"), 9000)

    @pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan")])
    def test_fraction_outside_unit_interval(self, fraction: float) -> None:
        """Utilisation outside [0, 1] is rejected."""
        with pytest.raises(ValueError, match="'gpu_memory_utilization' must be in"):
            kv_budget_bytes(get_model("Llama-3-8B"), get_gpu("H100-SXM"), fraction)

    @pytest.mark.parametrize(
        ("call", "field"),
        [
            (lambda: max_sequences(100, 0, 1), "context_len"),
            (lambda: max_sequences(-1, 1, 1), "budget_bytes"),
            (lambda: num_blocks(100, 0, 1), "block_size"),
            (lambda: num_blocks(100, 1, 0), "bytes_per_token"),
        ],
    )
    def test_bad_sizes(self, call: object, field: str) -> None:
        """Non-positive sizes name the field."""
        with pytest.raises(ValueError, match=field):
            call()  # type: ignore[operator]
