"""kvpolicy-sim: the reference serving simulator and the ``kvpolicy`` command.

An iteration-level continuous-batching engine (:class:`Engine`) over kvmodel's paged block
pool with prefix caching, a roofline time model (:class:`TimingModel`), a synthetic
attention-return model for token eviction (:class:`AttentionModel`), metrics
(:func:`summarize`), reports (:func:`write_report`) and sweeps (:func:`sweep`). Policies come
from the other kvpolicy packages through kvmodel's Protocols (:func:`build_stack`).
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from kvpolicy.sim.__about__ import __version__

if _TYPE_CHECKING:
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
        autoscaler_sizing,
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
    from kvpolicy.tenancy import RefreshConfig, ThroughputRefresh, refresh_factor

# Imported on first use (PEP 562): `import kvpolicy.sim` (and so the `kvpolicy` command's
# start) costs nothing until a name is used; `from kvpolicy.sim import X` works as before.
_LAZY = {
    "AdmissionConfig": "kvpolicy.sim._config",
    "AttentionConfig": "kvpolicy.sim._config",
    "AttentionModel": "kvpolicy.sim._attention",
    "ConfigError": "kvpolicy.sim._errors",
    "EXECUTORS": "kvpolicy.sim._sweep",
    "Engine": "kvpolicy.sim._engine",
    "EngineConfig": "kvpolicy.sim._config",
    "EvictionConfig": "kvpolicy.sim._config",
    "Fleet": "kvpolicy.sim._fleet",
    "FleetConfig": "kvpolicy.sim._config",
    "FleetRecord": "kvpolicy.sim._fleet",
    "FleetSummary": "kvpolicy.sim._metrics",
    "GatewayConfig": "kvpolicy.sim._config",
    "PolicyChoice": "kvpolicy.sim._config",
    "PreemptionConfig": "kvpolicy.sim._config",
    "RefreshConfig": "kvpolicy.tenancy",
    "ReplicaRecord": "kvpolicy.sim._fleet",
    "ReplicaSpec": "kvpolicy.sim._config",
    "ReplicaSummary": "kvpolicy.sim._metrics",
    "RunRecord": "kvpolicy.sim._engine",
    "SLOConfig": "kvpolicy.sim._config",
    "STACK_PRESETS": "kvpolicy.sim._presets",
    "Server": "kvpolicy.sim._engine",
    "SimError": "kvpolicy.sim._errors",
    "SimResult": "kvpolicy.sim._simulate",
    "Stack": "kvpolicy.sim._stack",
    "StackConfig": "kvpolicy.sim._config",
    "Summary": "kvpolicy.sim._metrics",
    "SweepPoint": "kvpolicy.sim._sweep",
    "TenantSummary": "kvpolicy.sim._metrics",
    "ThroughputRefresh": "kvpolicy.tenancy",
    "TiersConfig": "kvpolicy.sim._config",
    "TimingConfig": "kvpolicy.sim._config",
    "TimingModel": "kvpolicy.sim._timing",
    "apply_params": "kvpolicy.sim._sweep",
    "attention_recall": "kvpolicy.sim._attention_fit",
    "attention_summary": "kvpolicy.sim._attention_fit",
    "autoscaler_sizing": "kvpolicy.sim._simulate",
    "build_stack": "kvpolicy.sim._stack",
    "check_config": "kvpolicy.sim._simulate",
    "comparison_table": "kvpolicy.sim._report",
    "describe_stack": "kvpolicy.sim._story",
    "expand_grid": "kvpolicy.sim._sweep",
    "fit_attention": "kvpolicy.sim._attention_fit",
    "fit_error": "kvpolicy.sim._timing",
    "fit_timing": "kvpolicy.sim._timing",
    "fleet_parts": "kvpolicy.sim._simulate",
    "get_stack": "kvpolicy.sim._presets",
    "load_stack": "kvpolicy.sim._config",
    "part_names": "kvpolicy.sim._stack",
    "plot_latency_cdf": "kvpolicy.sim._report",
    "plot_memory": "kvpolicy.sim._report",
    "plot_tenant_shares": "kvpolicy.sim._report",
    "provisioning_delay": "kvpolicy.sim._fleet",
    "read_timing_csv": "kvpolicy.sim._timing",
    "refresh_factor": "kvpolicy.tenancy",
    "results_json": "kvpolicy.sim._report",
    "run_warnings": "kvpolicy.sim._story",
    "server_capacity": "kvpolicy.sim._simulate",
    "server_context": "kvpolicy.sim._simulate",
    "simulate": "kvpolicy.sim._simulate",
    "stack_from_dict": "kvpolicy.sim._config",
    "summarize": "kvpolicy.sim._metrics",
    "summarize_fleet": "kvpolicy.sim._fleet",
    "sweep": "kvpolicy.sim._sweep",
    "unchanged_parameters": "kvpolicy.sim._sweep",
    "what_happened": "kvpolicy.sim._story",
    "write_report": "kvpolicy.sim._report",
}

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
    "autoscaler_sizing",
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


def __getattr__(name: str) -> object:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(_importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
