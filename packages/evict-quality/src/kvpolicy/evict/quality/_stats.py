"""A model's attention statistics: :func:`model_attention_statistics` records the model on one
window and reports kvpolicy-evict's :func:`~kvpolicy.evict.attention_statistics` of it (the
one definition of the statistics, numpy only, lives in kvpolicy-evict so that the simulator
uses it without the harness). The values measured on SmolLM2-135M-Instruct are written down
in ``ATTENTION.md`` next to this module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvpolicy.evict import attention_statistics
from kvpolicy.evict.quality._model import CausalLM

__all__ = ["model_attention_statistics"]


def model_attention_statistics(lm: CausalLM, input_ids: Any, warmup: int = 64) -> dict[str, float]:
    """:func:`attention_statistics` of ``lm``'s attention on one window, decoded with the
    full cache and averaged over layers and heads, plus ``layers`` and ``heads``.

    Args:
        lm: the model (eager attention; needs the ``quality`` extra).
        input_ids: (n,) int64 torch tensor, n > ``warmup`` + 8.
        warmup: as in :func:`attention_statistics`.

    Raises:
        TypeError, ValueError: as :func:`attention_statistics`.
    """
    from kvpolicy.evict.quality._record import window_attention

    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"'warmup' must be an int >= 0: {warmup!r}")
    n = int(np.asarray(input_ids).size)
    if n <= warmup + 8:
        raise ValueError(f"'input_ids' must be longer than warmup + 8 = {warmup + 8}: {n}")
    _, attention = window_attention(lm, input_ids)
    layers, heads = int(attention.shape[0]), int(attention.shape[1])
    mass = attention.mean(dim=(0, 1)).double().numpy()  # (n, n)
    mass /= mass.sum(axis=1, keepdims=True)
    stats = {"layers": float(layers), "heads": float(heads)}
    stats.update(attention_statistics(mass, warmup))
    return stats
