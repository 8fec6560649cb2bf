"""Resources, entitlements and pools."""

from __future__ import annotations

import re

import pytest

from kvpolicy.tenancy import GUARANTEED, Resources, TokenEntitlement, TokenPool


def _ent(tenant: str, cls: str, conc: int, burst: int | None = None) -> TokenEntitlement:
    return TokenEntitlement(
        tenant,
        cls,
        Resources(10 * conc, 1000 * conc, conc),
        None if burst is None else Resources(10 * burst, 1000 * burst, burst),
    )


class TestResources:
    def test_fits_in(self) -> None:
        """Every dimension must fit."""
        assert Resources(1, 2, 3).fits_in(Resources(1, 2, 3))
        assert not Resources(1, 2, 4).fits_in(Resources(9, 9, 3))

    def test_bad_values(self) -> None:
        """Zero, negative, bool and non-finite values name the field."""
        with pytest.raises(
            ValueError, match=re.escape("'tokens_per_s' must be finite, > 0 and <= 1e+12: 0.0")
        ):
            Resources(0, 1, 1)
        with pytest.raises(ValueError, match="'concurrency' must be > 0 and <= 10000000: -2"):
            Resources(1, 1, -2)
        with pytest.raises(TypeError, match=re.escape("'kv_bytes' must be int: 1.5")):
            Resources(1, 1.5, 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be a number: True"):
            Resources(True, 1, 1)


class TestTokenEntitlement:
    def test_class_by_name(self) -> None:
        """A class name converts to the class."""
        assert _ent("a", "guaranteed", 4).service_class is GUARANTEED

    def test_limits(self) -> None:
        """Limits are the burst limits when given, the baseline otherwise."""
        assert _ent("a", "elastic", 4, burst=8).limits == Resources(80, 8000, 8)
        assert _ent("a", "elastic", 4).limits == Resources(40, 4000, 4)

    def test_request_tokens(self) -> None:
        """A request is charged its prompt plus max_output_tokens."""
        assert _ent("a", "spot", 1).request_tokens(100) == 356

    def test_burst_below_baseline(self) -> None:
        """Burst limits under the baseline are refused."""
        with pytest.raises(ValueError, match="'burst' must be at least 'baseline'"):
            _ent("a", "elastic", 4, burst=2)

    def test_guaranteed_cannot_burst(self) -> None:
        """A guaranteed entitlement with burst limits above its baseline is refused."""
        with pytest.raises(ValueError, match="'burst' must equal 'baseline' for service class"):
            _ent("a", "guaranteed", 4, burst=8)

    def test_bad_fields(self) -> None:
        """An empty tenant or a zero SLO names the field."""
        with pytest.raises(ValueError, match="'tenant'"):
            _ent("", "spot", 1)
        with pytest.raises(
            ValueError, match=re.escape("'slo_target_s' must be finite, > 0 and <= 3.1536e+07: 0.0")
        ):
            TokenEntitlement("a", "spot", Resources(1, 1, 1), slo_target_s=0)


class TestTokenPool:
    def test_lookup_and_mean_slo(self) -> None:
        """Entitlements are found by tenant; the mean SLO is over all of them."""
        a = TokenEntitlement("a", "elastic", Resources(1, 1, 1), slo_target_s=0.5)
        b = TokenEntitlement("b", "elastic", Resources(1, 1, 1), slo_target_s=30.0)
        pool = TokenPool("p", Resources(10, 10, 10), [a, b])
        assert pool.entitlement("b") is b
        assert pool.entitlement("c") is None
        assert pool.mean_slo_s == 15.25

    def test_reserved_must_fit(self) -> None:
        """Guaranteed baselines beyond capacity are refused; spot ones do not count."""
        ents = [_ent("a", "guaranteed", 6), _ent("b", "dedicated", 6), _ent("c", "spot", 10)]
        assert TokenPool("p", Resources(120, 12000, 12), ents).reserved == (120.0, 12000, 12)
        with pytest.raises(ValueError, match="reserved baselines need concurrency=12 but"):
            TokenPool("p", Resources(1000, 10**6, 11), ents)

    def test_duplicate_tenant(self) -> None:
        """Two entitlements for one tenant are refused."""
        with pytest.raises(ValueError, match="'entitlements' has tenant 'a' twice"):
            TokenPool("p", Resources(100, 10**6, 10), [_ent("a", "spot", 1)] * 2)

    def test_wrong_entitlement_type(self) -> None:
        """A non-entitlement names its index."""
        with pytest.raises(
            TypeError, match=re.escape("'entitlements[0]' must be TokenEntitlement")
        ):
            TokenPool("p", Resources(1, 1, 1), ["a"])  # type: ignore[list-item]
