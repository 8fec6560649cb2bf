"""kvpolicy-tiers: KV-cache blocks below HBM, seed 003 (Kareto) as a library.

Tier specs (capacity, bandwidth, latency, price), a TTL-based DRAM/disk prefix store that
implements :class:`kvpolicy.kvmodel.PrefixStore`, prefix-tree reuse analysis, the cost
model of eq. (2), ROI-aware group TTL (Algorithm 2), the adaptive Pareto search over
DRAM/disk/TTL (Algorithm 1), a Pareto filter and hypervolume.
"""

from __future__ import annotations

from kvpolicy.tiers.__about__ import __version__
from kvpolicy.tiers._cost import recompute_seconds_saved, serving_cost, usage_cost
from kvpolicy.tiers._errors import TiersError, UnknownTierError
from kvpolicy.tiers._factory import tiered_store
from kvpolicy.tiers._pareto import (
    Evaluation,
    Objectives,
    ParetoSearchResult,
    SearchAxis,
    adaptive_pareto_search,
    grid_search,
    hypervolume,
    pareto_mask,
)
from kvpolicy.tiers._plan import TierPlan, plan_tiers
from kvpolicy.tiers._replay import ReplayEvaluator, ReplayResult, replay
from kvpolicy.tiers._reuse import (
    HashTrace,
    PrefixGroup,
    ReuseAnalysis,
    analyze_reuse,
    prefix_groups,
)
from kvpolicy.tiers._roi import (
    GroupTTLAllocation,
    allocate_group_ttls,
    group_cost,
    group_hits,
    roi_optimal_ttl,
    uniform_ttl_for_budget,
)
from kvpolicy.tiers._spec import GIB, TIER_PRESETS, TierSpec, get_tier, provisioned_bandwidth
from kvpolicy.tiers._store import StoreStats, TieredPrefixStore, TierStats
from kvpolicy.tiers._tree import ROOT, export_graphml, prefix_tree, subtree_reuse, tree_groups
from kvpolicy.tiers._ttl import FixedTTL, GroupTTL, TTLPolicy, group_key

__all__ = [
    "GIB",
    "ROOT",
    "TIER_PRESETS",
    "Evaluation",
    "FixedTTL",
    "GroupTTL",
    "GroupTTLAllocation",
    "HashTrace",
    "Objectives",
    "ParetoSearchResult",
    "PrefixGroup",
    "ReplayEvaluator",
    "ReplayResult",
    "ReuseAnalysis",
    "SearchAxis",
    "StoreStats",
    "TTLPolicy",
    "TierPlan",
    "TierSpec",
    "TierStats",
    "TieredPrefixStore",
    "TiersError",
    "UnknownTierError",
    "__version__",
    "adaptive_pareto_search",
    "allocate_group_ttls",
    "analyze_reuse",
    "export_graphml",
    "get_tier",
    "grid_search",
    "group_cost",
    "group_hits",
    "group_key",
    "hypervolume",
    "pareto_mask",
    "plan_tiers",
    "prefix_groups",
    "prefix_tree",
    "provisioned_bandwidth",
    "recompute_seconds_saved",
    "replay",
    "roi_optimal_ttl",
    "serving_cost",
    "subtree_reuse",
    "tiered_store",
    "tree_groups",
    "uniform_ttl_for_budget",
    "usage_cost",
]
