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
from kvpolicy.kvmodel._fleet import (
    FleetView,
    ReplicaView,
    ReplicaViews,
    RoutingRequest,
    reads_kv_usage,
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
from kvpolicy.kvmodel._presets import GPU_PRESETS, MODEL_PRESETS, get_gpu, get_model
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

if _TYPE_CHECKING:
    from kvpolicy.kvmodel._residency import AttentionSource, ResidencyError, ResidencyLedger
    from kvpolicy.kvmodel._utilisation import (
        UtilisationPoint,
        naive_utilisation,
        paged_utilisation,
        seed001_lengths,
        utilisation_sweep,
    )

_LAZY = {
    **dict.fromkeys(("AttentionSource", "ResidencyError", "ResidencyLedger"), "_residency"),
    **dict.fromkeys(
        (
            "UtilisationPoint",
            "naive_utilisation",
            "paged_utilisation",
            "seed001_lengths",
            "utilisation_sweep",
        ),
        "_utilisation",
    ),
}
"""Names whose modules need numpy, imported on first use: importing kvmodel (every
``kvpolicy`` command's ``--help``) does not import numpy."""


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
    "reads_prefix_blocks",
    "rechunk_hashes",
    "seed001_lengths",
    "utilisation_sweep",
]
