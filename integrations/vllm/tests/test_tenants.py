"""Tenants of requests: resolution, priority ranks and quotas from tenancy's pool."""

from __future__ import annotations

from typing import Any

import pytest

from kvpolicy.vllm import TenantBook, UnknownTenantError, load_config


def _book(manifest: dict[str, Any], **tenancy: Any) -> TenantBook:
    cfg = load_config({"tenancy": {"manifest": manifest, **tenancy}})
    assert cfg.tenancy is not None
    return TenantBook(cfg.tenancy)


class TestTenantBook:
    def test_tenant_from_extra_args_and_header(self, manifest: dict[str, Any]) -> None:
        """The tenant comes from extra_args, else from an x-tenant header."""
        book = _book(manifest)
        assert book.tenant_of({"tenant": "gold"}) == "gold"
        assert book.tenant_of(None, {"X-Tenant": "free"}) == "free"

    def test_unknown_tenant_is_named(self, manifest: dict[str, Any]) -> None:
        """A tenant with no entitlement is an error naming it and the entitled ones."""
        with pytest.raises(UnknownTenantError, match=r"'mallory'.*entitled: free, gold"):
            _book(manifest).tenant_of({"tenant": "mallory"})

    def test_missing_tenant_uses_default(self, manifest: dict[str, Any]) -> None:
        """With a default tenant an untagged request is that tenant; without, an error."""
        assert _book(manifest, default_tenant="free").tenant_of({}) == "free"
        with pytest.raises(UnknownTenantError, match="names no tenant"):
            _book(manifest).tenant_of({})

    def test_priority_follows_class_and_slo(self, manifest: dict[str, Any]) -> None:
        """Guaranteed with a tight SLO ranks above spot; vLLM's number is the opposite."""
        book = _book(manifest)
        assert book.priority("gold") > book.priority("free")
        assert book.vllm_priority("gold") < book.vllm_priority("free")

    def test_limits_are_entitled_concurrency(self, manifest: dict[str, Any]) -> None:
        """A tenant's quota is its entitlement's concurrency limit."""
        book = _book(manifest)
        assert (book.limit("gold"), book.limit("free")) == (2, 8)
