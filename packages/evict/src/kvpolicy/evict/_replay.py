"""Drive an eviction policy through one forward pass's attention, one token at a time.

The quality harness feeds a policy one token per step: insert it, let the stream observe
that token's query attention on its resident tokens, evict to the budget. A forward pass
over ``q`` new tokens (a prompt, or one decode step of a batch) is replayed here in the same
order from its attention weights: query ``i``'s weights on the tokens still resident after
step ``i - 1``, renormalised, are exactly its softmax over those keys alone. Used by the
transformers cache (:mod:`kvpolicy.evict.hf`) and the kvpress press
(:mod:`kvpolicy.evict.kvpress`). numpy only.
"""

from __future__ import annotations

import numpy as np
from attrs import define, field
from numpy.typing import NDArray

from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["Residency", "replay"]


@define
class Residency:
    """What one layer holds for each row of a batch: slot indices and true positions."""

    slots: list[list[int]] = field(factory=list)
    """Per row, the index of each resident token in the layer's key tensor."""
    positions: list[list[int]] = field(factory=list)
    """Per row, the true position of each resident token (same order)."""
    next_position: NDArray[np.int64] = field(factory=lambda: np.zeros(0, dtype=np.int64))
    """Per row, the position the next real token gets."""

    @classmethod
    def empty(cls, rows: int) -> Residency:
        """Nothing resident in any of ``rows`` rows."""
        return cls([[] for _ in range(rows)], [[] for _ in range(rows)], np.zeros(rows, np.int64))

    @property
    def held(self) -> int:
        """Resident tokens over all rows."""
        return sum(len(s) for s in self.slots)


def replay(
    policy: EvictionPolicy,
    budget: int,
    attention: NDArray[np.float64],
    real: NDArray[np.bool_],
    state: Residency,
    first_slot: int,
    streams: list[str],
) -> tuple[int, int]:
    """Insert, observe and evict for each new token in order; update ``state`` in place.

    Args:
        policy: the layer's policy; row ``r`` is its stream ``streams[r]``.
        budget: tokens the policy may keep over all rows after each step.
        attention: (rows, q, slots) each new query's weights (mean over query heads) on
            every slot of the layer's key tensor (resident, padding and the ``q`` new ones).
        real: (rows, q) whether each new token is real (left padding is not).
        state: the rows' resident slots and positions before the forward pass.
        first_slot: slot of the first new token (new token ``i`` is at ``first_slot + i``).
        streams: the stream name of each row.

    Returns:
        ``(tokens evicted, most tokens held after any step)``.

    Raises:
        RuntimeError: the policy's resident count disagrees with the replayed one.
    """
    rows, queries = int(attention.shape[0]), int(attention.shape[1])
    evicted = 0
    most = 0
    for i in range(queries):
        for r in range(rows):
            if not real[r, i]:
                continue
            p = int(state.next_position[r])
            state.next_position[r] += 1
            policy.insert(streams[r], np.array([p], dtype=np.int64), None)
            state.slots[r].append(first_slot + i)
            state.positions[r].append(p)
            a = attention[r, i, state.slots[r]]
            total = a.sum()
            policy.observe(
                streams[r],
                np.array(state.positions[r], dtype=np.int64),
                a / total if total > 0 else a,
            )
        gone = policy.evict(budget)
        for r in range(rows):
            out = gone.get(streams[r])
            if out is None or not len(out):
                continue
            drop = {int(x) for x in out}
            keep = [k for k, p in enumerate(state.positions[r]) if p not in drop]
            evicted += len(state.positions[r]) - len(keep)
            state.slots[r] = [state.slots[r][k] for k in keep]
            state.positions[r] = [state.positions[r][k] for k in keep]
        most = max(most, state.held)
    if policy.resident_tokens() != state.held:
        raise RuntimeError(
            f"policy reports {policy.resident_tokens()} resident tokens, the cache holds "
            f"{state.held}"
        )
    return evicted, most
