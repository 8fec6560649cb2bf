"""The eviction early-warning monitor (§5.3)."""

from __future__ import annotations

import pytest

from kvpolicy.admit import AlertKind, EvictionMonitor
from kvpolicy.kvmodel import CompletionObserver, Request, SchedulerState


def _state(step: int) -> SchedulerState:
    return SchedulerState(step=step, time=float(step), used_tokens=0, capacity_tokens=100)


def _done(decode_len: int) -> Request:
    return Request(request_id="r", prompt_len=5, decode_len=decode_len)


class TestEvictionMonitor:
    """Alerts on entering and leaving the eviction region and on synchronised lengths."""

    def test_eviction_episode(self) -> None:
        """One EVICTING alert when evictions start, one RECOVERED when the window clears."""
        monitor = EvictionMonitor(window_steps=4)
        kinds = []
        for step, ev in enumerate([0, 0, 3, 1, 0, 0, 0, 0, 0]):
            kinds += [(step, a.kind) for a in monitor.observe_step(_state(step), ev)]
        assert kinds == [(2, AlertKind.EVICTING), (7, AlertKind.RECOVERED)]

    def test_tolerated_rate(self) -> None:
        """Below max_eviction_rate nothing is raised."""
        monitor = EvictionMonitor(window_steps=10, max_eviction_rate=0.5)
        alerts = [a for s in range(10) for a in monitor.observe_step(_state(s), int(s % 4 == 1))]
        assert alerts == []
        assert monitor.eviction_rate == pytest.approx(0.3)

    def test_effective_gcd(self) -> None:
        """Lengths 128/256/512 share 128; a frequent 127 desynchronises them."""
        monitor = EvictionMonitor(window_completions=300, min_share=0.05)
        for d in [128, 256, 512] * 10:
            monitor.observe_completion(_done(d), 0.0)
        alerts = monitor.observe_step(_state(0), 0)
        assert monitor.effective_gcd == 128
        assert [a.kind for a in alerts] == [AlertKind.SYNCHRONISED]
        assert alerts[0].effective_gcd == 128
        for _ in range(10):
            monitor.observe_completion(_done(127), 1.0)
        alerts = monitor.observe_step(_state(1), 0)
        assert monitor.effective_gcd == 1
        assert [a.kind for a in alerts] == [AlertKind.DESYNCHRONISED]

    def test_rare_lengths_ignored(self) -> None:
        """A single odd completion under min_share does not hide the common divisor."""
        monitor = EvictionMonitor(window_completions=1000, min_share=0.02)
        for _ in range(99):
            monitor.observe_completion(_done(20), 0.0)
        monitor.observe_completion(_done(21), 0.0)
        assert monitor.effective_gcd == 20

    def test_window_slides(self) -> None:
        """Old completions leave the decode-length window."""
        monitor = EvictionMonitor(window_completions=3, min_share=0.0)
        for d in (6, 9, 4, 8, 12):
            monitor.observe_completion(_done(d), 0.0)
        assert monitor.effective_gcd == 4

    def test_is_a_completion_observer(self) -> None:
        """The monitor implements CompletionObserver."""
        assert isinstance(EvictionMonitor(), CompletionObserver)

    def test_bad_input(self) -> None:
        """Negative evictions and a zero window raise, naming the argument."""
        with pytest.raises(ValueError, match="'evictions'"):
            EvictionMonitor().observe_step(_state(0), -1)
        with pytest.raises(ValueError, match="'window_steps'"):
            EvictionMonitor(window_steps=0)
