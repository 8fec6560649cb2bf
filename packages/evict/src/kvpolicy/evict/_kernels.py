"""Use kvpolicy-kernels' fused Triton scoring when it is installed and the logits are on a GPU.

The ``kernels`` extra (``pip install --find-links dist 'kvpolicy-evict[kernels]'``) adds
it. Without it, or for CPU tensors and numpy arrays, every function here computes what
evict always computed (numpy / eager torch), so results do not depend on the extra beyond
float32 rounding. torch is imported only when a
torch tensor arrives.
"""

from __future__ import annotations

import importlib.util
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from kvpolicy.evict.predictors._compact import CompactReturnPredictor
    from kvpolicy.evict.predictors._mlp import LogitsMLPPredictor

__all__ = ["compact_scores", "kernels_usable", "mlp_returns", "signals_from_logits"]

_HAS_KERNELS = importlib.util.find_spec("kvpolicy.kernels") is not None
# MLP weights in the kernels' layout, per network, rebuilt when a parameter changes.
_MLP_CACHE: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], float, Any]] = (
    weakref.WeakKeyDictionary()
)


def kernels_usable(logits: Any) -> bool:
    """True for (n, V) fp32/fp16/bf16 CUDA logits, rows contiguous, kvpolicy-kernels installed.

    Anything else (float64, strided rows, CPU, numpy) keeps evict's own path.
    """
    if not (_HAS_KERNELS and bool(getattr(logits, "is_cuda", False))):
        return False
    from kvpolicy.kernels import SUPPORTED_DTYPES

    return bool(logits.dtype in SUPPORTED_DTYPES and logits.ndim == 2 and logits.stride(1) == 1)


def mlp_returns(predictor: LogitsMLPPredictor, logits: Any) -> Any:
    """(n,) float32 CUDA tensor of the MLP's returns from the fused kernel, or None."""
    net = predictor.network
    first: Any = net[0]
    last: Any = net[2]
    hidden = int(first.out_features)
    # The kernel's tile holds the whole hidden layer: a power of 2 in [16, 512].
    if not kernels_usable(logits) or hidden & (hidden - 1) or not 16 <= hidden <= 512:
        return None
    if int(logits.shape[1]) != predictor.vocab_size:
        return None  # evict's own path raises its usual error
    from kvpolicy import kernels

    version = tuple(p._version for p in net.parameters())
    cached = _MLP_CACHE.get(net)
    if cached is None or cached[0] != version or cached[1] != predictor.risk:
        weights = kernels.MLPWeights(
            first.weight, first.bias, last.weight[0], float(last.bias.detach()), predictor.risk
        )
        cached = (version, predictor.risk, weights)
        _MLP_CACHE[net] = cached
    return kernels.score_tokens(logits, cached[2], kernels.ScoreParams()).returns


def compact_scores(
    predictor: CompactReturnPredictor, logits: Any, positions: Any, attention: Any
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(returns, risks)``, (n,) float64, of the compact predictor from (n, V) logits."""
    if kernels_usable(logits):
        import torch

        from kvpolicy import kernels

        dev = logits.device
        out = kernels.score_tokens(
            logits,
            kernels.CompactWeights(predictor.weights, predictor.residual_variance),
            kernels.ScoreParams(),
            positions=torch.as_tensor(positions, device=dev),
            attention=torch.as_tensor(attention, device=dev, dtype=torch.float32),
        )
        both = torch.stack((out.returns, out.risks)).double().cpu().numpy()
        return both[0], both[1]
    from kvpolicy.evict.predictors._compact import compact_features

    z = logits.float().cpu().numpy() if hasattr(logits, "cpu") else np.asarray(logits)
    pos = positions.cpu().numpy() if hasattr(positions, "cpu") else np.asarray(positions)
    att = attention.cpu().numpy() if hasattr(attention, "cpu") else np.asarray(attention)
    return predictor.predict(compact_features(z, pos, att))


def signals_from_logits(
    predictor: object, logits: Any, positions: Any, attention: Any = None
) -> NDArray[np.float64]:
    """(n, 2) float64 ``[R_hat, sigma_hat^2]`` for :meth:`TokenPDPolicy.insert`.

    Args:
        predictor: a ``CompactReturnPredictor`` (needs ``attention``) or a
            ``LogitsMLPPredictor``.
        logits: (n, V) next-token logits (numpy, or a torch tensor on any device).
        positions: (n,) int64 positions of the tokens.
        attention: (n,) float attention on arrival (compact predictor only).
    """
    from kvpolicy.evict.predictors._compact import CompactReturnPredictor

    if isinstance(predictor, CompactReturnPredictor):
        if attention is None:
            raise ValueError("'attention' is needed by the compact predictor")
        r, v = compact_scores(predictor, logits, positions, attention)
        return np.column_stack((r, v))
    predict_logits = getattr(predictor, "predict_logits", None)
    if predict_logits is None:
        raise TypeError(
            f"'predictor' must be a CompactReturnPredictor or LogitsMLPPredictor: "
            f"{type(predictor).__name__}"
        )
    if not hasattr(logits, "cpu"):
        r, v = predictor.predict(np.asarray(logits))  # type: ignore[attr-defined]
        return np.column_stack((r, v))
    r = predict_logits(logits).double().cpu().numpy()
    return np.column_stack((r, np.full(len(r), float(predictor.risk))))  # type: ignore[attr-defined]
