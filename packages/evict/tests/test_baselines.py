"""FIFO, LRU, H2O and sink+window: exact eviction orders."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.evict import FIFOPolicy, H2OPolicy, LRUPolicy, SinkWindowPolicy


def _evicted(out: dict[str, np.ndarray] | object) -> dict[str, list[int]]:
    assert isinstance(out, dict)
    return {k: v.tolist() for k, v in out.items()}


class TestFIFO:
    """First in, first out across streams."""

    def test_oldest_inserted_goes_first_across_streams(self) -> None:
        """Tokens leave in insertion order, whichever stream they belong to."""
        p = FIFOPolicy()
        p.insert("a", np.array([0, 1]))
        p.insert("b", np.array([0, 1, 2]))
        p.insert("a", np.array([2]))
        assert _evicted(p.evict(2)) == {"a": [0, 1], "b": [0, 1]}
        assert _evicted(p.evict(1)) == {"b": [2]}
        assert p.resident_positions("a").tolist() == [2]

    def test_attention_is_ignored(self) -> None:
        """Observed attention does not change the order."""
        p = FIFOPolicy()
        p.insert("a", np.arange(4))
        p.observe("a", np.arange(4), np.array([9.0, 0.0, 0.0, 0.0]))
        assert _evicted(p.evict(3)) == {"a": [0]}


class TestLRU:
    """Least recently used across streams."""

    def test_attended_tokens_are_refreshed(self) -> None:
        """A token attended after insertion outlives younger unattended ones."""
        p = LRUPolicy(access_threshold=0.05)
        p.insert("a", np.arange(4))
        p.insert("b", np.arange(2))
        p.observe("a", np.array([0, 1, 2]), np.array([0.5, 0.01, 0.2]))
        # Use order: a3, b0, b1 (insert), a1 below threshold keeps its insert stamp.
        assert _evicted(p.evict(2)) == {"a": [1, 3], "b": [0, 1]}
        assert p.resident_positions("a").tolist() == [0, 2]

    def test_default_refreshes_only_above_average_attention(self) -> None:
        """By default a token is used only when it gets more than the mean attention."""
        p = LRUPolicy()
        p.insert("a", np.arange(4))
        p.observe("a", np.arange(4), np.array([0.7, 0.1, 0.1, 0.1]))
        assert _evicted(p.evict(1)) == {"a": [1, 2, 3]}
        fifo = FIFOPolicy()
        fifo.insert("a", np.arange(4))
        assert _evicted(fifo.evict(1)) == {"a": [0, 1, 2]}

    def test_threshold_is_validated(self) -> None:
        """A negative or NaN threshold raises ValueError, a string TypeError."""
        with pytest.raises(ValueError, match="'access_threshold'"):
            LRUPolicy(access_threshold=-1.0)
        with pytest.raises(ValueError, match="'access_threshold'"):
            LRUPolicy(access_threshold=float("nan"))
        with pytest.raises(TypeError, match="'access_threshold'"):
            LRUPolicy(access_threshold="0")  # type: ignore[arg-type]


class TestH2O:
    """Heavy hitters plus a recent window."""

    def test_heavy_hitters_and_window_stay(self) -> None:
        """The least attended tokens outside the window go; the window stays."""
        p = H2OPolicy(recent_window=2)
        p.insert("a", np.arange(6))
        p.observe("a", np.arange(6), np.array([0.4, 0.1, 0.3, 0.0, 0.1, 0.1]))
        p.observe("a", np.arange(6), np.array([0.1, 0.0, 0.0, 0.1, 0.4, 0.4]))
        # Accumulated: [0.5, 0.1, 0.3, 0.1, 0.5, 0.5]; window = positions 4, 5.
        assert _evicted(p.evict(3)) == {"a": [1, 2, 3]}
        assert p.accumulated_attention("a", np.array([0, 4])).tolist() == [0.5, 0.5]

    def test_window_slides_with_new_tokens(self) -> None:
        """A token leaving the window competes on its accumulated attention."""
        p = H2OPolicy(recent_window=1)
        p.insert("a", np.array([0]))
        p.observe("a", np.array([0]), np.array([1.0]))
        p.insert("a", np.array([1]))
        p.insert("a", np.array([2]))
        # Position 1 left the window with 0 attention; position 0 has 1.0.
        assert _evicted(p.evict(2)) == {"a": [1]}

    def test_batch_global_across_heads(self) -> None:
        """Per-head streams compete for one budget."""
        p = H2OPolicy(recent_window=1)
        for head, att in (("r/h0", [0.9, 0.05, 0.05]), ("r/h1", [0.2, 0.4, 0.4])):
            p.insert(head, np.arange(3))
            p.observe(head, np.arange(3), np.array(att))
        assert _evicted(p.evict(4)) == {"r/h0": [1], "r/h1": [0]}

    def test_window_goes_last_when_budget_demands(self) -> None:
        """With a budget below the windows, protected tokens go oldest first."""
        p = H2OPolicy(recent_window=3)
        p.insert("a", np.arange(3))
        p.insert("b", np.arange(3))
        assert _evicted(p.evict(2)) == {"a": [0, 1, 2], "b": [0]}

    def test_recent_window_is_validated(self) -> None:
        """A negative window raises ValueError, a float TypeError."""
        with pytest.raises(ValueError, match="'recent_window' must be >= 0: -1"):
            H2OPolicy(recent_window=-1)
        with pytest.raises(TypeError, match="'recent_window' must be int"):
            H2OPolicy(recent_window=2.0)  # type: ignore[arg-type]

    def test_default_recent_window(self) -> None:
        """Without arguments the 32 newest positions of each stream are protected."""
        p = H2OPolicy()
        assert p.table.recent_window == H2OPolicy.DEFAULT_RECENT_WINDOW == 32
        p.insert("a", np.arange(40))
        p.observe("a", np.arange(40), np.r_[np.full(8, 0.01), np.full(32, 0.0)])
        assert _evicted(p.evict(32)) == {"a": list(range(8))}


class TestSinkWindow:
    """StreamingLLM sinks plus the newest tokens."""

    def test_sinks_stay_oldest_non_sinks_go(self) -> None:
        """The oldest non-sink tokens across streams are trimmed first."""
        p = SinkWindowPolicy(num_sink=2)
        p.insert("a", np.arange(5))
        p.insert("b", np.arange(4))
        assert _evicted(p.evict(6)) == {"a": [2, 3, 4]}
        assert _evicted(p.evict(5)) == {"b": [2]}
        assert p.resident_positions("a").tolist() == [0, 1]

    def test_default_keeps_four_sinks(self) -> None:
        """The default protects positions 0 to 3."""
        p = SinkWindowPolicy()
        p.insert("a", np.arange(10))
        p.evict(5)
        assert p.resident_positions("a").tolist() == [0, 1, 2, 3, 9]


class TestCandidateSet:
    """The amortised selection equals a full sort, at sizes beyond the candidate set."""

    def test_matches_brute_force_over_many_steps(self) -> None:
        """H2O's victims equal the smallest (accumulated attention, insertion) tokens."""
        rng = np.random.default_rng(1)
        p = H2OPolicy(recent_window=0)
        acc: dict[tuple[str, int], float] = {}
        seq: dict[tuple[str, int], int] = {}
        n = 0
        for s in range(8):
            p.insert(f"s{s}", np.arange(3000))
            for i in range(3000):
                acc[(f"s{s}", i)] = 0.0
                seq[(f"s{s}", i)] = n
                n += 1
        nxt = 3000
        for _ in range(12):
            for s in range(8):
                name = f"s{s}"
                pos = p.resident_positions(name)
                att = rng.random(pos.size) ** 8
                p.observe(name, pos, att)
                for i, a in zip(pos.tolist(), att.tolist(), strict=True):
                    acc[(name, i)] += a
                p.insert(name, np.array([nxt]))
                acc[(name, nxt)] = 0.0
                seq[(name, nxt)] = n
                n += 1
            nxt += 1
            budget = p.resident_tokens() - 50
            order = sorted(acc, key=lambda k: (acc[k], seq[k]))[:50]
            want: dict[str, list[int]] = {}
            for name, i in order:
                want.setdefault(name, []).append(i)
                del acc[(name, i)]
            got = _evicted(p.evict(budget))
            assert got == {k: sorted(v) for k, v in sorted(want.items())}


@pytest.mark.parametrize(
    "factory", [FIFOPolicy, LRUPolicy, H2OPolicy, SinkWindowPolicy], ids=lambda f: f.__name__
)
def test_nothing_leaves_while_the_cache_fits(factory: type[FIFOPolicy]) -> None:
    """Without a keep rule, evict under the budget evicts nothing."""
    p = factory()
    p.insert("a", np.arange(10))
    p.observe("a", np.arange(10), np.linspace(0.0, 0.2, 10))
    assert p.evict(10) == {}
    assert p.resident_tokens() == 10
