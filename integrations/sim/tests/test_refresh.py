"""The gateway's throughput estimate refreshed from the service observed at the server."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from kvpolicy.kvmodel import GateDecision, Request, get_gpu, get_model
from kvpolicy.sim import (
    ConfigError,
    RefreshConfig,
    SimResult,
    Stack,
    ThroughputRefresh,
    TimingModel,
    get_stack,
    refresh_factor,
    server_context,
    simulate,
)

CFG = RefreshConfig(window_s=10.0)


class TestRefreshFactor:
    def test_too_few_completions_say_nothing(self) -> None:
        """A window with fewer than min_completions completions changes nothing."""
        assert refresh_factor(CFG, 1000.0, 5000.0, 10.0, 1.0, 0, 19) == 1.0

    def test_saturated_moves_to_the_observed_rate(self) -> None:
        """Requests waited all window: the estimate becomes what was served (800 tokens/s)."""
        assert refresh_factor(CFG, 1000.0, 8000.0, 10.0, 0.95, 0, 40) == pytest.approx(0.8)
        assert refresh_factor(CFG, 1000.0, 13000.0, 10.0, 1.0, 0, 40) == pytest.approx(1.3)

    def test_saturated_step_is_clamped(self) -> None:
        """One refresh moves at most max_step either way."""
        assert refresh_factor(CFG, 1000.0, 100.0, 10.0, 1.0, 0, 40) == 0.5
        assert refresh_factor(CFG, 1000.0, 90000.0, 10.0, 1.0, 0, 40) == 2.0

    def test_throttled_probes_up(self) -> None:
        """Token 429s while the server had room: the estimate rises by ``probe``."""
        assert refresh_factor(CFG, 1000.0, 3000.0, 10.0, 0.2, 5, 40) == 1.5

    def test_a_busy_server_is_not_probed(self) -> None:
        """Token 429s while the server was busy half the time: the estimate stays."""
        assert refresh_factor(CFG, 1000.0, 3000.0, 10.0, 0.5, 5, 40) == 1.0

    def test_late_takes_back_a_probe(self) -> None:
        """Requests finishing late after a probe: the estimate falls back, not below the
        floor (where it started)."""
        late = refresh_factor(CFG, 1500.0, 9000.0, 10.0, 0.5, 0, 40, on_time=30, floor=1000.0)
        assert late == pytest.approx(1 / 1.5)
        assert refresh_factor(CFG, 1000.0, 9000.0, 10.0, 0.5, 0, 40, 30, 1000.0) == 1.0

    def test_late_never_probes(self) -> None:
        """Token 429s with room, but late requests: no probe."""
        assert refresh_factor(CFG, 1000.0, 3000.0, 10.0, 0.2, 5, 40, 30, 1000.0) == 1.0

    def test_neither_keeps_the_estimate(self) -> None:
        """No queue and no token 429s: the estimate limited nobody."""
        assert refresh_factor(CFG, 1000.0, 3000.0, 10.0, 0.2, 0, 40) == 1.0

    def test_deadband(self) -> None:
        """Changes within the deadband are ignored."""
        assert refresh_factor(CFG, 1000.0, 10300.0, 10.0, 1.0, 0, 40) == 1.0

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("window_s", -1.0),
            ("saturated_share", 0.0),
            ("room_share", 1.5),
            ("probe", 1.0),
            ("max_step", 0.5),
            ("deadband", 0.9),
            ("min_completions", 0),
        ],
    )
    def test_bad_config_names_the_field(self, field: str, value: float) -> None:
        """A bad setting is an error that names it."""
        with pytest.raises(ValueError, match=f"'{field}'"):
            RefreshConfig(**{field: value})  # type: ignore[arg-type]


class _OpenDoor:
    """A gateway that admits everything and cannot be rescaled."""

    def check(self, request: Request, time: float) -> GateDecision:
        return GateDecision(admitted=True)

    def release(self, request: Request, time: float) -> None:
        return None


def _workload(n: int, rate: float) -> list[Request]:
    """``n`` untagged requests of 512 + 128 tokens, Poisson arrivals at ``rate``/s."""
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(1.0 / rate, n))
    return [Request(f"r{i}", 512, 128, float(t)) for i, t in enumerate(times)]


def _estimate(reqs: list[Request]) -> float:
    """The server's tokens/s as the kvpolicy stack's gateway estimates it."""
    model, gpu = get_model("Llama-3-8B"), get_gpu("L40S")
    return server_context(reqs, TimingModel(model, gpu), get_stack("kvpolicy").engine).tokens_per_s


def _run(reqs: list[Request], scale: float, refresh_s: float) -> SimResult:
    """The kvpolicy stack with its gateway's tokens/s set to ``scale`` times the estimate."""
    model, gpu = get_model("Llama-3-8B"), get_gpu("L40S")
    base = get_stack("kvpolicy")
    gateway = attrs.evolve(
        base.gateway,
        params={**base.gateway.params, "tokens_per_s": _estimate(reqs) * scale},
        refresh_s=refresh_s,
    )
    return simulate(reqs, model, gpu, attrs.evolve(base, gateway=gateway))


class TestInTheEngine:
    def test_an_underestimate_is_corrected(self) -> None:
        """Sized at 30% of the server, the gateway turns clients away; refreshed, its
        estimate rises and far fewer requests give up."""
        reqs = _workload(1500, 12.0)
        stale = _run(reqs, 0.3, 0.0)
        fresh = _run(reqs, 0.3, 15.0)
        assert stale.record.gateway_refreshes == ()
        rates = [tps for _, tps in fresh.record.gateway_refreshes]
        assert rates
        assert rates[0] > 0.3 * _estimate(reqs)
        assert fresh.summary.gave_up * 3 < stale.summary.gave_up
        assert fresh.summary.goodput_rps > stale.summary.goodput_rps

    def test_an_overestimate_comes_down_under_overload(self) -> None:
        """Sized at 5x the server and overloaded, the busy server shows its real rate: the
        estimate falls."""
        reqs = _workload(3000, 40.0)
        fresh = _run(reqs, 5.0, 15.0)
        rates = [tps for _, tps in fresh.record.gateway_refreshes]
        assert rates
        assert rates[-1] < 5.0 * _estimate(reqs)

    def test_refresh_off_is_the_default(self) -> None:
        """refresh_s = 0 makes the same run as a gateway without the setting."""
        reqs = _workload(300, 12.0)
        base = get_stack("kvpolicy")
        plain = attrs.evolve(base, gateway=attrs.evolve(base.gateway, refresh_s=0.0))
        model, gpu = get_model("Llama-3-8B"), get_gpu("L40S")
        a = simulate(reqs, model, gpu, plain)
        b = simulate(
            reqs,
            model,
            gpu,
            attrs.evolve(plain, gateway=attrs.evolve(plain.gateway, refresh_s=0)),
        )
        assert a.summary == b.summary
        assert a.record.gateway_refreshes == ()

    def test_needs_a_scalable_gateway(self) -> None:
        """refresh_s with a gateway that cannot be rescaled is an error naming the key."""
        reqs = _workload(10, 1.0)
        base = get_stack("kvpolicy")
        model, gpu = get_model("Llama-3-8B"), get_gpu("L40S")
        with pytest.raises(ConfigError, match=r"gateway\.refresh_s = 15"):
            simulate(reqs, model, gpu, base, stack=Stack(gate=_OpenDoor()))


class _Gate:
    """A real rescalable gate reduced to its rate: admits everything."""

    def __init__(self, tokens_per_s: float) -> None:
        self.tokens_per_s = tokens_per_s

    def check(self, request: Request, time: float) -> GateDecision:
        return GateDecision(admitted=True)

    def release(self, request: Request, time: float) -> None:
        return None

    def scale_throughput(self, factor: float, time: float) -> None:
        self.tokens_per_s *= factor


class TestBackoff:
    def _window(
        self, refresh: ThroughputRefresh, start: float, *, late: bool, denials: int
    ) -> None:
        """One 10 s window with room (never busy): 40 completions, ``denials`` token 429s."""
        for _ in range(denials):
            refresh.denied("tokens")
        for _ in range(40):
            refresh.completed(100, 5.0 if late else 0.5, 0.05)
        refresh.iteration(start, start + 10.0, False)

    def test_a_reverted_probe_doubles_the_wait(self) -> None:
        """Probe, taken back by a late window; the next probe needs 2 eligible windows in a
        row, and after another revert 4."""
        gate = _Gate(1000.0)
        refresh = ThroughputRefresh(gate, CFG)
        self._window(refresh, 0.0, late=False, denials=5)
        assert gate.tokens_per_s == pytest.approx(1500.0)
        self._window(refresh, 10.0, late=True, denials=0)
        assert gate.tokens_per_s == pytest.approx(1000.0)
        self._window(refresh, 20.0, late=False, denials=5)
        assert gate.tokens_per_s == pytest.approx(1000.0)
        self._window(refresh, 30.0, late=False, denials=5)
        assert gate.tokens_per_s == pytest.approx(1500.0)
        self._window(refresh, 40.0, late=True, denials=0)
        for i in range(3):
            self._window(refresh, 50.0 + 10 * i, late=False, denials=5)
            assert gate.tokens_per_s == pytest.approx(1000.0)
        self._window(refresh, 80.0, late=False, denials=5)
        assert gate.tokens_per_s == pytest.approx(1500.0)
        assert [round(t) for t, _ in refresh.refreshes] == [10, 20, 40, 50, 90]
