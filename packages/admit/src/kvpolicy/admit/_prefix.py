"""Tier-weighted prefix matches: how much of a prompt's chained blocks one replica holds.

A prompt's full blocks are named by chained hashes (a block's hash names its whole prefix),
so what a replica can reuse is the leading run of the prompt's blocks it holds in some tier;
each block of the run counts the weight of the best tier holding it, and the run ends at
the first block no weighted tier holds. The match is that credit over the prompt's blocks.

:class:`TierCredit` computes it with the tiers ordered once. A replica reporting one tier
(the gateway's views, a simulated replica without offload) takes a path without the tier
walk per block: the run's length times the tier's weight, which is the sum of that many
weights added one by one whenever the weight has few significant bits (GPU 1.0, host 0.75,
disk 0.25: every partial sum is exact), and that sum itself otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set

__all__ = ["TierCredit", "exact_multiples"]

_EXACT_BITS = 20
"""A weight of at most this many significant bits has exact sums of up to 2**33 copies."""


def exact_multiples(weight: float) -> bool:
    """Whether ``k * weight`` equals ``weight`` added ``k`` times from 0.0, for every run a
    prompt can have (``k < 2**33``): true when ``weight`` has at most 20 significant bits,
    so that each partial sum ``j * weight`` is representable and no addition rounds."""
    if not math.isfinite(weight):
        return False
    mantissa, _ = math.frexp(weight)
    return (mantissa * (1 << _EXACT_BITS)).is_integer()


class TierCredit:
    """The match of a prompt on a replica's resident blocks, for fixed tier weights.

    Args:
        tier_weights: credit of a matched block by tier name (checked by the caller).
    """

    __slots__ = ("_order", "_single")

    def __init__(self, tier_weights: Mapping[str, float]) -> None:
        """See the class docstring."""
        # (weight, tier), heaviest first; equal weights keep the mapping's order.
        self._order: tuple[tuple[float, str], ...] = tuple(
            sorted(((w, t) for t, w in tier_weights.items()), key=lambda p: -p[0])
        )
        # tier -> (weight, whether k * weight is the sum of k weights)
        self._single: dict[str, tuple[float, bool]] = {
            t: (w, exact_multiples(w)) for t, w in tier_weights.items()
        }

    @property
    def order(self) -> tuple[tuple[float, str], ...]:
        """``(weight, tier)`` pairs, heaviest first (equal weights in the mapping's order)."""
        return self._order

    def match(self, hashes: Sequence[int], blocks: Sequence[tuple[str, Set[int]]]) -> float:
        """Credit of the leading run of ``hashes`` held in ``blocks`` (a view's
        ``prefix_blocks``: ``(tier, hashes)`` pairs) over ``len(hashes)``; 0.0 for a prompt
        without blocks or a replica reporting none.

        Returns:
            A fraction in [0, 1] (1: every block in a tier of weight 1).
        """
        total = len(hashes)
        if not total or not blocks:
            return 0.0
        if len(blocks) == 1:
            tier, held = blocks[0]
            weight = self._single.get(tier)
            if weight is None or hashes[0] not in held:
                return 0.0
            run = 0
            for h in hashes:
                if h not in held:
                    break
                run += 1
            w, exact = weight
            if exact:
                return run * w / total
            credit = 0.0
            for _ in range(run):
                credit += w
            return credit / total
        return self._walk(hashes, blocks) / total

    def _walk(self, hashes: Sequence[int], blocks: Sequence[tuple[str, Set[int]]]) -> float:
        """The run's credit over several tiers: each block the best tier holding it."""
        resident: dict[str, Set[int]] = {}
        for name, held in blocks:
            resident.setdefault(name, held)  # a tier named twice: its first set, as before
        tiers = [(w, resident[t]) for w, t in self._order if t in resident]
        first = hashes[0]
        if not any(first in held for _, held in tiers):
            return 0.0
        credit = 0.0
        for h in hashes:
            for w, held in tiers:
                if h in held:
                    credit += w
                    break
            else:
                break
        return credit
