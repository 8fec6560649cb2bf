"""The shared token table against a brute-force model, on its amortised paths."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpolicy.evict._table as table
from kvpolicy.evict import H2OPolicy


@pytest.fixture
def small_candidates() -> Iterator[None]:
    """Shrink the candidate set so that rebuilds, sampling and ties happen at small sizes."""
    saved = (table._MIN_CANDIDATES, table._CANDIDATE_FACTOR, table._SAMPLE)
    table._MIN_CANDIDATES, table._CANDIDATE_FACTOR, table._SAMPLE = 3, 1, 8
    yield
    table._MIN_CANDIDATES, table._CANDIDATE_FACTOR, table._SAMPLE = saved


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 4), st.integers(1, 20)),
        st.tuples(st.just("observe"), st.integers(0, 4), st.integers(0, 2**16)),
        st.tuples(st.just("evict"), st.integers(0, 4), st.integers(1, 30)),
        st.tuples(st.just("rollback"), st.integers(0, 4), st.integers(1, 4)),
        st.tuples(st.just("remove"), st.integers(0, 4), st.just(0)),
    ),
    max_size=60,
)


def _check_ops(ops: list[tuple[str, int, int]]) -> None:
    policy = H2OPolicy(recent_window=0)
    acc: dict[tuple[str, int], float] = {}
    seq: dict[tuple[str, int], int] = {}
    nxt = {f"s{i}": 0 for i in range(5)}
    counter = 0
    for op, s, arg in ops:
        name = f"s{s}"
        if op == "insert":
            pos = list(range(nxt[name], nxt[name] + arg))
            nxt[name] += arg
            policy.insert(name, np.asarray(pos))
            for p in pos:
                acc[(name, p)] = 0.0
                seq[(name, p)] = counter
                counter += 1
        elif op == "observe":
            res = sorted(p for (n, p) in acc if n == name)
            if res:
                # Few distinct values, so that equal keys (ties) are common.
                att = np.random.default_rng(arg).integers(0, 3, len(res)) / 4.0
                policy.observe(name, np.asarray(res), att)
                for p, a in zip(res, att.tolist(), strict=True):
                    acc[(name, p)] += a
        elif op == "evict":
            k = min(arg, len(acc))
            budget = len(acc) - k
            want: dict[str, list[int]] = {}
            for n, p in sorted(acc, key=lambda t: (acc[t], seq[t]))[:k]:
                want.setdefault(n, []).append(p)
                del acc[(n, p)]
            got = {n: v.tolist() for n, v in policy.evict(budget).items()}
            assert got == {n: sorted(v) for n, v in want.items()}
        elif op == "rollback":
            res = sorted(p for (n, p) in acc if n == name)[-arg:]
            if res:
                policy.rollback(name, np.asarray(res))
                for p in res:
                    del acc[(name, p)]
        else:
            policy.remove(name)
            for key in [t for t in acc if t[0] == name]:
                del acc[key]
        assert policy.resident_tokens() == len(acc)


@pytest.mark.usefixtures("small_candidates")
class TestAgainstBruteForce:
    """Victims equal the smallest (key, insertion) pairs of a plain sorted model."""

    @settings(max_examples=60, deadline=None)
    @given(ops=_ops)
    def test_random_operations(self, ops: list[tuple[str, int, int]]) -> None:
        """Inserts, tied attention, evictions, rollbacks and removals agree with the model."""
        _check_ops(ops)


class TestStreamMap:
    """The flat position map survives growth, removal and compaction."""

    def test_many_streams_come_and_go(self) -> None:
        """Thousands of streams created, grown and removed keep exact positions."""
        policy = H2OPolicy(recent_window=2)
        live: dict[str, int] = {}
        for i in range(1500):
            name = f"r{i}"
            policy.insert(name, np.arange(5 + i % 40))
            live[name] = 5 + i % 40
            if i % 3 == 0:
                old = f"r{i // 2}"
                if old in live:
                    policy.remove(old)
                    del live[old]
        assert policy.resident_tokens() == sum(live.values())
        for name, n in list(live.items())[::97]:
            assert policy.resident_positions(name).tolist() == list(range(n))
        tab = policy.table
        assert tab._map_used - tab._map_garbage == sum(int(tab._span[tab._index[n]]) for n in live)


class TestTokenTable:
    """The table's public API, without a policy."""

    def test_add_lookup_and_keys(self) -> None:
        """Slots come back in the order of the positions; keys are what new_keys gave."""
        tab = table.TokenTable()
        slots = tab.add("a", np.array([2, 0, 1]), lambda s: np.array([0.3, 0.1, 0.2]))
        assert tab.lookup("a", np.array([0, 1, 2])).tolist() == slots[[1, 2, 0]].tolist()
        assert tab.keys(slots).tolist() == [0.3, 0.1, 0.2]
        assert tab.positions_of(slots).tolist() == [2, 0, 1]
        assert tab.insertion_order(slots).tolist() == [0, 1, 2]
        assert tab.resident_tokens() == tab.stream_tokens("a") == 3

    def test_smallest_below_and_release(self) -> None:
        """smallest and below select by key; release reports positions per stream."""
        tab = table.TokenTable()
        a = tab.add("a", np.arange(3), lambda s: np.array([0.5, 0.1, 0.9]))
        tab.add(["b", "b"], np.array([0, 1]), lambda s: np.array([0.2, 0.05]))
        tab.set_keys(a[:1], np.array([0.01]))
        assert sorted(tab.keys(tab.smallest(2)).tolist()) == [0.01, 0.05]
        assert sorted(tab.keys(tab.below(0.15)).tolist()) == [0.01, 0.05, 0.1]
        out = tab.release(tab.smallest(3))
        assert {k: v.tolist() for k, v in out.items()} == {"a": [0, 1], "b": [1]}
        assert tab.resident_positions("a").tolist() == [2]

    def test_protected_tokens_go_last(self) -> None:
        """Sinks and the recent window are selected after every other token."""
        tab = table.TokenTable(num_sink=1, recent_window=1)
        tab.add("a", np.arange(4), lambda s: np.zeros(4))
        assert sorted(tab.positions_of(tab.smallest(2)).tolist()) == [1, 2]
        assert sorted(tab.positions_of(tab.smallest(3)).tolist()) == [0, 1, 2]  # older first

    def test_columns_follow_growth(self) -> None:
        """A policy's column keeps its values when the table grows."""
        tab = table.TokenTable()
        tab.add_column("risk", fill=-1.0)
        first = tab.add("a", np.arange(10), lambda s: np.zeros(10))
        tab.column("risk")[first] = np.arange(10.0)
        tab.add("b", np.arange(5000), lambda s: np.zeros(5000))
        assert tab.column("risk")[first].tolist() == list(np.arange(10.0))
        with pytest.raises(ValueError, match="column 'risk' exists"):
            tab.add_column("risk")

    def test_protect_only_before_the_first_token(self) -> None:
        """Protection grows to the larger setting, and only while the table is new."""
        tab = table.TokenTable(num_sink=2)
        tab.protect(num_sink=1, recent_window=3)
        assert (tab.num_sink, tab.recent_window) == (2, 3)
        tab.add("a", np.arange(2), lambda s: np.zeros(2))
        with pytest.raises(ValueError, match="before the first token"):
            tab.protect(num_sink=4)
        with pytest.raises(TypeError, match="'recent_window' must be int"):
            table.TokenTable(recent_window=1.5)  # type: ignore[arg-type]

    def test_bad_streams_length(self) -> None:
        """One id per position, or ValueError; nothing is added."""
        tab = table.TokenTable()
        with pytest.raises(ValueError, match="'streams' has 1 ids but 'positions' has 2"):
            tab.add(["a"], np.arange(2), lambda s: np.zeros(2))
        assert tab.resident_tokens() == 0


class TestResidentSlots:
    """Every resident slot, per stream or all, and which are protected."""

    def test_resident_slots_follow_positions_and_streams(self) -> None:
        """Slots come back in position order per stream, streams in insertion order."""
        t = table.TokenTable(num_sink=1)
        a = t.add("a", np.array([0, 1, 2]), lambda s: np.zeros(s.size))
        b = t.add("b", np.array([0, 1]), lambda s: np.zeros(s.size))
        t.release(a[1:2])
        assert t.resident_slots("a").tolist() == [a[0], a[2]]
        assert t.resident_slots().tolist() == [a[0], a[2], b[0], b[1]]
        assert t.resident_slots("missing").tolist() == []
        assert t.protected(t.resident_slots()).tolist() == [True, False, True, False]
