"""Seed 004's service classes (Table 1)."""

from __future__ import annotations

import re

import pytest

from kvpolicy.tenancy import (
    DEDICATED,
    ELASTIC,
    GUARANTEED,
    PREEMPTIBLE,
    SERVICE_CLASSES,
    SPOT,
    ServiceClass,
    service_class,
)


class TestServiceClasses:
    def test_table_one(self) -> None:
        """Weights, burst rights, debt and protection are Table 1's."""
        rows = [
            (c.name, c.weight, c.baseline, c.can_burst, c.accumulates_debt, c.preemptible)
            for c in SERVICE_CLASSES.values()
        ]
        assert rows == [
            ("dedicated", 1000.0, "reserved", True, False, False),
            ("guaranteed", 1000.0, "reserved", False, False, False),
            ("elastic", 100.0, "time-averaged", True, True, False),
            ("spot", 1.0, "none", True, False, False),
            ("preemptible", 0.1, "none", True, False, True),
        ]

    def test_protected(self) -> None:
        """Only dedicated and guaranteed hold a reserved baseline."""
        assert [c.protected for c in (DEDICATED, GUARANTEED, ELASTIC, SPOT, PREEMPTIBLE)] == [
            True,
            True,
            False,
            False,
            False,
        ]

    def test_lookup(self) -> None:
        """A name maps to its class and a class maps to itself."""
        assert service_class("spot") is SPOT
        assert service_class(ELASTIC) is ELASTIC

    def test_unknown_name(self) -> None:
        """An unknown name lists the known ones."""
        with pytest.raises(ValueError, match="'service_class' must be one of dedicated, "):
            service_class("gold")
        with pytest.raises(TypeError, match="'service_class' must be str or ServiceClass: 3"):
            service_class(3)  # type: ignore[arg-type]

    def test_custom_class_validated(self) -> None:
        """A custom class needs a positive weight and a known baseline kind."""
        with pytest.raises(ValueError, match=re.escape("'weight' must be finite and > 0: 0.0")):
            ServiceClass("x", 0, "none", can_burst=True, accumulates_debt=False)
        with pytest.raises(ValueError, match="'baseline' must be in"):
            ServiceClass("x", 1, "sometimes", can_burst=True, accumulates_debt=False)
