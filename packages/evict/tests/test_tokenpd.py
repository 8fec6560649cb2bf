"""Token-PD (seed 000): utility, keep rule, dual update, online learning, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy, dual_update, excess_value


def _sig(returns: list[float], risks: list[float] | None = None) -> np.ndarray:
    r = np.asarray(returns, dtype=np.float64)[:, None]
    if risks is None:
        return r
    return np.hstack((r, np.asarray(risks, dtype=np.float64)[:, None]))


class TestFormulas:
    """The pure functions of eq. 2, 4 and 5."""

    def test_excess_value(self) -> None:
        """g = R - lambda sigma^2 + delta - mu c."""
        cfg = TokenPDConfig(risk_aversion=0.5, recompute_penalty=0.1, token_cost=2.0)
        g = excess_value(np.array([0.4, 0.1]), np.array([0.2, 0.0]), 0.05, cfg)
        assert g.tolist() == pytest.approx([0.4 - 0.1 + 0.1 - 0.1, 0.1 + 0.1 - 0.1])

    def test_dual_update_moves_with_the_violation(self) -> None:
        """Eq. 5: the price grows over budget, shrinks under it, stays at it."""
        assert dual_update(0.2, 150.0, 100.0, 0.5) == pytest.approx(0.2 * math.exp(0.25))
        assert dual_update(0.2, 50.0, 100.0, 0.5) == pytest.approx(0.2 * math.exp(-0.25))
        assert dual_update(0.2, 100.0, 100.0, 0.5) == 0.2

    def test_dual_update_clips_and_validates(self) -> None:
        """A huge violation moves the price by at most e^20; capacity must be > 0."""
        assert dual_update(1.0, 1e9, 1.0, 1.0) == pytest.approx(math.exp(20.0))
        with pytest.raises(ValueError, match="'capacity' must be > 0: 0"):
            dual_update(1.0, 1.0, 0, 1.0)


class TestConfig:
    """TokenPDConfig validation."""

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"risk_aversion": -0.1}, "'risk_aversion' must be >= 0.0"),
            ({"token_cost": 0.0}, "'token_cost' must be > 0.0"),
            ({"learning_rate": float("nan")}, "'learning_rate' must be finite"),
            ({"horizon": 0}, "'horizon' must be > 0"),
            ({"initial_price": -1.0}, "'initial_price' must be > 0.0"),
            ({"recent_window": -2}, "'recent_window' must be >= 0"),
            ({"pool": 10**8}, "'pool' must be <= 65536: 100000000"),
            ({"recent_window": 10**30}, "'recent_window' must be <= 2147483647"),
        ],
    )
    def test_bad_values(self, kwargs: dict[str, float], match: str) -> None:
        """A value out of range raises ValueError naming the field and value."""
        with pytest.raises(ValueError, match=match):
            TokenPDConfig(**kwargs)  # type: ignore[arg-type]

    def test_bad_types(self) -> None:
        """A float horizon or a non-config object raises TypeError."""
        with pytest.raises(TypeError, match="'horizon'"):
            TokenPDConfig(horizon=2.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="'config' must be a TokenPDConfig"):
            TokenPDPolicy({"risk_aversion": 0.1})  # type: ignore[arg-type]


class TestKeepRule:
    """Eq. 4 and the hard budget."""

    def test_below_price_tokens_go_even_under_budget(self) -> None:
        """Tokens with g < 0 at the current price leave although the cache fits."""
        p = TokenPDPolicy(TokenPDConfig(initial_price=0.25, risk_aversion=0.0))
        p.insert("a", np.arange(4), _sig([0.1, 0.3, 0.2, 0.9]))
        out = p.evict(100)
        assert {k: v.tolist() for k, v in out.items()} == {"a": [0, 2]}
        assert p.last_demand == 2

    def test_keep_rule_off_only_enforces_budget(self) -> None:
        """With keep_rule=False the cache is trimmed to the budget by smallest g."""
        p = TokenPDPolicy(TokenPDConfig(initial_price=0.25, keep_rule=False))
        p.insert("a", np.arange(4), _sig([0.1, 0.3, 0.2, 0.9]))
        assert p.evict(100) == {}
        assert {k: v.tolist() for k, v in p.evict(3).items()} == {"a": [0]}

    def test_risk_lowers_the_value(self) -> None:
        """Of two equal returns, the riskier token goes first (lambda > 0)."""
        p = TokenPDPolicy(TokenPDConfig(risk_aversion=0.5))
        p.insert("a", np.arange(2), _sig([0.5, 0.5], [0.4, 0.1]))
        p.insert("b", np.arange(1), _sig([0.5], [0.2]))
        assert {k: v.tolist() for k, v in p.evict(2).items()} == {"a": [0]}
        assert p.excess_values("a", np.array([1])).tolist() == pytest.approx(
            [0.45 - p.price]  # type: ignore[operator]
        )

    def test_first_overflow_sets_the_clearing_price(self) -> None:
        """With no initial price, the first over-budget step prices the last victim."""
        p = TokenPDPolicy(TokenPDConfig(risk_aversion=0.0, learning_rate=1.0))
        p.insert("a", np.arange(4), _sig([0.1, 0.3, 0.2, 0.9]))
        assert p.evict(10) == {}
        assert p.price is None
        assert {k: v.tolist() for k, v in p.evict(2).items()} == {"a": [0, 2]}
        # Price 0.2 then eq. 5 with demand 4 > M = 2 at t = 2: eta = 1/sqrt(2).
        assert p.price == pytest.approx(0.2 * math.exp(1.0 / math.sqrt(2.0)))

    def test_price_settles_where_demand_meets_budget(self) -> None:
        """Over many steps of fresh tokens the keep rule alone holds about the budget."""
        rng = np.random.default_rng(3)
        p = TokenPDPolicy(TokenPDConfig(risk_aversion=0.0, initial_price=1e-4))
        budget = 200
        nxt = 0
        demands = []
        for _ in range(400):
            p.insert("a", np.arange(nxt, nxt + 20), _sig(rng.random(20).tolist()))
            nxt += 20
            p.evict(budget)
            demands.append(p.last_demand)
            assert p.resident_tokens() <= budget
        assert abs(np.mean(demands[-100:]) - budget) / budget < 0.1


class TestSignals:
    """Per-token signals from insert and learning from observe."""

    def test_without_signals_uses_the_constant_return(self) -> None:
        """signals=None gives every token default_return and default_risk."""
        p = TokenPDPolicy(TokenPDConfig(default_return=0.3, default_risk=0.2))
        p.insert("a", np.arange(2))
        r, v = p.estimates("a", np.arange(2))
        assert r.tolist() == [0.3, 0.3]
        assert v.tolist() == [0.2, 0.2]

    def test_observe_updates_the_running_estimate(self) -> None:
        """The prediction counts for prior_weight observations of the realised return."""
        p = TokenPDPolicy(TokenPDConfig(prior_weight=2.0))
        p.insert("a", np.arange(2), _sig([0.6, 0.0], [0.0, 0.0]))
        p.observe("a", np.arange(2), np.array([0.0, 0.3]))
        p.observe("a", np.arange(2), np.array([0.0, 0.1]))
        r, v = p.estimates("a", np.arange(2))
        assert r.tolist() == pytest.approx([(2 * 0.6) / 4, (0.3 + 0.1) / 4])
        assert v.tolist() == pytest.approx([0.0, 0.02 / 4])

    def test_learning_reorders_eviction(self) -> None:
        """A token predicted low but attended heavily outlives one predicted high."""
        p = TokenPDPolicy(TokenPDConfig(risk_aversion=0.0, prior_weight=1.0))
        p.insert("a", np.arange(2), _sig([0.05, 0.5]))
        for _ in range(5):
            p.observe("a", np.arange(2), np.array([0.9, 0.0]))
        assert {k: v.tolist() for k, v in p.evict(1).items()} == {"a": [1]}

    @pytest.mark.parametrize(
        ("signals", "match"),
        [
            (_sig([0.1, float("nan")]), r"column 0 \(predicted return\).*\[nan\]"),
            (_sig([0.1, -0.2]), r"column 0 \(predicted return\).*\[-0.2\]"),
            (_sig([0.1, 0.2], [0.0, -1.0]), r"column 1 \(predicted risk\).*\[-1.0\]"),
            (np.zeros((3, 1)), r"'signals' must have shape \(2, k\)"),
            (np.zeros((2, 0)), "at least one column"),
        ],
    )
    def test_bad_signals_leave_the_cache_unchanged(self, signals: np.ndarray, match: str) -> None:
        """NaN or negative returns, negative risks or a wrong shape raise ValueError."""
        p = TokenPDPolicy()
        p.insert("a", np.array([0]), _sig([0.4]))
        with pytest.raises(ValueError, match=match):
            p.insert("a", np.array([1, 2]), signals)
        assert p.resident_tokens() == 1
        assert p.resident_positions("a").tolist() == [0]
        p.insert("a", np.array([1, 2]), _sig([0.1, 0.2]))
        assert p.resident_tokens() == 3


class TestRollback:
    """Speculative tokens rolled back are reclaimed at once."""

    def test_rollback_frees_and_allows_reinsert(self) -> None:
        """Draft positions leave without an evict call and can be drafted again."""
        p = TokenPDPolicy(TokenPDConfig(initial_price=1e-6))
        p.insert("a", np.arange(8), _sig([0.5] * 8))
        p.rollback("a", np.array([5, 6, 7]))
        assert p.resident_tokens() == 5
        p.insert("a", np.array([5, 6]), _sig([0.01, 0.02]))
        assert {k: v.tolist() for k, v in p.evict(6).items()} == {"a": [5]}


@settings(max_examples=30, deadline=None)
@given(
    returns=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    budget=st.integers(0, 60),
    price=st.floats(1e-6, 2.0),
)
def test_keep_rule_and_budget_agree_with_a_sort(
    returns: list[float], budget: int, price: float
) -> None:
    """Survivors are the tokens of largest g with g >= 0, at most the budget of them."""
    p = TokenPDPolicy(TokenPDConfig(risk_aversion=0.0, initial_price=price))
    p.insert("a", np.arange(len(returns)), _sig(returns))
    p.evict(budget)
    kept = p.resident_positions("a").tolist()
    order = sorted(range(len(returns)), key=lambda i: (returns[i], i))
    eligible = [i for i in order if returns[i] >= price]
    assert sorted(kept) == sorted(eligible[max(0, len(eligible) - budget) :])
