"""Realised returns recorded from a model: the training targets of the return predictors.

Seed 000 defines a token's return ``R`` as "the expected fraction of future query attention
mass that will land on" it. On text decoded with the full cache this is measured directly:
one forward pass over a window gives every layer's (H, n, n) attention, and

    R_k = mean over q in (k, k + horizon], layers l, heads h of A[l, h, q, k]

so ``R_k`` is in [0, 1], and a token that every later query ignores has ``R_k = 0``. Only
tokens with a full horizon of later queries are recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from attrs import field, frozen
from numpy.typing import NDArray

from kvpolicy.evict.predictors import compact_features
from kvpolicy.evict.quality._model import CausalLM

__all__ = ["ReturnRecord", "mean_attention", "record_returns", "window_attention"]


@frozen
class ReturnRecord:
    """Per-token inputs of the predictors and realised returns, for m recorded tokens."""

    logits: Any = field()
    """(m, vocab_size) float16 torch tensor: next-token logits at each token's step."""
    features: NDArray[np.float64] = field()
    """(m, 4) float64 compact features (entropy, top_prob, position, arrival attention)."""
    returns: NDArray[np.float64] = field()
    """(m,) float64 realised returns in [0, 1]."""

    def __attrs_post_init__(self) -> None:
        m = len(self.returns)
        if self.features.shape != (m, 4) or int(self.logits.shape[0]) != m:
            raise ValueError(
                f"'logits', 'features' and 'returns' disagree on the token count: "
                f"{tuple(self.logits.shape)}, {self.features.shape}, {self.returns.shape}"
            )


def window_attention(lm: CausalLM, input_ids: Any) -> tuple[Any, Any]:
    """Full-cache forward pass over one window.

    Args:
        lm: the model (eager attention).
        input_ids: (n,) int64 torch tensor.

    Returns:
        ``(logits, attention)``: (n, vocab_size) float32 and (layers, heads, n, n) float32
        torch tensors (attention[l, h, q, k]: weight of key k in query q).
    """
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    with torch.no_grad():
        out = lm.model(input_ids=ids, use_cache=False, output_attentions=True)
    attention = torch.stack([a[0] for a in out.attentions])
    return out.logits[0].float(), attention.float()


def mean_attention(lm: CausalLM, input_ids: Any, *, per_layer: bool = False) -> NDArray[np.float64]:
    """Full-cache attention of one window, averaged over heads (and layers), as numpy.

    What kvpolicy-sim's attention model is fitted to. Each layer is reduced to its head
    mean as it comes out of the forward pass (no (layers, heads, n, n) stack, which at
    2048 tokens of SmolLM2-135M would be another 4.5 GB), and every row is renormalised
    to sum to exactly 1 (float32 softmax rows are off by up to ~1e-7).

    Args:
        lm: the model (eager attention).
        input_ids: (n,) int64 torch tensor, n >= 1.
        per_layer: keep the layers apart.

    Returns:
        (n, n) float64, or (layers, n, n) float64 with ``per_layer``: ``[..., q, k]`` is
        the share of query ``q``'s attention on key ``k`` (zero for ``k > q``).
    """
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1)
    if ids.shape[1] < 1:
        raise ValueError("'input_ids' must hold at least one token: got 0")
    with torch.no_grad():
        out = lm.model(input_ids=ids, use_cache=False, output_attentions=True)
    layers = np.stack([a[0].double().mean(dim=0).numpy() for a in out.attentions])
    mass = layers if per_layer else layers.mean(axis=0)
    result: NDArray[np.float64] = mass / mass.sum(axis=-1, keepdims=True)
    return result


def record_returns(lm: CausalLM, input_ids: Any, horizon: int = 128) -> ReturnRecord:
    """Record inputs and realised returns of the tokens of one window.

    Args:
        lm: the model (eager attention).
        input_ids: (n,) int64 torch tensor, n > ``horizon``.
        horizon: later queries averaged into each return.

    Returns:
        The ``n - horizon`` tokens that have a full horizon.
    """
    import torch

    n = int(torch.as_tensor(input_ids).numel())
    if not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"'horizon' must be an int >= 1: {horizon!r}")
    if n <= horizon:
        raise ValueError(f"'input_ids' must be longer than 'horizon' = {horizon}: {n}")
    logits, attention = window_attention(lm, input_ids)
    mass = attention.mean(dim=(0, 1)).double().numpy()  # (n, n): query q, key k
    m = n - horizon
    # Row sums of the lower-left band: mass[k+1 : k+horizon+1, k] for each k < m.
    cum = np.vstack([np.zeros((1, n)), np.cumsum(mass, axis=0)])
    k = np.arange(m)
    returns = (cum[k + horizon + 1, k] - cum[k + 1, k]) / horizon
    arrival = np.diagonal(mass)[:m]
    feats = compact_features(logits[:m].double().numpy(), k.astype(np.int64), arrival)
    return ReturnRecord(
        logits=logits[:m].half(),
        features=feats,
        returns=np.clip(returns, 0.0, 1.0),
    )
