"""Fidelity checks: seed 004's two experiments (§5.2, §5.3) replayed in discrete time.

A closed-loop client population sends requests through a :class:`TokenPoolGate` to a small
model of one serving replica: every admitted request needs ``prompt_len + decode_len``
tokens of work, a slot serves at most ``tokens_per_s / concurrency`` of them a second, and
when more requests are in flight than there are slots they share the replica's throughput
(the backend queues what the gateway over-commits). A denied client waits its Retry-After;
a finished client sends its next request at once.
"""

from __future__ import annotations

import functools

import pytest

from kvpolicy.tenancy._experiments import Replay, replay_experiment


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class TestCrossClassProtection:
    """Experiment 1 (§5.2): two guaranteed tenants and a spot tenant on 16 slots."""

    @staticmethod
    @functools.cache
    def replay() -> Replay:
        return replay_experiment("cross-class")[0]

    def test_guaranteed_never_denied(self) -> None:
        """Guaranteed requests are never rejected within their concurrency limits."""
        run = self.replay()
        denied = [d for d in run.decisions if d[1] != "spot-b" and d[2] != "ok"]
        assert denied == []

    def test_spot_throttled_only_in_overload(self) -> None:
        """Spot is denied only during phase 2 (30-60 s), on priority."""
        run = self.replay()
        assert run.denials("spot-b", "priority", 0, 30) == 0
        assert run.denials("spot-b", "priority", 30, 60) > 0
        reasons = {why for t, who, why in run.decisions if who == "spot-b"}
        assert reasons == {"ok", "priority"}

    def test_spot_squeezed_then_recovers(self) -> None:
        """Spot holds 10 slots, at most 4 once guaranteed-c runs, and 10 again after."""
        run = self.replay()
        spot = dict(run.series("in_flight", "spot-b"))
        assert spot[20.0] == 10
        assert max(v for t, v in spot.items() if 40 <= t < 60) <= 4
        assert min(v for t, v in spot.items() if 70 <= t < 90) == 10

    def test_queue_bounded(self) -> None:
        """The replica holds at most 16 + 6 requests (the reserve of guaranteed-c over spot)
        and no more than its 16 slots once the over-commit drains."""
        run = self.replay()
        pool = [(float(s["time"]), int(s["pool"])) for s in run.samples]  # type: ignore[call-overload]
        assert max(n for _, n in pool) <= 22
        assert max(n for t, n in pool if 40 <= t < 90) <= 16

    def test_throttle_rate_reported(self) -> None:
        """Spot's throttle rate in phase 2 (the paper reports 47%) lies in (0, 1)."""
        run = self.replay()
        rate = run.throttle_rate("spot-b", 30, 60)
        assert 0.0 < rate < 1.0


class TestSLOAwareFairShare:
    """Experiment 2 (§5.3): three elastic tenants, an outage halving capacity at 30-120 s."""

    @staticmethod
    @functools.cache
    def replay() -> Replay:
        return replay_experiment("fair-share")[0]

    def test_copilot_never_denied_on_priority(self) -> None:
        """Table 2: copilot gets no low-priority denial; synth absorbs the most (the paper:
        0 and 317, reports 22)."""
        run = self.replay()
        assert run.denials("elastic-copilot", "priority") == 0
        synth = run.denials("elastic-synth", "priority")
        assert synth > 100
        assert synth > 10 * run.denials("elastic-reports", "priority")

    def test_copilot_ahead_throughout_the_outage(self) -> None:
        """Copilot's priority stays above synth's all through the outage (the paper:
        "copilot retains higher priority throughout"), its own debt included."""
        run = self.replay()
        copilot = run.series("priority", "elastic-copilot")
        synth = run.series("priority", "elastic-synth")
        outage = [c / s for (t, c), (_, s) in zip(copilot, synth, strict=True) if 30 <= t < 120]
        assert min(outage) > 1.0

    def test_the_papers_weights_in_the_outage(self) -> None:
        """Reports is bound when it joins (210 s): until then the pool-average SLO is
        15.25 s and the weights are the paper's 93.8 and 20.3 (before debt and burst)."""
        run = self.replay()
        assert "elastic-reports" not in run.samples[0]["priority"]  # type: ignore[operator]
        first = run.samples[0]["priority"]
        assert first == {
            "elastic-copilot": pytest.approx(93.85, abs=0.01),
            "elastic-synth": pytest.approx(20.27, abs=0.01),
        }

    def test_outage_shares(self) -> None:
        """In the outage copilot holds about 5-7 slots and synth about 2-3 (the paper's)."""
        run = self.replay()
        copilot = [v for t, v in run.series("in_flight", "elastic-copilot") if 40 <= t < 120]
        synth = [v for t, v in run.series("in_flight", "elastic-synth") if 40 <= t < 120]
        assert 5.0 <= _mean(copilot) <= 7.0
        assert 1.5 <= _mean(synth) <= 3.5

    def test_debt_rises_synth_faster(self) -> None:
        """Both accrue debt in the outage, none before; synth's peaks above copilot's
        (paper: 0.775 vs 0.607)."""
        run = self.replay()
        for tenant in ("elastic-copilot", "elastic-synth"):
            assert max(v for t, v in run.series("debt", tenant) if t < 30) <= 0.0
        synth = max(v for _, v in run.series("debt", "elastic-synth"))
        copilot = max(v for _, v in run.series("debt", "elastic-copilot"))
        assert 0.2 < copilot < synth
        assert 0.5 < synth <= 1.0

    def test_gap_narrows(self) -> None:
        """Synth's rising debt narrows its gap to copilot, which stays ahead throughout."""
        run = self.replay()
        copilot = run.series("priority", "elastic-copilot")
        synth = run.series("priority", "elastic-synth")
        ratios = [(t, c / s) for (t, c), (_, s) in zip(copilot, synth, strict=True)]
        outage = [r for t, r in ratios if 30 <= t < 120]
        assert min(outage) < ratios[0][1]
        assert all(r > 1.0 for r in outage)

    def test_debt_decays_after_recovery(self) -> None:
        """Within 50 s of recovery (gamma_d = 0.7 every 5 s) debt is near zero (what is
        left below is credit from bursting over the baseline after recovery)."""
        run = self.replay()
        for tenant in ("elastic-copilot", "elastic-synth"):
            after = [v for t, v in run.series("debt", tenant) if 170 <= t < 210]
            assert max(after) < 0.1
            assert min(after) > -0.2

    def test_summary_per_entitlement(self) -> None:
        """The summary ``kvpolicy tenancy replay`` prints: synth's low-priority denials and
        peak debt exceed copilot's; every TTFT is positive."""
        rows = {r["name"]: r for r in replay_experiment("fair-share")[1]}
        assert set(rows) == {"elastic-copilot", "elastic-synth", "elastic-reports"}
        synth, copilot = rows["elastic-synth"], rows["elastic-copilot"]
        assert synth["low_priority_denied"] > copilot["low_priority_denied"]
        assert synth["peak_debt"] > copilot["peak_debt"]
        assert all(r["p99_ttft_s"] > 0 and r["admitted"] > 0 for r in rows.values())

    def test_newcomer_starts_without_debt(self) -> None:
        """Reports joins at 210 s with zero debt and competes on its SLO term alone."""
        run = self.replay()
        reports = dict(run.series("debt", "elastic-reports"))
        assert reports[209.0] == 0.0
        assert run.denials("elastic-reports", "ok", 210, 300) > 0
