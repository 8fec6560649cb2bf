"""Periodic (eviction cadence) and Protected (sinks and a recent window for any policy)."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.evict import (
    FIFOPolicy,
    H2OPolicy,
    LRUPolicy,
    Periodic,
    Protected,
    SinkWindowPolicy,
    TokenPDConfig,
    TokenPDPolicy,
)


def _evicted(out: object) -> dict[str, list[int]]:
    assert isinstance(out, dict)
    return {k: v.tolist() for k, v in out.items()}


class TestPeriodic:
    """Rounds every ``interval`` steps, or at once when over the budget."""

    def test_rounds_run_when_due(self) -> None:
        """Under the budget, the inner round runs only every ``interval`` ticks."""
        p = Periodic(TokenPDPolicy(TokenPDConfig(initial_price=0.05)), interval=3)
        p.insert("a", np.arange(4), np.array([[0.01], [0.1], [0.2], [0.3]]))
        rounds = []
        for _ in range(7):
            p.evict(100)
            rounds.append(p.rounds)
            p.tick()
        assert rounds == [0, 0, 0, 1, 1, 1, 2]
        assert p.step == 7
        assert p.policy.resident_tokens() == 3  # the keep rule priced out position 0

    def test_over_budget_runs_at_once_and_resets_the_cadence(self) -> None:
        """Exceeding the budget forces a round even when none is due."""
        p = Periodic(FIFOPolicy(), interval=10)
        p.insert("a", np.arange(5))
        assert p.evict(5) == {}
        assert p.steps_until_due == 10
        p.tick(4)
        p.insert("a", np.array([5]))
        assert _evicted(p.evict(5)) == {"a": [0]}
        assert p.rounds == 1
        assert p.steps_until_due == 10

    def test_headroom_leaves_room_for_growth(self) -> None:
        """A round evicts below the budget by the headroom; the next one waits for the
        budget to be exceeded again."""
        p = Periodic(FIFOPolicy(), interval=100)
        p.insert("a", np.arange(10))
        assert _evicted(p.evict(8, headroom=3)) == {"a": [0, 1, 2, 3, 4]}
        for t in range(10, 13):
            p.insert("a", np.array([t]))
            assert p.evict(8, headroom=3) == {}
        p.insert("a", np.array([13]))
        assert _evicted(p.evict(8, headroom=3)) == {"a": [5, 6, 7, 8]}
        assert p.rounds == 2
        with pytest.raises(ValueError, match="'headroom' must be >= 0: -1"):
            p.evict(8, headroom=-1)

    def test_steps_until_due_counts_down(self) -> None:
        """steps_until_due falls with each tick and is 0 once due."""
        p = Periodic(FIFOPolicy(), interval=4)
        assert p.steps_until_due == 4
        p.tick(3)
        assert p.steps_until_due == 1
        p.tick(5)
        assert p.steps_until_due == 0
        p.evict(10)
        assert p.steps_until_due == 4

    def test_steps_free_plans_a_jump(self) -> None:
        """steps_free is the smaller of the cadence and the room left in the budget."""
        p = Periodic(FIFOPolicy(), interval=8)
        p.insert("a", np.arange(10))
        assert p.steps_free(20, 3) == 3
        assert p.steps_free(100, 3) == 8
        assert p.steps_free(100, 0) == 8
        assert p.steps_free(5, 1) == 0

    def test_interval_one_is_the_inner_policy(self) -> None:
        """With interval 1 every call is a round: the same evictions as the policy alone."""
        a, b = Periodic(H2OPolicy(recent_window=2), interval=1), H2OPolicy(recent_window=2)
        rng = np.random.default_rng(0)
        for t in range(30):
            for p in (a, b):
                p.insert("s", np.array([t]))
            att = rng.random(t + 1)
            res = b.resident_positions("s")
            a.observe("s", res, att[: res.size])
            b.observe("s", res, att[: res.size])
            assert _evicted(a.evict(8)) == _evicted(b.evict(8))
            a.tick()

    def test_bad_arguments(self) -> None:
        """A bad interval, tick or policy raises, naming it."""
        with pytest.raises(ValueError, match="'interval' must be >= 1: 0"):
            Periodic(FIFOPolicy(), interval=0)
        with pytest.raises(TypeError, match="'interval' must be int"):
            Periodic(FIFOPolicy(), interval=2.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="'policy' must implement EvictionPolicy"):
            Periodic(object(), interval=2)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'n' must be >= 0: -1"):
            Periodic(FIFOPolicy()).tick(-1)


class TestProtected:
    """Sinks and a recent window around any policy built on the token table."""

    @pytest.mark.parametrize(("sink", "window"), [(0, 3), (2, 0), (1, 2)])
    def test_same_as_the_policy_own_protection(self, sink: int, window: int) -> None:
        """Protected(H2O) evicts exactly as H2O with the same sinks and window."""
        a = Protected(H2OPolicy(recent_window=0), num_sink=sink, recent_window=window)
        b = H2OPolicy(recent_window=window, num_sink=sink)
        rng = np.random.default_rng(1)
        for t in range(40):
            for s in ("x", "y"):
                a.insert(s, np.array([t]))
                b.insert(s, np.array([t]))
                res = b.resident_positions(s)
                att = rng.random(res.size)
                a.observe(s, res, att)
                b.observe(s, res, att)
            assert _evicted(a.evict(12)) == _evicted(b.evict(12))

    def test_lru_keeps_sinks(self) -> None:
        """Protected(LRU, num_sink=1) keeps position 0 that plain LRU would evict."""
        p = Protected(LRUPolicy(), num_sink=1)
        p.insert("a", np.arange(4))
        assert _evicted(p.evict(2)) == {"a": [1, 2]}

    def test_takes_the_larger_protection(self) -> None:
        """A base that protects more keeps its own setting."""
        p = Protected(SinkWindowPolicy(num_sink=4), num_sink=1, recent_window=2)
        assert (p.table.num_sink, p.table.recent_window) == (4, 2)

    def test_token_pd_keeps_its_round(self) -> None:
        """The base's own evict (Token-PD's keep rule and price) runs, on the shared table."""
        p = Protected(TokenPDPolicy(TokenPDConfig(initial_price=0.05)), recent_window=1)
        p.insert("a", np.arange(3), np.array([[0.01], [0.02], [0.5]]))
        p.insert("a", np.array([3]), np.array([[0.0]]))
        assert _evicted(p.evict(10)) == {"a": [0, 1]}
        assert isinstance(p.base, TokenPDPolicy)
        assert p.base.steps == 1

    def test_bad_base(self) -> None:
        """A base that is not a ScoredPolicy, or that holds tokens, is refused."""
        with pytest.raises(TypeError, match="'base' must be a ScoredPolicy"):
            Protected(Periodic(FIFOPolicy()))  # type: ignore[arg-type]
        used = FIFOPolicy()
        used.insert("a", np.arange(2))
        with pytest.raises(ValueError, match="'base' must hold no tokens yet: 2"):
            Protected(used, num_sink=1)
        with pytest.raises(ValueError, match="'num_sink' must be >= 0: -1"):
            Protected(FIFOPolicy(), num_sink=-1)
