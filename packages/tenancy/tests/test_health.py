"""Passive ejection with backoff, re-admission and draining of one backend."""

from __future__ import annotations

import pytest

from kvpolicy.tenancy._health import BackendHealth, HealthConfig, backoff_s


def test_backoff_doubles_up_to_the_cap() -> None:
    """The k-th ejection in a row lasts backoff * 2**(k-1), capped."""
    cfg = HealthConfig(backoff_s=1.0, max_backoff_s=5.0)
    assert [backoff_s(k, cfg) for k in (1, 2, 3, 4, 100)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="'ejections' must be >= 1: 0"):
        backoff_s(0, cfg)


class TestBackendHealth:
    def test_ejected_after_failures_then_readmitted(self) -> None:
        """Two failures in a row eject it (failures=2); a success re-admits it."""
        h = BackendHealth(HealthConfig(failures=2, backoff_s=1.0))
        assert h.failed(10.0, "refused") is False
        assert h.routable(10.0, active_checks=True)
        assert h.failed(10.5, "refused") is True
        assert (h.state, h.ejected_until) == ("ejected", 11.5)
        assert not h.routable(11.0, active_checks=True)
        assert not h.probe_due(11.0)
        assert h.probe_due(11.5)
        assert h.succeeded() is True
        assert (h.state, h.failures, h.ejections) == ("up", 0, 0)

    def test_a_failed_probe_doubles_the_backoff(self) -> None:
        """A failure after the backoff (a probe) ejects it for twice as long."""
        h = BackendHealth(HealthConfig(backoff_s=1.0))
        h.failed(0.0, "5xx")
        h.failed(0.5, "5xx")  # during the ejection: nothing changes
        assert h.ejected_until == 1.0
        h.failed(1.0, "5xx")
        assert h.ejected_until == 3.0

    def test_without_active_checks_a_request_probes(self) -> None:
        """Without active checks an ejected backend is tried again after its backoff."""
        h = BackendHealth(HealthConfig(backoff_s=2.0))
        h.failed(0.0, "timeout")
        assert not h.routable(1.0, active_checks=False)
        assert h.routable(2.0, active_checks=False)
        assert not h.routable(2.0, active_checks=True)

    def test_draining_takes_nothing_new(self) -> None:
        """A draining backend is not routable, whatever its health."""
        h = BackendHealth(HealthConfig())
        h.draining = True
        assert (h.state, h.routable(0.0, True)) == ("draining", False)
