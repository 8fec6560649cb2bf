"""kvpolicy-admit: admission control from the stability math of continuous batching.

Seed 002 as a library: the discrete-time model of a memory-constrained server (execute,
arrive, evict, admit) in fluid and integer form; the eviction-free rate ``x*``, the worst
cycle, limit cycles; the characteristic polynomial, its spectral radius, the GCD test and
the finite-input threshold; greedy and rate-limited admission policies for a real server
loop; request mixing across GPUs; an eviction early-warning monitor; and a fleet's routers
and autoscalers.
"""

from __future__ import annotations

from kvpolicy.admit.__about__ import __version__
from kvpolicy.admit._analysis import (
    eviction_free_rate,
    eviction_level,
    fixed_point,
    lifetime_footprints,
    linearised_admissions,
    spread,
    stage_weights,
    transition_matrix,
    worst_cycle_ratio,
    worst_cycle_throughput,
)
from kvpolicy.admit._autoscaling import (
    PlannerAutoscaler,
    StaticAutoscaler,
    ThresholdAutoscaler,
    replica_token_rate,
)
from kvpolicy.admit._cycles import LimitCycle, detect_limit_cycle
from kvpolicy.admit._errors import AdmitError, RootFindingError
from kvpolicy.admit._mixing import MixVerdict, RoutingPlan, mix_verdict, plan_routing
from kvpolicy.admit._model import (
    ModelResult,
    PoissonArrivals,
    SaturatedArrivals,
    TraceArrivals,
    simulate_model,
)
from kvpolicy.admit._monitor import AlertKind, EvictionAlert, EvictionMonitor
from kvpolicy.admit._policies import (
    GreedyAdmission,
    RateEstimate,
    RateLimitedAdmission,
    RequestClass,
)
from kvpolicy.admit._routing import (
    DEFAULT_TIER_WEIGHTS,
    ChoiceScorer,
    KVScorer,
    LeastKVRouter,
    LeastRequestsRouter,
    MixingRouter,
    PowerOfTwoRouter,
    PrefixAwareRouter,
    PrefixScorer,
    QueueScorer,
    RandomRouter,
    ReplicaScorer,
    RequestsScorer,
    RoundRobinRouter,
    WeightedRouter,
    eligible_replicas,
    prefix_match,
)
from kvpolicy.admit._spectral import (
    StabilityReport,
    analyze_stability,
    asymptotic_min_input_len,
    characteristic_polynomial,
    count_roots_outside,
    decode_gcd,
    limiting_polynomial,
    min_stable_input_len,
    polynomial_roots,
    spectral_radius,
)
from kvpolicy.admit._workload import StabilityWorkload

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "AdmitError",
    "AlertKind",
    "ChoiceScorer",
    "EvictionAlert",
    "EvictionMonitor",
    "GreedyAdmission",
    "KVScorer",
    "LeastKVRouter",
    "LeastRequestsRouter",
    "LimitCycle",
    "MixVerdict",
    "MixingRouter",
    "ModelResult",
    "PlannerAutoscaler",
    "PoissonArrivals",
    "PowerOfTwoRouter",
    "PrefixAwareRouter",
    "PrefixScorer",
    "QueueScorer",
    "RandomRouter",
    "RateEstimate",
    "RateLimitedAdmission",
    "ReplicaScorer",
    "RequestClass",
    "RequestsScorer",
    "RootFindingError",
    "RoundRobinRouter",
    "RoutingPlan",
    "SaturatedArrivals",
    "StabilityReport",
    "StabilityWorkload",
    "StaticAutoscaler",
    "ThresholdAutoscaler",
    "TraceArrivals",
    "WeightedRouter",
    "__version__",
    "analyze_stability",
    "asymptotic_min_input_len",
    "characteristic_polynomial",
    "count_roots_outside",
    "decode_gcd",
    "detect_limit_cycle",
    "eligible_replicas",
    "eviction_free_rate",
    "eviction_level",
    "fixed_point",
    "lifetime_footprints",
    "limiting_polynomial",
    "linearised_admissions",
    "min_stable_input_len",
    "mix_verdict",
    "plan_routing",
    "polynomial_roots",
    "prefix_match",
    "replica_token_rate",
    "simulate_model",
    "spectral_radius",
    "spread",
    "stage_weights",
    "transition_matrix",
    "worst_cycle_ratio",
    "worst_cycle_throughput",
]
