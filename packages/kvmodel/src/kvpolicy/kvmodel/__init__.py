"""kvpolicy-kvmodel: the vocabulary of kvpolicy.

KV bytes per token from a model's architecture, capacity planning on a GPU, a paged block
pool with copy-on-write prefix sharing, naive-vs-paged utilisation, and the value types and
Protocols that the other kvpolicy packages implement or consume.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from kvpolicy.kvmodel.__about__ import __version__
from kvpolicy.kvmodel._errors import BlockPoolError, KVModelError, UnknownPresetError

if _TYPE_CHECKING:
    from kvpolicy.kvmodel._fleet import (
        FleetView,
        ReplicaView,
        ReplicaViews,
        RoutingRequest,
        reads_kv_usage,
        reads_load,
    )
    from kvpolicy.kvmodel._planning import (
        CapacityError,
        CapacityPlan,
        kv_budget_bytes,
        max_sequences,
        num_blocks,
        plan_capacity,
    )
    from kvpolicy.kvmodel._pool import (
        Allocation,
        BlockPool,
        PoolStats,
        chain_block_hashes,
        rechunk_hashes,
    )
    from kvpolicy.kvmodel._presets import (
        GPU_PRESETS,
        MODEL_PRESETS,
        get_gpu,
        get_model,
    )
    from kvpolicy.kvmodel._protocols import (
        AdmissionPolicy,
        Autoscaler,
        CompletionObserver,
        DemotingPolicy,
        EvictionPolicy,
        PreemptionPolicy,
        PrefixStore,
        PromptObserver,
        RequestGate,
        Router,
        Scheduled,
        ThroughputScalable,
        reads_prefix_blocks,
    )
    from kvpolicy.kvmodel._registry import (
        ADMISSION,
        AUTOSCALING,
        EVICTION,
        GATEWAY,
        GROUPS,
        PREEMPTION,
        ROUTING,
        TIERS,
        WORKLOAD_FORMATS,
        Group,
        ParamSpec,
        RegistryError,
        RegistryTypeError,
        ServerContext,
        build,
        describe,
        names,
    )
    from kvpolicy.kvmodel._residency import (
        AttentionSource,
        ResidencyError,
        ResidencyLedger,
    )
    from kvpolicy.kvmodel._specs import (
        KV_DTYPE_BYTES,
        KV_PRECISIONS,
        GPUSpec,
        ModelSpec,
        kv_dtype_bytes,
        quantized_token_bytes,
    )
    from kvpolicy.kvmodel._types import (
        GateDecision,
        MemoryBudget,
        Request,
        SchedulerState,
        SequenceView,
        TierFetch,
    )
    from kvpolicy.kvmodel._utilisation import (
        UtilisationPoint,
        naive_utilisation,
        paged_utilisation,
        seed001_lengths,
        utilisation_sweep,
    )

_LAZY: dict[str, str] = {
    "FleetView": "_fleet",
    "ReplicaView": "_fleet",
    "ReplicaViews": "_fleet",
    "RoutingRequest": "_fleet",
    "reads_kv_usage": "_fleet",
    "reads_load": "_fleet",
    "CapacityError": "_planning",
    "CapacityPlan": "_planning",
    "kv_budget_bytes": "_planning",
    "max_sequences": "_planning",
    "num_blocks": "_planning",
    "plan_capacity": "_planning",
    "Allocation": "_pool",
    "BlockPool": "_pool",
    "PoolStats": "_pool",
    "chain_block_hashes": "_pool",
    "rechunk_hashes": "_pool",
    "GPU_PRESETS": "_presets",
    "MODEL_PRESETS": "_presets",
    "get_gpu": "_presets",
    "get_model": "_presets",
    "AdmissionPolicy": "_protocols",
    "Autoscaler": "_protocols",
    "CompletionObserver": "_protocols",
    "DemotingPolicy": "_protocols",
    "EvictionPolicy": "_protocols",
    "PreemptionPolicy": "_protocols",
    "PrefixStore": "_protocols",
    "PromptObserver": "_protocols",
    "RequestGate": "_protocols",
    "Router": "_protocols",
    "Scheduled": "_protocols",
    "ThroughputScalable": "_protocols",
    "reads_prefix_blocks": "_protocols",
    "ADMISSION": "_registry",
    "AUTOSCALING": "_registry",
    "EVICTION": "_registry",
    "GATEWAY": "_registry",
    "GROUPS": "_registry",
    "PREEMPTION": "_registry",
    "ROUTING": "_registry",
    "TIERS": "_registry",
    "WORKLOAD_FORMATS": "_registry",
    "Group": "_registry",
    "ParamSpec": "_registry",
    "RegistryError": "_registry",
    "RegistryTypeError": "_registry",
    "ServerContext": "_registry",
    "build": "_registry",
    "describe": "_registry",
    "names": "_registry",
    "KV_DTYPE_BYTES": "_specs",
    "KV_PRECISIONS": "_specs",
    "GPUSpec": "_specs",
    "ModelSpec": "_specs",
    "kv_dtype_bytes": "_specs",
    "quantized_token_bytes": "_specs",
    "GateDecision": "_types",
    "MemoryBudget": "_types",
    "Request": "_types",
    "SchedulerState": "_types",
    "SequenceView": "_types",
    "TierFetch": "_types",
    "AttentionSource": "_residency",
    "ResidencyError": "_residency",
    "ResidencyLedger": "_residency",
    "UtilisationPoint": "_utilisation",
    "naive_utilisation": "_utilisation",
    "paged_utilisation": "_utilisation",
    "seed001_lengths": "_utilisation",
    "utilisation_sweep": "_utilisation",
}
"""Every public name but the errors and the version, by the module that defines it, imported
on first use (PEP 562): ``import kvpolicy.kvmodel`` imports neither attrs nor numpy, so each
``kvpolicy`` command's ``--help`` starts without them; ``from kvpolicy.kvmodel import X``
imports X's module alone."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpolicy.kvmodel' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"kvpolicy.kvmodel.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ADMISSION",
    "AUTOSCALING",
    "EVICTION",
    "GATEWAY",
    "GPU_PRESETS",
    "GROUPS",
    "KV_DTYPE_BYTES",
    "KV_PRECISIONS",
    "MODEL_PRESETS",
    "PREEMPTION",
    "ROUTING",
    "TIERS",
    "WORKLOAD_FORMATS",
    "AdmissionPolicy",
    "Allocation",
    "AttentionSource",
    "Autoscaler",
    "BlockPool",
    "BlockPoolError",
    "CapacityError",
    "CapacityPlan",
    "CompletionObserver",
    "DemotingPolicy",
    "EvictionPolicy",
    "FleetView",
    "GPUSpec",
    "GateDecision",
    "Group",
    "KVModelError",
    "MemoryBudget",
    "ModelSpec",
    "ParamSpec",
    "PoolStats",
    "PreemptionPolicy",
    "PrefixStore",
    "PromptObserver",
    "RegistryError",
    "RegistryTypeError",
    "ReplicaView",
    "ReplicaViews",
    "Request",
    "RequestGate",
    "ResidencyError",
    "ResidencyLedger",
    "Router",
    "RoutingRequest",
    "Scheduled",
    "SchedulerState",
    "SequenceView",
    "ServerContext",
    "ThroughputScalable",
    "TierFetch",
    "UnknownPresetError",
    "UtilisationPoint",
    "__version__",
    "build",
    "chain_block_hashes",
    "describe",
    "get_gpu",
    "get_model",
    "kv_budget_bytes",
    "kv_dtype_bytes",
    "max_sequences",
    "naive_utilisation",
    "names",
    "num_blocks",
    "paged_utilisation",
    "plan_capacity",
    "quantized_token_bytes",
    "reads_kv_usage",
    "reads_load",
    "reads_prefix_blocks",
    "rechunk_hashes",
    "seed001_lengths",
    "utilisation_sweep",
]
