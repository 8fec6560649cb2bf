"""TTL policies: FixedTTL, GroupTTL, group_key."""

from __future__ import annotations

import math

import pytest

from kvpolicy.tiers import FixedTTL, GroupTTL, TTLPolicy, group_key


class TestFixedTTL:
    def test_named_tiers_get_their_ttl_others_the_default(self) -> None:
        """Each tier's TTL; unnamed tiers never expire."""
        p = FixedTTL({"disk": 60.0})
        assert p.ttl(1, "disk") == 60.0
        assert p.ttl(1, "dram") == math.inf
        assert FixedTTL(default=5.0).ttl(1, "dram") == 5.0

    def test_is_a_ttl_policy(self) -> None:
        """FixedTTL and GroupTTL satisfy the TTLPolicy protocol."""
        assert isinstance(FixedTTL(), TTLPolicy)
        assert isinstance(GroupTTL({}, residual=1.0), TTLPolicy)

    @pytest.mark.parametrize(
        ("ttls", "exc", "needle"),
        [
            ({"disk": -1.0}, ValueError, "'ttls\\['disk'\\]' must be >= 0"),
            ({"disk": float("nan")}, ValueError, "'ttls\\['disk'\\]'"),
            ({"disk": "1"}, TypeError, "'ttls\\['disk'\\]' must be a number"),
            ({3: 1.0}, TypeError, "'ttls' keys must be tier names: 3"),
        ],
    )
    def test_bad_ttls_raise(
        self, ttls: dict[object, object], exc: type[Exception], needle: str
    ) -> None:
        """Negative, NaN or non-number TTLs and non-string tiers are refused."""
        with pytest.raises(exc, match=needle):
            FixedTTL(ttls)  # type: ignore[arg-type]


class TestGroupKey:
    def test_depth_names_the_subtree(self) -> None:
        """The key is the chain's block at depth - 1; shallower blocks name themselves."""
        chain = [10, 11, 12, 13]
        assert [group_key(chain, p, 1) for p in range(4)] == [10, 10, 10, 10]
        assert [group_key(chain, p, 2) for p in range(4)] == [10, 11, 11, 11]
        assert [group_key(chain, p, 3) for p in range(4)] == [10, 11, 12, 12]


class TestGroupTTL:
    def test_assigned_blocks_get_their_group_ttl_in_the_governed_tier(self) -> None:
        """Blocks of a top-K group get its TTL; unknown blocks the residual; other tiers base."""
        p = GroupTTL({7: 900.0, 8: 30.0}, residual=5.0, base=FixedTTL({"dram": 100.0}))
        p.assign([7, 70, 71])
        p.assign([8, 80])
        p.assign([9, 90])
        assert [p.ttl(h, "disk") for h in (7, 70, 71, 8, 80, 9, 90, 12345)] == [
            900.0,
            900.0,
            900.0,
            30.0,
            30.0,
            5.0,
            5.0,
            5.0,
        ]
        assert p.ttl(70, "dram") == 100.0
        assert p.group_of(71) == 7
        assert p.group_of(90) is None

    def test_depth_two_groups_below_a_shared_root(self) -> None:
        """With depth 2 the shared first block is its own group and the rest split."""
        p = GroupTTL({0: 1.0, 5: 50.0}, residual=2.0, depth=2)
        p.assign([0, 5, 6])
        p.assign([0, 9, 10])
        assert [p.group_of(h) for h in (0, 5, 6, 9, 10)] == [0, 5, 5, None, None]

    def test_labels_are_bounded(self) -> None:
        """Beyond max_labels the least recently assigned blocks fall back to the residual."""
        p = GroupTTL({1: 10.0}, residual=0.0, max_labels=3)
        p.assign([1, 2, 3, 4, 5])
        assert [p.group_of(h) for h in (1, 2, 3, 4, 5)] == [None, None, 1, 1, 1]

    def test_assign_rejects_non_int_hashes_without_learning(self) -> None:
        """A bad hash raises TypeError and no block of that chain is labelled."""
        p = GroupTTL({1: 10.0}, residual=0.0)
        with pytest.raises(TypeError, match="'block_hashes' must hold int hashes: 'x'"):
            p.assign([1, 2, "x"])  # type: ignore[list-item]
        assert p.group_of(1) is None

    @pytest.mark.parametrize(
        ("kwargs", "exc", "needle"),
        [
            ({"depth": 0}, ValueError, "'depth' must be >= 1: 0"),
            ({"max_labels": 0}, ValueError, "'max_labels' must be >= 1: 0"),
            ({"residual": -1.0}, ValueError, "'residual' must be >= 0"),
            ({"tier": ""}, TypeError, "'tier' must be a non-empty str"),
            ({"base": object()}, TypeError, "'base' must be a TTLPolicy"),
        ],
    )
    def test_bad_arguments_raise(
        self, kwargs: dict[str, object], exc: type[Exception], needle: str
    ) -> None:
        """Each bad argument is named in the error."""
        args: dict[str, object] = {"residual": 1.0}
        args.update(kwargs)
        with pytest.raises(exc, match=needle):
            GroupTTL({}, **args)  # type: ignore[arg-type]
