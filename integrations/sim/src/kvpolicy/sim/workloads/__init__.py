"""Workloads of the kvpolicy simulator: trace loaders and calibrated synthetic generators.

A :class:`Workload` is a sorted tuple of :class:`kvpolicy.kvmodel.Request` objects with its
provenance. Get one by name (:func:`get_workload`, the embedded default being
``"multi-tenant"``), from a public trace file (:func:`load_trace`: Azure CSV, Mooncake JSONL,
length-only CSV, ServeGen per-client series) or from a :class:`SyntheticConfig`
(:func:`generate`). :func:`describe` summarises any of them for reports.
"""

from __future__ import annotations

from kvpolicy.sim.workloads._arrivals import ArrivalProcess, GammaArrivals, Poisson, Saturated
from kvpolicy.sim.workloads._errors import TraceFormatError, WorkloadError
from kvpolicy.sim.workloads._lengthdist import (
    EmpiricalLengths,
    FixedLengths,
    LengthDistribution,
    LogNormalLengths,
    PMFLengths,
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
    "Saturated",
    "ServeGenClient",
    "SyntheticConfig",
    "TenantSpec",
    "TraceFormatError",
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
