"""kvpolicy-tenancy: token pools (seed 004) as a library.

Entitlements in tokens/s, KV bytes and concurrency; five service classes; the priority
formula with SLO, burst and debt terms; the ordered admission checks of a gateway with a
Retry-After from the capacity model; state stores.
"""

from __future__ import annotations

from kvpolicy.tenancy.__about__ import __version__
from kvpolicy.tenancy._autoscale import TokenPoolAutoscaler
from kvpolicy.tenancy._backends import (
    BackendSpec,
    FleetSettings,
    RoutingConfig,
    fleet_settings,
    load_backends,
    load_routing,
)
from kvpolicy.tenancy._classes import (
    DEDICATED,
    ELASTIC,
    GUARANTEED,
    PREEMPTIBLE,
    SERVICE_CLASSES,
    SPOT,
    ServiceClass,
    service_class,
)
from kvpolicy.tenancy._crd import crd_documents, custom_resources, manifest_schema
from kvpolicy.tenancy._entitlements import Resources, TokenEntitlement, TokenPool
from kvpolicy.tenancy._errors import ManifestError, TenancyError, UnknownRequestError
from kvpolicy.tenancy._experiments import replay_experiment
from kvpolicy.tenancy._gate import GateConfig, TokenPoolGate, admission_decision
from kvpolicy.tenancy._health import HealthConfig
from kvpolicy.tenancy._kv_events import (
    KVEvent,
    KVEventError,
    KVEventFollower,
    decode_event_batch,
    encode_event_batch,
)
from kvpolicy.tenancy._lease import LeaseRelease, OutagePolicy, RedisLeaseGate
from kvpolicy.tenancy._manifest import (
    dump_manifest,
    load_gate,
    load_lease_gate,
    load_manifest,
    load_yaml,
)
from kvpolicy.tenancy._math import (
    PriorityCoefficients,
    burst_intensity,
    ewma,
    priority_weight,
    retry_after,
    service_gap,
    update_debt,
)
from kvpolicy.tenancy._prefix_index import PrefixIndex, prompt_text, text_block_hashes
from kvpolicy.tenancy._refresh import (
    RefreshConfig,
    SharedThroughputRefresh,
    ThroughputRefresh,
    refresh_factor,
)
from kvpolicy.tenancy._shares import token_pool_gateway
from kvpolicy.tenancy._signals import MetricsError, parse_vllm_metrics
from kvpolicy.tenancy._store import (
    EntitlementState,
    Holding,
    InMemoryStateStore,
    PoolState,
    StateStore,
)

__all__ = [
    "DEDICATED",
    "ELASTIC",
    "GUARANTEED",
    "PREEMPTIBLE",
    "SERVICE_CLASSES",
    "SPOT",
    "BackendSpec",
    "EntitlementState",
    "FleetSettings",
    "GateConfig",
    "HealthConfig",
    "Holding",
    "InMemoryStateStore",
    "KVEvent",
    "KVEventError",
    "KVEventFollower",
    "LeaseRelease",
    "ManifestError",
    "MetricsError",
    "OutagePolicy",
    "PoolState",
    "PrefixIndex",
    "PriorityCoefficients",
    "RedisLeaseGate",
    "RefreshConfig",
    "Resources",
    "RoutingConfig",
    "ServiceClass",
    "SharedThroughputRefresh",
    "StateStore",
    "TenancyError",
    "ThroughputRefresh",
    "TokenEntitlement",
    "TokenPool",
    "TokenPoolAutoscaler",
    "TokenPoolGate",
    "UnknownRequestError",
    "__version__",
    "admission_decision",
    "burst_intensity",
    "crd_documents",
    "custom_resources",
    "decode_event_batch",
    "dump_manifest",
    "encode_event_batch",
    "ewma",
    "fleet_settings",
    "load_backends",
    "load_gate",
    "load_lease_gate",
    "load_manifest",
    "load_routing",
    "load_yaml",
    "manifest_schema",
    "parse_vllm_metrics",
    "priority_weight",
    "prompt_text",
    "refresh_factor",
    "replay_experiment",
    "retry_after",
    "service_class",
    "service_gap",
    "text_block_hashes",
    "token_pool_gateway",
    "update_debt",
]
