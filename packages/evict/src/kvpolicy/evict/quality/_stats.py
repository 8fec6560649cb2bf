"""Attention statistics of a real model, for the simulator's synthetic attention-return model.

Measured on one window decoded with the full cache, averaged over layers and heads
(the ``mass[q, k]`` of :mod:`kvpolicy.evict.quality._record`). The values measured on
SmolLM2-135M-Instruct are written down in ``ATTENTION.md`` next to this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvpolicy.evict.quality._model import CausalLM
from kvpolicy.evict.quality._record import window_attention

__all__ = ["attention_statistics"]

_DISTANCES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SINKS = 4


def attention_statistics(lm: CausalLM, input_ids: Any, warmup: int = 64) -> dict[str, float]:
    """Sink mass, decay with distance and heavy-hitter concentration of ``lm``'s attention.

    Args:
        lm: the model (eager attention).
        input_ids: (n,) int64 torch tensor, n > ``warmup`` + 8.
        warmup: queries before this position are left out of the per-query statistics
            (their few keys would inflate every share).

    Returns:
        A flat dict of floats:

        - ``sink_mass_first_token``, ``sink_mass_first_4``: mean share of a query's
          attention on key 0 and on keys 0-3;
        - ``recent_mass_last_16``: mean share on the 16 most recent keys (self included);
        - ``attention_at_distance_<d>``: mean weight on the key ``d`` positions back
          (sink keys excluded), for d in 1, 2, ..., 256;
        - ``decay_exponent``: α of the least-squares fit ``weight ∝ d^-α`` over those d;
        - ``per_query_top_<p>pct_mass``: mean share of a query's attention held by its
          top p% keys (p = 1, 5, 10);
        - ``accumulated_top_<p>pct_mass``: share of the column sums (H2O's accumulated
          attention) held by the top p% keys;
        - ``layers``, ``heads``, ``tokens``.
    """
    n = int(np.asarray(input_ids).size)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"'warmup' must be an int >= 0: {warmup!r}")
    if n <= warmup + 8:
        raise ValueError(f"'input_ids' must be longer than warmup + 8 = {warmup + 8}: {n}")
    _, attention = window_attention(lm, input_ids)
    layers, heads = int(attention.shape[0]), int(attention.shape[1])
    mass = attention.mean(dim=(0, 1)).double().numpy()  # (n, n)
    queries = np.arange(warmup, n)
    stats: dict[str, float] = {
        "layers": float(layers),
        "heads": float(heads),
        "tokens": float(n),
        "sink_mass_first_token": float(mass[queries, 0].mean()),
        "sink_mass_first_4": float(mass[queries, :_SINKS].sum(axis=1).mean()),
    }
    recent = [mass[q, max(0, q - 15) : q + 1].sum() for q in queries]
    stats["recent_mass_last_16"] = float(np.mean(recent))
    used: list[tuple[int, float]] = []
    for d in _DISTANCES:
        qs = np.arange(max(warmup, d + _SINKS), n)
        if len(qs) == 0:
            continue
        w = float(mass[qs, qs - d].mean())
        stats[f"attention_at_distance_{d}"] = w
        if w > 0:
            used.append((d, w))
    if len(used) >= 2:
        x = np.log([d for d, _ in used])
        y = np.log([w for _, w in used])
        slope = np.polyfit(x, y, 1)[0]
        stats["decay_exponent"] = float(-slope)
    for p in (1, 5, 10):
        shares = []
        for q in queries:
            row = np.sort(mass[q, : q + 1])[::-1]
            top = max(1, int(np.ceil(len(row) * p / 100)))
            shares.append(row[:top].sum() / row.sum())
        stats[f"per_query_top_{p}pct_mass"] = float(np.mean(shares))
        col = np.sort(mass.sum(axis=0))[::-1]
        top = max(1, int(np.ceil(n * p / 100)))
        stats[f"accumulated_top_{p}pct_mass"] = float(col[:top].sum() / col.sum())
    return stats
