"""Parameters of the fused scoring: the dual price, the predictors' weights, the outputs."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple, SupportsFloat

import torch
from attrs import field, frozen
from attrs.validators import ge, gt

__all__ = [
    "COMPACT_BASIS_SIZE",
    "TOLERANCES",
    "CompactWeights",
    "EvictionSelection",
    "MLPWeights",
    "ScoreParams",
    "TokenScores",
]

COMPACT_BASIS_SIZE = 7
"""Weights of evict's compact predictor: bias, entropy, top_prob, log1p(position),
1/(1+position), attention, log(attention + 1e-6)."""

TOLERANCES: tuple[tuple[torch.dtype, float, float], ...] = (
    (torch.float32, 1e-5, 1e-5),
    (torch.float16, 2e-5, 1e-4),
    (torch.bfloat16, 2e-5, 1e-4),
)
"""``(logits dtype, atol, rtol)`` of the Triton kernels against the torch reference on the
same inputs. Both read the same rounded logits and weights and accumulate in fp32; the gap
is summation order and the MLP's ``W1 z - lse * rowsum(W1)`` rewrite (cancellation of
about eps32 * |lse| * |rowsum|). Against evict's fp32 MLP, fp16/bf16 logits add the
rounding of W1 to that dtype (about 1e-3 relative on R_hat)."""


def _finite(_inst: object, attribute: object, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{getattr(attribute, 'name', '?')}' must be finite: {value!r}")


def _ffield(default: float, *validators: object) -> float:
    return field(default=default, converter=float, validator=[_finite, *validators])  # type: ignore[list-item]


@frozen
class ScoreParams:
    """The terms of ``g = R - lambda sigma^2 + delta - mu c`` (evict's ``excess_value``)."""

    risk_aversion: float = _ffield(0.1, ge(0.0))
    """``lambda``: return given up per unit of risk."""
    recompute_penalty: float = _ffield(0.0, ge(0.0))
    """``delta``: utility lost when an evicted token must be recomputed."""
    token_cost: float = _ffield(1.0, gt(0.0))
    """``c``: memory cost of one token."""
    price: float = _ffield(0.0, ge(0.0))
    """``mu``: the current dual price (0 before the first over-budget step)."""


def _to_floats(values: Iterable[SupportsFloat]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _weights_ok(_inst: object, _attribute: object, value: tuple[float, ...]) -> None:
    if len(value) != COMPACT_BASIS_SIZE:
        raise ValueError(f"'weights' must have {COMPACT_BASIS_SIZE} entries: {len(value)}")
    if not all(math.isfinite(w) for w in value):
        raise ValueError(f"'weights' must be finite: {value!r}")


@frozen
class CompactWeights:
    """evict's ``CompactReturnPredictor``: ``log R = w . phi(features)``, lognormal risk."""

    weights: tuple[float, ...] = field(converter=_to_floats, validator=_weights_ok)
    """One weight per basis function (see :data:`COMPACT_BASIS_SIZE`)."""
    residual_variance: float = _ffield(0.0, ge(0.0))
    """``s^2``: variance of ``log R`` around the fit."""


class MLPWeights:
    """Seed 000's logits MLP ``sigmoid(w2 . relu(W1 log_softmax(z) + b1) + b2)``.

    The kernel streams ``W1`` transposed, ``(vocab_size, hidden)`` row-major, in the
    logits' dtype (tensor cores take both operands in one dtype); :meth:`prepared` builds
    and caches that copy and ``W1``'s row sums once per (dtype, device).
    """

    __slots__ = ("_cache", "b1", "b2", "risk", "w1", "w2")

    def __init__(
        self,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: float,
        risk: float = 0.0,
    ) -> None:
        """Hold the weights.

        Args:
            w1: (hidden, vocab_size) float weight of the first layer; hidden a power of 2
                in [16, 512] (seed 000: 256).
            b1: (hidden,) float bias of the first layer.
            w2: (hidden,) float weight of the output unit.
            b2: bias of the output unit.
            risk: ``sigma^2`` reported for every token, finite and >= 0.
        """
        for name, t, nd in (("w1", w1, 2), ("b1", b1, 1), ("w2", w2, 1)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"'{name}' must be a torch.Tensor: {type(t).__name__}")
            if t.ndim != nd:
                raise ValueError(f"'{name}' must be {nd}-D: shape {tuple(t.shape)}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"'{name}' must be floating point: {t.dtype}")
        hidden = int(w1.shape[0])
        if hidden < 16 or hidden > 512 or hidden & (hidden - 1):
            raise ValueError(f"'w1' hidden width must be a power of 2 in [16, 512]: {hidden}")
        if tuple(b1.shape) != (hidden,) or tuple(w2.shape) != (hidden,):
            raise ValueError(
                f"'b1' and 'w2' must be ({hidden},): {tuple(b1.shape)}, {tuple(w2.shape)}"
            )
        if not (math.isfinite(b2) and math.isfinite(risk) and risk >= 0):
            raise ValueError(f"'b2' must be finite and 'risk' finite and >= 0: {b2!r}, {risk!r}")
        self.w1 = w1.detach()
        self.b1 = b1.detach()
        self.w2 = w2.detach()
        self.b2 = float(b2)
        self.risk = float(risk)
        self._cache: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}

    @property
    def hidden(self) -> int:
        """Hidden width."""
        return int(self.w1.shape[0])

    @property
    def vocab_size(self) -> int:
        """Input width."""
        return int(self.w1.shape[1])

    def prepared(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(W1^T (V, H) in dtype, rowsum (H,) f32, b1 (H,) f32, w2 (H,) f32)`` on device."""
        key = (dtype, device)
        got = self._cache.get(key)
        if got is None:
            w1t = self.w1.to(device=device, dtype=dtype).t().contiguous()
            # Row sums of the weights as the kernel sees them (rounded to dtype), so that
            # W1 (z - lse) = W1 z - lse * rowsum holds up to accumulation order.
            rowsum = w1t.float().sum(dim=0).contiguous()
            b1 = self.b1.to(device=device, dtype=torch.float32).contiguous()
            w2 = self.w2.to(device=device, dtype=torch.float32).contiguous()
            got = (w1t, rowsum, b1, w2)
            self._cache[key] = got
        return got  # type: ignore[return-value]


class TokenScores(NamedTuple):
    """Output of the scoring: three (B,) float32 tensors on the logits' device."""

    returns: torch.Tensor
    """``R_hat`` in [0, 1]."""
    risks: torch.Tensor
    """``sigma_hat^2`` >= 0."""
    excess: torch.Tensor
    """``g = R_hat - lambda sigma_hat^2 + delta - mu c``."""


class EvictionSelection(NamedTuple):
    """Output of the selection."""

    indices: torch.Tensor
    """(m,) int64 indices into ``g`` of the tokens to evict, ascending."""
    demand: int
    """Tokens the keep rule alone keeps (``g >= 0``; all of them without the rule): the
    demand ``D`` of the dual update (eq. 5)."""
