"""The online knapsack of seed 000: clairvoyant optimum, Token-PD run, settling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import TokenPDConfig, clairvoyant_value, online_knapsack, settling_step


class TestClairvoyant:
    """The offline optimum keeps the best positive values."""

    def test_top_values(self) -> None:
        """With budget 3 the best three values are summed."""
        v = np.array([[0.1, 0.9], [0.5, 0.2], [0.7, 0.0]])
        assert clairvoyant_value(v, 3) == pytest.approx(2.1)

    def test_negative_values_are_left_out(self) -> None:
        """A negative value is never worth keeping."""
        assert clairvoyant_value(np.array([[0.3, -0.2]]), 2) == pytest.approx(0.3)

    def test_bad_budget_and_values(self) -> None:
        """Budgets outside (0, T*n] and NaN values raise ValueError."""
        with pytest.raises(ValueError, match=r"'budget' must be in \(0, 2\]: 3"):
            clairvoyant_value(np.ones((1, 2)), 3)
        with pytest.raises(ValueError, match="'values' must be finite"):
            clairvoyant_value(np.array([[np.nan]]), 1)
        with pytest.raises(TypeError, match="'budget' must be int"):
            clairvoyant_value(np.ones((1, 2)), 1.0)  # type: ignore[arg-type]


class TestOnline:
    """Token-PD's keep rule and eq. 5 on arrivals."""

    def test_exact_run(self) -> None:
        """Two steps by hand: keep g >= 0, then mu * exp(eta (kept - M) / M)."""
        v = np.array([[0.9, 0.1, 0.6], [0.4, 0.8, 0.3]])
        run = online_knapsack(v, 2, TokenPDConfig(initial_price=0.5, learning_rate=1.0))
        eta = 1.0 / math.sqrt(2)
        mu1 = 0.5 * math.exp(eta * (2 - 1) / 1)
        assert run.prices.tolist() == pytest.approx([0.5, mu1, mu1 * math.exp(-eta)])
        assert run.kept == 2
        assert run.value == pytest.approx(1.5)

    def test_warm_start_clears_the_first_batch(self) -> None:
        """Without an initial price the first price keeps the per-step share."""
        v = np.array([[0.9, 0.1, 0.6, 0.3], [0.2, 0.2, 0.2, 0.2]])
        run = online_knapsack(v, 4, TokenPDConfig())
        assert run.prices[0] == pytest.approx(0.6)

    def test_regret_per_step_falls_with_the_horizon(self) -> None:
        """Regret/T shrinks from T = 100 to T = 1600 (seed 000's sublinear regret)."""
        per_step = []
        for steps in (100, 1600):
            rng = np.random.default_rng(0)
            v = rng.beta(0.5, 5.0, size=(steps, 32))
            budget = int(0.2 * v.size)
            run = online_knapsack(v, budget, TokenPDConfig(initial_price=1.0))
            per_step.append((clairvoyant_value(v, budget) - run.value) / steps)
        assert per_step[1] < per_step[0] / 2


@settings(max_examples=40, deadline=None)
@given(
    steps=st.integers(1, 30),
    n=st.integers(1, 8),
    frac=st.floats(0.01, 1.0),
    price=st.floats(1e-4, 10.0),
    seed=st.integers(0, 1000),
)
def test_budget_and_optimum_bound(steps: int, n: int, frac: float, price: float, seed: int) -> None:
    """The run never exceeds the budget nor beats the clairvoyant."""
    v = np.random.default_rng(seed).random((steps, n))
    budget = max(1, int(frac * steps * n))
    run = online_knapsack(v, budget, TokenPDConfig(initial_price=price))
    assert run.kept <= budget
    assert run.value <= clairvoyant_value(v, budget) + 1e-9


class TestSettling:
    """The settling step of a price path."""

    def test_last_exit_from_the_band(self) -> None:
        """The step after the last one outside the band."""
        assert settling_step(np.array([5.0, 1.5, 1.05, 1.3, 1.0, 0.95]), 1.0, 0.1) == 4
        assert settling_step(np.array([1.0, 1.0]), 1.0) == 0
        assert settling_step(np.array([1.0, 3.0]), 1.0) == 2

    def test_bad_target(self) -> None:
        """A non-positive target or tolerance raises ValueError."""
        with pytest.raises(ValueError, match=r"'target' must be > 0: 0\.0"):
            settling_step(np.ones(2), 0.0)
        with pytest.raises(ValueError, match="'tolerance' must be > 0"):
            settling_step(np.ones(2), 1.0, 0.0)
