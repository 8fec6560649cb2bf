"""Preemption orders: exact orders, composition and bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import CostAware, LastInFirstOut, LeastProgressedFirst, PriorityAware
from kvpolicy.kvmodel import PreemptionPolicy, SequenceView


def make_view(rid: str, **kw: float) -> SequenceView:
    """A running sequence with sensible defaults."""
    args: dict[str, object] = {
        "request_id": rid,
        "prompt_len": 10,
        "generated": 0,
        "kv_tokens": 10,
    }
    args.update(kw)
    return SequenceView(**args)  # type: ignore[arg-type]


BATCH = [
    make_view("a", generated=5, admitted_time=1.0, priority=1, kv_tokens=15, computed_tokens=15),
    make_view("b", generated=2, admitted_time=3.0, priority=0, kv_tokens=12, computed_tokens=12),
    make_view("c", generated=2, admitted_time=2.0, priority=1, kv_tokens=4, computed_tokens=40),
    make_view("d", generated=9, admitted_time=4.0, priority=0, kv_tokens=0, computed_tokens=19),
    make_view("e", generated=0, admitted_time=0.5, priority=2, kv_tokens=10, computed_tokens=10),
]

ORDERS = [LeastProgressedFirst(), LastInFirstOut(), PriorityAware(), CostAware()]


class TestOrders:
    """Each order on one batch."""

    def test_least_progressed_first(self) -> None:
        """Fewest generated tokens first; within a stage the latest admitted."""
        assert LeastProgressedFirst().order(BATCH) == ["e", "b", "c", "a", "d"]

    def test_last_in_first_out(self) -> None:
        """Latest admission first."""
        assert LastInFirstOut().order(BATCH) == ["d", "b", "c", "a", "e"]

    def test_priority_aware(self) -> None:
        """Lowest priority first, LIFO within a level."""
        assert PriorityAware().order(BATCH) == ["d", "b", "c", "a", "e"]

    def test_priority_aware_composes(self) -> None:
        """Another order can decide within a priority level."""
        assert PriorityAware(LeastProgressedFirst()).order(BATCH) == ["b", "d", "c", "a", "e"]

    def test_cost_aware(self) -> None:
        """Least recomputation per byte first; a request freeing nothing goes last."""
        assert CostAware().order(BATCH) == ["b", "a", "e", "c", "d"]
        assert CostAware(bytes_per_token=2).cost_per_byte(BATCH[2]) == 40 / 8
        assert CostAware().cost_per_byte(BATCH[3]) == math.inf

    def test_cost_aware_quadratic_term(self) -> None:
        """With attention weight, long computed prefixes cost more per byte."""
        cost = CostAware(attention_weight=0.1).cost_per_byte(BATCH[0])
        assert cost == pytest.approx((15 + 0.1 * 225 / 2) / 15)


class TestContract:
    """Every order is a PreemptionPolicy returning a permutation."""

    @pytest.mark.parametrize("policy", ORDERS, ids=lambda p: type(p).__name__)
    def test_is_a_preemption_policy(self, policy: PreemptionPolicy) -> None:
        """The runtime-checkable Protocol holds and an empty batch gives []."""
        assert isinstance(policy, PreemptionPolicy)
        assert policy.order([]) == []

    @pytest.mark.parametrize("policy", ORDERS, ids=lambda p: type(p).__name__)
    def test_duplicate_ids(self, policy: PreemptionPolicy) -> None:
        """A request id twice raises ValueError."""
        with pytest.raises(ValueError, match="request id 'a' twice"):
            policy.order([BATCH[0], BATCH[0]])

    @pytest.mark.parametrize("policy", ORDERS, ids=lambda p: type(p).__name__)
    def test_wrong_item(self, policy: PreemptionPolicy) -> None:
        """A non-SequenceView item raises TypeError."""
        with pytest.raises(TypeError, match="SequenceView"):
            policy.order(["a"])  # type: ignore[list-item]

    def test_bad_parameters(self) -> None:
        """Bad constructor arguments raise naming the parameter."""
        with pytest.raises(ValueError, match="'bytes_per_token' must be > 0: 0"):
            CostAware(bytes_per_token=0)
        with pytest.raises(ValueError, match="'attention_weight'"):
            CostAware(attention_weight=-1.0)
        with pytest.raises(TypeError, match="'within' must be a PreemptionPolicy"):
            PriorityAware(within="lifo")  # type: ignore[arg-type]


_views = st.lists(
    st.builds(
        make_view,
        rid=st.text("abcdefgh", min_size=1, max_size=3),
        generated=st.integers(0, 50),
        admitted_time=st.floats(0, 100),
        priority=st.integers(-2, 2),
        kv_tokens=st.integers(0, 100),
        computed_tokens=st.integers(0, 100),
    ),
    max_size=12,
    unique_by=lambda v: v.request_id,
)


@settings(max_examples=50, deadline=None)
@given(views=_views)
def test_orders_are_permutations(views: list[SequenceView]) -> None:
    """Every order returns each running id exactly once, whatever the batch."""
    for policy in ORDERS:
        assert sorted(policy.order(views)) == sorted(v.request_id for v in views)
