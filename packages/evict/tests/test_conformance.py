"""Conformance of every eviction policy and wrapper to kvmodel's EvictionPolicy Protocol.

Parametrized over :func:`kvpolicy.evict.default_policies` (every registered policy built with
its defaults, and the wrappers); only the Protocol's methods are used.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import default_policies
from kvpolicy.kvmodel import EvictionPolicy

LABELS = sorted(default_policies())


@pytest.fixture(params=LABELS)
def policy(request: pytest.FixtureRequest) -> EvictionPolicy:
    """A fresh instance of each policy in turn."""
    return default_policies()[request.param]


class _Model:
    """What the caller knows: the resident positions of each stream."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.resident: dict[str, set[int]] = {}
        self.next: dict[str, int] = {}
        self.rng = np.random.default_rng(0)

    def insert(self, stream: str, n: int) -> None:
        start = self.next.get(stream, 0)
        pos = np.arange(start, start + n, dtype=np.int64)
        signals = np.column_stack((self.rng.random(n) * 0.1, self.rng.random(n) * 0.01))
        self.policy.insert(stream, pos, signals)
        self.next[stream] = start + n
        self.resident.setdefault(stream, set()).update(pos.tolist())

    def observe(self, stream: str, seed: int) -> None:
        pos = np.array(sorted(self.resident.get(stream, ())), dtype=np.int64)
        if pos.size:
            att = np.random.default_rng(seed).random(pos.size)
            self.policy.observe(stream, pos, att / att.sum())

    def evict(self, budget: int) -> None:
        out = self.policy.evict(budget)
        assert self.policy.resident_tokens() <= budget
        for stream, pos in out.items():
            assert pos.dtype == np.int64
            gone = pos.tolist()
            assert len(set(gone)) == len(gone)
            assert set(gone) <= self.resident[stream], "evicted a position that was not resident"
            self.resident[stream] -= set(gone)

    def remove(self, stream: str) -> None:
        self.policy.remove(stream)
        self.resident.pop(stream, None)
        self.next.pop(stream, None)

    def check(self) -> None:
        assert self.policy.resident_tokens() == sum(len(p) for p in self.resident.values())


class TestProtocol:
    """The contract every eviction policy keeps."""

    def test_is_an_eviction_policy(self, policy: EvictionPolicy) -> None:
        """The policy satisfies the runtime-checkable Protocol."""
        assert isinstance(policy, EvictionPolicy)

    def test_inserted_tokens_are_resident(self, policy: EvictionPolicy) -> None:
        """Every inserted token counts as resident until evicted."""
        m = _Model(policy)
        m.insert("a", 10)
        m.insert("b", 6)
        assert policy.resident_tokens() == 16

    def test_evict_meets_the_budget(self, policy: EvictionPolicy) -> None:
        """After evict(budget) at most budget tokens remain, all of them accounted for."""
        m = _Model(policy)
        m.insert("a", 10)
        m.insert("b", 6)
        m.observe("a", 1)
        m.evict(9)
        m.check()

    def test_evict_to_zero_empties_the_cache(self, policy: EvictionPolicy) -> None:
        """A zero budget evicts every token, protected ones included."""
        m = _Model(policy)
        m.insert("a", 10)
        m.evict(0)
        assert policy.resident_tokens() == 0
        assert m.resident["a"] == set()

    def test_remove_forgets_the_stream(self, policy: EvictionPolicy) -> None:
        """Removing a stream frees its tokens and its positions can be inserted anew."""
        m = _Model(policy)
        m.insert("a", 10)
        m.insert("b", 6)
        m.remove("a")
        policy.remove("never-seen")
        assert policy.resident_tokens() == 6
        m.insert("a", 3)
        assert policy.resident_tokens() == 9
        m.evict(4)
        m.check()

    def test_evicted_positions_can_be_inserted_again(self, policy: EvictionPolicy) -> None:
        """An evicted position may be recomputed and inserted again."""
        m = _Model(policy)
        m.insert("a", 8)
        m.evict(3)
        gone = sorted(set(range(8)) - m.resident["a"])
        policy.insert("a", np.array(gone[:1], dtype=np.int64))
        assert policy.resident_tokens() == len(m.resident["a"]) + 1

    def test_observe_of_a_non_resident_position_raises(self, policy: EvictionPolicy) -> None:
        """Attention for a position that is not resident is a ValueError."""
        m = _Model(policy)
        m.insert("a", 4)
        with pytest.raises(ValueError, match="not resident"):
            policy.observe("a", np.array([9]), np.array([0.5]))

    @pytest.mark.parametrize(
        ("budget", "exc"), [(-1, ValueError), (2.5, TypeError), (True, TypeError)]
    )
    def test_bad_budget(self, policy: EvictionPolicy, budget: object, exc: type) -> None:
        """A budget that is not an int >= 0 raises, naming it, and evicts nothing."""
        m = _Model(policy)
        m.insert("a", 5)
        with pytest.raises(exc, match="'budget_tokens'"):
            policy.evict(budget)  # type: ignore[arg-type]
        assert policy.resident_tokens() == 5


_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("observe"), st.integers(0, 3), st.integers(0, 10**6)),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(st.just("remove"), st.integers(0, 3), st.just(0)),
)


@pytest.mark.parametrize("label", LABELS)
@settings(max_examples=25, deadline=None)
@given(ops=st.lists(_op, max_size=40))
def test_budget_never_exceeded(label: str, ops: list[tuple[str, int, int]]) -> None:
    """Under any sequence of operations evict(budget) leaves <= budget tokens, evicts only
    resident positions, and the resident count matches what the caller was told."""
    m = _Model(default_policies()[label])
    for op, s, arg in ops:
        stream = f"s{s}"
        if op == "insert":
            m.insert(stream, arg)
        elif op == "observe":
            m.observe(stream, arg)
        elif op == "evict":
            m.evict(arg)
        else:
            m.remove(stream)
        m.check()
