"""kvpolicy-kernels: seed 000's fused Token-PD scoring and eviction selection.

- :func:`score_tokens`: ``(R_hat, sigma_hat^2, g)`` of B new tokens from their (B, V)
  logits in one pass (logits MLP or compact predictor), float32 out.
- :func:`select_evictions`: which of N resident tokens to evict (smallest ``g`` across
  the batch), evict's keep rule (eq. 4) and budget, ties by index.

CUDA tensors run the Triton kernels, CPU tensors the torch reference; ``backend=``
overrides. Triton is imported only when a Triton backend runs.
"""

from __future__ import annotations

from kvpolicy.kernels.__about__ import __version__
from kvpolicy.kernels._dispatch import SUPPORTED_DTYPES, Backend, score_tokens, select_evictions
from kvpolicy.kernels._params import (
    COMPACT_BASIS_SIZE,
    TOLERANCES,
    CompactWeights,
    EvictionSelection,
    MLPWeights,
    ScoreParams,
    TokenScores,
)
from kvpolicy.kernels._reference import score_tokens_torch, select_evictions_torch

__all__ = [
    "COMPACT_BASIS_SIZE",
    "SUPPORTED_DTYPES",
    "TOLERANCES",
    "Backend",
    "CompactWeights",
    "EvictionSelection",
    "MLPWeights",
    "ScoreParams",
    "TokenScores",
    "__version__",
    "score_tokens",
    "score_tokens_torch",
    "select_evictions",
    "select_evictions_torch",
]
