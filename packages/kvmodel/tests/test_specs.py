"""ModelSpec, GPUSpec, KV dtypes and presets."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import (
    GPU_PRESETS,
    MODEL_PRESETS,
    ModelSpec,
    UnknownPresetError,
    get_gpu,
    get_model,
    kv_dtype_bytes,
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
