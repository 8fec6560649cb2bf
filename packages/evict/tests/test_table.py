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
