"""The views a router and an autoscaler see, their validation, and their Protocols' groups."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvpolicy.kvmodel import (
    AUTOSCALING,
    GROUPS,
    ROUTING,
    Autoscaler,
    FleetView,
    RegistryError,
    ReplicaView,
    ReplicaViews,
    Router,
    RoutingRequest,
    _registry,
    build,
    reads_kv_usage,
    reads_load,
)


def _view(replica_id: str = "r0", **kw: object) -> ReplicaView:
    args: dict[str, object] = {
        "running": 2,
        "waiting": 1,
        "kv_usage": 0.5,
        "free_blocks": 40,
        "block_size": 16,
    }
    args.update(kw)
    return ReplicaView(replica_id, **args)  # type: ignore[arg-type]


class TestReplicaView:
    def test_prefix_blocks_are_sorted_pairs_of_frozen_sets(self) -> None:
        """A mapping of tiers becomes pairs sorted by tier; lookups answer per tier."""
        view = _view(prefix_blocks={"host": [7, 8], "gpu": (1, 2, 2)})
        assert view.prefix_blocks == (("gpu", frozenset({1, 2})), ("host", frozenset({7, 8})))
        assert view.tiers == ("gpu", "host")
        assert view.resident("gpu") == frozenset({1, 2})
        assert view.resident("disk") == frozenset()

    def test_outstanding_and_defaults(self) -> None:
        """Outstanding requests are running plus waiting; labels and flags default empty."""
        view = _view()
        assert view.outstanding == 3
        assert (view.draining, view.signal_age_s, view.model, view.gpu) == (False, 0.0, "", "")

    def test_views_are_hashable_values(self) -> None:
        """Equal views compare and hash equal."""
        assert hash(_view(prefix_blocks={"gpu": [1]})) == hash(_view(prefix_blocks={"gpu": [1]}))

    @pytest.mark.parametrize(
        ("field", "value", "error", "message"),
        [
            ("running", -1, ValueError, "'running' must be >= 0: -1"),
            ("waiting", 1.5, TypeError, "'waiting' must be an int: 1.5"),
            ("kv_usage", 1.25, ValueError, "'kv_usage' must be <= 1.0: 1.25"),
            ("kv_usage", -0.1, ValueError, "'kv_usage' must be >= 0.0: -0.1"),
            ("kv_usage", True, TypeError, "must be a number: True"),
            ("free_blocks", -3, ValueError, "'free_blocks' must be >= 0: -3"),
            ("block_size", 0, ValueError, "'block_size' must be >= 1: 0"),
            ("draining", 1, TypeError, "'draining' must be <class 'bool'>"),
            ("signal_age_s", -0.5, ValueError, "'signal_age_s' must be >= 0.0: -0.5"),
            ("signal_age_s", float("inf"), ValueError, "'signal_age_s' must be finite: inf"),
            ("prefix_blocks", {"gpu": ["a"]}, TypeError, "'block_hashes' must hold int"),
            ("prefix_blocks", {"": [1]}, TypeError, "tier names must be non-empty str: ''"),
            ("prefix_blocks", 3, TypeError, "'prefix_blocks' must map tier names"),
            ("model", 3, TypeError, "'model' must be <class 'str'>"),
        ],
    )
    def test_bad_field_is_named(
        self, field: str, value: object, error: type[Exception], message: str
    ) -> None:
        """Each field rejects a wrong type (TypeError) or value (ValueError), naming it."""
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            _view(**{field: value})

    def test_empty_replica_id(self) -> None:
        """An empty replica id is refused."""
        with pytest.raises(ValueError, match="'replica_id' must not be empty: ''"):
            _view("")


class TestRoutingRequest:
    def test_fields(self) -> None:
        """Hashes become a tuple; the label defaults to 'default'."""
        request = RoutingRequest("q1", prompt_len=40, block_hashes=[5, 6])
        assert (request.block_hashes, request.label) == ((5, 6), "default")

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"prompt_len": 0}, ValueError, "'prompt_len' must be >= 1: 0"),
            ({"block_hashes": "ab"}, TypeError, "'block_hashes' must be a sequence of int"),
            ({"block_hashes": [1.0]}, TypeError, "'block_hashes' must hold int values: 1.0"),
            ({"label": ""}, ValueError, "'label' must not be empty"),
            ({"request_id": 7}, TypeError, "'request_id' must be a str: 7"),
        ],
    )
    def test_bad_field_is_named(
        self, kw: dict[str, object], error: type[Exception], message: str
    ) -> None:
        """A bad field is named with its value."""
        args: dict[str, object] = {"request_id": "q", "prompt_len": 4, **kw}
        with pytest.raises(error, match=message):
            RoutingRequest(**args)  # type: ignore[arg-type]


class TestFleetView:
    def test_replicas_counts_up_and_provisioning(self) -> None:
        """The count toward a target is up plus provisioning; draining replicas leave."""
        fleet = FleetView(
            time=30.0,
            up=[_view("a"), _view("b")],
            provisioning=["c"],
            draining=[_view("d", draining=True)],
        )
        assert fleet.replicas == 3
        assert fleet.up == (_view("a"), _view("b"))

    @pytest.mark.parametrize(
        ("kw", "error", "message"),
        [
            ({"time": -1.0}, ValueError, "'time' must be >= 0.0: -1.0"),
            ({"arrival_rate": -2}, ValueError, "'arrival_rate' must be >= 0.0: -2.0"),
            ({"queued": -1}, ValueError, "'queued' must be >= 0: -1"),
            ({"tokens_per_s": float("nan")}, ValueError, "'tokens_per_s' must be finite: nan"),
            ({"prefix_hit_rate": 1.5}, ValueError, "'prefix_hit_rate' must be <= 1.0: 1.5"),
            ({"mean_prompt_tokens": -1}, ValueError, "'mean_prompt_tokens' must be >= 0.0"),
            ({"up": [_view("a", draining=True)]}, ValueError, r"'up\[0\]' must have draining"),
            ({"draining": [_view("a")]}, ValueError, r"'draining\[0\]' must have draining"),
            ({"up": ["a"]}, TypeError, r"'up\[0\]' must be a ReplicaView: 'a'"),
            ({"up": [_view("a")], "provisioning": ["a"]}, ValueError, "ids must be unique"),
            ({"provisioning": [""]}, TypeError, r"'provisioning\[0\]' must be a non-empty str"),
            ({"provisioning": "ab"}, TypeError, "'provisioning' must be a sequence"),
        ],
    )
    def test_bad_field_is_named(
        self, kw: dict[str, object], error: type[Exception], message: str
    ) -> None:
        """A bad field is named with its value."""
        args: dict[str, object] = {"time": 0.0, **kw}
        with pytest.raises(error, match=message):
            FleetView(**args)  # type: ignore[arg-type]


class _First:
    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        return next((r.replica_id for r in replicas if not r.draining), None)


class _Two:
    def target(self, fleet: FleetView) -> int:
        return 2


class TestGroups:
    def test_routing_and_autoscaling_groups(self) -> None:
        """Both groups name their entry-point group and Protocol and are among GROUPS."""
        assert (ROUTING.entry_point, ROUTING.kind, ROUTING.protocol) == (
            "kvpolicy.routing",
            "router",
            Router,
        )
        assert (AUTOSCALING.entry_point, AUTOSCALING.kind, AUTOSCALING.protocol) == (
            "kvpolicy.autoscaling",
            "autoscaler",
            Autoscaler,
        )
        assert GROUPS[-2:] == (ROUTING, AUTOSCALING)

    def test_protocols_are_runtime_checkable(self) -> None:
        """A class with route() is a Router, one with target() an Autoscaler."""
        assert isinstance(_First(), Router)
        assert isinstance(_Two(), Autoscaler)
        assert not isinstance(_Two(), Router)

    def test_unknown_names_list_the_known(self) -> None:
        """An unknown router or autoscaler is an error that lists the installed ones."""
        _registry.group_entry_points.cache_clear()
        known = _registry.group_entry_points("kvpolicy.routing")
        listed = ", ".join(sorted(known)) or "none installed"
        with pytest.raises(RegistryError, match=f"unknown router 'nope'; known: {listed}$"):
            build(ROUTING, "nope")
        with pytest.raises(RegistryError, match="unknown autoscaler 'nope'; known: "):
            build(AUTOSCALING, "nope")


class TestReplicaViews:
    def test_checked_when_made(self) -> None:
        """Made from views with unique ids it is a tuple of them, in order."""
        views = ReplicaViews([_view("a"), _view("b")])
        assert isinstance(views, tuple)
        assert [v.replica_id for v in views] == ["a", "b"]
        assert ReplicaViews() == ()

    def test_wrong_item_is_named(self) -> None:
        """An item that is not a ReplicaView is a TypeError naming its index."""
        with pytest.raises(TypeError, match=r"'views\[1\]' must be a ReplicaView: 'b'"):
            ReplicaViews([_view("a"), "b"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="'views' must be a sequence of ReplicaView"):
            ReplicaViews("ab")  # type: ignore[arg-type]

    def test_duplicate_id_is_refused(self) -> None:
        """Two views with one id are a ValueError naming the id."""
        with pytest.raises(ValueError, match="'views' has replica id 'a' twice"):
            ReplicaViews([_view("a"), _view("a")])

    def test_trusted_is_not_checked(self) -> None:
        """``trusted`` makes one without the check (for a fleet's own views)."""
        views = ReplicaViews.trusted([_view("a"), _view("b")])
        assert type(views) is ReplicaViews
        assert views == ReplicaViews([_view("a"), _view("b")])


class TestReadsKVUsage:
    def test_only_a_declared_false_is_false(self) -> None:
        """Only ``reads_kv_usage = False`` says a router never reads KV memory."""

        class Blind:
            reads_kv_usage = False

        class Sighted:
            reads_kv_usage = True

        assert reads_kv_usage(Blind()) is False
        assert reads_kv_usage(Sighted()) is True
        assert reads_kv_usage(object()) is True


class TestReadsLoad:
    def test_only_a_declared_false_is_false(self) -> None:
        """Only ``reads_load = False`` says a router reads no load; anything else (a truthy
        value that is not True included) means it may."""

        class Blind:
            reads_load = False

        class Sighted:
            reads_load = True

        class Vague:
            reads_load = 0

        assert reads_load(Blind()) is False
        assert reads_load(Sighted()) is True
        assert reads_load(Vague()) is True
        assert reads_load(object()) is True
