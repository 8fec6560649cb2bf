"""The presets' and dtypes' plain tables, without attrs: the ``kvpolicy`` commands read the
names from here for their ``--help`` without importing the specs (``_presets`` builds the
:class:`ModelSpec`/:class:`GPUSpec` objects from the same rows).

Model shapes come from the models' published configurations; seed 001's GPT-style config is
included because its numbers (524,288 bytes per token) are reproduced in the tests. GPU
figures are the vendors' datasheet values (dense bf16 FLOP/s, HBM capacity and bandwidth).
"""

from __future__ import annotations

__all__ = ["GPU_ROWS", "KV_DTYPE_BYTES", "MODEL_ROWS"]

_GIB = 1024**3
_GB = 10**9

KV_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
"""Bytes of one KV element for each supported KV-cache dtype."""

MODEL_ROWS: dict[str, tuple[int, int, int, float, int, int, float, int]] = {
    # name: (layers, KV heads, head dim, KV dtype bytes, max context, parameters,
    #        weight dtype bytes, attention heads)
    "Llama-3-8B": (32, 8, 128, 2.0, 8192, 8_030_261_248, 2.0, 32),
    "Llama-3-70B": (80, 8, 128, 2.0, 8192, 70_553_706_496, 2.0, 64),
    "Qwen3-8B": (36, 8, 128, 2.0, 32768, 8_190_735_360, 2.0, 32),
    "Mistral-7B": (32, 8, 128, 2.0, 32768, 7_241_732_096, 2.0, 32),
    "SmolLM2-135M": (30, 3, 64, 2.0, 8192, 134_515_008, 2.0, 9),
    "GPT-style-7B": (32, 32, 128, 2.0, 2048, 6_738_415_616, 2.0, 32),
}
"""The model presets' rows, in :class:`ModelSpec`'s positional order after the name."""

GPU_ROWS: dict[str, tuple[int, float, float, float]] = {
    # name: (HBM bytes, HBM bytes/s, dense bf16 FLOP/s, price per hour)
    "A100-40GB": (40 * _GIB, 1.555e12, 312e12, 1.8),
    "A100-80GB": (80 * _GIB, 2.039e12, 312e12, 2.2),
    "H100-SXM": (80 * _GIB, 3.35e12, 989e12, 3.0),
    "H200": (141 * _GB, 4.8e12, 989e12, 3.8),
    "L40S": (48 * _GIB, 0.864e12, 362e12, 1.0),
}
"""The GPU presets' rows, in :class:`GPUSpec`'s positional order after the name."""
