"""Named model and GPU presets, built from the rows of ``_tables`` (where their sources are
said)."""

from __future__ import annotations

from kvpolicy.kvmodel._errors import UnknownPresetError
from kvpolicy.kvmodel._specs import GPUSpec, ModelSpec
from kvpolicy.kvmodel._tables import GPU_ROWS, MODEL_ROWS

__all__ = ["GPU_PRESETS", "MODEL_PRESETS", "get_gpu", "get_model"]

MODEL_PRESETS: dict[str, ModelSpec] = {
    name: ModelSpec(name, *row) for name, row in MODEL_ROWS.items()
}
"""Known models by name. ``GPT-style-7B`` is seed 001's configuration."""

GPU_PRESETS: dict[str, GPUSpec] = {name: GPUSpec(name, *row) for name, row in GPU_ROWS.items()}
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
