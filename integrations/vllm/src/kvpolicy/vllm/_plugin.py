"""Registration with vLLM through the ``vllm.general_plugins`` entry point."""

from __future__ import annotations

import logging

from kvpolicy.vllm._errors import UnsupportedVLLMError
from kvpolicy.vllm._version import check_vllm_version

__all__ = ["CACHE_POLICY_NAME", "register"]

CACHE_POLICY_NAME = "kvpolicy-group-ttl"
"""Name of :class:`~kvpolicy.vllm.GroupTTLCachePolicy` in vLLM's cache-policy registry."""

_log = logging.getLogger("kvpolicy.vllm")


def register() -> None:
    """Make kvpolicy's vLLM components known to vLLM (called by vLLM in each process).

    Registers the offloading cache policy under :data:`CACHE_POLICY_NAME`, so that
    ``kv_connector_extra_config={"cache_policy": "kvpolicy-group-ttl"}`` selects it
    without a module path. The scheduler needs no registration
    (``--scheduler-cls kvpolicy.vllm.KVPolicyScheduler``). Idempotent.
    """
    try:
        check_vllm_version()
    except UnsupportedVLLMError as exc:
        # Startup of the kvpolicy components themselves raises; a plugin load only warns.
        _log.warning("kvpolicy-vllm: %s", exc)
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    if CACHE_POLICY_NAME not in CachePolicyFactory._registry:
        CachePolicyFactory.register_cache_policy(
            CACHE_POLICY_NAME, "kvpolicy.vllm._offload", "GroupTTLCachePolicy"
        )
