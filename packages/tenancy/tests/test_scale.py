"""TokenPoolGate.scale_throughput: every token rate follows a new estimate of the server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvpolicy.kvmodel import Request, ThroughputScalable
from kvpolicy.tenancy import GateConfig, Resources, TokenEntitlement, TokenPool, TokenPoolGate

MakeRequest = Callable[..., Request]
BPT = 100


class TestScaleThroughput:
    def test_is_throughput_scalable(self, small_pool: TokenPool) -> None:
        """The gate implements kvmodel's ThroughputScalable and reports its tokens/s."""
        gate = TokenPoolGate(small_pool, BPT)
        assert isinstance(gate, ThroughputScalable)
        assert gate.tokens_per_s == 240

    def test_rates_scale_and_nothing_else(self, small_pool: TokenPool) -> None:
        """Pool, baselines and bursts scale by the factor; KV bytes and slots stay."""
        gate = TokenPoolGate(small_pool, BPT)
        gate.scale_throughput(2.0, 1.0)
        assert gate.tokens_per_s == 480
        assert gate.pool_state().capacity == Resources(480, 1_000_000, 16)
        by_tenant = {e.tenant: e for e in gate.entitlements}
        assert by_tenant["g"].baseline == Resources(120, 250_000, 4)
        assert by_tenant["e"].baseline == Resources(120, 250_000, 4)
        assert by_tenant["e"].burst == Resources(240, 500_000, 8)
        assert by_tenant["s"].baseline == Resources(240, 500_000, 8)

    def test_default_entitlement_scales(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """Tenants under the default entitlement, seen or not yet seen, get the new rate."""
        default = TokenEntitlement("*", "spot", Resources(100, 10**6, 1), max_output_tokens=64)
        gate = TokenPoolGate(small_pool, BPT, default_entitlement=default)
        assert gate.check(make_request("x"), 0.0).admitted
        gate.scale_throughput(0.5, 1.0)
        for tenant in ("x", "y"):
            ent = gate.entitlement(tenant)
            assert ent is not None
            assert ent.baseline == Resources(50, 10**6, 1)

    def test_buckets_capped_at_their_new_depth(self, small_pool: TokenPool) -> None:
        """A full bucket keeps at most the new depth (rate · window) after a cut."""
        gate = TokenPoolGate(small_pool, BPT, config=GateConfig(window_s=10.0))
        gate.scale_throughput(0.25, 0.0)
        assert gate.pool_state().bucket == pytest.approx(60 * 10.0)
        for tenant, rate in (("g", 15.0), ("e", 30.0), ("s", 30.0)):
            assert gate.usage(tenant).bucket <= rate * 10.0

    def test_a_faster_server_refills_faster(
        self, small_pool: TokenPool, make_request: MakeRequest
    ) -> None:
        """After doubling, a drained bucket refills at twice the rate: a request denied for
        tokens on the unscaled gate gets in 0.1 s later on the scaled one."""
        gates = [TokenPoolGate(small_pool, BPT, config=GateConfig(window_s=2.0)) for _ in "ab"]
        for gate in gates:  # spot's bucket: 240 tokens; each request is charged 128
            assert gate.check(make_request("s"), 0.0).admitted
            assert gate.check(make_request("s"), 0.0).reason == "tokens"
        gates[1].scale_throughput(2.0, 0.0)
        late = [gate.check(make_request("s"), 0.1) for gate in gates]
        assert [d.reason or "ok" for d in late] == ["tokens", "ok"]

    @pytest.mark.parametrize(
        ("factor", "error"),
        [
            (0.0, ValueError),
            (-1.0, ValueError),
            (float("nan"), ValueError),
            (float("inf"), ValueError),
            (True, TypeError),
            ("2", TypeError),
        ],
    )
    def test_bad_factor_changes_nothing(
        self, small_pool: TokenPool, factor: object, error: type[Exception]
    ) -> None:
        """A bad factor is an error naming 'factor', and no state changes."""
        gate = TokenPoolGate(small_pool, BPT)
        before = (gate.pool_state(), gate.entitlements, [gate.usage(t) for t in "ges"])
        with pytest.raises(error, match="'factor'"):
            gate.scale_throughput(factor, 1.0)  # type: ignore[arg-type]
        assert (gate.pool_state(), gate.entitlements, [gate.usage(t) for t in "ges"]) == before
