"""Conformance of every router and autoscaler this package declares, built by name.

Routers: never a draining or unknown replica, None only when no replica is eligible, the
same choices for the same seed and inputs, bad params named. Autoscalers: the target within
``[min_replicas, max_replicas]``, never below 1, monotone in demand, bad bounds named.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

import attrs
import pytest

from kvpolicy.kvmodel import (
    AUTOSCALING,
    ROUTING,
    Autoscaler,
    FleetView,
    RegistryError,
    ReplicaView,
    ReplicaViews,
    Router,
    RoutingRequest,
    build,
    describe,
    reads_kv_usage,
    reads_load,
    reads_prefix_blocks,
)


def _declared(group: str) -> list[str]:
    """Entry points of ``group`` that kvpolicy-admit declares."""
    eps = entry_points(group=group)
    return sorted(ep.name for ep in eps if ep.value.startswith("kvpolicy.admit:"))


ROUTERS = _declared(ROUTING.entry_point)
AUTOSCALERS = _declared(AUTOSCALING.entry_point)

ROUTER_PARAMS: Mapping[str, Mapping[str, object]] = {
    "mixing": {"classes": [(30, 6, 0.5), (30, 10, 0.5)]},
}
AUTOSCALER_PARAMS: Mapping[str, Mapping[str, object]] = {
    "planner": {"per_replica_tokens_per_s": 1000.0, "min_replicas": 1, "max_replicas": 8},
    "static": {"replicas": 3},
    "threshold": {"min_replicas": 1, "max_replicas": 8},
}


def test_every_declared_name_is_covered() -> None:
    """The suites run over the routers and autoscalers the issue asks for, at least."""
    assert set(ROUTERS) >= {
        "least-kv",
        "least-requests",
        "mixing",
        "power-of-two",
        "prefix-aware",
        "random",
        "round-robin",
        "weighted",
    }
    assert set(AUTOSCALERS) >= {"planner", "static", "threshold"}


BAD_ROUTER_PARAMS: Mapping[str, tuple[str, object, str]] = {
    "mixing": ("classes", [], r"'classes' must not be empty: \[\]"),
    "power-of-two": ("seed", 1.5, r"'seed' must be an int: 1\.5"),
    "prefix-aware": ("tier_weights", {"gpu": 2.0}, r"'tier_weights\['gpu'\]' must be in"),
    "random": ("seed", "x", "'seed' must be an int: 'x'"),
    "weighted": ("scorers", {"latency": 1.0}, "'scorers' names unknown scorer 'latency'"),
}


def test_unknown_names_list_the_known() -> None:
    """An unknown router or autoscaler lists the installed ones."""
    with pytest.raises(RegistryError, match=r"unknown router 'nope'; known: .*least-kv"):
        build(ROUTING, "nope")
    with pytest.raises(RegistryError, match=r"unknown autoscaler 'nope'; known: .*planner"):
        build(AUTOSCALING, "nope")


def _router(name: str, **extra: object) -> Router:
    return build(ROUTING, name, {**ROUTER_PARAMS.get(name, {}), **extra})


def _random_fleet(rng: random.Random, n: int) -> list[ReplicaView]:
    return [
        ReplicaView(
            f"r{i}",
            running=rng.randrange(8),
            waiting=rng.randrange(4),
            kv_usage=rng.random(),
            free_blocks=rng.randrange(100),
            block_size=16,
            prefix_blocks={"gpu": rng.sample(range(8), 3), "host": rng.sample(range(8), 3)},
            draining=rng.random() < 0.3,
        )
        for i in range(n)
    ]


def _decides_alike(
    name: str, seed: int, move: Callable[[ReplicaView, random.Random], ReplicaView]
) -> None:
    """Two routers ``name`` built alike choose alike over 200 random fleets, one shown the
    views, the other each view ``move``d."""
    rng = random.Random(seed)
    seen, other = _router(name), _router(name)
    for step in range(200):
        fleet = _random_fleet(rng, rng.randrange(1, 6))
        moved = [move(r, rng) for r in fleet]
        (request,) = _requests(rng, 1)
        assert seen.route(request, fleet) == other.route(request, moved), step


def _requests(rng: random.Random, n: int) -> list[RoutingRequest]:
    return [
        RoutingRequest(
            f"q{i}",
            prompt_len=64,
            block_hashes=tuple(range(rng.randrange(5))),
            label=str(rng.randrange(2)),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("name", ROUTERS)
class TestRouterConformance:
    def test_is_a_router(self, name: str) -> None:
        """Built by name, it implements the Router Protocol."""
        assert isinstance(_router(name), Router)

    def test_only_eligible_replicas(self, name: str) -> None:
        """Over random fleets every answer is a non-draining replica of the list, and None
        exactly when every replica drains."""
        rng = random.Random(1)
        router = _router(name)
        for step in range(200):
            fleet = _random_fleet(rng, rng.randrange(1, 6))
            (request,) = _requests(rng, 1)
            choice = router.route(request, fleet)
            eligible = {r.replica_id for r in fleet if not r.draining}
            if eligible:
                assert choice in eligible, (step, choice)
            else:
                assert choice is None

    def test_prefix_blocks_unread_when_it_says_so(self, name: str) -> None:
        """A router saying ``reads_prefix_blocks = False`` decides the same without its
        views' prefix blocks (a gateway may leave them out)."""
        if reads_prefix_blocks(_router(name)):
            return
        rng = random.Random(3)
        with_blocks, without = _router(name), _router(name)
        for step in range(200):
            fleet = _random_fleet(rng, rng.randrange(1, 6))
            bare = [attrs.evolve(r, prefix_blocks={}) for r in fleet]
            (request,) = _requests(rng, 1)
            assert with_blocks.route(request, fleet) == without.route(request, bare), step

    def test_kv_usage_unread_when_it_says_so(self, name: str) -> None:
        """A router saying ``reads_kv_usage = False`` decides the same whatever its views'
        KV memory (a simulator may show it as of each replica's last change)."""
        if not reads_kv_usage(_router(name)):
            _decides_alike(
                name,
                4,
                lambda r, rng: attrs.evolve(
                    r, kv_usage=rng.random(), free_blocks=rng.randrange(100)
                ),
            )

    def test_load_unread_when_it_says_so(self, name: str) -> None:
        """A router saying ``reads_load = False`` decides the same whatever its views say of
        load (counts, KV memory, prefix blocks, signal age): only ids, order and draining
        (a simulator may then route a fixed fleet's requests before serving them)."""
        if not reads_load(_router(name)):
            _decides_alike(
                name,
                6,
                lambda r, rng: attrs.evolve(
                    r,
                    running=rng.randrange(50),
                    waiting=rng.randrange(50),
                    kv_usage=rng.random(),
                    free_blocks=rng.randrange(1000),
                    prefix_blocks={"gpu": rng.sample(range(8), rng.randrange(4))},
                    signal_age_s=rng.random(),
                ),
            )

    def test_replica_views_decide_as_a_list(self, name: str) -> None:
        """Shown its views as a checked :class:`ReplicaViews` (taken as it is), it decides
        as it does on the same views in a list (checked item by item)."""
        rng = random.Random(5)
        listed, checked = _router(name), _router(name)
        for step in range(200):
            fleet = _random_fleet(rng, rng.randrange(0, 6))
            (request,) = _requests(rng, 1)
            assert listed.route(request, fleet) == checked.route(request, ReplicaViews(fleet)), step

    def test_empty_fleet(self, name: str) -> None:
        """No replica at all: None."""
        (request,) = _requests(random.Random(0), 1)
        assert _router(name).route(request, []) is None

    def test_deterministic(self, name: str) -> None:
        """Two routers built alike choose alike on the same sequence of requests."""
        rng = random.Random(2)
        fleets = [_random_fleet(rng, 4) for _ in range(50)]
        requests = _requests(rng, 50)
        first, second = _router(name), _router(name)
        assert [first.route(q, f) for q, f in zip(requests, fleets, strict=True)] == [
            second.route(q, f) for q, f in zip(requests, fleets, strict=True)
        ]

    def test_unknown_param_is_named(self, name: str) -> None:
        """A param the router does not take is named, with the accepted ones."""
        with pytest.raises(RegistryError, match=f"router '{name}': unknown param 'nope'"):
            _router(name, nope=1)

    def test_bad_param_value_is_named(self, name: str) -> None:
        """A bad value of a router's param is an error naming the param and the value."""
        if name not in BAD_ROUTER_PARAMS:
            assert describe(ROUTING, name) == (), "add a bad value for it"
            return
        param, value, message = BAD_ROUTER_PARAMS[name]
        with pytest.raises(RegistryError, match=f"router '{name}': {message}"):
            _router(name, **{param: value})

    def test_wrong_replica_type(self, name: str) -> None:
        """A replica that is not a ReplicaView is a TypeError naming it."""
        (request,) = _requests(random.Random(0), 1)
        with pytest.raises(TypeError, match=r"'replicas\[0\]' must be a ReplicaView"):
            _router(name).route(request, ["r0"])  # type: ignore[list-item]


def test_seeded_routers_follow_their_seed() -> None:
    """Seeded routers differ between seeds on the same inputs (the seed is used)."""
    rng = random.Random(3)
    fleets = [_random_fleet(rng, 6) for _ in range(50)]
    requests = _requests(rng, 50)
    for name in ("random", "power-of-two"):
        runs = []
        for seed in (0, 1):
            router = _router(name, seed=seed)
            runs.append([router.route(q, f) for q, f in zip(requests, fleets, strict=True)])
        assert runs[0] != runs[1], name


def _fleet_at(level: float, up: int = 4) -> FleetView:
    """A fleet whose every demand signal grows with ``level`` in [0, 1]."""
    views = tuple(
        ReplicaView(
            f"r{i}",
            running=int(8 * level),
            waiting=int(12 * level),
            kv_usage=level,
            free_blocks=int(100 * (1 - level)),
            block_size=16,
        )
        for i in range(up)
    )
    return FleetView(
        time=0.0,
        up=views,
        arrival_rate=40.0 * level,
        queued=int(20 * level),
        tokens_per_s=8000.0 * level,
        mean_prompt_tokens=200.0,
        mean_output_tokens=100.0,
    )


def _autoscaler(name: str, **extra: object) -> Autoscaler:
    return build(AUTOSCALING, name, {**AUTOSCALER_PARAMS.get(name, {}), **extra})


@pytest.mark.parametrize("name", AUTOSCALERS)
class TestAutoscalerConformance:
    def test_is_an_autoscaler(self, name: str) -> None:
        """Built by name, it implements the Autoscaler Protocol."""
        assert isinstance(_autoscaler(name), Autoscaler)

    def test_within_bounds_and_monotone_in_demand(self, name: str) -> None:
        """From demand 0 to overload, each target is within its bounds and never falls."""
        params = AUTOSCALER_PARAMS[name]
        low = int(params.get("min_replicas", params.get("replicas", 1)))  # type: ignore[call-overload]
        high = int(params.get("max_replicas", params.get("replicas", 1)))  # type: ignore[call-overload]
        targets = [_autoscaler(name).target(_fleet_at(level / 10)) for level in range(11)]
        assert all(low <= t <= high for t in targets), targets
        assert targets == sorted(targets), targets

    def test_wrong_fleet_type(self, name: str) -> None:
        """A fleet that is not a FleetView is a TypeError naming 'fleet'."""
        with pytest.raises(TypeError, match="'fleet' must be a FleetView"):
            _autoscaler(name).target("fleet")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(set(AUTOSCALERS) - {"static"}))
def test_min_above_max_is_named(name: str) -> None:
    """min_replicas > max_replicas is an error naming the field and its value."""
    with pytest.raises(RegistryError, match="'min_replicas' must be <= 'max_replicas' \\(2\\): 3"):
        _autoscaler(name, min_replicas=3, max_replicas=2)


@pytest.mark.parametrize("name", AUTOSCALERS)
def test_replicas_below_one_are_named(name: str) -> None:
    """A replica bound below 1 is an error naming the field and its value."""
    field = "replicas" if name == "static" else "min_replicas"
    with pytest.raises(RegistryError, match=f"'{field}' must be >= 1: 0"):
        _autoscaler(name, **{field: 0})
