"""Named model and GPU presets.

Model shapes come from the models' published configurations; seed 001's GPT-style config is
included because its numbers (524,288 bytes per token) are reproduced in the tests. GPU
figures are the vendors' datasheet values (dense bf16 FLOP/s, HBM capacity and bandwidth).
"""

from __future__ import annotations

from kvpolicy.kvmodel._errors import UnknownPresetError
from kvpolicy.kvmodel._specs import GPUSpec, ModelSpec

__all__ = ["GPU_PRESETS", "MODEL_PRESETS", "get_gpu", "get_model"]

_GIB = 1024**3
_GB = 10**9

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("Llama-3-8B", 32, 8, 128, 2.0, 8192, 8_030_261_248, 2.0, 32),
        ModelSpec("Llama-3-70B", 80, 8, 128, 2.0, 8192, 70_553_706_496, 2.0, 64),
        ModelSpec("Qwen3-8B", 36, 8, 128, 2.0, 32768, 8_190_735_360, 2.0, 32),
        ModelSpec("Mistral-7B", 32, 8, 128, 2.0, 32768, 7_241_732_096, 2.0, 32),
        ModelSpec("SmolLM2-135M", 30, 3, 64, 2.0, 8192, 134_515_008, 2.0, 9),
        ModelSpec("GPT-style-7B", 32, 32, 128, 2.0, 2048, 6_738_415_616, 2.0, 32),
    )
}
"""Known models by name. ``GPT-style-7B`` is seed 001's configuration."""

GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("A100-40GB", 40 * _GIB, 1.555e12, 312e12, 1.8),
        GPUSpec("A100-80GB", 80 * _GIB, 2.039e12, 312e12, 2.2),
        GPUSpec("H100-SXM", 80 * _GIB, 3.35e12, 989e12, 3.0),
        GPUSpec("H200", 141 * _GB, 4.8e12, 989e12, 3.8),
        GPUSpec("L40S", 48 * _GIB, 0.864e12, 362e12, 1.0),
    )
}
"""Known GPUs by name."""


def _lookup(table: dict[str, object], kind: str, name: str) -> object:
    if not isinstance(name, str):
        raise TypeError(f"'{kind}' must be a name (str): {name!r}")
    folded = {k.lower(): v for k, v in table.items()}
    try:
        return folded[name.lower()]
    except KeyError:
        known = ", ".join(table)
        raise UnknownPresetError(f"unknown {kind} {name!r}; known: {known}") from None


def get_model(name: str) -> ModelSpec:
    """The model preset called ``name`` (case-insensitive); the error lists known names."""
    spec = _lookup(MODEL_PRESETS, "model", name)  # type: ignore[arg-type]
    assert isinstance(spec, ModelSpec)
    return spec


def get_gpu(name: str) -> GPUSpec:
    """The GPU preset called ``name`` (case-insensitive); the error lists known names."""
    spec = _lookup(GPU_PRESETS, "gpu", name)  # type: ignore[arg-type]
    assert isinstance(spec, GPUSpec)
    return spec
