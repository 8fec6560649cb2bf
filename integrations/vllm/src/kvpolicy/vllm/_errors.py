"""Exceptions of kvpolicy-vllm."""

from __future__ import annotations

__all__ = ["ConfigError", "KVPolicyVLLMError", "UnknownTenantError", "UnsupportedVLLMError"]


class KVPolicyVLLMError(Exception):
    """Base class of every error kvpolicy-vllm raises on misuse."""


class ConfigError(KVPolicyVLLMError, ValueError):
    """A kvpolicy config for vLLM that cannot be used; the message names the field."""


class UnknownTenantError(ConfigError):
    """A request's tenant has no entitlement in the configured token pool."""


class UnsupportedVLLMError(KVPolicyVLLMError, RuntimeError):
    """The installed vLLM is not a version this package was tested against."""
