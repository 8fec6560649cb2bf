"""The fleet: replicas of the engine behind one router, advanced in time order in one loop."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace

import attrs
import numpy as np
import pytest

from kvpolicy.admit import LeastRequestsRouter, RoundRobinRouter, StaticAutoscaler
from kvpolicy.kvmodel import ReplicaView, Request, RoutingRequest, get_gpu, get_model
from kvpolicy.sim import (
    STACK_PRESETS,
    ConfigError,
    Engine,
    Fleet,
    FleetConfig,
    ReplicaSpec,
    SimError,
    StackConfig,
    TimingModel,
    check_config,
    provisioning_delay,
    simulate,
)
from kvpolicy.sim.workloads import get_workload

FLEET_KEYS = ("gpu_hours", "peak_replicas", "replicas", "replicas_reclaimed")


def _requests(kit: SimpleNamespace, n: int, gap: float = 0.002) -> list[Request]:
    return [kit.request(i, 64 + 13 * (i % 7), 8 + i % 5, t=gap * i) for i in range(n)]


class _Recording:
    """Round-robin that keeps every list of views it was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[ReplicaView, ...]] = []
        self._inner = RoundRobinRouter()

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        self.seen.append(tuple(replicas))
        return self._inner.route(request, replicas)


class TestOneReplica:
    @pytest.mark.parametrize("preset", ["vllm", "kvpolicy"])
    def test_equals_the_single_engine(self, preset: str) -> None:
        """One replica behind round-robin gives the engine's record and summary exactly
        (the demo's stacks, the kvpolicy one with its gateway); the fleet only adds its
        own keys."""
        w = get_workload("multi-tenant", seed=0, num_requests=120)
        m, g = get_model("Llama-3-8B"), get_gpu("L40S")
        cfg = STACK_PRESETS[preset]
        one = simulate(w.requests, m, g, cfg, seed=0)
        fleet_cfg = attrs.evolve(cfg, fleet=FleetConfig(replicas=1, startup_s=1.0))
        fleet = simulate(w.requests, m, g, fleet_cfg, seed=0)
        assert fleet.fleet is not None
        got = fleet.summary.as_dict()
        extra = {k: got.pop(k) for k in FLEET_KEYS}
        assert json.dumps(got, sort_keys=True) == json.dumps(one.summary.as_dict(), sort_keys=True)
        assert fleet.record.finish.tobytes() == one.record.finish.tobytes()
        assert fleet.record.series_kv_tokens.tolist() == one.record.series_kv_tokens.tolist()
        assert extra["peak_replicas"] == 1
        assert [r["requests"] for r in extra["replicas"]] == [
            int(np.isfinite(one.record.finish).sum())
        ]


class TestRouting:
    def test_round_robin_spreads_and_loses_nothing(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Three replicas take requests in turn; every request finishes exactly once."""
        reqs = _requests(kit, 30)
        fleet = Fleet(lambda k: Engine(tm, kit.engine(4096)), RoundRobinRouter(), FleetConfig(3))
        out = fleet.run(reqs)
        assert out.assignment.tolist() == [i % 3 for i in range(30)]
        assert [r.requests for r in out.replicas] == [10, 10, 10]
        assert np.isfinite(out.record.finish).all()
        assert out.peak_replicas == 3

    def test_replicas_serve_like_engines_given_their_share(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Each replica finishes its requests at the times one engine serving only those
        requests gives (replicas share nothing but the front door)."""
        reqs = _requests(kit, 24)
        out = Fleet(lambda k: Engine(tm, kit.engine(4096)), RoundRobinRouter(), FleetConfig(2)).run(
            reqs
        )
        for k in range(2):
            mine = [r for i, r in enumerate(reqs) if i % 2 == k]
            alone = Engine(tm, kit.engine(4096)).run(mine)
            assert out.record.finish[k::2].tolist() == alone.finish.tolist()

    def test_each_replica_is_exactly_an_engine_given_its_share(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """A replica's decode runs end only at its own requests: one long request on r0
        while r1 takes a request every 4 ms finishes bit for bit as on an engine alone, and
        so does r1's share."""
        reqs = [kit.request(0, 256, 600, t=0.0)] + [
            kit.request(i, 40 + 7 * (i % 5), 20 + i % 9, t=0.004 * i) for i in range(1, 120)
        ]

        class Split(_Recording):
            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                return "r0" if request.request_id == "r0" else "r1"

        out = Fleet(lambda k: Engine(tm, kit.engine(65536)), Split(), FleetConfig(2)).run(reqs)
        for k, share in ((0, reqs[:1]), (1, reqs[1:])):
            alone = Engine(tm, kit.engine(65536)).run(share)
            mine = out.assignment == k
            assert out.record.finish[mine].tobytes() == alone.finish.tobytes()
            assert out.record.first_token[mine].tobytes() == alone.first_token.tobytes()

    def test_four_replicas_keep_the_figures_measured_before_the_speed_up(self) -> None:
        """Four L40S replicas behind round-robin, 600 multi-tenant requests at 16 req/s:
        the figures measured before decode runs were left running across other replicas'
        arrivals (requests in SLO, prefix hits, requests per replica exactly; TTFT to
        float rounding)."""
        w = get_workload("multi-tenant", seed=0, num_requests=600).with_rate(16)
        cfg = attrs.evolve(STACK_PRESETS["vllm"], fleet=FleetConfig(4))
        got = simulate(w.requests, get_model("Llama-3-8B"), get_gpu("L40S"), cfg, seed=0)
        s = got.summary.as_dict()
        assert (s["completed"], s["slo_met"], s["prefix_hit_tokens"]) == (600, 600, 334597)
        assert [r["requests"] for r in s["replicas"]] == [150, 150, 150, 150]
        assert s["ttft"]["p50"] == pytest.approx(0.3306112344560166, rel=1e-12)
        assert s["ttft"]["p99"] == pytest.approx(1.7299939024545516, rel=1e-12)
        assert s["tpot"]["p95"] == pytest.approx(0.0741454059151674, rel=1e-12)

    def test_views_count_the_kv_of_a_decode_run_under_way(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """A replica in the middle of a decode run shows the blocks its iterations over by
        then took: the free blocks a router sees fall between two requests on the other
        replica, with no iteration of the viewed replica settled in between."""
        reqs = [kit.request(0, 64, 400, t=0.0)] + [
            kit.request(i, 16, 2, t=0.5 + 0.25 * i) for i in range(1, 6)
        ]

        class ToSecond(_Recording):
            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                self.seen.append(tuple(replicas))
                return replicas[0].replica_id if request.request_id == "r0" else "r1"

        router = ToSecond()
        Fleet(lambda k: Engine(tm, kit.engine(4096)), router, FleetConfig(2)).run(reqs)
        free = [views[0].free_blocks for views in router.seen[1:]]
        assert free == sorted(free, reverse=True)
        assert free[0] > free[-1]
        assert all(views[0].running == 1 for views in router.seen[1:])

    def test_a_router_blind_to_kv_and_prefix_decides_as_when_shown_all(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Least-requests says it reads neither KV memory nor prefix blocks, so its views'
        are not kept fresh: it places every request, and the run ends, bit for bit as the
        same router behind a wrapper that says nothing (shown everything, fresh)."""
        reqs = _requests(kit, 150, gap=0.001)

        class Sighted:
            def __init__(self) -> None:
                self._inner = LeastRequestsRouter()

            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                return self._inner.route(request, replicas)

        runs = [
            Fleet(lambda k: Engine(tm, kit.engine(4096)), router, FleetConfig(3)).run(reqs)
            for router in (LeastRequestsRouter(), Sighted())
        ]
        assert runs[0].assignment.tobytes() == runs[1].assignment.tobytes()
        assert len(set(runs[0].assignment.tolist())) == 3
        assert runs[0].record.finish.tobytes() == runs[1].record.finish.tobytes()

    def test_a_delayed_view_of_a_decode_run_keeps_its_prefix_cache(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """With a signal delay, a replica in the middle of a long decode run shows the
        routed request's blocks its prefix cache holds (the first request's prompt), and
        KV growing as the run goes."""
        hashes = (11, 12, 13, 14)
        reqs = [kit.request(0, 64, 400, t=0.0, prefix_hashes=hashes)] + [
            kit.request(i, 64, 2, t=0.5 + 0.25 * i, prefix_hashes=hashes) for i in range(1, 6)
        ]

        class ToSecond(_Recording):
            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                self.seen.append(tuple(replicas))
                return replicas[0].replica_id if request.request_id == "r0" else "r1"

        router = ToSecond()
        engine = kit.engine(4096, prefix_caching=True)
        Fleet(lambda k: Engine(tm, engine), router, FleetConfig(2, signal_delay_s=0.1)).run(reqs)
        first = [views[0] for views in router.seen[1:]]
        assert all(v.resident("gpu") == frozenset(hashes) for v in first)
        assert all(v.signal_age_s >= 0.1 for v in first)
        free = [v.free_blocks for v in first]
        assert free == sorted(free, reverse=True)
        assert free[0] > free[-1]

    def test_views_are_as_old_as_the_delay(self, kit: SimpleNamespace, tm: TimingModel) -> None:
        """With a signal delay every view a router sees is at least that old; without one,
        every view is fresh."""
        reqs = _requests(kit, 40, gap=0.01)
        for delay in (0.0, 0.05):
            router = _Recording()
            Fleet(
                lambda k: Engine(tm, kit.engine(4096)),
                router,
                FleetConfig(2, signal_delay_s=delay),
            ).run(reqs)
            ages = [v.signal_age_s for views in router.seen for v in views]
            assert len(router.seen) == 40
            if delay == 0:
                assert set(ages) == {0.0}
            else:
                late = [a for views in router.seen[10:] for a in (v.signal_age_s for v in views)]
                assert min(late) >= delay

    def test_a_router_naming_no_replica_is_an_error(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """A router that answers an id outside the fleet stops the run, naming it."""

        class Wrong:
            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str:
                return "nowhere"

        fleet = Fleet(lambda k: Engine(tm, kit.engine(4096)), Wrong(), FleetConfig(2))
        with pytest.raises(SimError, match="'nowhere'"):
            fleet.run(_requests(kit, 3))


def _same_run(a: object, b: object) -> None:
    """Two simulation results are one run: summary, per-request arrays, memory series and
    replica rows, bit for bit."""
    assert json.dumps(a.summary.as_dict(), sort_keys=True) == json.dumps(  # type: ignore[attr-defined]
        b.summary.as_dict(),
        sort_keys=True,  # type: ignore[attr-defined]
    )
    ra, rb = a.record, b.record  # type: ignore[attr-defined]
    for f in attrs.fields(type(ra)):
        x, y = getattr(ra, f.name), getattr(rb, f.name)
        if isinstance(x, np.ndarray):
            assert x.tobytes() == y.tobytes(), f.name
        else:
            assert x == y or (x != x and y != y), f.name
    fa, fb = a.fleet, b.fleet  # type: ignore[attr-defined]
    assert fa.assignment.tobytes() == fb.assignment.tobytes()
    assert [attrs.astuple(r) for r in fa.replicas] == [attrs.astuple(r) for r in fb.replicas]


class TestApart:
    """With no gateway, no autoscaler and a router that reads no load (round-robin,
    random), the fleet routes every request first and serves each replica's share apart:
    the same run, bit for bit, as the fleet's loop (forced here by saying that the router
    reads load)."""

    @pytest.mark.parametrize(
        ("preset", "fleet", "workload"),
        [
            ("vllm", {"replicas": 8}, "azure-conv-like"),
            ("vllm", {"replicas": 3, "router": "random"}, "multi-tenant"),
            ("vllm", {"replicas": 3, "specs": [{}, {"gpu": "L40S"}]}, "multi-tenant"),
            ("vllm", {"replicas": 4, "signal_delay_s": 0.05}, "multi-tenant"),
            ("vllm", {"replicas": 1}, "multi-tenant"),
            ("kvpolicy-no-gateway", {"replicas": 3}, "multi-tenant"),
        ],
    )
    def test_equals_the_loop(
        self,
        preset: str,
        fleet: dict[str, object],
        workload: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        import kvpolicy.sim._fleet as fleet_module

        w = get_workload(workload, seed=0, num_requests=240)
        w = w.with_rate(5.0 * int(fleet["replicas"]))  # type: ignore[call-overload]
        base = STACK_PRESETS[preset.removesuffix("-no-gateway")]
        if preset.endswith("-no-gateway"):
            base = attrs.evolve(base, gateway=attrs.evolve(base.gateway, name="none"))
        cfg = attrs.evolve(base, fleet=FleetConfig(startup_s=1.0, **fleet))  # type: ignore[arg-type]
        m, g = get_model("Llama-3-8B"), get_gpu("H100-SXM")
        apart = simulate(w.requests, m, g, cfg, seed=0)
        monkeypatch.setattr(fleet_module, "reads_load", lambda router: True)
        looped = simulate(w.requests, m, g, cfg, seed=0)
        assert apart.fleet is not None
        assert looped.fleet is not None
        assert apart.fleet.served_apart
        assert not looped.fleet.served_apart  # the loop
        assert apart.summary.completed > 0
        _same_run(apart, looped)

    def test_a_request_placed_nowhere_waits_as_in_the_loop(
        self, kit: SimpleNamespace, tm: TimingModel, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A router that places a request nowhere (None) leaves it unserved in both paths,
        and the rest run the same."""
        import kvpolicy.sim._fleet as fleet_module

        class Picky:
            reads_load = False

            def __init__(self) -> None:
                self._inner = RoundRobinRouter()

            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
                return None if request.request_id == "r3" else self._inner.route(request, replicas)

        reqs = _requests(kit, 30)
        engines = lambda k: Engine(tm, kit.engine(4096))  # noqa: E731
        apart = Fleet(engines, Picky(), FleetConfig(3)).run(reqs)
        monkeypatch.setattr(fleet_module, "reads_load", lambda router: True)
        looped = Fleet(engines, Picky(), FleetConfig(3)).run(reqs)
        assert apart.served_apart
        assert not looped.served_apart
        assert apart.assignment[3] == looped.assignment[3] == -1
        assert np.isnan(apart.record.finish[3])
        assert apart.assignment.tobytes() == looped.assignment.tobytes()
        assert apart.record.finish.tobytes() == looped.record.finish.tobytes()
        assert apart.record.series_kv_tokens.tobytes() == looped.record.series_kv_tokens.tobytes()

    def test_progress_is_reported_while_a_replica_serves(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Served apart, one replica's long share still reports progress as it goes, up
        to every request done."""
        reqs = _requests(kit, 400)
        seen: list[tuple[int, int]] = []
        Fleet(lambda k: Engine(tm, kit.engine(4096)), RoundRobinRouter(), FleetConfig(1)).run(
            reqs, progress=lambda done, total: seen.append((done, total))
        )
        assert len(seen) > 20
        assert seen[0] == (0, 400)
        assert seen[-1] == (400, 400)
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    def test_coupled_fleets_take_the_loop(
        self, kit: SimpleNamespace, tm: TimingModel, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A router that reads load, a gateway or an autoscaler couple the replicas: the
        loop runs them."""
        import kvpolicy.sim._fleet as fleet_module

        def refuse(run: object, progress: object) -> None:
            raise AssertionError("served apart")

        monkeypatch.setattr(fleet_module._Run, "_apart", refuse)
        reqs = _requests(kit, 20)
        engines = lambda k: Engine(tm, kit.engine(4096))  # noqa: E731
        Fleet(engines, LeastRequestsRouter(), FleetConfig(2)).run(reqs)
        Fleet(engines, _Recording(), FleetConfig(2)).run(reqs)
        Fleet(
            engines,
            RoundRobinRouter(),
            FleetConfig(2, min_replicas=1, max_replicas=3),
            autoscaler=StaticAutoscaler(2),
        ).run(reqs)
        w = get_workload("multi-tenant", seed=0, num_requests=40)
        cfg = attrs.evolve(STACK_PRESETS["kvpolicy"], fleet=FleetConfig(2, startup_s=1.0))
        simulate(w.requests, get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg, seed=0)

    def test_a_router_naming_no_replica_is_an_error(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Served apart, a router answering an id outside the fleet still stops the run."""

        class Wrong:
            reads_load = False

            def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str:
                return "nowhere"

        fleet = Fleet(lambda k: Engine(tm, kit.engine(4096)), Wrong(), FleetConfig(2))
        with pytest.raises(SimError, match="'nowhere'"):
            fleet.run(_requests(kit, 3))


class TestHeterogeneous:
    def test_each_replica_runs_its_spec(self) -> None:
        """Replicas take the specs in turn, each priced at its own GPU's rate."""
        w = get_workload("multi-tenant", seed=0, num_requests=30)
        cfg = StackConfig(fleet=FleetConfig(3, specs=[{}, {"gpu": "L40S"}]))
        out = simulate(w.requests, get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)
        assert out.fleet is not None
        rows = out.fleet.replicas
        assert [(r.model, r.gpu) for r in rows] == [
            ("Llama-3-8B", "H100-SXM"),
            ("Llama-3-8B", "L40S"),
            ("Llama-3-8B", "H100-SXM"),
        ]
        assert [r.price_per_hour for r in rows] == [3.0, 1.0, 3.0]
        assert out.summary.cost_usd == pytest.approx(
            sum(r.price_per_hour * r.gpu_hours for r in rows)
        )


class TestAutoscaling:
    def test_a_new_replica_serves_after_its_provisioning_delay(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """Asked for at the first decision, the second replica serves only once its weights
        are loaded and it started; it is billed from the decision on."""
        cfg = FleetConfig(
            1,
            autoscaler="static",
            max_replicas=2,
            decision_interval_s=0.1,
            load_bandwidth=1e12,
            startup_s=0.05,
        )
        reqs = _requests(kit, 200, gap=0.002)
        out = Fleet(
            lambda k: Engine(tm, kit.engine(4096)),
            RoundRobinRouter(),
            cfg,
            autoscaler=StaticAutoscaler(2),
        ).run(reqs)
        first, second = out.replicas
        delay = provisioning_delay(tm.model.weight_bytes(), 1e12, 0.05)
        assert delay == pytest.approx(16_060_522_496 / 1e12 + 0.05)
        assert second.start_s == pytest.approx(0.1)
        assert second.up_s == pytest.approx(0.1 + delay)
        placed = np.flatnonzero(out.assignment == 1)
        assert placed.size == second.requests > 0
        assert min(reqs[i].arrival_time for i in placed) >= second.up_s - 0.05
        assert np.isfinite(out.record.finish).all()
        assert out.gpu_hours == pytest.approx(
            (first.down_s - first.start_s + second.down_s - second.start_s) / 3600
        )

    def test_scale_down_drains_without_losing_a_request(
        self, kit: SimpleNamespace, tm: TimingModel
    ) -> None:
        """A drained replica takes no request after the decision, finishes those it has,
        and stops when its last one finishes."""
        cfg = FleetConfig(2, autoscaler="static", decision_interval_s=0.05)
        reqs = _requests(kit, 120, gap=0.002)
        out = Fleet(
            lambda k: Engine(tm, kit.engine(4096)),
            RoundRobinRouter(),
            cfg,
            autoscaler=StaticAutoscaler(1),
        ).run(reqs)
        assert np.isfinite(out.record.finish).all()
        drained = [r for r in out.replicas if r.down_s < out.record.end_time]
        assert len(drained) == 1
        k = out.replicas.index(drained[0])
        mine = out.assignment == k
        assert max(reqs[i].arrival_time for i in np.flatnonzero(mine)) <= 0.05 + 0.01
        assert drained[0].down_s == pytest.approx(float(np.max(out.record.finish[mine])))

    @pytest.mark.parametrize("reclaim", [False, True])
    def test_a_rise_takes_a_draining_replica_back(
        self, kit: SimpleNamespace, tm: TimingModel, reclaim: bool
    ) -> None:
        """Asked for 1 replica then 2 again while the drained one still has requests,
        the fleet with ``reclaim_draining`` serves on it again (no third replica, one
        reclaim counted, nothing lost); without it the fleet starts a third."""
        cfg = FleetConfig(
            2,
            autoscaler="static",
            decision_interval_s=0.01,
            startup_s=0.0,
            reclaim_draining=reclaim,
        )
        reqs = [kit.request(i, 64, 400, t=0.002 * i) for i in range(60)]
        scaler = _Schedule([1, 2])
        engines = lambda k: Engine(tm, kit.engine(4096))  # noqa: E731
        out = Fleet(engines, RoundRobinRouter(), cfg, autoscaler=scaler).run(reqs)
        assert np.isfinite(out.record.finish).all()
        assert scaler.draining[1] == 1  # the second decision saw one replica draining
        if reclaim:
            assert len(out.replicas) == 2
            assert out.reclaimed == 1
            # the replica taken back served requests that arrived after it was taken back
            late = out.assignment[[i for i, r in enumerate(reqs) if r.arrival_time > 0.03]]
            assert set(late.tolist()) == {0, 1}
        else:
            assert len(out.replicas) == 3
            assert out.reclaimed == 0


class _Schedule:
    """An autoscaler asking for ``counts`` in turn (the last one from then on), noting how
    many replicas each decision saw draining."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = list(counts)
        self.draining: list[int] = []

    def target(self, view: object) -> int:
        self.draining.append(len(view.draining))  # type: ignore[attr-defined]
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]


class TestBadInput:
    def test_unknown_router_lists_the_known_ones(self, kit: SimpleNamespace) -> None:
        """An unknown router names the field and lists the routers installed."""
        cfg = StackConfig(fleet=FleetConfig(2, router="fastest"))
        with pytest.raises(
            ConfigError, match=r"fleet.router: unknown router 'fastest'.*round-robin"
        ):
            check_config(_requests(kit, 3), get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)

    def test_unknown_autoscaler_lists_the_known_ones(self, kit: SimpleNamespace) -> None:
        """An unknown autoscaler names the field and lists the autoscalers installed."""
        cfg = StackConfig(fleet=FleetConfig(2, autoscaler="magic"))
        with pytest.raises(
            ConfigError, match=r"fleet.autoscaler: unknown autoscaler 'magic'.*static"
        ):
            check_config(_requests(kit, 3), get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)

    @pytest.mark.parametrize(
        ("kw", "message"),
        [
            ({"replicas": 0}, "'replicas' must be >= 1: 0"),
            (
                {"min_replicas": 3, "max_replicas": 2},
                r"'min_replicas' \(3\) must be <= 'max_replicas' \(2\)",
            ),
            ({"signal_delay_s": -1.0}, "'signal_delay_s' must be a finite number >= 0: -1.0"),
            ({"startup_s": -2.0}, "'startup_s' must be a finite number >= 0: -2.0"),
        ],
    )
    def test_bad_values_name_the_field(self, kw: dict[str, object], message: str) -> None:
        """A bad count, bounds or delay is a ValueError naming the field and the value."""
        with pytest.raises(ValueError, match=message):
            FleetConfig(**kw)  # type: ignore[arg-type]

    def test_a_spec_that_does_not_fit_its_gpu_is_named(self, kit: SimpleNamespace) -> None:
        """A replica spec whose model leaves no KV memory on its GPU names the spec."""
        cfg = StackConfig(
            fleet=FleetConfig(2, specs=[{}, {"model": "Llama-3-70B", "gpu": "A100-40GB"}])
        )
        with pytest.raises(ConfigError, match=r"fleet.specs\[1\]: no KV memory: Llama-3-70B"):
            check_config(_requests(kit, 3), get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)

    def test_sweep_parameters_reach_the_fleet(self) -> None:
        """A sweep's fleet.replicas and fleet.router set the fleet; a bad count is named."""
        from kvpolicy.sim import apply_params

        cfg = apply_params(StackConfig(), {"fleet.replicas": 3, "fleet.router": "weighted"})
        assert (cfg.fleet.replicas, cfg.fleet.router.name) == (3, "weighted")
        with pytest.raises(ConfigError, match="'replicas' must be >= 1: 0"):
            apply_params(StackConfig(), {"fleet.replicas": 0})

    def test_fleet_section_in_a_stack_file(self) -> None:
        """A stack's fleet section builds its router and autoscaler choices with params."""
        from kvpolicy.sim import stack_from_dict

        cfg = stack_from_dict(
            {
                "fleet": {
                    "replicas": 2,
                    "router": {"name": "power-of-two", "params": {"seed": 3}},
                    "autoscaler": "threshold",
                    "max_replicas": 4,
                }
            }
        )
        assert (cfg.fleet.replicas, cfg.fleet.max_replicas) == (2, 4)
        assert (cfg.fleet.router.name, cfg.fleet.router.params) == ("power-of-two", {"seed": 3})
        assert cfg.fleet.autoscaler.name == "threshold"
        assert cfg.fleet.specs == ()
        assert ReplicaSpec("Qwen3-8B").gpu is None
