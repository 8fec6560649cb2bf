"""DRAM and disk tiers below one server's HBM, built from a few params.

This is the ``tiered`` implementation of the ``kvpolicy.tiers`` entry-point group:
``build(TIERS, "tiered", {"dram_gib": 64, "disk_gib": 512, "ttl_s": 600}, context=...)``.
``ttl_s`` is one TTL for every tier or a mapping of tier name to seconds (default: no
expiry, LRU only). ``group_ttl`` instead gives the slowest tier (disk; DRAM when it is the
only one) seed 003's ROI-aware per-group TTLs (Algorithm 2), fitted on the first
``fit_fraction`` of the context's requests that carry prefix hashes, within a storage budget
of ``budget_block_s`` block-seconds::

    {dram_gib: 16, disk_gib: 256,
     group_ttl: {budget_block_s: 2.0e6, top_k: 8, depth: 2, fit_fraction: 0.5}}
"""

from __future__ import annotations

from collections.abc import Mapping

from kvpolicy.kvmodel import ServerContext, rechunk_hashes
from kvpolicy.tiers._reuse import prefix_groups
from kvpolicy.tiers._roi import allocate_group_ttls
from kvpolicy.tiers._spec import TierSpec, get_tier
from kvpolicy.tiers._store import TieredPrefixStore
from kvpolicy.tiers._ttl import FixedTTL, GroupTTL, TTLPolicy

__all__ = ["tiered_store"]

_GIB = 2**30
_GROUP_KEYS = ("budget_block_s", "top_k", "depth", "fit_fraction")


def _group_policy(raw: object, context: ServerContext, tier: str) -> GroupTTL:
    if not isinstance(raw, Mapping):
        raise TypeError(f"'group_ttl' must be a mapping: {raw!r}")
    for key in raw:
        if key not in _GROUP_KEYS:
            raise ValueError(f"unknown key 'group_ttl.{key!s}'; allowed: {', '.join(_GROUP_KEYS)}")
    if "budget_block_s" not in raw:
        raise ValueError("'group_ttl' needs budget_block_s (block-seconds of the slowest tier)")
    fraction = raw.get("fit_fraction", 0.5)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"'group_ttl.fit_fraction' must be in (0, 1]: {fraction!r}")
    bs = context.block_size
    chains = [
        (r.arrival_time, list(rechunk_hashes(r.prefix_hashes, r.hash_block_size, bs)))
        for r in context.requests
        if r.prefix_hashes
    ]
    chains = [c for c in chains if c[1]]
    if not chains:
        raise ValueError("'group_ttl' needs requests with prefix hashes to fit on")
    trace = chains[: max(1, int(len(chains) * fraction))]
    depth = raw.get("depth", 1)
    groups = prefix_groups(trace, raw.get("top_k", 8), depth)
    plan = allocate_group_ttls(groups, raw["budget_block_s"])
    return plan.policy(tier=tier, depth=depth)


def tiered_store(
    dram_gib: float = 64,
    disk_gib: float = 0,
    ttl_s: float | Mapping[str, float] | None = None,
    group_ttl: Mapping[str, object] | None = None,
    *,
    context: ServerContext,
) -> TieredPrefixStore:
    """DRAM (and disk, when ``disk_gib`` > 0) below the HBM of the server ``context``.

    Raises:
        ValueError / TypeError: a bad size, TTL or group_ttl key (named), or both ``ttl_s``
            and ``group_ttl``.
    """
    specs: list[TierSpec] = []
    for name, gib in (("dram", dram_gib), ("disk", disk_gib)):
        if isinstance(gib, bool) or not isinstance(gib, int | float) or not gib >= 0:
            raise ValueError(f"'{name}_gib' must be a number >= 0: {gib!r}")
        if gib > 0:
            specs.append(get_tier(name).with_capacity(int(gib * _GIB)))
    if not specs:
        raise ValueError("give 'dram_gib' or 'disk_gib' > 0")
    policy: TTLPolicy | None = None
    if group_ttl is not None:
        if ttl_s is not None:
            raise ValueError("give 'ttl_s' or 'group_ttl', not both")
        # The group TTLs govern the slowest tier (disk, as in seed 003 §5.3.2; DRAM when it
        # is the only one); the faster tier above it keeps LRU without expiry.
        policy = _group_policy(group_ttl, context, specs[-1].name)
    elif isinstance(ttl_s, Mapping):
        policy = FixedTTL({str(k): float(v) for k, v in ttl_s.items()})
    elif ttl_s is not None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
            raise TypeError(f"'ttl_s' must be seconds or a mapping: {ttl_s!r}")
        policy = FixedTTL({s.name: float(ttl_s) for s in specs})
    block_bytes = context.block_size * context.model.kv_bytes_per_token()
    return TieredPrefixStore(specs, block_bytes=block_bytes, ttl=policy)
