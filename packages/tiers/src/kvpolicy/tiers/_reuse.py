"""Prefix-tree reuse analysis of a trace of block-hash lists (§3.1.1 X5/X6, §4.3 of seed 003).

A *hash trace* is a sequence of ``(time, block_hashes)`` pairs, one per request, in arrival
order: ``time`` in seconds and ``block_hashes`` the request's chained prefix hashes from
its first block (a Mooncake ``hash_ids`` row). Every block reference is an access; a
reference to a block seen before is a *reuse*, with an inter-arrival time (seconds since
the block's previous reference, δ of §4.3) and an LRU stack distance (distinct other
blocks referenced in between), from which the hit ratio of an LRU cache of any size
follows (Mattson et al.'s stack algorithm; Figure 3's "storage capacity vs. reuse ratio").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from attrs import field, frozen

from kvpolicy.tiers._check import is_sequence
from kvpolicy.tiers._ttl import group_key

__all__ = ["HashTrace", "PrefixGroup", "ReuseAnalysis", "analyze_reuse", "prefix_groups"]

HashTrace = Sequence[tuple[float, Sequence[int]]]
"""Requests as ``(arrival time in seconds, chained block hashes from the first block)``."""


def _validate(trace: HashTrace) -> None:
    if not is_sequence(trace):
        raise TypeError(f"'trace' must be a sequence of (time, block_hashes): {trace!r}")
    prev = -math.inf
    for k, row in enumerate(trace):
        if not isinstance(row, tuple | list) or len(row) != 2:
            raise TypeError(f"'trace[{k}]' must be a (time, block_hashes) pair: {row!r}")
        t, hashes = row
        if isinstance(t, bool) or not isinstance(t, int | float):
            raise TypeError(f"'trace[{k}]' time must be a number: {t!r}")
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"'trace[{k}]' time must be finite and >= 0: {t!r}")
        if t < prev:
            raise ValueError(f"'trace[{k}]' time goes backwards: {t!r} < {prev!r}")
        prev = t
        if not is_sequence(hashes):
            raise TypeError(f"'trace[{k}]' block_hashes must be a sequence: {hashes!r}")
        for h in hashes:
            if isinstance(h, bool) or not isinstance(h, int):
                raise TypeError(f"'trace[{k}]' block_hashes must hold ints: {h!r}")


def _float_array(value: object) -> npt.NDArray[np.float64]:
    return np.asarray(value, dtype=np.float64)


def _int_array(value: object) -> npt.NDArray[np.int64]:
    return np.asarray(value, dtype=np.int64)


@frozen(eq=False)
class ReuseAnalysis:
    """Block reuse of a hash trace (see :func:`analyze_reuse`)."""

    references: int
    """Block references (sum of the requests' block counts)."""
    unique_blocks: int
    """Distinct blocks."""
    intervals: npt.NDArray[np.float64] = field(converter=_float_array)
    """(reuses,) float64: seconds since the previous reference of the same block."""
    stack_distances: npt.NDArray[np.int64] = field(converter=_int_array)
    """(reuses,) int64: distinct other blocks referenced since that previous reference."""
    reuse_counts: npt.NDArray[np.int64] = field(converter=_int_array)
    """(unique_blocks,) int64: reuses of each block, in order of first reference."""

    @property
    def reuses(self) -> int:
        """References to a block referenced before."""
        return int(self.intervals.size)

    @property
    def reuse_ratio(self) -> float:
        """Reuses over references: the hit ratio of an unbounded cache without TTL."""
        return self.reuses / self.references if self.references else 0.0

    def lru_hit_ratio(self, capacity_blocks: int) -> float:
        """Hit ratio of one LRU cache holding ``capacity_blocks`` blocks, no TTL.

        A reuse hits when fewer than ``capacity_blocks`` distinct other blocks were
        referenced since its previous reference (the stack-distance property of LRU).
        """
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int):
            raise TypeError(f"'capacity_blocks' must be an int: {capacity_blocks!r}")
        if capacity_blocks < 0:
            raise ValueError(f"'capacity_blocks' must be >= 0: {capacity_blocks!r}")
        if not self.references:
            return 0.0
        hits = int(np.count_nonzero(self.stack_distances < capacity_blocks))
        return hits / self.references

    def ttl_hit_ratio(self, ttl: float) -> float:
        """Hit ratio of an unbounded cache whose blocks expire ``ttl`` seconds after use."""
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise TypeError(f"'ttl' must be a number: {ttl!r}")
        if math.isnan(ttl) or ttl < 0:
            raise ValueError(f"'ttl' must be >= 0: {ttl!r}")
        if not self.references or ttl == 0:
            return 0.0
        return int(np.count_nonzero(self.intervals <= ttl)) / self.references

    def hot_fraction(self, share: float = 0.9) -> float:
        """Smallest fraction of blocks that accounts for ``share`` of all reuses.

        §3.1.1 (X5) of seed 003: "31.95% of blocks account for 90% of hits in Trace A,
        compared to only 0.67% in Trace B". Blocks are taken in decreasing reuse count.
        """
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise TypeError(f"'share' must be a number: {share!r}")
        if not 0 < share <= 1:
            raise ValueError(f"'share' must be in (0, 1]: {share!r}")
        total = int(self.reuse_counts.sum())
        if total == 0:
            return 0.0
        cum = np.cumsum(np.sort(self.reuse_counts)[::-1])
        needed = int(np.searchsorted(cum, share * total - 1e-9 * total)) + 1
        return needed / self.unique_blocks


def analyze_reuse(trace: HashTrace) -> ReuseAnalysis:
    """Reuse intervals, LRU stack distances and per-block reuse counts of ``trace``.

    Stack distances use a Fenwick tree over reference positions marking each block's
    latest reference: the distance of a reuse at position ``i`` whose previous reference
    was at ``p`` is the number of marks in ``(p, i)``. O(references · log references).

    Raises:
        TypeError / ValueError: a malformed row, a negative time or time going backwards.
    """
    _validate(trace)
    n = sum(len(hashes) for _, hashes in trace)
    tree = [0] * (n + 1)
    last_pos: dict[int, int] = {}
    last_time: dict[int, float] = {}
    index: dict[int, int] = {}
    counts: list[int] = []
    intervals: list[float] = []
    distances: list[int] = []
    pos = 0
    for t, hashes in trace:
        tf = float(t)
        for h in hashes:
            pos += 1
            p = last_pos.get(h)
            if p is None:
                index[h] = len(counts)
                counts.append(0)
            else:
                # marks in (p, pos) = prefix(pos - 1) - prefix(p)
                s = 0
                j = pos - 1
                while j > 0:
                    s += tree[j]
                    j -= j & -j
                j = p
                while j > 0:
                    s -= tree[j]
                    j -= j & -j
                distances.append(s)
                intervals.append(tf - last_time[h])
                counts[index[h]] += 1
                j = p
                while j <= n:
                    tree[j] -= 1
                    j += j & -j
            j = pos
            while j <= n:
                tree[j] += 1
                j += j & -j
            last_pos[h] = pos
            last_time[h] = tf
    return ReuseAnalysis(
        references=n,
        unique_blocks=len(counts),
        intervals=intervals,
        stack_distances=distances,
        reuse_counts=counts,
    )


@frozen(eq=False)
class PrefixGroup:
    """The blocks of one prefix subtree (or of the residual group) and their reuse."""

    key: int | None
    """Hash naming the subtree (see :func:`group_key`); ``None`` for the residual group."""
    unique_blocks: int
    """Distinct blocks, |B_g| of §4.3."""
    references: int
    """Block references."""
    intervals: npt.NDArray[np.float64] = field(converter=_float_array)
    """(reuses,) float64: the inter-arrival times A_g of §4.3."""

    @property
    def reuses(self) -> int:
        """Reuse events (N_g of §4.3)."""
        return int(self.intervals.size)


def prefix_groups(trace: HashTrace, top_k: int, depth: int = 1) -> tuple[PrefixGroup, ...]:
    """Partition a trace's blocks into the top-K prefix subtrees and a residual group.

    Algorithm 2, line 1 of seed 003: "top-K frequent prefix subtrees and residual group
    G_{K+1}". Subtrees are ranked by reuse events (Figure 10 ranks them by "Total Reuse
    Events"; ties by first appearance). Returns the ``top_k`` groups, most reused first,
    then the residual group (``key=None``, possibly empty).
    """
    _validate(trace)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"'top_k' must be an int: {top_k!r}")
    if top_k < 0:
        raise ValueError(f"'top_k' must be >= 0: {top_k!r}")
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(f"'depth' must be an int: {depth!r}")
    if depth < 1:
        raise ValueError(f"'depth' must be >= 1: {depth!r}")
    last_time: dict[int, float] = {}
    block_group: dict[int, int] = {}
    refs: dict[int, int] = {}
    uniq: dict[int, int] = {}
    gaps: dict[int, list[float]] = {}
    for t, hashes in trace:
        tf = float(t)
        for position, h in enumerate(hashes):
            prev = last_time.get(h)
            if prev is None:
                key = group_key(hashes, position, depth)
                block_group[h] = key
                uniq[key] = uniq.get(key, 0) + 1
                if key not in gaps:
                    gaps[key] = []
                    refs[key] = 0
            else:
                key = block_group[h]
                gaps[key].append(tf - prev)
            refs[key] += 1
            last_time[h] = tf
    ranked = sorted(gaps, key=lambda k: -len(gaps[k]))  # stable: first appearance breaks ties
    top = ranked[:top_k]
    rest = ranked[top_k:]
    groups = [
        PrefixGroup(key=k, unique_blocks=uniq[k], references=refs[k], intervals=gaps[k])
        for k in top
    ]
    groups.append(
        PrefixGroup(
            key=None,
            unique_blocks=sum(uniq[k] for k in rest),
            references=sum(refs[k] for k in rest),
            intervals=[d for k in rest for d in gaps[k]],
        )
    )
    return tuple(groups)
