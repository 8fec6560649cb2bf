"""ScoredPolicy's API beyond the Protocol (per-stream queries, rollback, insert_many, errors)
for every policy built on it; the Protocol itself is in test_conformance.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import ScoredPolicy


def _fill(policy: ScoredPolicy) -> None:
    policy.insert("a", np.arange(10, dtype=np.int64))
    policy.insert("b", np.arange(6, dtype=np.int64))
    policy.observe("a", np.arange(10, dtype=np.int64), np.linspace(0.0, 0.2, 10))


class TestAPI:
    """The shared API, for every policy."""

    def test_insert_counts_resident_tokens(self, any_policy: ScoredPolicy) -> None:
        """Inserted tokens are resident, per stream and in total."""
        _fill(any_policy)
        assert any_policy.resident_tokens() == 16
        assert any_policy.stream_tokens("a") == 10
        assert any_policy.resident_positions("b").tolist() == [0, 1, 2, 3, 4, 5]

    def test_evict_meets_budget_and_reports_positions(self, any_policy: ScoredPolicy) -> None:
        """Evict leaves at most the budget and reports exactly the positions that left."""
        _fill(any_policy)
        out = any_policy.evict(9)
        assert any_policy.resident_tokens() <= 9
        gone = sum(p.size for p in out.values())
        assert gone == 16 - any_policy.resident_tokens()
        for stream, pos in out.items():
            assert pos.dtype == np.int64
            assert pos.tolist() == sorted(pos.tolist())
            assert not set(pos.tolist()) & set(any_policy.resident_positions(stream).tolist())

    def test_evict_to_zero_empties_the_cache(self, any_policy: ScoredPolicy) -> None:
        """A zero budget evicts every token, protected ones included."""
        _fill(any_policy)
        out = any_policy.evict(0)
        assert any_policy.resident_tokens() == 0
        assert out["a"].tolist() == list(range(10))

    def test_remove_forgets_the_stream(self, any_policy: ScoredPolicy) -> None:
        """Removing a stream frees its tokens; unknown streams are a no-op."""
        _fill(any_policy)
        any_policy.remove("a")
        any_policy.remove("never-seen")
        assert any_policy.resident_tokens() == 6
        assert any_policy.streams == ("b",)

    def test_rollback_reclaims_at_once(self, any_policy: ScoredPolicy) -> None:
        """Rolled-back draft tokens leave immediately and may be inserted again."""
        _fill(any_policy)
        any_policy.rollback("a", np.array([7, 8, 9]))
        assert any_policy.resident_tokens() == 13
        assert any_policy.resident_positions("a").tolist() == [0, 1, 2, 3, 4, 5, 6]
        any_policy.insert("a", np.array([7, 8]))
        assert any_policy.stream_tokens("a") == 9

    def test_evicted_tokens_can_be_recomputed(self, any_policy: ScoredPolicy) -> None:
        """An evicted position can be inserted again (recomputation)."""
        _fill(any_policy)
        out = any_policy.evict(4)
        stream, pos = next(iter(out.items()))
        any_policy.insert(stream, pos[:1])
        assert any_policy.resident_tokens() == 5

    def test_insert_many_equals_insert(
        self,
        any_policy: ScoredPolicy,
        policy_name: str,
        policy_factories: dict[str, Callable[[], ScoredPolicy]],
    ) -> None:
        """insert_many over several streams matches one insert per stream."""
        other = policy_factories[policy_name]()
        any_policy.insert_many(["x", "y", "x", "z"], np.array([0, 0, 1, 0]))
        other.insert("x", np.array([0, 1]))
        other.insert("y", np.array([0]))
        other.insert("z", np.array([0]))
        assert any_policy.resident_tokens() == other.resident_tokens() == 4
        assert any_policy.resident_positions("x").tolist() == [0, 1]


class TestBadInput:
    """Misuse raises a clear error and changes nothing."""

    def test_duplicate_insert(self, any_policy: ScoredPolicy) -> None:
        """Inserting a resident position raises ValueError naming it."""
        _fill(any_policy)
        with pytest.raises(ValueError, match=r"already resident in stream 'a': \[3\]"):
            any_policy.insert("a", np.array([3, 20]))
        assert any_policy.resident_tokens() == 16
        assert any_policy.stream_tokens("a") == 10

    def test_repeated_positions(self, any_policy: ScoredPolicy) -> None:
        """A position twice in one call raises ValueError."""
        with pytest.raises(ValueError, match="distinct"):
            any_policy.insert("a", np.array([1, 1]))
        assert any_policy.resident_tokens() == 0

    def test_negative_or_2d_positions(self, any_policy: ScoredPolicy) -> None:
        """Negative or 2-D positions raise ValueError, float positions TypeError."""
        with pytest.raises(ValueError, match="non-negative"):
            any_policy.insert("a", np.array([-1]))
        with pytest.raises(ValueError, match="1-D"):
            any_policy.insert("a", np.zeros((2, 2), dtype=np.int64))
        with pytest.raises(TypeError, match="integers"):
            any_policy.insert("a", np.array([0.5]))
        assert any_policy.resident_tokens() == 0

    def test_bad_stream_type(self, any_policy: ScoredPolicy) -> None:
        """A stream id that is not a str raises TypeError, in insert and insert_many."""
        with pytest.raises(TypeError, match="'stream' must be str: 7"):
            any_policy.insert(7, np.array([0]))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"'streams' must hold str ids: \['x'\]"):
            any_policy.insert_many(["a", ["x"]], np.array([0, 1]))  # type: ignore[list-item]
        with pytest.raises(TypeError, match="'stream' must be str: 3"):
            any_policy.insert_many(["a", 3], np.array([0, 1]))  # type: ignore[list-item]
        assert any_policy.resident_tokens() == 0

    def test_observe_unknown_or_evicted(self, any_policy: ScoredPolicy) -> None:
        """Attention for an unknown stream or a non-resident position raises ValueError."""
        _fill(any_policy)
        with pytest.raises(ValueError, match="unknown stream: 'zz'"):
            any_policy.observe("zz", np.array([0]), np.array([0.1]))
        with pytest.raises(ValueError, match=r"not resident in stream 'b': \[6\]"):
            any_policy.observe("b", np.array([5, 6]), np.array([0.1, 0.1]))

    @pytest.mark.parametrize("att", [[np.nan, 0.1], [-0.1, 0.1], [0.1]])
    def test_observe_bad_attention(
        self,
        any_policy: ScoredPolicy,
        policy_name: str,
        policy_factories: dict[str, Callable[[], ScoredPolicy]],
        att: list[float],
    ) -> None:
        """NaN, negative or misshapen attention raises ValueError and changes nothing."""
        twin = policy_factories[policy_name]()
        _fill(any_policy)
        _fill(twin)
        with pytest.raises(ValueError, match="'attention'"):
            any_policy.observe("a", np.array([0, 1]), np.array(att))
        got = {k: v.tolist() for k, v in any_policy.evict(8).items()}
        assert got == {k: v.tolist() for k, v in twin.evict(8).items()}

    @pytest.mark.parametrize(
        ("budget", "exc"), [(-1, ValueError), (2.5, TypeError), (True, TypeError)]
    )
    def test_bad_budget(self, any_policy: ScoredPolicy, budget: object, exc: type) -> None:
        """A budget that is not an int >= 0 raises and evicts nothing."""
        _fill(any_policy)
        with pytest.raises(exc, match="'budget_tokens'"):
            any_policy.evict(budget)  # type: ignore[arg-type]
        assert any_policy.resident_tokens() == 16

    def test_rollback_not_resident(self, any_policy: ScoredPolicy) -> None:
        """Rolling back a position that is not resident raises and frees nothing."""
        _fill(any_policy)
        with pytest.raises(ValueError, match=r"not resident in stream 'b': \[9\]"):
            any_policy.rollback("b", np.array([0, 9]))
        assert any_policy.stream_tokens("b") == 6


_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("observe"), st.integers(0, 3), st.integers(0, 10**6)),
    st.tuples(st.just("evict"), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(st.just("rollback"), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("remove"), st.integers(0, 3), st.just(0)),
)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(_op, max_size=40))
def test_budget_never_exceeded(
    policy_factories: dict[str, Callable[[], ScoredPolicy]], ops: list[tuple[str, int, int]]
) -> None:
    """After every evict(budget) the resident tokens are <= budget, for every policy."""
    for name, factory in policy_factories.items():
        _run_ops(name, factory(), ops)


def _run_ops(name: str, policy: ScoredPolicy, ops: list[tuple[str, int, int]]) -> None:
    rng = np.random.default_rng(0)
    nxt = {f"s{i}": 0 for i in range(4)}
    for op, s, arg in ops:
        stream = f"s{s}"
        if op == "insert":
            pos = np.arange(nxt[stream], nxt[stream] + arg)
            nxt[stream] += arg
            sig = rng.random((arg, 2)) if name.startswith("token-pd") else None
            policy.insert(stream, pos, sig)
        elif op == "observe":
            res = policy.resident_positions(stream)
            if res.size:
                policy.observe(stream, res, np.random.default_rng(arg).random(res.size))
        elif op == "evict":
            out = policy.evict(arg)
            assert policy.resident_tokens() <= arg
            for st_name, pos in out.items():
                assert np.unique(pos).size == pos.size
                assert not np.isin(pos, policy.resident_positions(st_name)).any()
        elif op == "rollback":
            res = policy.resident_positions(stream)
            if res.size:
                policy.rollback(stream, res[-arg:])
                nxt[stream] = int(res[-arg:][0]) if res[-arg:].size else nxt[stream]
        else:
            policy.remove(stream)
            nxt[stream] = 0
        total = sum(policy.stream_tokens(k) for k in nxt)
        assert total == policy.resident_tokens()


class _SignalKey(ScoredPolicy):
    """A policy in a few lines: the key is signal column 0 (a score given at insertion)."""

    def new_keys(self, slots: np.ndarray, signals: np.ndarray | None) -> np.ndarray:
        if signals is None:
            return np.zeros(slots.size)
        return np.asarray(signals[:, 0], dtype=np.float64)


class TestKeyHook:
    """A new policy implements new_keys only and gets the whole Protocol."""

    def test_smallest_score_goes_first_across_streams(self) -> None:
        """The table evicts the smallest keys of every stream, ties oldest first."""
        p = _SignalKey(num_sink=1)
        p.insert("a", np.arange(4), np.array([[0.9], [0.1], [0.5], [0.2]]))
        p.insert("b", np.arange(3), np.array([[0.05], [0.2], [0.3]]))
        out = p.evict(4)
        assert {k: v.tolist() for k, v in out.items()} == {"a": [1, 3], "b": [1]}

    def test_hook_must_be_implemented(self) -> None:
        """A ScoredPolicy without new_keys says which class lacks it."""
        with pytest.raises(NotImplementedError, match="ScoredPolicy must implement new_keys"):
            ScoredPolicy().insert("a", np.arange(2))
