"""TierSpec, presets, provisioned bandwidth."""

from __future__ import annotations

import pytest

from kvpolicy.tiers import (
    GIB,
    TIER_PRESETS,
    TierSpec,
    UnknownTierError,
    get_tier,
    provisioned_bandwidth,
)


class TestTierSpec:
    def test_read_and_write_seconds_are_latency_plus_bytes_over_bandwidth(self) -> None:
        """One transfer pays the latency once and the bytes at the bandwidth."""
        t = TierSpec("x", 100, read_bandwidth=50.0, write_bandwidth=25.0, latency=0.5)
        assert t.read_seconds(100) == 2.5
        assert t.write_seconds(100) == 4.5

    def test_with_capacity_keeps_everything_else(self) -> None:
        """Resizing changes only the capacity."""
        dram = get_tier("dram")
        small = dram.with_capacity(GIB)
        assert small.capacity_bytes == GIB
        assert (small.name, small.read_bandwidth, small.price_per_gib_hour) == (
            "dram",
            dram.read_bandwidth,
            dram.price_per_gib_hour,
        )

    def test_cost_is_gib_times_price_times_hours(self) -> None:
        """Provisioned capacity is billed per GiB-hour."""
        t = TierSpec("x", 2 * GIB, 1.0, 1.0, price_per_gib_hour=0.25)
        assert t.cost(3.0) == 1.5

    @pytest.mark.parametrize(
        ("kwargs", "exc", "needle"),
        [
            ({"name": ""}, ValueError, "'name'"),
            ({"name": 3}, TypeError, "'name'"),
            ({"capacity_bytes": -1}, ValueError, "'capacity_bytes' must be >= 0: -1"),
            ({"capacity_bytes": 1.5}, TypeError, "'capacity_bytes' must be an int: 1.5"),
            ({"capacity_bytes": True}, TypeError, "'capacity_bytes'"),
            ({"read_bandwidth": 0.0}, ValueError, "'read_bandwidth' must be > 0: 0.0"),
            ({"write_bandwidth": float("inf")}, ValueError, "'write_bandwidth' must be finite"),
            ({"latency": -1.0}, ValueError, "'latency' must be >= 0: -1.0"),
            ({"price_per_gib_hour": "1"}, TypeError, "'price_per_gib_hour'"),
        ],
    )
    def test_bad_fields_raise_naming_the_field(
        self, kwargs: dict[str, object], exc: type[Exception], needle: str
    ) -> None:
        """A wrong type is a TypeError, a wrong value a ValueError, naming field and value."""
        base: dict[str, object] = {
            "name": "x",
            "capacity_bytes": 1,
            "read_bandwidth": 1.0,
            "write_bandwidth": 1.0,
        }
        base.update(kwargs)
        with pytest.raises(exc, match=needle.replace("(", r"\(")):
            TierSpec(**base)  # type: ignore[arg-type]

    def test_bad_hours_raise(self) -> None:
        """Negative hours are refused."""
        with pytest.raises(ValueError, match="'hours' must be finite and >= 0: -1"):
            get_tier("dram").cost(-1)


class TestPresets:
    def test_presets_are_ordered_fastest_and_dearest_first(self) -> None:
        """HBM > DRAM > disk in bandwidth; DRAM costs more per GiB than disk."""
        hbm, dram, disk = (TIER_PRESETS[n] for n in ("hbm", "dram", "disk"))
        assert hbm.read_bandwidth > dram.read_bandwidth > disk.read_bandwidth
        assert dram.price_per_gib_hour > disk.price_per_gib_hour
        assert dram.capacity_bytes == 1024 * GIB  # the fixed baseline of seed 003 §5.2
        assert disk.read_bandwidth == 350e6  # Table 1's lowest row, the ESSD PL1 ceiling

    def test_unknown_name_lists_known_names(self) -> None:
        """An unknown preset raises UnknownTierError (a ValueError) listing the names."""
        with pytest.raises(UnknownTierError, match="known tiers: disk, dram, hbm"):
            get_tier("tape")
        with pytest.raises(ValueError, match="unknown tier 'tape'"):
            get_tier("tape")


class TestProvisionedBandwidth:
    def test_grows_linearly_then_caps(self) -> None:
        """Bandwidth is base + per_gib * GiB up to the maximum (Observation 5)."""
        assert provisioned_bandwidth(100 * GIB, 120e6, 0.5e6, 350e6) == 170e6
        assert provisioned_bandwidth(1000 * GIB, 120e6, 0.5e6, 350e6) == 350e6

    def test_rejects_negative_capacity(self) -> None:
        """A negative capacity is refused, naming the parameter."""
        with pytest.raises(ValueError, match="'capacity_bytes' must be >= 0: -5"):
            provisioned_bandwidth(-5, 1.0, 1.0, 1.0)
