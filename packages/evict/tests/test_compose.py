"""Composed (successive rounds, each member its share of the excess) and cadence through
kvmodel's ResidencyLedger (Periodic is the policy's cadence, a bare policy has none)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from kvpolicy.evict import (
    Composed,
    FIFOPolicy,
    H2OPolicy,
    LRUPolicy,
    Periodic,
    SinkWindowPolicy,
    TokenPDConfig,
    TokenPDPolicy,
    default_policies,
)
from kvpolicy.kvmodel import EVICTION, RegistryError, ResidencyLedger, Scheduled, build


def _evicted(out: object) -> dict[str, list[int]]:
    assert isinstance(out, dict)
    return {k: v.tolist() for k, v in out.items()}


class TestComposed:
    """Each member evicts its share of the excess by its own keys, over what is left."""

    def test_shares_of_the_excess(self) -> None:
        """FIFO takes the first half of the excess (the oldest), H2O the rest (the least
        attended among those left)."""
        c = Composed([FIFOPolicy(), H2OPolicy(recent_window=0)])
        c.insert("a", np.arange(10))
        c.observe("a", np.arange(10), np.array([0, 0, 9, 9, 9, 1, 8, 2, 7, 3], dtype=float))
        assert _evicted(c.evict(6)) == {"a": [0, 1, 5, 7]}
        assert c.resident_tokens() == 6
        assert [p.resident_tokens() for p in c.policies] == [6, 6]

    def test_unequal_shares(self) -> None:
        """shares=[3, 1]: the first member evicts three quarters of the excess."""
        c = Composed([FIFOPolicy(), LRUPolicy()], shares=[3, 1])
        assert c.shares == (0.75, 0.25)
        c.insert("a", np.arange(8))
        c.observe("a", np.array([4, 5, 6]), np.ones(3))
        out = _evicted(c.evict(4))
        assert out == {"a": [0, 1, 2, 3]}

    def test_token_pd_keep_rule_leaves_less_for_later_members(self) -> None:
        """A member that evicts beyond its share (Token-PD's keep rule) leaves the later
        members less to do; the budget still holds."""
        pd = TokenPDPolicy(TokenPDConfig(initial_price=0.05, recent_window=0))
        c = Composed([pd, FIFOPolicy()])
        sig = np.array([[0.01], [0.01], [0.01], [0.3], [0.3], [0.3]])
        c.insert("a", np.arange(6), sig)
        assert _evicted(c.evict(5)) == {"a": [0, 1, 2]}
        assert c.resident_tokens() == 3

    def test_under_budget_every_member_runs_its_round(self) -> None:
        """With no excess each member still runs its round (Token-PD's price moves)."""
        pd = TokenPDPolicy(TokenPDConfig(initial_price=0.05))
        c = Composed([FIFOPolicy(), pd])
        c.insert("a", np.arange(3), np.full((3, 1), 0.5))
        assert c.evict(10) == {}
        assert pd.steps == 1

    def test_a_rejected_insert_changes_nothing(self) -> None:
        """Signals one member rejects leave every member as it was."""
        c = Composed([FIFOPolicy(), TokenPDPolicy()])
        bad: NDArray[np.float64] = np.array([[0.1], [-1.0]])
        with pytest.raises(ValueError, match="signals"):
            c.insert("a", np.arange(2), bad)
        assert [p.resident_tokens() for p in c.policies] == [0, 0]
        c.insert("a", np.arange(2))
        assert c.resident_tokens() == 2

    def test_bad_members_and_shares(self) -> None:
        """Misuse is named: too few policies, a cadence inside, a shared object, tokens
        already held, bad shares."""
        with pytest.raises(ValueError, match="at least two"):
            Composed([FIFOPolicy()])
        with pytest.raises(ValueError, match=r"Periodic\(Composed"):
            Composed([Periodic(FIFOPolicy()), LRUPolicy()])
        f = FIFOPolicy()
        with pytest.raises(ValueError, match="twice"):
            Composed([f, f])
        f.insert("a", np.arange(2))
        with pytest.raises(ValueError, match="no tokens yet"):
            Composed([f, LRUPolicy()])
        with pytest.raises(TypeError, match="EvictionPolicy"):
            Composed([FIFOPolicy(), object()])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="one entry per policy"):
            Composed([FIFOPolicy(), LRUPolicy()], shares=[1.0])
        with pytest.raises(ValueError, match="'shares' must be > 0"):
            Composed([FIFOPolicy(), LRUPolicy()], shares=[1.0, 0.0])

    def test_composition_composes(self) -> None:
        """A composition is a member of another one (it forgets positions too)."""
        inner = Composed([FIFOPolicy(), LRUPolicy()])
        c = Composed([inner, H2OPolicy(recent_window=0)])
        c.insert("a", np.arange(8))
        c.evict(4)
        assert c.resident_tokens() == inner.resident_tokens() == 4


class _Uniform:
    """Attention source: no signals, every resident position attended alike."""

    def signals(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> NDArray[np.float64] | None:
        return None

    def attention(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> tuple[NDArray[np.float64], float]:
        return np.ones(len(positions)), float(max(length, 1))


def _rounds_at(policy: FIFOPolicy | Periodic, steps: int, budget: int = 1000) -> list[int]:
    """Steps at which a ledger runs rounds for one stream growing a token per step."""
    ledger = ResidencyLedger(policy, budget, _Uniform(), evict_ahead=0)
    ledger.open("a", 0)
    at = []
    for step in range(steps):
        if ledger.due(step, 1):
            ledger.round(step, [("a", step)], 1)
            at.append(step)
        ledger.wrote(1)
    return at


class TestCadenceThroughTheLedger:
    """The ledger asks the policy when a round is due (kvmodel's Scheduled)."""

    def test_periodic_is_scheduled(self) -> None:
        """Periodic implements Scheduled; a bare policy does not."""
        assert isinstance(Periodic(FIFOPolicy(), 4), Scheduled)
        assert not isinstance(FIFOPolicy(), Scheduled)

    def test_periodic_sets_the_rounds(self) -> None:
        """Periodic(policy, 4) under a ledger: a round every 4 iterations."""
        assert _rounds_at(Periodic(FIFOPolicy(), interval=4), 14) == [4, 8, 12]

    def test_a_bare_policy_runs_only_over_budget(self) -> None:
        """Without a cadence, rounds come only when the growth would pass the budget."""
        assert _rounds_at(FIFOPolicy(), 14) == []
        assert _rounds_at(FIFOPolicy(), 14, budget=10) == [10, 11, 12, 13]

    def test_budget_rounds_reset_the_cadence(self) -> None:
        """A round forced by the budget starts the cadence over, as the policy's own."""
        assert _rounds_at(Periodic(FIFOPolicy(), interval=6), 14, budget=8) == [
            6,
            8,
            9,
            10,
            11,
            12,
            13,
        ]


class TestComposeByName:
    def test_built_through_the_resolver(self) -> None:
        """``composed`` builds its members by name, params and shares included."""
        policy = build(
            EVICTION,
            "composed",
            {
                "policies": ["sink-window", {"name": "token-pd", "params": {"risk_aversion": 0.2}}],
                "shares": [1, 3],
            },
        )
        assert isinstance(policy, Composed)
        assert [type(p) for p in policy.policies] == [SinkWindowPolicy, TokenPDPolicy]
        assert policy.shares == (0.25, 0.75)

    @pytest.mark.parametrize(
        ("params", "error", "match"),
        [
            ({}, RegistryError, "param 'policies' is required"),
            ({"policies": "h2o"}, RegistryError, "'policies' must be a list"),
            ({"policies": ["h2o", {"nam": "lru"}]}, RegistryError, r"'policies\[1\]'"),
            ({"policies": ["h2o", {"name": "lru", "x": 1}]}, RegistryError, "unknown keys"),
            ({"policies": ["h2o", "lfu"]}, RegistryError, "unknown eviction policy 'lfu'"),
            ({"policies": ["h2o"]}, RegistryError, "at least two policies"),
        ],
    )
    def test_bad_params_are_named(
        self, params: dict[str, object], error: type[Exception], match: str
    ) -> None:
        """A bad entry is an error naming it."""
        with pytest.raises(error, match=match):
            build(EVICTION, "composed", params)

    def test_not_among_the_defaults(self) -> None:
        """default_policies leaves out what needs params (composed names its members)."""
        assert "composed" not in default_policies()
