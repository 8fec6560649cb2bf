"""A replica's rate at the SLO from the time model, and what autoscalers are given of it."""

from __future__ import annotations

import math

import attrs
import pytest

from kvpolicy.kvmodel import Request, get_gpu, get_model
from kvpolicy.sim import FleetConfig, PolicyChoice, StackConfig
from kvpolicy.sim._config import EngineConfig, SLOConfig
from kvpolicy.sim._engine import pool_capacity_tokens
from kvpolicy.sim._simulate import autoscaler_sizing, fleet_parts
from kvpolicy.sim._sizing import (
    erlang_c,
    server_capacity,
    slo_capacity,
    slo_load,
    slot_kv_tokens,
)
from kvpolicy.sim._timing import TimingModel


class TestErlang:
    def test_one_server_waits_with_its_utilisation(self) -> None:
        """M/M/1: an arrival waits with probability rho."""
        assert erlang_c(1, 0.3) == pytest.approx(0.3)

    def test_two_servers(self) -> None:
        """M/M/2 at 1 Erlang: C = 1/3 (the textbook value)."""
        assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)

    def test_saturated_always_waits(self) -> None:
        assert erlang_c(4, 4.0) == 1.0

    def test_bad_input_is_named(self) -> None:
        with pytest.raises(ValueError, match="'servers'"):
            erlang_c(0, 0.5)
        with pytest.raises(ValueError, match="'load'"):
            erlang_c(2, -1.0)
        with pytest.raises(ValueError, match="'miss'"):
            slo_load(2, 1.0, 1.0, 0.0)

    def test_slo_load_meets_its_target(self) -> None:
        """At the load found, exactly ``miss`` of the arrivals wait past the budget; a
        stricter target or a shorter budget bears less load; no budget bears none."""
        load = slo_load(10, 5.0, 1.0, 0.01)
        late = erlang_c(10, load) * math.exp(-(10 - load) * 1.0 / 5.0)
        assert late == pytest.approx(0.01, rel=1e-6)
        assert slo_load(10, 5.0, 1.0, 0.001) < load
        assert slo_load(10, 5.0, 0.5, 0.01) < load
        assert slo_load(10, 5.0, 0.0, 0.01) == 0.0


def _timing() -> TimingModel:
    return TimingModel(get_model("Qwen3-8B"), get_gpu("H100-SXM"))


class TestSLOCapacity:
    def test_below_saturation_and_within_the_batch(self) -> None:
        """Reasoning-length requests: the KV pool bounds the batch, the queue's TTFT
        target takes some of its saturation rate (every slot busy), and the rate is that of
        the saturated server of :func:`server_capacity` to within its serial prefills."""
        tm, engine = _timing(), EngineConfig()
        cap = pool_capacity_tokens(tm, engine)
        at = slo_capacity(tm, engine, cap, 1261.0, 1517.0, SLOConfig())
        assert at.batch == int(cap // (1261 + 1517 / 2))
        every_slot = at.batch / at.service_s * (1261 + 1517)
        assert 0.5 * every_slot < at.tokens_per_s < every_slot
        saturated = server_capacity(tm, engine, cap, 1261.0, 1517.0)
        assert 0.8 * saturated < at.tokens_per_s < 1.2 * saturated
        assert at.concurrency == int(at.tokens_per_s * at.service_s / (1261 + 1517))
        # The KV its requests hold at that load: min(load, batch) slots of P + D/2 tokens.
        slots = min(at.concurrency, at.batch)
        assert at.kv_fill == pytest.approx(slots * (1261 + 1517 / 2) / cap)
        assert 0.0 < at.kv_fill < 1.0

    def test_varied_lengths_hold_more_kv_per_slot(self) -> None:
        """A long request holds more KV for longer: 100 and 3,000 output tokens of 1,000
        prompt tokens hold (1050 * 100 + 2500 * 3000) / 3100 on average over their time in
        the batch, and fewer slots fit the pool than at the means."""
        slot = slot_kv_tokens([(1000, 100), (1000, 3000)])
        assert slot == pytest.approx((1050 * 100 + 2500 * 3000) / 3100)
        assert slot_kv_tokens([(10, 0)]) == 0.0
        tm, engine = _timing(), EngineConfig()
        cap = pool_capacity_tokens(tm, engine)
        at_means = slo_capacity(tm, engine, cap, 1000.0, 1550.0, SLOConfig())
        held = slo_capacity(tm, engine, cap, 1000.0, 1550.0, SLOConfig(), slot_kv_tokens=slot)
        assert held.batch == int(cap // slot) < at_means.batch
        assert held.tokens_per_s < at_means.tokens_per_s

    def test_tpot_bounds_the_batch(self) -> None:
        """A TPOT target below the full batch's iteration time shrinks the batch."""
        tm, engine = _timing(), EngineConfig()
        cap = pool_capacity_tokens(tm, engine)
        loose = slo_capacity(tm, engine, cap, 200.0, 200.0, SLOConfig())
        tight = slo_capacity(tm, engine, cap, 200.0, 200.0, SLOConfig(tpot_s=0.015))
        assert tight.batch < loose.batch
        assert tight.tokens_per_s < loose.tokens_per_s


def _requests(n: int = 40) -> list[Request]:
    return [
        Request(f"q{i}", prompt_len=500, decode_len=300, arrival_time=i * 0.1) for i in range(n)
    ]


class TestAutoscalersAreSized:
    def test_planner_and_token_pool_get_the_rate_at_the_slo(self) -> None:
        """Without a rate in the stack the planner divides by the time model's rate at the
        SLO; the token pool's replica is that rate, its whole KV pool and the requests in
        flight at that rate."""
        reqs = _requests()
        model, gpu = get_model("Qwen3-8B"), get_gpu("H100-SXM")
        cfg = StackConfig()
        sized = autoscaler_sizing(reqs, TimingModel(model, gpu), cfg)
        planner_cfg = attrs.evolve(
            cfg, fleet=FleetConfig(2, autoscaler=PolicyChoice("planner", {"max_replicas": 4}))
        )
        scaler = fleet_parts(reqs, model, gpu, planner_cfg, None, None, 0)[2]
        assert scaler.per_replica_tokens_per_s == sized["per_replica_tokens_per_s"]
        given = attrs.evolve(
            cfg,
            fleet=FleetConfig(
                2,
                autoscaler=PolicyChoice(
                    "planner", {"max_replicas": 4, "per_replica_tokens_per_s": 1234.0}
                ),
            ),
        )
        scaler = fleet_parts(reqs, model, gpu, given, None, None, 0)[2]
        assert scaler.per_replica_tokens_per_s == 1234.0
        pool = {
            "pool": {
                "name": "p",
                "capacity": {"tokens_per_s": 1e5, "kv_bytes": 10**12, "concurrency": 1000},
            },
            "entitlements": [
                {
                    "tenant": "t",
                    "service_class": "guaranteed",
                    "baseline": {"tokens_per_s": 100.0, "kv_bytes": 10**6, "concurrency": 2},
                }
            ],
        }
        pool_cfg = attrs.evolve(
            cfg,
            fleet=FleetConfig(
                2, autoscaler=PolicyChoice("token-pool", {"pool": pool, "max_replicas": 4})
            ),
        )
        scaler = fleet_parts(reqs, model, gpu, pool_cfg, None, None, 0)[2]
        assert scaler.replica == sized["replica"]
        assert scaler.replica.tokens_per_s == sized["per_replica_tokens_per_s"]
        # The KV dimension sizes by the share of the KV its requests hold at that rate.
        assert scaler.kv_fill == sized["kv_fill"]
        fill = sized["kv_fill"]
        assert isinstance(fill, float)
        assert 0.0 < fill <= 1.0
        filled = attrs.evolve(
            pool_cfg,
            fleet=FleetConfig(
                2,
                autoscaler=PolicyChoice(
                    "token-pool", {"pool": pool, "max_replicas": 4, "kv_fill": 0.5}
                ),
            ),
        )
        assert fleet_parts(reqs, model, gpu, filled, None, None, 0)[2].kv_fill == 0.5
