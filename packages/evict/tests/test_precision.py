"""Precision states, their costs, and the multiple-choice knapsack at one price per byte."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import (
    EVICTED,
    PrecisionCosts,
    check_precisions,
    choose_states,
    retained_fraction,
)
from kvpolicy.kvmodel import ModelSpec

COSTS = np.array([0.0, 96.0, 160.0, 288.0, 512.0])  # evicted, 2, 4, 8, 16 bits
KEEPS = np.array([0.0, 1 - 1 / 3, 1 - 1 / 15, 1 - 1 / 255, 1.0])


def _brute(values: np.ndarray, costs: np.ndarray, budget: float) -> float:
    best = 0.0
    for combo in itertools.product(range(values.shape[1]), repeat=values.shape[0]):
        c = costs[list(combo)].sum()
        if c <= budget:
            best = max(best, float(values[np.arange(values.shape[0]), list(combo)].sum()))
    return best


class TestStates:
    """Precisions, retained shares and costs."""

    def test_check_precisions_sorts_highest_first(self) -> None:
        """Precisions come back distinct and highest first."""
        assert check_precisions([4, 16, 8]) == (16, 8, 4)

    @pytest.mark.parametrize(
        ("value", "exc", "match"),
        [
            ([], ValueError, "at least one"),
            ([16, 16], ValueError, "distinct"),
            ([3], ValueError, "among"),
            (["16"], TypeError, "ints"),
            ("16", TypeError, "sequence of ints"),
        ],
    )
    def test_bad_precisions_are_named(self, value: object, exc: type, match: str) -> None:
        """Empty, repeated, unsupported or non-int precisions are refused."""
        with pytest.raises(exc, match=match):
            check_precisions(value)  # type: ignore[arg-type]

    def test_retained_fraction(self) -> None:
        """1 at 16 bits, 0 evicted, 1 - s / (2**b - 1) in between, never below 0."""
        assert retained_fraction(16, 1.0) == 1.0
        assert retained_fraction(EVICTED, 1.0) == 0.0
        assert retained_fraction(4, 1.5) == pytest.approx(0.9)
        assert retained_fraction(2, 9.0) == 0.0
        with pytest.raises(ValueError, match="'loss_scale'"):
            retained_fraction(4, -1.0)

    def test_costs_from_the_model(self) -> None:
        """PrecisionCosts.of prices one layer of SmolLM2 from kvmodel's byte count."""
        layer = ModelSpec("one layer", num_layers=1, num_kv_heads=3, head_dim=64)
        c = PrecisionCosts.of(layer, (16, 8, 4))
        assert dict(c.token_bytes) == {16: 768.0, 8: 432.0, 4: 240.0}
        assert c.cost(np.array([16, 0, 4, 8])).tolist() == [768.0, 0.0, 240.0, 432.0]
        with pytest.raises(ValueError, match="no cost for precision 2"):
            c.cost(np.array([2]))

    def test_costs_must_grow_with_bits(self) -> None:
        """A cheaper higher precision is refused, naming both."""
        with pytest.raises(ValueError, match=r"4 bits cost 300\.0, 8 bits 200\.0"):
            PrecisionCosts({8: 200.0, 4: 300.0})


class TestChooseStates:
    """The LP-greedy of the multiple-choice knapsack."""

    def test_everything_fits(self) -> None:
        """A budget for every token at 16 bits keeps them all at 16 bits, price 0."""
        r = np.array([0.3, 0.1, 0.6])
        got = choose_states(r[:, None] * KEEPS, COSTS, 3 * 512.0)
        assert got.state.tolist() == [4, 4, 4]
        assert got.price == 0.0
        assert got.spent == 1536.0

    def test_small_budget_quantizes_before_it_evicts(self) -> None:
        """Bytes for three int4 tokens: all three at 4 bits beat one at 16."""
        r = np.array([0.3, 0.1, 0.6])
        got = choose_states(r[:, None] * KEEPS, COSTS, 3 * 160.0)
        assert got.state.tolist() == [2, 2, 2]

    def test_high_return_token_keeps_precision(self) -> None:
        """One dominant token stays at 16 bits while the others drop to 2 bits."""
        r = np.array([10.0, 0.01, 0.01])
        got = choose_states(r[:, None] * KEEPS, COSTS, 512.0 + 2 * 96.0)
        assert got.state.tolist() == [4, 1, 1]

    def test_available_states_bound_each_token(self) -> None:
        """A token already at 4 bits cannot go back up."""
        r = np.array([1.0, 1.0])
        avail = np.ones((2, 5), dtype=bool)
        avail[0, 3:] = False
        got = choose_states(r[:, None] * KEEPS, COSTS, 2 * 512.0, available=avail)
        assert got.state.tolist() == [2, 4]

    def test_priority_breaks_ties(self) -> None:
        """Among equal values the token of larger priority keeps its bytes."""
        r = np.array([1.0, 1.0, 1.0])
        got = choose_states(r[:, None] * KEEPS, COSTS, 512.0, priority=np.array([0.0, 2.0, 1.0]))
        assert got.state.tolist()[1] >= got.state.tolist()[0]

    def test_every_token_at_its_best_state_at_the_price(self) -> None:
        """Each chosen state maximises value - price * cost (the dual's condition)."""
        rng = np.random.default_rng(1)
        v = rng.random(200)[:, None] * KEEPS
        got = choose_states(v, COSTS, 200 * 150.0)
        net = v - got.price * COSTS[None, :]
        chosen = net[np.arange(200), got.state]
        assert bool((chosen >= net.max(axis=1) - 1e-9).all())

    @settings(max_examples=60, deadline=None)
    @given(
        r=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
        budget=st.floats(0.0, 3000.0),
    )
    def test_within_budget_and_near_the_optimum(self, r: list[float], budget: float) -> None:
        """Never over the budget; within one token's value of the brute-force optimum."""
        v = np.array(r)[:, None] * KEEPS
        got = choose_states(v, COSTS, budget)
        spent = float(COSTS[got.state].sum())
        assert spent <= budget + 1e-9
        assert got.spent == pytest.approx(spent)
        value = float(v[np.arange(len(r)), got.state].sum())
        best = _brute(v, COSTS, budget)
        assert value <= best + 1e-9
        assert value >= best - max(r) - 1e-9

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"costs": np.array([1.0, 2.0, 3.0, 4.0, 5.0])}, "start at 0"),
            ({"budget": -1.0}, "'budget' must be finite and >= 0"),
            ({"values": np.full((2, 5), np.nan)}, "finite"),
            ({"available": np.zeros((2, 5), dtype=bool)}, "free state"),
        ],
    )
    def test_bad_input_is_named(self, kwargs: dict[str, object], match: str) -> None:
        """Bad costs, budgets, values or availability are a ValueError."""
        args: dict[str, object] = {"values": np.ones((2, 5)), "costs": COSTS, "budget": 100.0}
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            choose_states(**args)  # type: ignore[arg-type]
