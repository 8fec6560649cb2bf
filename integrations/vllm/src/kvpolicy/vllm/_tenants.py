"""Tenants of vLLM requests: who they are, their priority and their concurrency quota."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpolicy.tenancy import priority_weight
from kvpolicy.vllm._config import TenancyConfig
from kvpolicy.vllm._errors import UnknownTenantError

__all__ = ["TenantBook"]


class TenantBook:
    """Resolves a request's tenant and gives its priority rank and concurrency quota.

    The priority is tenancy's eq. (1) of seed 004 with no burst and no debt (a scheduler
    sees no per-tenant rates): ``w = w_class / (1 + a_slo * slo / mean_slo)``. Its *rank*
    among the pool's entitlements is the priority (larger is more important, kvmodel's
    convention); vLLM's priority is the opposite (smaller runs first), see
    :meth:`vllm_priority`.

    Args:
        config: the tenancy section of the kvpolicy config.
    """

    __slots__ = ("_config", "_limits", "_rank")

    def __init__(self, config: TenancyConfig) -> None:
        if not isinstance(config, TenancyConfig):
            raise TypeError(f"'config' must be a TenancyConfig: {config!r}")
        self._config = config
        pool = config.pool
        weights = {
            e.tenant: priority_weight(e.service_class.weight, e.slo_target_s, pool.mean_slo_s)
            for e in pool.entitlements
        }
        levels = sorted(set(weights.values()))
        self._rank = {t: levels.index(w) for t, w in weights.items()}
        self._limits = {e.tenant: e.limits.concurrency for e in pool.entitlements}

    @property
    def config(self) -> TenancyConfig:
        """The tenancy config."""
        return self._config

    def tenant_of(
        self, extra_args: Mapping[str, Any] | None, headers: Mapping[str, str] | None = None
    ) -> str:
        """The entitled tenant of a request from its extra args (or forwarded headers).

        Raises:
            UnknownTenantError: the request names a tenant with no entitlement, or none
                while ``default_tenant`` is unset.
        """
        key = self._config.tenant_key
        tenant: object = None
        if extra_args:
            tenant = extra_args.get(key)
        if tenant is None and headers:
            header = f"x-{key}".lower()
            tenant = next((v for k, v in headers.items() if k.lower() == header), None)
        if tenant is None:
            tenant = self._config.default_tenant
            if tenant is None:
                raise UnknownTenantError(
                    f"request names no tenant ('{key}' in extra_args) and the kvpolicy config "
                    "sets no 'tenancy.default_tenant'"
                )
        if not isinstance(tenant, str) or tenant not in self._rank:
            known = ", ".join(sorted(self._rank)) or "none"
            raise UnknownTenantError(
                f"tenant {tenant!r} has no entitlement in pool {self._config.pool.name!r} "
                f"(entitled: {known})"
            )
        return tenant

    def priority(self, tenant: str) -> int:
        """Priority rank of ``tenant`` (larger is more important)."""
        return self._rank[tenant]

    def vllm_priority(self, tenant: str) -> int:
        """vLLM's priority of ``tenant`` (smaller runs first, preempted last)."""
        return -self._rank[tenant]

    def limit(self, tenant: str) -> int:
        """Most running requests of ``tenant`` (its entitlement's concurrency limit)."""
        return self._limits[tenant]
