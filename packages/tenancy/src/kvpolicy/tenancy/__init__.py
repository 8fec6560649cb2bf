"""kvpolicy-tenancy: token pools (seed 004) as a library.

Entitlements in tokens/s, KV bytes and concurrency; five service classes; the priority
formula with SLO, burst and debt terms; the ordered admission checks of a gateway with a
Retry-After from the capacity model; state stores.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from kvpolicy.tenancy.__about__ import __version__
from kvpolicy.tenancy._errors import ManifestError, TenancyError, UnknownRequestError

if _TYPE_CHECKING:
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
    from kvpolicy.tenancy._crd import (
        crd_documents,
        custom_resources,
        manifest_schema,
    )
    from kvpolicy.tenancy._entitlements import (
        Resources,
        TokenEntitlement,
        TokenPool,
    )
    from kvpolicy.tenancy._experiments import replay_experiment
    from kvpolicy.tenancy._gate import (
        GateConfig,
        TokenPoolGate,
        admission_decision,
    )
    from kvpolicy.tenancy._health import HealthConfig
    from kvpolicy.tenancy._kv_events import (
        KVEvent,
        KVEventError,
        KVEventFollower,
        decode_event_batch,
        encode_event_batch,
    )
    from kvpolicy.tenancy._lease import (
        LeaseRelease,
        OutagePolicy,
        RedisLeaseGate,
    )
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
    from kvpolicy.tenancy._measured import MeasuredReplica
    from kvpolicy.tenancy._prefix_index import (
        PrefixIndex,
        prompt_text,
        text_block_hashes,
    )
    from kvpolicy.tenancy._refresh import (
        RefreshConfig,
        SharedThroughputRefresh,
        ThroughputRefresh,
        refresh_factor,
    )
    from kvpolicy.tenancy._shares import token_pool_gateway
    from kvpolicy.tenancy._signals import (
        MetricsError,
        parse_vllm_metrics,
    )
    from kvpolicy.tenancy._store import (
        EntitlementState,
        Holding,
        InMemoryStateStore,
        PoolState,
        StateStore,
    )

_LAZY: dict[str, str] = {
    "TokenPoolAutoscaler": "_autoscale",
    "MeasuredReplica": "_measured",
    "BackendSpec": "_backends",
    "FleetSettings": "_backends",
    "RoutingConfig": "_backends",
    "fleet_settings": "_backends",
    "load_backends": "_backends",
    "load_routing": "_backends",
    "DEDICATED": "_classes",
    "ELASTIC": "_classes",
    "GUARANTEED": "_classes",
    "PREEMPTIBLE": "_classes",
    "SERVICE_CLASSES": "_classes",
    "SPOT": "_classes",
    "ServiceClass": "_classes",
    "service_class": "_classes",
    "crd_documents": "_crd",
    "custom_resources": "_crd",
    "manifest_schema": "_crd",
    "Resources": "_entitlements",
    "TokenEntitlement": "_entitlements",
    "TokenPool": "_entitlements",
    "replay_experiment": "_experiments",
    "GateConfig": "_gate",
    "TokenPoolGate": "_gate",
    "admission_decision": "_gate",
    "HealthConfig": "_health",
    "KVEvent": "_kv_events",
    "KVEventError": "_kv_events",
    "KVEventFollower": "_kv_events",
    "decode_event_batch": "_kv_events",
    "encode_event_batch": "_kv_events",
    "LeaseRelease": "_lease",
    "OutagePolicy": "_lease",
    "RedisLeaseGate": "_lease",
    "dump_manifest": "_manifest",
    "load_gate": "_manifest",
    "load_lease_gate": "_manifest",
    "load_manifest": "_manifest",
    "load_yaml": "_manifest",
    "PriorityCoefficients": "_math",
    "burst_intensity": "_math",
    "ewma": "_math",
    "priority_weight": "_math",
    "retry_after": "_math",
    "service_gap": "_math",
    "update_debt": "_math",
    "PrefixIndex": "_prefix_index",
    "prompt_text": "_prefix_index",
    "text_block_hashes": "_prefix_index",
    "RefreshConfig": "_refresh",
    "SharedThroughputRefresh": "_refresh",
    "ThroughputRefresh": "_refresh",
    "refresh_factor": "_refresh",
    "token_pool_gateway": "_shares",
    "MetricsError": "_signals",
    "parse_vllm_metrics": "_signals",
    "EntitlementState": "_store",
    "Holding": "_store",
    "InMemoryStateStore": "_store",
    "PoolState": "_store",
    "StateStore": "_store",
}
"""Every public name but the errors and the version, by the module that defines it, imported
on first use (PEP 562): ``kvpolicy tenancy --help`` starts without the library, and
``from kvpolicy.tenancy import X`` imports X's module alone."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpolicy.tenancy' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"kvpolicy.tenancy.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
    "MeasuredReplica",
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
