"""Public entry points: validate, then run Triton on CUDA tensors and torch on CPU ones.

``backend="auto"`` picks ``"triton"`` for CUDA tensors and ``"torch"`` otherwise;
``"triton"`` on CPU tensors runs Triton's interpreter, which needs ``TRITON_INTERPRET=1``
in the environment before triton is first imported (the tests do this).
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from kvpolicy.kernels._params import (
    CompactWeights,
    EvictionSelection,
    MLPWeights,
    ScoreParams,
    TokenScores,
)
from kvpolicy.kernels._reference import score_tokens_torch, select_evictions_torch

__all__ = ["SUPPORTED_DTYPES", "Backend", "score_tokens", "select_evictions"]

Backend = Literal["auto", "torch", "triton"]
"""Which implementation runs: the device decides (auto), or the one named."""

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""Logits dtypes the scoring accepts (accumulation is always float32)."""

MAX_VOCAB = 1 << 20
"""Largest vocabulary the kernels index with 32-bit column offsets."""


def _backend(backend: str, device: torch.device) -> str:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"'backend' must be 'auto', 'torch' or 'triton': {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend 'triton' needs CUDA tensors (got {device}) or TRITON_INTERPRET=1 "
            "set before triton is imported"
        )
    return backend


def _check_tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"'{name}' must be a torch.Tensor: {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"'{name}' must be {ndim}-D: shape {tuple(t.shape)}")
    return t


def score_tokens(
    logits: torch.Tensor,
    predictor: MLPWeights | CompactWeights,
    params: ScoreParams,
    *,
    positions: torch.Tensor | None = None,
    attention: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> TokenScores:
    """Price B new tokens in one pass over their logits (seed 000, Sec. 4-5).

    Args:
        logits: (B, V) float32/float16/bfloat16 next-token logits at each token's step,
            rows contiguous (stride 1 along V). A row holding a NaN or +-inf logit (or a
            non-finite ``attention``) comes out as NaN in all three outputs: checking
            beforehand would read the logits a second time and stall on a host sync, and a
            NaN g is refused by :func:`select_evictions`, so it cannot evict silently.
        predictor: seed 000's logits MLP (:class:`MLPWeights`, V == its vocab_size) or
            evict's compact predictor (:class:`CompactWeights`).
        params: lambda, delta, c and the current price mu.
        positions: (B,) int32/int64 absolute positions; needed by the compact predictor.
        attention: (B,) float attention mass on arrival; needed by the compact predictor.
        backend: "auto" (Triton on CUDA, torch on CPU), "torch" or "triton".

    Returns:
        ``(returns, risks, excess)``, each (B,) float32 on the logits' device, with
        ``excess = returns - lambda risks + delta - mu c`` (evict's ``excess_value``).

    Raises:
        TypeError: a wrong type or an unsupported dtype.
        ValueError: mismatched shapes or devices, non-contiguous rows.
    """
    z = _check_tensor("logits", logits, 2)
    if z.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"'logits' dtype must be float32, float16 or bfloat16: {z.dtype}")
    b, v = z.shape
    if b == 0 or v == 0 or v > MAX_VOCAB:
        raise ValueError(f"'logits' must be (B >= 1, 1 <= V <= {MAX_VOCAB}): {tuple(z.shape)}")
    if z.stride(1) != 1:
        raise ValueError(f"'logits' rows must be contiguous (stride 1 along V): {z.stride()}")
    if not isinstance(params, ScoreParams):
        raise TypeError(f"'params' must be a ScoreParams: {type(params).__name__}")
    if isinstance(predictor, MLPWeights):
        if predictor.vocab_size != v:
            raise ValueError(f"'logits' has V={v}, the MLP reads {predictor.vocab_size}")
        if positions is not None or attention is not None:
            raise ValueError("'positions' and 'attention' are for the compact predictor only")
    elif isinstance(predictor, CompactWeights):
        pos = _check_tensor("positions", positions, 1)
        att = _check_tensor("attention", attention, 1)
        if pos.shape[0] != b or att.shape[0] != b:
            raise ValueError(
                f"'positions' and 'attention' must be ({b},): "
                f"{tuple(pos.shape)}, {tuple(att.shape)}"
            )
        if pos.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"'positions' dtype must be int32 or int64: {pos.dtype}")
        if not att.dtype.is_floating_point:
            raise TypeError(f"'attention' must be floating point: {att.dtype}")
        for name, t in (("positions", pos), ("attention", att)):
            if t.device != z.device:
                raise ValueError(f"'{name}' is on {t.device}, 'logits' on {z.device}")
        positions, attention = pos.contiguous(), att.contiguous()
    else:
        raise TypeError(
            f"'predictor' must be MLPWeights or CompactWeights: {type(predictor).__name__}"
        )
    if _backend(backend, z.device) == "torch":
        return score_tokens_torch(z, predictor, params, positions, attention)
    from kvpolicy.kernels._triton import score_tokens_triton

    return score_tokens_triton(
        z, predictor, params, positions, attention, interpret=z.device.type != "cuda"
    )


def select_evictions(
    g: torch.Tensor,
    budget_tokens: int,
    *,
    keep_rule: bool = True,
    backend: Backend = "auto",
) -> EvictionSelection:
    """The tokens to evict from N resident ones across every stream, by evict's rule.

    Evicts every token with ``g < 0`` (eq. 4, when ``keep_rule``), then the smallest ``g``
    until at most ``budget_tokens`` remain; ties go by index, lowest first (pass the tokens
    in insertion order to match evict's ``TokenPDPolicy`` exactly). In all, the ``m``
    smallest by ``(g, index)`` with ``m = max(#{g < 0}, N - budget_tokens)``, clipped to
    [0, N].

    Args:
        g: (N,) float32 excess values (other float dtypes are converted), contiguous,
            no NaN (+-inf allowed: +inf is evicted last).
        budget_tokens: hard budget in tokens, >= 0.
        keep_rule: apply eq. 4; False only enforces the budget.
        backend: "auto" (Triton on CUDA, torch on CPU), "torch" or "triton".

    Returns:
        ``(indices, demand)``: (m,) int64 ascending indices into ``g`` and the demand of
        eq. 5.

    Raises:
        TypeError: a wrong type or dtype.
        ValueError: not 1-D, non-contiguous, a negative budget, or a NaN.
    """
    g = _check_tensor("g", g, 1)
    if not g.dtype.is_floating_point:
        raise TypeError(f"'g' must be floating point: {g.dtype}")
    if not g.is_contiguous():
        raise ValueError(f"'g' must be contiguous: stride {g.stride()}")
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
        raise TypeError(f"'budget_tokens' must be an int: {budget_tokens!r}")
    if budget_tokens < 0:
        raise ValueError(f"'budget_tokens' must be >= 0: {budget_tokens}")
    if not isinstance(keep_rule, bool):
        raise TypeError(f"'keep_rule' must be a bool: {keep_rule!r}")
    if g.numel() >= 1 << 31:
        raise ValueError(f"'g' must have fewer than 2**31 entries: {g.numel()}")
    if bool(torch.isnan(g).any()):
        raise ValueError("'g' must not hold NaN")
    g = g.to(torch.float32)
    if _backend(backend, g.device) == "torch" or g.numel() == 0:
        return select_evictions_torch(g, budget_tokens, keep_rule)
    from kvpolicy.kernels._triton import select_evictions_triton

    return select_evictions_triton(g, budget_tokens, keep_rule, interpret=g.device.type != "cuda")
