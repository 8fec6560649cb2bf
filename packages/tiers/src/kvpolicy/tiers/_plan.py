"""Algorithm 1 with the paper-scale axes, and its comparison with the full grid (Fig. 13)."""

from __future__ import annotations

from attrs import frozen

from kvpolicy.tiers._pareto import (
    Evaluate,
    ParetoSearchResult,
    SearchAxis,
    adaptive_pareto_search,
    grid_search,
)

__all__ = ["TierPlan", "plan_tiers"]


@frozen
class TierPlan:
    """The adaptive search, and the grid with the hypervolume ratio when it was run."""

    adaptive: ParetoSearchResult
    """Algorithm 1's evaluations and front."""
    grid: ParetoSearchResult | None
    """The full grid (``None`` unless asked for)."""
    hypervolume_ratio: float | None
    """Hypervolume of the adaptive front over the grid's, against one reference point
    (10 % beyond the worst latency and cost seen, throughput 0)."""


def plan_tiers(evaluate: Evaluate, *, grid: bool = False) -> TierPlan:
    """Search DRAM GiB (0-2048) x disk GiB (0-2400) with Algorithm 1 (thresholds 0.02,
    0.02, 0.01) and, with ``grid``, the 256 x 300 GiB grid it approximates."""
    adaptive = adaptive_pareto_search(
        evaluate,
        [
            SearchAxis.of("dram_gib", 0, 1024, 512, min_step=256, limit=2048),
            SearchAxis.of("disk_gib", 0, 1600, 600, min_step=300, limit=2400),
        ],
        expand_threshold=0.02,
        perf_threshold=0.02,
        cost_threshold=0.01,
    )
    if not grid:
        return TierPlan(adaptive, None, None)
    full = grid_search(
        evaluate, [SearchAxis.of("dram_gib", 0, 2048, 256), SearchAxis.of("disk_gib", 0, 2400, 300)]
    )
    every = [e.objectives.as_minimization() for e in (*full.evaluations, *adaptive.evaluations)]
    ref = [max(p[0] for p in every) * 1.1, 0.0, max(p[2] for p in every) * 1.1]
    truth = full.hypervolume(ref)
    ratio = adaptive.hypervolume(ref) / truth if truth > 0 else 1.0
    return TierPlan(adaptive, full, ratio)
