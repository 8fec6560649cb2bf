"""Request-level preemption orders (kvmodel's ``PreemptionPolicy``).

When token eviction cannot free enough memory, a server preempts whole requests and
recomputes them later. Each order here returns the request ids of the running batch, the
first to preempt first; ties always fall back to a total order so that results are
reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvpolicy.kvmodel import PreemptionPolicy, SequenceView

__all__ = ["CostAware", "LastInFirstOut", "LeastProgressedFirst", "PriorityAware"]


def _check(running: Sequence[SequenceView]) -> list[SequenceView]:
    """Validate the running batch: SequenceView items with distinct request ids."""
    views = list(running)
    seen: set[str] = set()
    for v in views:
        if not isinstance(v, SequenceView):
            raise TypeError(f"'running' must hold SequenceView items: {v!r}")
        if v.request_id in seen:
            raise ValueError(f"'running' holds request id {v.request_id!r} twice")
        seen.add(v.request_id)
    return views


def _lifo_key(v: SequenceView) -> tuple[float, float, str]:
    return (-v.admitted_time, -v.arrival_time, v.request_id)


class LeastProgressedFirst:
    """Seed 002's LPF rule: requests at earlier decode stages are preempted first.

    The stage of a request is its decode progress (tokens generated). Within a stage the
    most recently admitted goes first (in the homogeneous model of seed 002 arrival order
    and progress coincide, so this is the same rule), then the request id.
    """

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        """Request ids, least decode progress first."""
        views = _check(running)
        views.sort(key=lambda v: (v.progress, *_lifo_key(v)))
        return [v.request_id for v in views]


class LastInFirstOut:
    """The most recently admitted request is preempted first (vLLM's recompute order)."""

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        """Request ids, latest admission first; ties by later arrival, then id."""
        views = _check(running)
        views.sort(key=_lifo_key)
        return [v.request_id for v in views]


class PriorityAware:
    """Lowest priority first; within one priority level, ``within`` decides.

    Args:
        within: the order inside a priority level (default :class:`LastInFirstOut`).
    """

    def __init__(self, within: PreemptionPolicy | None = None) -> None:
        inner = LastInFirstOut() if within is None else within
        if not isinstance(inner, PreemptionPolicy):
            raise TypeError(f"'within' must be a PreemptionPolicy: {within!r}")
        self._within = inner

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        """Request ids, lowest priority first."""
        views = _check(running)
        rank = {rid: i for i, rid in enumerate(self._within.order(views))}
        if set(rank) != {v.request_id for v in views}:
            raise ValueError("'within' must return exactly the running request ids")
        views.sort(key=lambda v: (v.priority, rank[v.request_id]))
        return [v.request_id for v in views]


class CostAware:
    """Least recomputation lost per byte freed goes first.

    Preempting a request frees its resident KV (``kv_tokens * bytes_per_token`` bytes) and
    loses the work of recomputing it later: a prefill over its computed tokens, costing
    ``n + attention_weight * n^2 / 2`` for ``n`` tokens (linear layers plus causal attention,
    in token-equivalents). ``n`` is ``max(computed_tokens, kv_tokens)``: resident KV was
    computed. A request that frees nothing goes last.

    Args:
        bytes_per_token: KV bytes of one token (``ModelSpec.kv_bytes_per_token()``); every
            request of a model has the same, so it scales the costs and leaves the order
            unchanged (the default 1 counts in tokens).
        attention_weight: weight of the quadratic attention term of a prefill (>= 0).
    """

    def __init__(self, bytes_per_token: int = 1, attention_weight: float = 0.0) -> None:
        if not isinstance(bytes_per_token, int) or isinstance(bytes_per_token, bool):
            raise TypeError(f"'bytes_per_token' must be int: {bytes_per_token!r}")
        if bytes_per_token <= 0:
            raise ValueError(f"'bytes_per_token' must be > 0: {bytes_per_token!r}")
        if isinstance(attention_weight, bool) or not isinstance(attention_weight, int | float):
            raise TypeError(f"'attention_weight' must be a float: {attention_weight!r}")
        if not math.isfinite(attention_weight) or attention_weight < 0:
            raise ValueError(f"'attention_weight' must be finite and >= 0: {attention_weight!r}")
        self._bytes = bytes_per_token
        self._attn = float(attention_weight)

    def cost_per_byte(self, view: SequenceView) -> float:
        """Recomputation lost per byte freed by preempting ``view`` (inf if it frees nothing)."""
        n = max(view.computed_tokens, view.kv_tokens)
        freed = view.kv_tokens * self._bytes
        if freed == 0:
            return math.inf
        return (n + self._attn * n * n / 2.0) / freed

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        """Request ids, cheapest recomputation per byte first; ties latest admitted first."""
        views = _check(running)
        views.sort(key=lambda v: (self.cost_per_byte(v), *_lifo_key(v)))
        return [v.request_id for v in views]
