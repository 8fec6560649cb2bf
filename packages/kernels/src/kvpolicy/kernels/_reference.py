"""Pure-torch reference of the two kernels, with the same semantics (and the CPU backend).

Both run in float32 whatever the input dtype (fp16/bf16 logits are upcast once), like the
kernels' fp32 accumulation; the MLP's first layer uses the weights rounded to the logits'
dtype, as the kernel's tensor-core dot does.
"""

from __future__ import annotations

import torch

from kvpolicy.kernels._params import (
    CompactWeights,
    EvictionSelection,
    MLPWeights,
    ScoreParams,
    TokenScores,
)

__all__ = ["compact_returns_torch", "score_tokens_torch", "select_evictions_torch"]

_EPS = 1e-6


def compact_returns_torch(
    entropy: torch.Tensor,
    top_prob: torch.Tensor,
    positions: torch.Tensor,
    attention: torch.Tensor,
    weights: CompactWeights,
) -> tuple[torch.Tensor, torch.Tensor]:
    """evict's ``CompactReturnPredictor.predict`` on (B,) float32 features, in torch."""
    pos = positions.float().clamp_min(0.0)
    att = attention.float().clamp(0.0, 1.0)
    w = weights.weights
    log_mean = (
        w[0]
        + w[1] * entropy
        + w[2] * top_prob
        + w[3] * torch.log1p(pos)
        + w[4] / (1.0 + pos)
        + w[5] * att
        + w[6] * torch.log(att + _EPS)
    )
    s2 = weights.residual_variance
    returns = torch.exp(torch.clamp_max(log_mean + s2 / 2.0, 0.0))
    risks = torch.expm1(torch.tensor(s2)).item() * torch.exp(
        torch.clamp_max(2.0 * log_mean + s2, 0.0)
    )
    return returns, risks


def score_tokens_torch(
    logits: torch.Tensor,
    predictor: MLPWeights | CompactWeights,
    params: ScoreParams,
    positions: torch.Tensor | None = None,
    attention: torch.Tensor | None = None,
) -> TokenScores:
    """Reference of :func:`kvpolicy.kernels.score_tokens` (inputs already validated)."""
    z = logits.float()
    # Non-finite logits are zeroed for the arithmetic and their rows reported as NaN.
    finite = torch.isfinite(z)
    bad = ~finite.all(dim=1)
    z = torch.where(finite, z, 0.0)
    lse = torch.logsumexp(z, dim=1)
    if isinstance(predictor, MLPWeights):
        w1t, _rowsum, b1, w2 = predictor.prepared(logits.dtype, logits.device)
        h = torch.relu((z - lse[:, None]) @ w1t.float() + b1)
        returns = torch.sigmoid(h @ w2 + predictor.b2)
        risks = torch.full_like(returns, predictor.risk)
    else:
        assert positions is not None
        assert attention is not None
        att_ok = torch.isfinite(attention)
        bad |= ~att_ok
        attention = torch.where(att_ok, attention, 0.0)
        p = torch.exp(z - lse[:, None])
        # -sum p log p = lse - sum p z (no log of a zero probability).
        entropy = lse - (p * z).sum(dim=1)
        top = torch.exp(z.max(dim=1).values - lse)
        returns, risks = compact_returns_torch(entropy, top, positions, attention, predictor)
    excess = (
        returns
        - params.risk_aversion * risks
        + params.recompute_penalty
        - params.price * params.token_cost
    )
    nan = torch.tensor(float("nan"), device=z.device)
    out = [torch.where(bad, nan, x.float()) for x in (returns, risks, excess)]
    return TokenScores(out[0], out[1], out[2])


def select_evictions_torch(
    g: torch.Tensor, budget_tokens: int, keep_rule: bool
) -> EvictionSelection:
    """Reference of :func:`kvpolicy.kernels.select_evictions` (inputs already validated).

    The tokens evicted are the ``m`` smallest by ``(g, index)``, with ``m`` the larger of
    the keep rule's count (``g < 0``, eq. 4) and ``N - budget``: evict's ``TokenPDPolicy``
    first drops every ``g < 0`` and then pops the smallest ``(key, insertion number)`` until
    the budget holds, and the index plays the insertion number.
    """
    n = int(g.numel())
    below = int((g < 0).sum()) if keep_rule else 0
    m = min(n, max(below, n - budget_tokens))
    if m == 0:
        return EvictionSelection(torch.zeros(0, dtype=torch.int64, device=g.device), n - below)
    if m == n:
        return EvictionSelection(torch.arange(n, device=g.device), n - below)
    # The m-th smallest value, everything below it, then its ties by index (-0.0 == 0.0).
    kth = torch.kthvalue(g.float(), m).values
    take = g < kth
    ties = torch.nonzero(g == kth).flatten()
    take[ties[: m - int(take.sum())]] = True
    return EvictionSelection(torch.nonzero(take).flatten(), n - below)
