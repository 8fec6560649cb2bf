"""kvpolicy-sim: the reference serving simulator and the ``kvpolicy`` command.

An iteration-level continuous-batching engine (:class:`Engine`) over kvmodel's paged block
pool with prefix caching, a roofline time model (:class:`TimingModel`), a synthetic
attention-return model for token eviction (:class:`AttentionModel`), metrics
(:func:`summarize`), reports (:func:`write_report`) and sweeps (:func:`sweep`). Policies come
from the other kvpolicy packages through kvmodel's Protocols (:func:`build_stack`).
"""

from __future__ import annotations

from kvpolicy.sim.__about__ import __version__
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._attention_fit import attention_recall, attention_summary, fit_attention
from kvpolicy.sim._config import (
    AdmissionConfig,
    AttentionConfig,
    EngineConfig,
    EvictionConfig,
    FleetConfig,
    GatewayConfig,
    PolicyChoice,
    PreemptionConfig,
    ReplicaSpec,
    SLOConfig,
    StackConfig,
    TiersConfig,
    TimingConfig,
    load_stack,
    stack_from_dict,
)
from kvpolicy.sim._engine import Engine, RunRecord, Server
from kvpolicy.sim._errors import ConfigError, SimError
from kvpolicy.sim._fleet import (
    Fleet,
    FleetRecord,
    ReplicaRecord,
    provisioning_delay,
    summarize_fleet,
)
from kvpolicy.sim._metrics import (
    FleetSummary,
    ReplicaSummary,
    Summary,
    TenantSummary,
    summarize,
)
from kvpolicy.sim._presets import STACK_PRESETS, get_stack
from kvpolicy.sim._refresh import RefreshConfig, ThroughputRefresh, refresh_factor
from kvpolicy.sim._report import (
    comparison_table,
    plot_latency_cdf,
    plot_memory,
    plot_tenant_shares,
    results_json,
    write_report,
)
from kvpolicy.sim._simulate import (
    SimResult,
    check_config,
    fleet_parts,
    server_capacity,
    server_context,
    simulate,
)
from kvpolicy.sim._stack import Stack, build_stack, part_names
from kvpolicy.sim._story import describe_stack, run_warnings, what_happened
from kvpolicy.sim._sweep import (
    EXECUTORS,
    SweepPoint,
    apply_params,
    expand_grid,
    sweep,
    unchanged_parameters,
)
from kvpolicy.sim._timing import TimingModel, fit_error, fit_timing, read_timing_csv

__all__ = [
    "EXECUTORS",
    "STACK_PRESETS",
    "AdmissionConfig",
    "AttentionConfig",
    "AttentionModel",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "EvictionConfig",
    "Fleet",
    "FleetConfig",
    "FleetRecord",
    "FleetSummary",
    "GatewayConfig",
    "PolicyChoice",
    "PreemptionConfig",
    "RefreshConfig",
    "ReplicaRecord",
    "ReplicaSpec",
    "ReplicaSummary",
    "RunRecord",
    "SLOConfig",
    "Server",
    "SimError",
    "SimResult",
    "Stack",
    "StackConfig",
    "Summary",
    "SweepPoint",
    "TenantSummary",
    "ThroughputRefresh",
    "TiersConfig",
    "TimingConfig",
    "TimingModel",
    "__version__",
    "apply_params",
    "attention_recall",
    "attention_summary",
    "build_stack",
    "check_config",
    "comparison_table",
    "describe_stack",
    "expand_grid",
    "fit_attention",
    "fit_error",
    "fit_timing",
    "fleet_parts",
    "get_stack",
    "load_stack",
    "part_names",
    "plot_latency_cdf",
    "plot_memory",
    "plot_tenant_shares",
    "provisioning_delay",
    "read_timing_csv",
    "refresh_factor",
    "results_json",
    "run_warnings",
    "server_capacity",
    "server_context",
    "simulate",
    "stack_from_dict",
    "summarize",
    "summarize_fleet",
    "sweep",
    "unchanged_parameters",
    "what_happened",
    "write_report",
]
