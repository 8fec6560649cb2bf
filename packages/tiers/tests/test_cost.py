"""The cost model: eq. (2), usage cost, recompute savings."""

from __future__ import annotations

import pytest

from kvpolicy.tiers import GIB, TierSpec, recompute_seconds_saved, serving_cost, usage_cost


class TestServingCost:
    def test_gpu_hours_plus_provisioned_storage(self) -> None:
        """Eq. (2) with linear storage pricing: 8 GPU-h at $2 + 2 GiB·$0.5 + 4 GiB·$0.25, 2 h."""
        a = TierSpec("dram", 2 * GIB, 1.0, 1.0, price_per_gib_hour=0.5)
        b = TierSpec("disk", 4 * GIB, 1.0, 1.0, price_per_gib_hour=0.25)
        assert serving_cost(8.0, 2.0, [a, b], 2.0) == 16.0 + 2.0 + 2.0

    def test_bad_arguments_raise(self) -> None:
        """Negative hours or prices and non-tier entries are refused."""
        with pytest.raises(ValueError, match="'gpu_hours' must be finite and >= 0: -1"):
            serving_cost(-1, 1.0, [], 1.0)
        with pytest.raises(TypeError, match="'tiers' must hold TierSpec values: 'dram'"):
            serving_cost(1, 1.0, ["dram"], 1.0)  # type: ignore[list-item]


class TestUsageCost:
    def test_byte_seconds_priced_per_gib_hour(self) -> None:
        """One GiB held for one hour costs the tier's GiB-hour price."""
        t = TierSpec("disk", GIB, 1.0, 1.0, price_per_gib_hour=0.3)
        assert usage_cost(GIB * 3600.0, t) == pytest.approx(0.3)


class TestRecomputeSaved:
    def test_saving_is_prefill_minus_load(self) -> None:
        """A hit saves its prefill and costs its load; a slow load saves negative time."""
        assert recompute_seconds_saved(4, 0.5, 0.5) == 1.5
        assert recompute_seconds_saved(1, 0.05, 0.19) == pytest.approx(-0.14)
        with pytest.raises(ValueError, match="'hit_blocks' must be >= 0: -1"):
            recompute_seconds_saved(-1, 0.5, 0.0)
