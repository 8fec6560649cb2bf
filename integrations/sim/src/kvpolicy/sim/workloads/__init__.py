"""Workloads of the kvpolicy simulator: trace loaders and calibrated synthetic generators.

A :class:`Workload` is a sorted tuple of :class:`kvpolicy.kvmodel.Request` objects with its
provenance (``source``, ``skipped_rows``, ``clamped_rows``, ``notes``, ``tenant_specs``).
Get one by name, from a trace file, or from a config::

    from kvpolicy.sim.workloads import get_workload, load_trace, describe

    w = get_workload("multi-tenant", seed=0)          # the embedded default, 2,000 requests
    t = load_trace("../shared/traces/azure-llm-2023-conv/AzureLLMInferenceTrace_conv.csv")
    hot = t.with_rate(20.0)                           # the same trace replayed at 20 req/s
    describe(w)["tenants"]["chat"]["share"]           # JSON-ready summary for reports

:func:`load_trace` reads the Azure LLM CSV, Mooncake JSONL (prefix hashes expanded to the
simulator's block size), length-only CSVs (Poisson arrivals at a given rate) and ServeGen
per-client series (one tenant per client); a malformed row raises :class:`TraceFormatError`
naming the file and line, or is skipped and counted with ``skip_bad=True``.
:func:`generate` draws a :class:`SyntheticConfig`: tenants (:class:`TenantSpec`, seed 004
service classes) as independent :class:`GammaArrivals`/:class:`Poisson` processes, lengths
from a :class:`LengthDistribution`, optional :class:`PrefixSharing`. The presets
(:data:`WORKLOAD_NAMES`) are calibrated from the public traces; the constants and their
provenance are tabulated in :mod:`kvpolicy.sim.workloads._calibration`.
"""

from __future__ import annotations

from kvpolicy.sim.workloads._arrivals import ArrivalProcess, GammaArrivals, Poisson, Saturated
from kvpolicy.sim.workloads._errors import TraceFormatError, TraceWarning, WorkloadError
from kvpolicy.sim.workloads._lengthdist import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    LogNormalLengths,
    PMFLengths,
    QuantileLengths,
)
from kvpolicy.sim.workloads._load import TRACE_FORMATS, detect_format, load_trace
from kvpolicy.sim.workloads._mooncake import expand_block_hashes
from kvpolicy.sim.workloads._prefix import PrefixSharing
from kvpolicy.sim.workloads._presets import WORKLOAD_NAMES, get_workload, workload_config
from kvpolicy.sim.workloads._servegen import ServeGenClient, servegen_client_stats
from kvpolicy.sim.workloads._synthetic import SyntheticConfig, generate
from kvpolicy.sim.workloads._tenants import SERVICE_CLASSES, TenantSpec
from kvpolicy.sim.workloads._workload import Workload, describe

__all__ = [
    "SERVICE_CLASSES",
    "TRACE_FORMATS",
    "WORKLOAD_NAMES",
    "ArrivalProcess",
    "EmpiricalLengths",
    "FixedLengths",
    "GammaArrivals",
    "LengthDistribution",
    "LogNormalLengths",
    "PMFLengths",
    "Poisson",
    "PrefixSharing",
    "QuantileLengths",
    "Saturated",
    "ServeGenClient",
    "SyntheticConfig",
    "TenantSpec",
    "TraceFormatError",
    "TraceWarning",
    "Workload",
    "WorkloadError",
    "describe",
    "detect_format",
    "expand_block_hashes",
    "generate",
    "get_workload",
    "load_trace",
    "servegen_client_stats",
    "workload_config",
]
