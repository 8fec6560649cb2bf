"""ModelSpec, GPUSpec, KV dtypes and presets."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import (
    GPU_PRESETS,
    KV_PRECISIONS,
    MODEL_PRESETS,
    ModelSpec,
    UnknownPresetError,
    get_gpu,
    get_model,
    kv_dtype_bytes,
    quantized_token_bytes,
)


class TestModelSpec:
    def test_llama3_8b_bf16_bytes_per_token(self) -> None:
        """Llama-3-8B in bf16 costs 2·32·8·128·2 = 131,072 bytes per token."""
        assert get_model("Llama-3-8B").kv_bytes_per_token() == 131_072

    def test_seed001_gpt_style_bytes_per_token(self) -> None:
        """Seed 001's GPT-style config (32 layers, 32 heads, 128, fp16) costs 524,288 bytes."""
        assert get_model("GPT-style-7B").kv_bytes_per_token() == 524_288

    def test_smollm2_shape(self) -> None:
        """SmolLM2-135M: 30 layers, 3 KV heads, head dim 64 -> 23,040 bytes in bf16."""
        spec = get_model("SmolLM2-135M")
        assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (30, 3, 64)
        assert spec.kv_bytes_per_token() == 23_040

    def test_bytes_per_block(self) -> None:
        """A block of 16 tokens is 16 times a token."""
        assert get_model("Llama-3-8B").kv_bytes_per_block(16) == 16 * 131_072

    @pytest.mark.parametrize(
        ("dtype", "expected"),
        [("fp32", 262_144), ("fp16", 131_072), ("fp8", 65_536), ("int8", 65_536), ("int4", 32_768)],
    )
    def test_kv_dtypes(self, dtype: str, expected: int) -> None:
        """Each KV dtype scales bytes per token by its element size."""
        assert get_model("Llama-3-8B").with_kv_dtype(dtype).kv_bytes_per_token() == expected

    def test_unknown_dtype_lists_known(self) -> None:
        """An unknown dtype names the field, the value and the known dtypes."""
        with pytest.raises(ValueError, match=r"'kv_dtype' must be one of fp32, bf16.*'fp6'"):
            kv_dtype_bytes("fp6")

    @pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "max_context"])
    @pytest.mark.parametrize("value", [0, -3])
    def test_non_positive_sizes_rejected(self, field: str, value: int) -> None:
        """Zero or negative sizes raise ValueError naming the field."""
        kwargs = {"name": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8}
        kwargs[field] = value
        with pytest.raises(ValueError, match=field):
            ModelSpec(**kwargs)  # type: ignore[arg-type]

    def test_wrong_type_rejected(self) -> None:
        """A float layer count is a TypeError naming the field."""
        with pytest.raises(TypeError, match="num_layers"):
            ModelSpec("m", 2.5, 2, 8)  # type: ignore[arg-type]

    def test_bad_block_size(self) -> None:
        """A zero block size is rejected."""
        with pytest.raises(ValueError, match="'block_size' must be > 0: 0"):
            get_model("Llama-3-8B").kv_bytes_per_block(0)


class TestPresets:
    def test_required_presets_exist(self) -> None:
        """The presets the documentation promises exist."""
        for name in ("Llama-3-8B", "Llama-3-70B", "Qwen3-8B", "Mistral-7B", "SmolLM2-135M"):
            assert name in MODEL_PRESETS
        for name in ("A100-40GB", "A100-80GB", "H100-SXM", "H200", "L40S"):
            assert name in GPU_PRESETS

    def test_lookup_is_case_insensitive(self) -> None:
        """Names match regardless of case."""
        assert get_gpu("h100-sxm") is GPU_PRESETS["H100-SXM"]

    def test_unknown_model_lists_known(self) -> None:
        """An unknown model raises a ValueError that lists the known ones."""
        with pytest.raises(UnknownPresetError, match="unknown model 'gpt-5'; known: Llama-3-8B"):
            get_model("gpt-5")
        with pytest.raises(ValueError, match="known: A100-40GB"):
            get_gpu("tpu")


SMOL = ModelSpec("SmolLM2-135M", num_layers=30, num_kv_heads=3, head_dim=64)


class TestQuantizedTokenBytes:
    """Bytes of one token at a precision, scales and zero points included."""

    def test_sixteen_bits_is_the_fp16_cost(self) -> None:
        """At 16 bits a token costs kv_bytes_per_token at 2 bytes per element."""
        assert quantized_token_bytes(SMOL, 16) == SMOL.kv_bytes_per_token() == 23040

    def test_codes_plus_scales_and_zeros(self) -> None:
        """int8 and int4 with groups of 32: codes plus 2 fp16 numbers per group, K and V."""
        per_head_8 = 64 + 2 * 2 * 2  # 64 codes, 2 groups x (scale + zero) x 2 bytes
        per_head_4 = 32 + 2 * 2 * 2
        assert quantized_token_bytes(SMOL, 8) == 2 * 30 * 3 * per_head_8 == 12960
        assert quantized_token_bytes(SMOL, 4) == 2 * 30 * 3 * per_head_4 == 7200
        assert quantized_token_bytes(SMOL, 2) == 2 * 30 * 3 * (16 + 8) == 4320

    def test_group_size_and_scale_bytes(self) -> None:
        """Larger groups hold fewer scales; a group beyond the head is one per head."""
        assert quantized_token_bytes(SMOL, 4, group_size=64) == 2 * 30 * 3 * (32 + 4)
        assert quantized_token_bytes(SMOL, 4, group_size=128) == 2 * 30 * 3 * (32 + 4)
        assert quantized_token_bytes(SMOL, 4, scale_bytes=4) == 2 * 30 * 3 * (32 + 16)

    def test_evicted_costs_nothing_and_cost_grows_with_bits(self) -> None:
        """0 bits costs 0 and every precision costs more than the next lower one."""
        costs = [quantized_token_bytes(SMOL, b) for b in (0, *sorted(KV_PRECISIONS))]
        assert costs[0] == 0
        assert costs == sorted(costs)
        assert len(set(costs)) == len(costs)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"bits": 3}, "'bits' must be 0 or one of"),
            ({"bits": 4, "group_size": 0}, "'group_size' must be >= 1: 0"),
            ({"bits": 4, "scale_bytes": 3}, "'scale_bytes' must be 1, 2 or 4: 3"),
        ],
    )
    def test_bad_values_are_named(self, kwargs: dict[str, int], match: str) -> None:
        """An unsupported precision, group or scale size is a ValueError naming it."""
        with pytest.raises(ValueError, match=match):
            quantized_token_bytes(SMOL, **kwargs)

    def test_bad_types(self) -> None:
        """A spec that is not a ModelSpec or a float count is a TypeError."""
        with pytest.raises(TypeError, match="'spec' must be a ModelSpec"):
            quantized_token_bytes("smol", 4)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"'bits' must be an int: 4\.0"):
            quantized_token_bytes(SMOL, 4.0)  # type: ignore[arg-type]
