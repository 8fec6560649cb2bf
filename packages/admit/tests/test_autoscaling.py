"""Autoscalers on small fleet views with exact expectations."""

from __future__ import annotations

import pytest

from kvpolicy.admit import (
    PlannerAutoscaler,
    StabilityWorkload,
    StaticAutoscaler,
    ThresholdAutoscaler,
    eviction_free_rate,
    replica_token_rate,
)
from kvpolicy.kvmodel import FleetView, ReplicaView


def _up(n: int, kv_usage: float = 0.5, waiting: int = 0) -> tuple[ReplicaView, ...]:
    return tuple(
        ReplicaView(
            f"r{i}",
            running=1,
            waiting=waiting,
            kv_usage=kv_usage,
            free_blocks=10,
            block_size=16,
        )
        for i in range(n)
    )


class TestStatic:
    def test_fixed_count(self) -> None:
        """The count, whatever the fleet."""
        assert StaticAutoscaler(3).target(FleetView(0.0, up=_up(1), queued=99)) == 3

    @pytest.mark.parametrize(
        ("value", "error", "message"),
        [
            (0, ValueError, "'replicas' must be >= 1: 0"),
            (2.0, TypeError, "'replicas' must be an int: 2.0"),
            (True, TypeError, "'replicas' must be an int: True"),
        ],
    )
    def test_bad_count(self, value: object, error: type[Exception], message: str) -> None:
        """replicas < 1 or not an int is named with its value."""
        with pytest.raises(error, match=message):
            StaticAutoscaler(value)  # type: ignore[arg-type]

    def test_fleet_type(self) -> None:
        """A fleet that is not a FleetView is a TypeError naming 'fleet'."""
        with pytest.raises(TypeError, match="'fleet' must be a FleetView: 3"):
            StaticAutoscaler().target(3)  # type: ignore[arg-type]


class TestThreshold:
    def test_kv_usage_scales_up(self) -> None:
        """4 replicas at 100% KV against a 0.8 target: ceil(4 * 1.25) = 5."""
        scaler = ThresholdAutoscaler(max_replicas=10)
        assert scaler.target(FleetView(0.0, up=_up(4, kv_usage=1.0))) == 5

    def test_queue_scales_up(self) -> None:
        """2 replicas with 3 waiting each and 10 at the door: 16/2 = 8 per replica against 4."""
        scaler = ThresholdAutoscaler()
        assert scaler.target(FleetView(0.0, up=_up(2, waiting=3), queued=10)) == 4

    def test_within_tolerance_keeps_the_count(self) -> None:
        """A ratio of 0.95 (KV 0.76 against 0.8) keeps up plus provisioning replicas."""
        scaler = ThresholdAutoscaler()
        fleet = FleetView(0.0, up=_up(3, kv_usage=0.76), provisioning=["p"])
        assert scaler.target(fleet) == 4

    def test_scale_down_waits_for_the_window(self) -> None:
        """Down to 2 only after 300 s without a decision that wanted more."""
        scaler = ThresholdAutoscaler(stabilisation_s=300.0)
        busy = FleetView(0.0, up=_up(4, kv_usage=0.8))
        assert scaler.target(busy) == 4
        quiet = [FleetView(t, up=_up(4, kv_usage=0.4)) for t in (100.0, 300.0, 301.0)]
        assert [scaler.target(f) for f in quiet] == [4, 4, 2]

    def test_scale_up_is_immediate(self) -> None:
        """A decision that wants more replicas takes effect at once."""
        scaler = ThresholdAutoscaler()
        assert scaler.target(FleetView(0.0, up=_up(2, kv_usage=0.4))) == 1
        assert scaler.target(FleetView(10.0, up=_up(2, kv_usage=1.6 / 2))) == 2
        assert scaler.target(FleetView(20.0, up=_up(2, kv_usage=1.0))) == 3

    def test_bounds(self) -> None:
        """The target stays within [min_replicas, max_replicas]."""
        scaler = ThresholdAutoscaler(min_replicas=2, max_replicas=3, stabilisation_s=0.0)
        assert scaler.target(FleetView(0.0, up=_up(4, kv_usage=1.0))) == 3
        assert scaler.target(FleetView(1.0, up=_up(4, kv_usage=0.0))) == 2

    def test_no_replica_up_keeps_the_count(self) -> None:
        """Nothing up: the replicas already asked for (at least min_replicas)."""
        scaler = ThresholdAutoscaler(min_replicas=1)
        assert scaler.target(FleetView(0.0, provisioning=["a", "b"])) == 2
        assert ThresholdAutoscaler().target(FleetView(0.0)) == 1

    def test_time_must_not_go_back(self) -> None:
        """A decision earlier than the last one is refused, naming 'time'."""
        scaler = ThresholdAutoscaler()
        scaler.target(FleetView(5.0, up=_up(1)))
        with pytest.raises(ValueError, match=r"'time' must not go back .*: 4.0"):
            scaler.target(FleetView(4.0, up=_up(1)))

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"min_replicas": 0}, ValueError, "'min_replicas' must be >= 1: 0"),
            ({"min_replicas": 5, "max_replicas": 4}, ValueError, r"'min_replicas' must be <= "),
            ({"kv_usage_target": 0.0}, ValueError, "'kv_usage_target' must be finite and > 0"),
            ({"kv_usage_target": 1.2}, ValueError, "'kv_usage_target' must be <= 1: 1.2"),
            ({"queue_target": -1}, ValueError, "'queue_target' must be finite and > 0: -1.0"),
            ({"stabilisation_s": -1}, ValueError, "'stabilisation_s' must be finite and >= 0"),
            ({"tolerance": "x"}, TypeError, "must be a number: 'x'"),
        ],
    )
    def test_bad_config(self, kw: dict[str, object], error: type[Exception], message: str) -> None:
        """Each bad parameter is named with its value."""
        with pytest.raises(error, match=message):
            ThresholdAutoscaler(**kw)  # type: ignore[arg-type]


class TestPlanner:
    def test_demand_from_arrivals_and_lengths(self) -> None:
        """10 req/s of 500 prompt tokens (half cached) and 200 output: 4,500 tok/s -> 5."""
        fleet = FleetView(
            0.0,
            arrival_rate=10.0,
            mean_prompt_tokens=500.0,
            mean_output_tokens=200.0,
            prefix_hit_rate=0.5,
        )
        assert PlannerAutoscaler.demand(fleet) == 4500.0
        assert PlannerAutoscaler(1000.0).target(fleet) == 5

    def test_observed_tokens_without_lengths(self) -> None:
        """No request lengths known: the observed 3,000 tok/s need exactly 3 replicas."""
        assert PlannerAutoscaler(1000.0).target(FleetView(0.0, tokens_per_s=3000.0)) == 3

    def test_backlog_is_drained_in_backlog_s(self) -> None:
        """5 requests at the door and 7 waiting on a replica, 450 tokens each (half the
        prompt cached), over 60 s: 90 tok/s join the arrivals' 4,500. At 900 tok/s a
        replica that is 5 replicas without the backlog and 6 with it."""
        view = ReplicaView("r0", running=3, waiting=7, kv_usage=0.5, free_blocks=10, block_size=16)
        fleet = FleetView(
            0.0,
            up=(view,),
            queued=5,
            arrival_rate=10.0,
            mean_prompt_tokens=500.0,
            mean_output_tokens=200.0,
            prefix_hit_rate=0.5,
        )
        scaler = PlannerAutoscaler(900.0, max_replicas=10)
        assert scaler.backlog(fleet) == pytest.approx(12 * 450.0 / 60.0)
        assert scaler.target(fleet) == 6
        assert PlannerAutoscaler(900.0, max_replicas=10, backlog_s=0.0).target(fleet) == 5

    def test_backlog_without_lengths_uses_tokens_per_arrival(self) -> None:
        """No lengths: each waiting request counts the observed tokens per arrival."""
        fleet = FleetView(0.0, queued=30, arrival_rate=2.0, tokens_per_s=1000.0)
        scaler = PlannerAutoscaler(1000.0, backlog_s=15.0)
        assert scaler.backlog(fleet) == pytest.approx(30 * 500.0 / 15.0)
        assert scaler.target(fleet) == 2
        assert scaler.backlog(FleetView(0.0, queued=30)) == 0.0

    def test_bounds(self) -> None:
        """The target stays within [min_replicas, max_replicas]."""
        scaler = PlannerAutoscaler(100.0, min_replicas=2, max_replicas=4)
        assert scaler.target(FleetView(0.0)) == 2
        assert scaler.target(FleetView(0.0, tokens_per_s=10_000.0)) == 4

    def test_rate_from_seed_002(self) -> None:
        """x* requests of l0 + l1 tokens per iteration: 40 + 10 tokens, 20 ms iterations."""
        workload = StabilityWorkload(input_lens=(40,), decode_lens=(10,), memory=2000)
        rate = replica_token_rate(workload, 0.02)
        assert rate == pytest.approx(eviction_free_rate(workload) * 50 / 0.02)
        assert eviction_free_rate(workload) == pytest.approx(2 * 2000 / (10 * (2 * 40 + 10 + 1)))

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"per_replica_tokens_per_s": 0}, ValueError, "'per_replica_tokens_per_s' must be"),
            ({"max_replicas": 0}, ValueError, "'max_replicas' must be >= 1: 0"),
            ({"min_replicas": 3, "max_replicas": 2}, ValueError, "'min_replicas' must be <="),
        ],
    )
    def test_bad_config(self, kw: dict[str, object], error: type[Exception], message: str) -> None:
        """Each bad parameter is named with its value."""
        args: dict[str, object] = {"per_replica_tokens_per_s": 100.0, **kw}
        with pytest.raises(error, match=message):
            PlannerAutoscaler(**args)  # type: ignore[arg-type]

    def test_bad_iteration_time(self) -> None:
        """A non-positive iteration time is named."""
        workload = StabilityWorkload(input_lens=(40,), decode_lens=(10,), memory=2000)
        with pytest.raises(ValueError, match=r"'iteration_s' must be finite and > 0: 0\.0"):
            replica_token_rate(workload, 0.0)
