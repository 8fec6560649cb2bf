"""The token pool's autoscaler: replicas that fund the commitments and the observed burst."""

from __future__ import annotations

import attrs
import pytest

from kvpolicy.kvmodel import (
    AUTOSCALING,
    Autoscaler,
    FleetView,
    RegistryError,
    ReplicaView,
    ServerContext,
    build,
    get_model,
)
from kvpolicy.tenancy import (
    MeasuredReplica,
    Resources,
    TokenPool,
    TokenPoolAutoscaler,
    dump_manifest,
)

REPLICA = Resources(100, 400_000, 4)
"""One replica: 100 tokens/s, 400 kB of KV, 4 sequences."""


def _up(
    n: int, kv_usage: float = 0.0, running: int = 0, waiting: int = 0
) -> tuple[ReplicaView, ...]:
    return tuple(
        ReplicaView(
            f"r{i}",
            running=running,
            waiting=waiting,
            kv_usage=kv_usage,
            free_blocks=10,
            block_size=16,
        )
        for i in range(n)
    )


def _server(max_batch: int, tokens_per_s: float) -> ServerContext:
    """A server of 1,000 KV tokens of Llama-3-8B."""
    return ServerContext(
        model=get_model("Llama-3-8B"),
        block_size=16,
        kv_capacity_tokens=1000,
        max_batch=max_batch,
        tokens_per_s=tokens_per_s,
    )


class TestTokenPoolAutoscaler:
    def test_committed_is_the_reserved_baselines(self, small_pool: TokenPool) -> None:
        """The guaranteed baseline is reserved (held even when idle); the elastic one is
        time-averaged (funded when asked for) and spot is promised nothing."""
        assert TokenPoolAutoscaler(small_pool, REPLICA).committed == (60.0, 250_000, 4)

    def test_idle_fleet_funds_the_commitments(self, small_pool: TokenPool) -> None:
        """60 tok/s, 250 kB and 4 slots need 1 replica of 100 tok/s, 400 kB and 4 slots;
        a second reserved baseline as large needs 2."""
        assert TokenPoolAutoscaler(small_pool, REPLICA).target(FleetView(0.0)) == 1
        two = attrs.evolve(
            small_pool,
            entitlements=[
                attrs.evolve(e, service_class="dedicated") if e.tenant == "e" else e
                for e in small_pool.entitlements
            ],
        )
        assert TokenPoolAutoscaler(two, REPLICA).committed == (120.0, 500_000, 8)
        assert TokenPoolAutoscaler(two, REPLICA).target(FleetView(0.0)) == 2

    def test_token_burst(self, small_pool: TokenPool) -> None:
        """450 tok/s observed, 330 above the commitments: ceil(4.5) = 5 replicas."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA)
        assert scaler.target(FleetView(0.0, up=_up(2), tokens_per_s=450.0)) == 5

    def test_arrivals_show_a_burst_the_fleet_cannot_serve(self, small_pool: TokenPool) -> None:
        """2 saturated replicas serve 200 tok/s while 5 req/s of 60 + 30 tokens arrive (450
        tok/s): the demand, not what the short fleet serves, sizes it (5 replicas)."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA)
        view = FleetView(
            0.0,
            up=_up(2),
            tokens_per_s=200.0,
            arrival_rate=5.0,
            mean_prompt_tokens=60.0,
            mean_output_tokens=30.0,
        )
        assert scaler.observed(view)[0] == 450.0
        assert scaler.target(view) == 5
        # Served above what arrives (a backlog draining) counts as served.
        assert scaler.observed(FleetView(0.0, tokens_per_s=500.0, arrival_rate=1.0))[0] == 500.0

    def test_scale_down_waits_for_the_window(self, small_pool: TokenPool) -> None:
        """With a 60 s window the target falls only once the burst is 60 s old; it rises
        at once; time going back is refused."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, stabilisation_s=60.0)
        assert scaler.target(FleetView(0.0, tokens_per_s=450.0)) == 5
        assert scaler.target(FleetView(30.0)) == 5
        assert scaler.target(FleetView(60.0)) == 5
        assert scaler.target(FleetView(61.0)) == 1
        assert scaler.target(FleetView(70.0, tokens_per_s=650.0)) == 7
        with pytest.raises(ValueError, match="'time' must not go back"):
            scaler.target(FleetView(69.0))
        with pytest.raises(ValueError, match="'stabilisation_s'"):
            TokenPoolAutoscaler(small_pool, REPLICA, stabilisation_s=-1.0)

    def test_burst_decay_averages_what_is_observed(self, small_pool: TokenPool) -> None:
        """With gamma_b 0.5 a burst of 900 tok/s after 100 counts 500 (5 replicas), then
        700 and 800 as it lasts (7, 8); the first decision starts the average."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, burst_decay=0.5)
        assert scaler.target(FleetView(0.0, tokens_per_s=100.0)) == 1
        assert scaler.target(FleetView(10.0, tokens_per_s=900.0)) == 5
        assert scaler.target(FleetView(20.0, tokens_per_s=900.0)) == 7
        assert scaler.target(FleetView(30.0, tokens_per_s=900.0)) == 8
        with pytest.raises(ValueError, match="'burst_decay'"):
            TokenPoolAutoscaler(small_pool, REPLICA, burst_decay=1.0)

    def test_served_and_arriving_are_averaged_apart(self, small_pool: TokenPool) -> None:
        """Served and arriving tokens/s alternate between 400 and 800, out of step: with
        gamma_b 0.5 each is averaged apart (650 served, 550 arriving: 7 replicas at the
        third decision), where averaging the larger of the two would count 750 (8)."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, burst_decay=0.5)

        def view(t: float, served: float, arriving: float) -> FleetView:
            rate = arriving / 100.0  # 100 tokens a request
            return FleetView(
                t,
                tokens_per_s=served,
                arrival_rate=rate,
                mean_prompt_tokens=50.0,
                mean_output_tokens=50.0,
            )

        assert scaler.target(view(0.0, 600.0, 600.0)) == 6
        assert scaler.target(view(10.0, 400.0, 800.0)) == 7  # 500 served, 700 arriving
        assert scaler.target(view(20.0, 800.0, 400.0)) == 7  # 650 and 550
        assert scaler.observed(view(30.0, 400.0, 800.0))[0] == 800.0  # now, not averaged

    def test_kv_and_concurrency_burst(self, small_pool: TokenPool) -> None:
        """3 full replicas hold 1.2 MB (3 replicas); 15 requests on them and 5 queued need
        20 slots (5 replicas)."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA)
        full = FleetView(0.0, up=_up(3, kv_usage=1.0))
        assert scaler.observed(full) == (0.0, 1_200_000.0, 0)
        assert scaler.target(full) == 3
        busy = FleetView(0.0, up=_up(3, running=4, waiting=1), queued=5)
        assert scaler.target(busy) == 5

    def test_kv_fill_sizes_by_the_kv_a_replica_holds_at_the_slo(
        self, small_pool: TokenPool
    ) -> None:
        """With ``kv_fill`` 0.8 a replica counts for 320 kB of its 400 kB: 3 replicas 90%
        full hold 1.08 MB, which asks for 4 of them (3 at the whole KV); the KV in use is
        still read as a share of all 400 kB."""
        kv_bound = FleetView(0.0, up=_up(3, kv_usage=0.9))
        assert TokenPoolAutoscaler(small_pool, REPLICA).target(kv_bound) == 3
        filled = TokenPoolAutoscaler(small_pool, REPLICA, kv_fill=0.8)
        assert filled.observed(kv_bound) == (0.0, 1_080_000.0, 0)
        assert filled.target(kv_bound) == 4
        built = TokenPoolAutoscaler.for_pool(small_pool, REPLICA, kv_fill=0.8)
        assert built.kv_fill == 0.8
        assert built.target(kv_bound) == 4

    def test_bounds(self, small_pool: TokenPool) -> None:
        """The target stays within [min_replicas, max_replicas]."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, min_replicas=3, max_replicas=4)
        assert scaler.target(FleetView(0.0)) == 3
        assert scaler.target(FleetView(0.0, tokens_per_s=450.0)) == 4

    def test_for_pool_sizes_a_replica_from_the_server(self, small_pool: TokenPool) -> None:
        """Without ``replica``, one replica is the context's server; a manifest is a pool."""
        context = _server(max_batch=4, tokens_per_s=100.0)
        scaler = TokenPoolAutoscaler.for_pool(dump_manifest(small_pool), context=context)
        assert scaler.replica == Resources(100, 1000 * 131_072, 4)
        assert scaler.pool == small_pool
        # A stack file gives the replica as a mapping, checked as a manifest's resources.
        given = {"tokens_per_s": 100, "kv_bytes": 400_000, "concurrency": 4}
        assert TokenPoolAutoscaler.for_pool(small_pool, given).replica == REPLICA
        with pytest.raises(ValueError, match="replica"):
            TokenPoolAutoscaler.for_pool(small_pool, {"tokens_per_s": 100, "concurrency": 4})

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"min_replicas": 0}, ValueError, "'min_replicas' must be >= 1: 0"),
            ({"max_replicas": 2.0}, TypeError, r"'max_replicas' must be an int: 2\.0"),
            (
                {"min_replicas": 3, "max_replicas": 2},
                ValueError,
                r"'min_replicas' must be <= 'max_replicas' \(2\): 3",
            ),
            ({"replica": 100}, TypeError, "'replica' must be <class"),
            ({"kv_fill": 0.0}, ValueError, r"'kv_fill' must be in \(0, 1\]: 0\.0"),
            ({"kv_fill": 1.5}, ValueError, r"'kv_fill' must be in \(0, 1\]: 1\.5"),
            ({"kv_fill": float("nan")}, ValueError, r"'kv_fill' must be in \(0, 1\]: nan"),
        ],
    )
    def test_bad_config(
        self, small_pool: TokenPool, kw: dict[str, object], error: type[Exception], message: str
    ) -> None:
        """Each bad parameter is named with its value."""
        args: dict[str, object] = {"pool": small_pool, "replica": REPLICA, **kw}
        with pytest.raises(error, match=message):
            TokenPoolAutoscaler(**args)  # type: ignore[arg-type]

    def test_replica_or_context_required(self, small_pool: TokenPool) -> None:
        """for_pool needs one replica's size, given or from the server's context."""
        with pytest.raises(ValueError, match="'replica' is required without the server's"):
            TokenPoolAutoscaler.for_pool(small_pool)

    def test_fleet_type(self, small_pool: TokenPool) -> None:
        """A fleet that is not a FleetView is a TypeError naming 'fleet'."""
        with pytest.raises(TypeError, match="'fleet' must be a FleetView: 1"):
            TokenPoolAutoscaler(small_pool, REPLICA).target(1)  # type: ignore[arg-type]


def _fleet_at(level: float) -> FleetView:
    """A fleet of 4 replicas whose every demand signal grows with ``level`` in [0, 1]."""
    return FleetView(
        0.0,
        up=_up(4, kv_usage=level, running=int(4 * level), waiting=int(3 * level)),
        queued=int(10 * level),
        tokens_per_s=900.0 * level,
    )


class TestConformance:
    """The Autoscaler contract, built by name as ``token-pool`` (kvpolicy-admit's suite
    checks its own autoscalers the same way)."""

    def test_built_by_name(self, small_pool: TokenPool) -> None:
        """The entry point builds an Autoscaler from params."""
        scaler = build(AUTOSCALING, "token-pool", {"pool": small_pool, "replica": REPLICA})
        assert isinstance(scaler, Autoscaler)

    def test_within_bounds_and_monotone_in_demand(self, small_pool: TokenPool) -> None:
        """From no demand to overload, the target is within its bounds and never falls."""
        params = {"pool": small_pool, "replica": REPLICA, "min_replicas": 1, "max_replicas": 8}
        scaler = build(AUTOSCALING, "token-pool", params)
        targets = [scaler.target(_fleet_at(level / 10)) for level in range(11)]
        assert targets == [1, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8]

    def test_bad_bounds_are_named(self, small_pool: TokenPool) -> None:
        """min_replicas > max_replicas and replicas < 1 are errors naming field and value."""
        params = {"pool": small_pool, "replica": REPLICA, "min_replicas": 3, "max_replicas": 2}
        with pytest.raises(RegistryError, match=r"'min_replicas' must be <= 'max_replicas'"):
            build(AUTOSCALING, "token-pool", params)
        with pytest.raises(RegistryError, match="'min_replicas' must be >= 1: 0"):
            build(AUTOSCALING, "token-pool", {**params, "min_replicas": 0})


CEILING = Resources(300, 400_000, 10)
"""One replica at saturation: 300 tokens/s, 10 sequences."""


def _serving(n: int, running: int, waiting: int = 0, draining: int = 0) -> dict[str, object]:
    """``n`` replicas up (and ``draining`` more) each running ``running`` requests."""
    up = _up(n, running=running, waiting=waiting)
    gone = tuple(
        ReplicaView(
            f"d{i}",
            running=running,
            waiting=0,
            kv_usage=0.0,
            free_blocks=10,
            block_size=16,
            draining=True,
        )
        for i in range(draining)
    )
    return {"up": up, "draining": gone}


class TestMeasuredReplica:
    def test_a_load_carried_with_no_request_waiting_counts(self) -> None:
        """Two decisions with no request waiting: 2 replicas served 360 tok/s, 180 and 6
        requests each, so one replica carries 180 tok/s and 6 sequences within the SLO."""
        meter = MeasuredReplica(CEILING)
        meter.observe(FleetView(0.0, tokens_per_s=300.0, **_serving(2, running=5)))
        assert (meter.tokens_per_s, meter.concurrency) == (0.0, 0.0)  # one end of a window
        meter.observe(FleetView(10.0, tokens_per_s=360.0, **_serving(2, running=6)))
        assert (meter.tokens_per_s, meter.concurrency) == (180.0, 6.0)
        assert meter.capacity(REPLICA) == Resources(180, 400_000, 6)
        # A lighter load later leaves the largest.
        meter.observe(FleetView(20.0, tokens_per_s=100.0, **_serving(2, running=1)))
        assert meter.capacity(REPLICA) == Resources(180, 400_000, 6)

    def test_waiting_at_either_end_of_the_window_does_not_count(self) -> None:
        """A request waiting on a replica or at the front door, at this decision or the
        previous one, and the load is not counted; draining replicas share the load."""
        meter = MeasuredReplica(CEILING)
        meter.observe(FleetView(0.0, tokens_per_s=400.0, **_serving(2, running=8, waiting=1)))
        meter.observe(FleetView(10.0, tokens_per_s=400.0, **_serving(2, running=8)))
        assert meter.tokens_per_s == 0.0  # waited at the window's start
        meter.observe(FleetView(20.0, tokens_per_s=400.0, queued=1, **_serving(2, running=8)))
        meter.observe(FleetView(30.0, tokens_per_s=400.0, **_serving(2, running=8)))
        assert meter.tokens_per_s == 0.0
        meter.observe(FleetView(40.0, tokens_per_s=400.0, **_serving(1, running=7, draining=1)))
        assert (meter.tokens_per_s, meter.concurrency) == (200.0, 7.0)
        # No replica serving: nothing measured, and the next window starts afresh.
        meter.observe(FleetView(50.0))
        meter.observe(FleetView(60.0, tokens_per_s=500.0, **_serving(2, running=9)))
        assert meter.tokens_per_s == 200.0

    def test_a_load_counts_once_sustained_for_a_request_s_time_in_the_system(self) -> None:
        """12 requests in flight at 0.5 req/s stay 24 s (Little's law): a load counts once
        the decisions cover 24 s with no request waiting, as the least of them; a request
        waiting within that time and none counts until 24 s have passed again."""
        meter = MeasuredReplica(CEILING)

        def view(t: float, tokens: float, waiting: int = 0) -> FleetView:
            busy = _serving(2, running=6 - waiting, waiting=waiting)
            return FleetView(t, tokens_per_s=tokens, arrival_rate=0.5, **busy)

        for t, tokens in ((0.0, 400.0), (10.0, 300.0), (20.0, 360.0)):
            meter.observe(view(t, tokens))
            assert meter.tokens_per_s == 0.0  # not yet 24 s
        meter.observe(view(30.0, 380.0))
        assert (meter.tokens_per_s, meter.concurrency) == (150.0, 6.0)
        meter.observe(view(40.0, 600.0, waiting=1))
        for t in (50.0, 60.0, 70.0):
            meter.observe(view(t, 500.0))
            assert meter.tokens_per_s == 150.0  # the wait at 40 s is within 24 s
        meter.observe(view(80.0, 500.0))
        assert meter.tokens_per_s == 250.0
        with pytest.raises(ValueError, match="'time' must not go back"):
            meter.observe(view(79.0, 500.0))

    def test_a_wait_within_the_queue_budget_counts(self) -> None:
        """With a 0.5 s queue budget, 2 requests waiting at 8 req/s (a 0.25 s mean wait by
        Little's law) still meet the SLO and the load counts; 8 waiting (1 s) do not, nor
        do requests waiting with none arriving."""
        meter = MeasuredReplica(CEILING, queue_budget_s=0.5)

        def view(t: float, waiting: int, rate: float = 8.0) -> FleetView:
            busy = _serving(2, running=4, waiting=waiting // 2)
            return FleetView(t, tokens_per_s=400.0, arrival_rate=rate, **busy)

        meter.observe(view(0.0, 2))
        meter.observe(view(10.0, 2))
        assert (meter.tokens_per_s, meter.concurrency) == (200.0, 4.0)
        strict = MeasuredReplica(CEILING)  # the default: nothing may wait
        strict.observe(view(0.0, 2))
        strict.observe(view(10.0, 2))
        assert strict.tokens_per_s == 0.0
        over = MeasuredReplica(CEILING, queue_budget_s=0.5)
        over.observe(view(0.0, 8))
        over.observe(view(10.0, 8))
        assert over.tokens_per_s == 0.0
        idle = MeasuredReplica(CEILING, queue_budget_s=0.5)
        idle.observe(view(0.0, 2, rate=0.0))
        idle.observe(view(10.0, 2, rate=0.0))
        assert idle.tokens_per_s == 0.0
        for bad in (-1.0, float("inf"), float("nan")):
            with pytest.raises(ValueError, match="'queue_budget_s' must be finite and >= 0"):
                MeasuredReplica(CEILING, queue_budget_s=bad)

    def test_bounded_by_the_model_and_the_saturation(self) -> None:
        """Below the model's rate the model's counts; no more than the ceiling counts."""
        meter = MeasuredReplica(CEILING)
        assert meter.capacity(REPLICA) == REPLICA
        for t in (0.0, 10.0):
            meter.observe(FleetView(t, tokens_per_s=1000.0, **_serving(2, running=40)))
        assert meter.capacity(REPLICA) == Resources(300, 400_000, 10)
        low = MeasuredReplica(CEILING)
        for t in (0.0, 10.0):
            low.observe(FleetView(t, tokens_per_s=100.0, **_serving(2, running=1)))
        assert low.capacity(REPLICA) == REPLICA

    def test_bad_input_is_named(self) -> None:
        with pytest.raises(TypeError, match="'ceiling' must be <class"):
            MeasuredReplica(300)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="'fleet' must be a FleetView: 1"):
            MeasuredReplica(CEILING).observe(1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="'modelled' must be Resources: 1"):
            MeasuredReplica(CEILING).capacity(1)  # type: ignore[arg-type]

    def test_the_autoscaler_sizes_by_the_measured_rate(self, small_pool: TokenPool) -> None:
        """Replicas seen to carry 200 tok/s within the SLO: 600 tok/s (with requests
        waiting, so not measured) need 3, not 6."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, measured=MeasuredReplica(CEILING))
        busy = _serving(2, running=3)
        assert scaler.target(FleetView(0.0, tokens_per_s=400.0, **busy)) == 4
        assert scaler.target(FleetView(10.0, tokens_per_s=400.0, **busy)) == 2
        assert scaler.capacity == Resources(200, 400_000, 4)
        queue = _serving(2, running=3, waiting=1)
        assert scaler.target(FleetView(20.0, tokens_per_s=600.0, **queue)) == 3
        assert scaler.capacity == Resources(200, 400_000, 4)

    def test_for_pool_measures_up_to_the_server_at_saturation(self, small_pool: TokenPool) -> None:
        """measure_rate takes the ceiling from ``saturation`` or the server's context."""
        context = _server(max_batch=12, tokens_per_s=250.0)
        scaler = TokenPoolAutoscaler.for_pool(
            small_pool, REPLICA, measure_rate=True, burst_decay=0.5, context=context
        )
        assert scaler.measured == MeasuredReplica(Resources(250, 400_000, 12))
        given = {"tokens_per_s": 300, "kv_bytes": 400_000, "concurrency": 10}
        scaler = TokenPoolAutoscaler.for_pool(
            small_pool, REPLICA, measure_rate=True, saturation=given
        )
        assert scaler.measured == MeasuredReplica(CEILING)
        scaler = TokenPoolAutoscaler.for_pool(
            small_pool, REPLICA, measure_rate=True, saturation=given, queue_budget_s=0.4
        )
        assert scaler.measured == MeasuredReplica(CEILING, queue_budget_s=0.4)
        assert TokenPoolAutoscaler.for_pool(small_pool, REPLICA).measured is None
        with pytest.raises(ValueError, match="'saturation' is required to measure the rate"):
            TokenPoolAutoscaler.for_pool(small_pool, REPLICA, measure_rate=True)
        with pytest.raises(TypeError, match="'measure_rate' must be a bool: 'yes'"):
            TokenPoolAutoscaler.for_pool(
                small_pool,
                REPLICA,
                measure_rate="yes",
                context=context,  # type: ignore[arg-type]
            )
