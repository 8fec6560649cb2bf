"""Time-to-live policies: how long a block may stay in a tier after its last use.

A TTL counts from a block's last use (its offload or its last fetch), in every tier: a
block last used at ``a`` with TTL ``t`` is found at any time ``<= a + t`` and is gone
after. A TTL of 0 means the tier does not keep the block at all (Algorithm 1 of seed 003
uses TTL = 0 for "no disk retention"); ``math.inf`` means no expiry (plain LRU).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

__all__ = ["FixedTTL", "GroupTTL", "TTLPolicy", "group_key"]


@runtime_checkable
class TTLPolicy(Protocol):
    """Chooses the TTL of a block in a tier."""

    def ttl(self, block_hash: int, tier: str) -> float:
        """Seconds that ``block_hash`` may stay in tier ``tier`` after its last use (>= 0)."""
        ...


def _check_ttl(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number of seconds: {value!r}")
    f = float(value)
    if math.isnan(f) or f < 0:
        raise ValueError(f"'{name}' must be >= 0 seconds (or inf): {value!r}")
    return f


class FixedTTL:
    """One TTL per tier, the same for every block (the "fixed TTL" baseline of §5.3.2).

    Example:
        >>> FixedTTL({"disk": 600.0}).ttl(123, "disk")
        600.0
        >>> FixedTTL({"disk": 600.0}).ttl(123, "dram")
        inf
    """

    __slots__ = ("_default", "_ttls")

    def __init__(self, ttls: Mapping[str, float] | None = None, default: float = math.inf):
        """Build from TTLs by tier name; tiers not named get ``default`` (no expiry)."""
        if ttls is not None and not isinstance(ttls, Mapping):
            raise TypeError(f"'ttls' must be a mapping of tier name to seconds: {ttls!r}")
        checked: dict[str, float] = {}
        for tier, value in (ttls or {}).items():
            if not isinstance(tier, str):
                raise TypeError(f"'ttls' keys must be tier names: {tier!r}")
            checked[tier] = _check_ttl(f"ttls[{tier!r}]", value)
        self._ttls = checked
        self._default = _check_ttl("default", default)

    @property
    def ttls(self) -> dict[str, float]:
        """TTL by tier name (a copy)."""
        return dict(self._ttls)

    def ttl(self, block_hash: int, tier: str) -> float:
        """The TTL of ``tier``; every block gets the same."""
        return self._ttls.get(tier, self._default)

    def __repr__(self) -> str:
        return f"FixedTTL({self._ttls!r}, default={self._default!r})"


def group_key(block_hashes: Sequence[int], position: int, depth: int = 1) -> int:
    """The prefix group (subtree of the prefix tree) of the block at ``position``.

    Seed 003 §4.3 groups blocks by "subtrees grouped by their initial prefixes". With
    chained hashes the subtree at depth ``depth`` is named by the hash of the chain's block
    number ``depth - 1``; blocks above that depth name their own subtree::

        position:  0    1    2    3    4        depth = 2
        hashes:   h0 - h1 - h2 - h3 - h4       group: h0, h1, h1, h1, h1

    ``depth = 1`` groups by the first block; a trace whose every request starts with the
    same system-prompt block (the Mooncake trace does) needs ``depth = 2``.
    """
    return block_hashes[min(position, depth - 1)]


class GroupTTL:
    """ROI-aware group TTL (Algorithm 2 of seed 003) as a policy for one tier.

    Blocks of the groups in ``ttls`` get their group's TTL in tier ``tier``; every other
    block gets ``residual`` there (the residual group G_{K+1}). Other tiers are left to
    ``base``. The store names a block only by its hash, so the policy learns which group a
    block belongs to from whole prompt chains: call :meth:`assign` with each request's
    prefix hashes (from its first block) when the request arrives.

    Example:
        >>> policy = GroupTTL({7: 900.0}, residual=30.0)
        >>> policy.assign([7, 8, 9])
        >>> policy.ttl(9, "disk"), policy.ttl(99, "disk"), policy.ttl(9, "dram")
        (900.0, 30.0, inf)
    """

    __slots__ = ("_base", "_depth", "_labels", "_max_labels", "_residual", "_tier", "_ttls")

    def __init__(
        self,
        ttls: Mapping[int, float],
        *,
        residual: float,
        tier: str = "disk",
        depth: int = 1,
        base: TTLPolicy | None = None,
        max_labels: int = 1 << 20,
    ) -> None:
        """Build from TTLs by group key (see :func:`group_key`).

        Args:
            ttls: seconds by group key, for the top-K groups.
            residual: seconds for blocks of any other group.
            tier: the tier the group TTLs govern (§5.3.2: group TTL acts on disk).
            depth: the prefix-tree depth that names a group.
            base: the policy of the other tiers (default: no expiry).
            max_labels: blocks whose group is remembered; the least recently assigned are
                forgotten beyond it (they fall back to ``residual``).
        """
        if not isinstance(ttls, Mapping):
            raise TypeError(f"'ttls' must be a mapping of group key to seconds: {ttls!r}")
        checked: dict[int, float] = {}
        for key, value in ttls.items():
            if isinstance(key, bool) or not isinstance(key, int):
                raise TypeError(f"'ttls' keys must be int block hashes: {key!r}")
            checked[key] = _check_ttl(f"ttls[{key!r}]", value)
        if not isinstance(tier, str) or not tier:
            raise TypeError(f"'tier' must be a non-empty str: {tier!r}")
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise TypeError(f"'depth' must be an int: {depth!r}")
        if depth < 1:
            raise ValueError(f"'depth' must be >= 1: {depth!r}")
        if isinstance(max_labels, bool) or not isinstance(max_labels, int):
            raise TypeError(f"'max_labels' must be an int: {max_labels!r}")
        if max_labels < 1:
            raise ValueError(f"'max_labels' must be >= 1: {max_labels!r}")
        if base is not None and not isinstance(base, TTLPolicy):
            raise TypeError(f"'base' must be a TTLPolicy: {base!r}")
        self._ttls = checked
        self._residual = _check_ttl("residual", residual)
        self._tier = tier
        self._depth = depth
        self._base: TTLPolicy = base if base is not None else FixedTTL()
        self._max_labels = max_labels
        self._labels: OrderedDict[int, int] = OrderedDict()

    @property
    def tier(self) -> str:
        """The tier whose TTLs this policy sets per group."""
        return self._tier

    @property
    def ttls(self) -> dict[int, float]:
        """TTL by group key (a copy)."""
        return dict(self._ttls)

    def assign(self, block_hashes: Sequence[int]) -> None:
        """Learn the groups of a prompt's blocks from its whole chain (first block first)."""
        for h in block_hashes:
            if isinstance(h, bool) or not isinstance(h, int):
                raise TypeError(f"'block_hashes' must hold int hashes: {h!r}")
        depth = self._depth
        for position, h in enumerate(block_hashes):
            key = block_hashes[position if position < depth else depth - 1]
            if key in self._ttls:
                self._labels[h] = key
                self._labels.move_to_end(h)
        while len(self._labels) > self._max_labels:
            self._labels.popitem(last=False)

    def group_of(self, block_hash: int) -> int | None:
        """The top-K group key of ``block_hash``, or ``None`` for the residual group."""
        return self._labels.get(block_hash)

    def ttl(self, block_hash: int, tier: str) -> float:
        """The group's TTL in :attr:`tier`; ``base`` decides the other tiers."""
        if tier != self._tier:
            return self._base.ttl(block_hash, tier)
        key = self._labels.get(block_hash)
        if key is None:
            return self._residual
        return self._ttls[key]

    def __repr__(self) -> str:
        return (
            f"GroupTTL({self._ttls!r}, residual={self._residual!r}, tier={self._tier!r}, "
            f"depth={self._depth!r})"
        )
