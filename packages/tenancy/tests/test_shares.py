"""The token-pool gateway built from shares of one server (the ``token-pool`` entry point)."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import GATEWAY, Request, ServerContext, build, get_model
from kvpolicy.tenancy import TokenPoolGate, token_pool_gateway


def _context(*tenants: str) -> ServerContext:
    return ServerContext(
        model=get_model("Llama-3-8B"),
        block_size=16,
        kv_capacity_tokens=100_000,
        max_batch=100,
        tokens_per_s=10_000.0,
        requests=tuple(Request(f"r{i}", 10, 10, tenant=t) for i, t in enumerate(tenants)),
    )


def _shares(gate: TokenPoolGate) -> dict[str, float]:
    pool = gate.pool
    return {
        e.tenant: e.baseline.tokens_per_s / pool.capacity.tokens_per_s for e in pool.entitlements
    }


class TestSplit:
    def test_untagged_workload_owns_the_whole_pool(self) -> None:
        """With no tenant tags, the one tenant ('default') gets the whole capacity."""
        gate = token_pool_gateway(tenants={}, default="split", context=_context("default"))
        assert _shares(gate) == {"default": 1.0}

    def test_unnamed_tenants_share_the_rest_equally(self) -> None:
        """Tenants with no entitlement split what the named ones present don't reserve; the
        shares never sum above the capacity."""
        named = {"gold": {"service_class": "guaranteed", "share": 0.4}}
        ctx = _context("gold", *(f"c{i}" for i in range(6)))
        shares = _shares(token_pool_gateway(tenants=named, default="split", context=ctx))
        assert shares["gold"] == 0.4
        assert [round(shares[f"c{i}"], 12) for i in range(6)] == [0.1] * 6
        assert sum(shares.values()) == pytest.approx(1.0)

    def test_named_but_absent_tenants_reserve_nothing(self) -> None:
        """A named tenant the workload never sends does not hold back capacity."""
        named = {"gold": {"service_class": "guaranteed", "share": 0.6}}
        shares = _shares(token_pool_gateway(tenants=named, default="split", context=_context("x")))
        assert shares == {"x": 1.0}

    def test_split_needs_shares(self) -> None:
        """``split`` works on shares, not on a manifest in absolute units."""
        with pytest.raises(ValueError, match="needs 'tenants'"):
            token_pool_gateway(manifest="pool.yaml", default="split", context=_context("a"))

    def test_bad_default(self) -> None:
        """An unknown default policy is named."""
        with pytest.raises(ValueError, match="'default' must be a share mapping or 'split'"):
            token_pool_gateway(tenants={}, default="even", context=_context("a"))

    def test_built_by_name(self) -> None:
        """The resolver builds it as the ``token-pool`` gateway, with the server's context."""
        gate = build(
            GATEWAY, "token-pool", {"tenants": {}, "default": "split"}, context=_context("a")
        )
        assert isinstance(gate, TokenPoolGate)
        assert gate.check(Request("q", 10, 10, tenant="a"), 0.0).admitted
