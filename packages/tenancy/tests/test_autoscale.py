"""The token pool's autoscaler: replicas that fund the commitments and the observed burst."""

from __future__ import annotations

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
from kvpolicy.tenancy import Resources, TokenPool, TokenPoolAutoscaler, dump_manifest

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


class TestTokenPoolAutoscaler:
    def test_committed_leaves_out_spot(self, small_pool: TokenPool) -> None:
        """Guaranteed and elastic baselines are committed; spot is promised nothing."""
        assert TokenPoolAutoscaler(small_pool, REPLICA).committed == (120.0, 500_000, 8)

    def test_idle_fleet_funds_the_commitments(self, small_pool: TokenPool) -> None:
        """120 tok/s, 500 kB and 8 slots need 2 replicas of 100 tok/s, 400 kB and 4 slots."""
        assert TokenPoolAutoscaler(small_pool, REPLICA).target(FleetView(0.0)) == 2

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
        assert scaler.target(FleetView(61.0)) == 2
        assert scaler.target(FleetView(70.0, tokens_per_s=650.0)) == 7
        with pytest.raises(ValueError, match="'time' must not go back"):
            scaler.target(FleetView(69.0))
        with pytest.raises(ValueError, match="'stabilisation_s'"):
            TokenPoolAutoscaler(small_pool, REPLICA, stabilisation_s=-1.0)

    def test_burst_decay_averages_what_is_observed(self, small_pool: TokenPool) -> None:
        """With gamma_b 0.5 a burst of 900 tok/s after 100 counts 500 (5 replicas), then
        700 and 800 as it lasts (7, 8); the first decision starts the average."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, burst_decay=0.5)
        assert scaler.target(FleetView(0.0, tokens_per_s=100.0)) == 2
        assert scaler.target(FleetView(10.0, tokens_per_s=900.0)) == 5
        assert scaler.target(FleetView(20.0, tokens_per_s=900.0)) == 7
        assert scaler.target(FleetView(30.0, tokens_per_s=900.0)) == 8
        with pytest.raises(ValueError, match="'burst_decay'"):
            TokenPoolAutoscaler(small_pool, REPLICA, burst_decay=1.0)

    def test_kv_and_concurrency_burst(self, small_pool: TokenPool) -> None:
        """3 full replicas hold 1.2 MB (3 replicas); 15 requests on them and 5 queued need
        20 slots (5 replicas)."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA)
        full = FleetView(0.0, up=_up(3, kv_usage=1.0))
        assert scaler.observed(full) == (0.0, 1_200_000.0, 0)
        assert scaler.target(full) == 3
        busy = FleetView(0.0, up=_up(3, running=4, waiting=1), queued=5)
        assert scaler.target(busy) == 5

    def test_bounds(self, small_pool: TokenPool) -> None:
        """The target stays within [min_replicas, max_replicas]."""
        scaler = TokenPoolAutoscaler(small_pool, REPLICA, min_replicas=3, max_replicas=4)
        assert scaler.target(FleetView(0.0)) == 3
        assert scaler.target(FleetView(0.0, tokens_per_s=450.0)) == 4

    def test_for_pool_sizes_a_replica_from_the_server(self, small_pool: TokenPool) -> None:
        """Without ``replica``, one replica is the context's server; a manifest is a pool."""
        context = ServerContext(
            model=get_model("Llama-3-8B"),
            block_size=16,
            kv_capacity_tokens=1000,
            max_batch=4,
            tokens_per_s=100.0,
        )
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
        assert targets == [2, 2, 2, 3, 4, 5, 6, 7, 8, 8, 8]

    def test_bad_bounds_are_named(self, small_pool: TokenPool) -> None:
        """min_replicas > max_replicas and replicas < 1 are errors naming field and value."""
        params = {"pool": small_pool, "replica": REPLICA, "min_replicas": 3, "max_replicas": 2}
        with pytest.raises(RegistryError, match=r"'min_replicas' must be <= 'max_replicas'"):
            build(AUTOSCALING, "token-pool", params)
        with pytest.raises(RegistryError, match="'min_replicas' must be >= 1: 0"):
            build(AUTOSCALING, "token-pool", {**params, "min_replicas": 0})
