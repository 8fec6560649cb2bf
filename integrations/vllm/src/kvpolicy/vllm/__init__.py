"""kvpolicy-vllm: kvpolicy inside a real vLLM through its public extension points.

The config object and the tenant book import without vLLM; the vLLM-facing classes
(:class:`KVPolicyScheduler`, :class:`GroupTTLCachePolicy`, the harness) load vLLM when
first used, so ``import kvpolicy.vllm`` works where vLLM is not installed.
"""

from __future__ import annotations

from typing import Any

from kvpolicy.vllm.__about__ import __version__
from kvpolicy.vllm._config import (
    ENV_VAR,
    BlockEvictionConfig,
    KVPolicyConfig,
    OffloadConfig,
    PolicyChoice,
    TenancyConfig,
    config_from_vllm,
    load_config,
)
from kvpolicy.vllm._drift import REQUIRED_VLLM_SYMBOLS, vllm_drift
from kvpolicy.vllm._errors import (
    ConfigError,
    KVPolicyVLLMError,
    UnknownTenantError,
    UnsupportedVLLMError,
)
from kvpolicy.vllm._events import KVEventsConsumer, block_key
from kvpolicy.vllm._plugin import CACHE_POLICY_NAME, register
from kvpolicy.vllm._tenants import TenantBook
from kvpolicy.vllm._version import TESTED_VLLM_VERSIONS, check_vllm_version

# Names whose modules import vLLM: resolved on first access (PEP 562).
_LAZY = {
    "BlockEvictionScheduler": "kvpolicy.vllm._blocks",
    "BlockValues": "kvpolicy.vllm._blocks",
    "GroupTTLCachePolicy": "kvpolicy.vllm._offload",
    "KVPolicyScheduler": "kvpolicy.vllm._scheduler",
    "ReturnSignalProcessor": "kvpolicy.vllm._logits",
    "RunStats": "kvpolicy.vllm._harness",
    "WorkloadRequest": "kvpolicy.vllm._harness",
    "make_scheduler": "kvpolicy.vllm._harness",
    "run_workload": "kvpolicy.vllm._harness",
    "tiny_model_dir": "kvpolicy.vllm._harness",
}

__all__ = [
    "CACHE_POLICY_NAME",
    "ENV_VAR",
    "REQUIRED_VLLM_SYMBOLS",
    "TESTED_VLLM_VERSIONS",
    "BlockEvictionConfig",
    "BlockEvictionScheduler",
    "BlockValues",
    "ConfigError",
    "GroupTTLCachePolicy",
    "KVEventsConsumer",
    "KVPolicyConfig",
    "KVPolicyScheduler",
    "KVPolicyVLLMError",
    "OffloadConfig",
    "PolicyChoice",
    "ReturnSignalProcessor",
    "RunStats",
    "TenancyConfig",
    "TenantBook",
    "UnknownTenantError",
    "UnsupportedVLLMError",
    "WorkloadRequest",
    "__version__",
    "block_key",
    "check_vllm_version",
    "config_from_vllm",
    "load_config",
    "make_scheduler",
    "register",
    "run_workload",
    "tiny_model_dir",
    "vllm_drift",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvpolicy.vllm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
