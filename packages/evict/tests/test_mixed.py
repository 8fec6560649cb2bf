"""Demoting policies: kvmodel's DemotingPolicy, Token-PD over states, uniform precision."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import (
    DEFAULT_COSTS,
    FIFOPolicy,
    GroupedPrecision,
    H2OPolicy,
    MixedConfig,
    PrecisionCosts,
    TokenPDConfig,
    TokenPDMixed,
    UniformPrecision,
)
from kvpolicy.kvmodel import DemotingPolicy, EvictionPolicy

C16, C8, C4, C2 = (DEFAULT_COSTS.token_bytes[b] for b in (16, 8, 4, 2))

DEMOTING: dict[str, Callable[[], DemotingPolicy]] = {
    "token-pd-mixed": TokenPDMixed,
    "token-pd-mixed(16+8+4+2, sinks)": lambda: TokenPDMixed(
        TokenPDConfig(num_sink=2, recent_window=2, keep_rule=False),
        MixedConfig(precisions=(16, 8, 4, 2)),
    ),
    "token-pd-mixed(8+4)": lambda: TokenPDMixed(mixed=MixedConfig(precisions=(8, 4))),
    "uniform(h2o, 4)": lambda: UniformPrecision(H2OPolicy(recent_window=2), bits=4),
    "uniform(fifo, 16)": lambda: UniformPrecision(FIFOPolicy(), bits=16),
    "uniform(token-pd, 8)": lambda: UniformPrecision(TokenPDMixed(), bits=8),
    "uniform(h2o, 4, residual 4)": lambda: UniformPrecision(
        H2OPolicy(recent_window=2), bits=4, residual=4
    ),
    "uniform(h2o, 4, window 3)": lambda: UniformPrecision(
        H2OPolicy(recent_window=2), bits=4, window=3
    ),
    "uniform(token-pd, 2, residual 3)": lambda: UniformPrecision(
        TokenPDMixed(), bits=2, residual=3
    ),
    "grouped(token-pd-mixed, 4)": lambda: GroupedPrecision(
        TokenPDMixed(), DEFAULT_COSTS, residual=4
    ),
    "grouped(token-pd-mixed 16+8+4+2, sinks, 3)": lambda: GroupedPrecision(
        TokenPDMixed(
            TokenPDConfig(num_sink=2, recent_window=2, keep_rule=False),
            MixedConfig(precisions=(16, 8, 4, 2)),
        ),
        DEFAULT_COSTS,
        residual=3,
    ),
}


@pytest.fixture(params=sorted(DEMOTING))
def demoting(request: pytest.FixtureRequest) -> DemotingPolicy:
    """A fresh instance of each demoting policy in turn."""
    return DEMOTING[request.param]()


def _drive(
    policy: DemotingPolicy, steps: int, budget: float, streams: int = 2, seed: int = 0
) -> list[dict[str, dict[int, int]]]:
    """Decode ``steps`` tokens in each stream, allocating after each; checks the contract
    at every step and returns each step's state of every resident token."""
    rng = np.random.default_rng(seed)
    state: dict[str, dict[int, int]] = {f"s{i}": {} for i in range(streams)}
    history = []
    for t in range(steps):
        for name, held in state.items():
            pos = np.array([t], dtype=np.int64)
            policy.insert(name, pos, np.array([[rng.random() * 0.1, 0.0]]))
            held[t] = 16
            resident = np.array(sorted(held), dtype=np.int64)
            att = rng.random(resident.size)
            policy.observe(name, resident, att / att.sum())
        changes = policy.allocate(budget)
        for name, (pos, bits) in changes.items():
            assert pos.dtype == np.int64
            assert bits.dtype == np.int64
            assert np.all(np.diff(pos) > 0), "positions must be ascending"
            for p, b in zip(pos.tolist(), bits.tolist(), strict=True):
                assert p in state[name], "changed a token that was not resident"
                assert b < state[name][p], "a state may only go down"
                if b == 0:
                    del state[name][p]
                else:
                    state[name][p] = b
        held_bytes = sum(
            DEFAULT_COSTS.token_bytes[b] for held in state.values() for b in held.values()
        )
        assert policy.resident_bytes() == pytest.approx(held_bytes)
        assert policy.resident_bytes() <= budget + 1e-9
        assert policy.resident_tokens() == sum(len(h) for h in state.values())
        history.append({k: dict(v) for k, v in state.items()})
    return history


class TestDemotingProtocol:
    """The contract every demoting policy keeps."""

    def test_is_a_demoting_and_an_eviction_policy(self, demoting: DemotingPolicy) -> None:
        """The runtime-checkable Protocols both hold."""
        assert isinstance(demoting, DemotingPolicy)
        assert isinstance(demoting, EvictionPolicy)

    def test_budget_in_bytes_holds_at_every_step(self, demoting: DemotingPolicy) -> None:
        """After each allocate the bytes held are within the budget, states only go down,
        and resident bytes equal what the returned states say."""
        _drive(demoting, steps=30, budget=10 * C16)

    def test_empty_allocate_changes_nothing(self, demoting: DemotingPolicy) -> None:
        """Allocating with nothing resident returns no changes."""
        assert dict(demoting.allocate(100.0)) == {}
        assert demoting.resident_bytes() == 0.0

    def test_zero_budget_evicts_everything(self, demoting: DemotingPolicy) -> None:
        """A budget of 0 bytes evicts every token."""
        demoting.insert("a", np.arange(5, dtype=np.int64))
        changes = demoting.allocate(0.0)
        pos, bits = changes["a"]
        assert pos.tolist() == [0, 1, 2, 3, 4]
        assert bits.tolist() == [0] * 5
        assert demoting.resident_tokens() == 0

    @pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
    def test_bad_budget_changes_nothing(self, demoting: DemotingPolicy, bad: float) -> None:
        """A negative or non-finite budget is a ValueError and nothing changes."""
        demoting.insert("a", np.arange(3, dtype=np.int64))
        before = demoting.resident_bytes()
        with pytest.raises(ValueError, match="'budget_bytes' must be finite and >= 0"):
            demoting.allocate(bad)
        assert demoting.resident_bytes() == before
        with pytest.raises(TypeError, match="'budget_bytes' must be a number"):
            demoting.allocate("1000")  # type: ignore[arg-type]

    def test_remove_forgets_the_stream(self, demoting: DemotingPolicy) -> None:
        """remove drops a stream's tokens and bytes."""
        demoting.insert("a", np.arange(4, dtype=np.int64))
        demoting.insert("b", np.arange(2, dtype=np.int64))
        demoting.remove("a")
        assert demoting.resident_tokens() == 2
        assert demoting.resident_bytes() == pytest.approx(2 * C16)


class TestTokenPDMixed:
    """Token-PD choosing between precisions and eviction."""

    def test_full_budget_keeps_full_precision(self) -> None:
        """With bytes for every token at 16 bits nothing changes."""
        p = TokenPDMixed()
        hist = _drive(p, steps=12, budget=24 * C16, streams=2)
        assert all(b == 16 for s in hist[-1].values() for b in s.values())

    def test_quantizes_before_it_evicts(self) -> None:
        """At the bytes of a third of the tokens at 16 bits, Token-PD keeps more tokens
        than a third (at lower precision) and uses most of the budget."""
        p = TokenPDMixed()
        budget = 20 * C16
        hist = _drive(p, steps=30, budget=budget, streams=2)
        assert p.resident_tokens() > 20
        assert p.resident_bytes() > budget - C16
        assert any(b < 16 for s in hist[-1].values() for b in s.values())

    def test_one_price_across_streams(self) -> None:
        """A stream whose tokens receive more attention keeps more bytes."""
        p = TokenPDMixed(TokenPDConfig(keep_rule=False))
        for t in range(40):
            for name in ("hot", "cold"):
                p.insert(name, np.array([t], dtype=np.int64))
            for name, scale in (("hot", 1.0), ("cold", 0.01)):
                pos = p.resident_positions(name)
                p.observe(name, pos, np.full(pos.size, scale / pos.size))
            p.allocate(30 * C16)
        assert p.byte_price > 0
        hot = DEFAULT_COSTS.cost(p.precisions_of("hot", p.resident_positions("hot"))).sum()
        cold = DEFAULT_COSTS.cost(p.precisions_of("cold", p.resident_positions("cold"))).sum()
        assert hot > 2 * cold

    def test_only_offered_precisions_are_used(self) -> None:
        """With precisions 8 and 4 no token is held at 16 or 2 bits after allocating."""
        p = TokenPDMixed(mixed=MixedConfig(precisions=(8, 4)))
        hist = _drive(p, steps=20, budget=8 * C16, streams=1)
        assert {b for s in hist[-1].values() for b in s.values()} <= {8, 4}

    def test_protected_tokens_keep_full_precision(self) -> None:
        """Sinks keep 16 bits while other tokens are quantized or evicted."""
        p = TokenPDMixed(TokenPDConfig(num_sink=2), MixedConfig(precisions=(16, 4)))
        hist = _drive(p, steps=30, budget=8 * C16, streams=1)
        assert hist[-1]["s0"][0] == 16
        assert hist[-1]["s0"][1] == 16

    def test_costs_must_cover_the_precisions(self) -> None:
        """A precision without a cost is refused, naming it."""
        with pytest.raises(ValueError, match="no cost for 2 bits"):
            MixedConfig(precisions=(16, 2), costs=PrecisionCosts({16: 10.0, 8: 5.0}))

    @settings(max_examples=20, deadline=None)
    @given(
        budget=st.floats(0.0, 40 * C16),
        precisions=st.sampled_from([(16, 8, 4), (16, 4), (16, 8, 4, 2), (4,)]),
        scale=st.floats(0.0, 5.0),
    )
    def test_budget_never_exceeded(
        self, budget: float, precisions: tuple[int, ...], scale: float
    ) -> None:
        """Any budget, set of precisions and loss scale: the bytes held never exceed it."""
        p = TokenPDMixed(mixed=MixedConfig(precisions=precisions, loss_scale=scale))
        _drive(p, steps=15, budget=budget, streams=2)


class TestUniformPrecision:
    """Any eviction policy with every token at one precision."""

    def test_sixteen_bits_evicts_like_the_base_policy(self) -> None:
        """At 16 bits the byte budget of B tokens evicts what evict(B) would."""
        a, b = UniformPrecision(H2OPolicy(recent_window=2), bits=16), H2OPolicy(recent_window=2)
        rng = np.random.default_rng(3)
        for t in range(30):
            pos = np.array([t], dtype=np.int64)
            a.insert("s", pos)
            b.insert("s", pos)
            held = b.resident_positions("s")
            att = rng.random(held.size)
            a.observe("s", held, att)
            b.observe("s", held, att)
            got = a.allocate(8 * C16).get("s")
            want = b.evict(8).get("s")
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert got[0].tolist() == want.tolist()
                assert set(got[1].tolist()) == {0}

    def test_int4_holds_more_tokens(self) -> None:
        """At 4 bits the same bytes hold 512 / 160 as many tokens as at 16."""
        p = UniformPrecision(FIFOPolicy(), bits=4)
        _drive(p, steps=40, budget=10 * C16, streams=1)
        assert p.resident_tokens() == int(10 * C16 // C4)

    def test_residual_demotes_whole_groups_oldest_first(self) -> None:
        """With a residual of G, tokens wait at 16 bits until G of them do, then the
        oldest G are demoted together: never G or more at 16 bits after an allocate."""
        g = 4
        p = UniformPrecision(FIFOPolicy(), bits=4, residual=g)
        assert (p.residual, p.key_axis) == (g, "channel")
        demoted: list[list[int]] = []
        for t in range(19):
            p.insert("s", np.array([t], dtype=np.int64))
            got = p.allocate(1e9).get("s")
            if got is not None:
                assert set(got[1].tolist()) == {4}
                demoted.append(got[0].tolist())
            held_16 = (t + 1) % g
            assert p.resident_bytes() == (t + 1 - held_16) * C4 + held_16 * C16
        assert demoted == [list(range(i, i + g)) for i in range(0, 16, g)]

    def test_residual_counts_its_16_bit_tokens_in_the_budget(self) -> None:
        """The tokens left at 16 bits are paid for: the bytes never exceed the budget and
        the policy holds fewer tokens than without a residual."""
        budget = 12 * C4
        with_residual = UniformPrecision(FIFOPolicy(), bits=4, residual=8)
        plain = UniformPrecision(FIFOPolicy(), bits=4)
        for p in (with_residual, plain):
            _drive(p, steps=41, budget=budget, streams=1)
        assert plain.resident_tokens() == 12
        assert with_residual.resident_tokens() < 12
        assert with_residual.resident_bytes() <= budget
        assert plain.key_axis == "token"

    def test_window_keeps_the_newest_at_16_bits_and_slides(self) -> None:
        """With a window of W, the newest W tokens of each stream stay at 16 bits and each
        older one is demoted alone, at the allocate after the one that pushed it out."""
        w = 3
        p = UniformPrecision(FIFOPolicy(), bits=4, window=w)
        assert (p.window, p.residual, p.key_axis) == (w, 0, "token")
        demoted: list[list[int]] = []
        for t in range(10):
            p.insert("s", np.array([t], dtype=np.int64))
            got = p.allocate(1e9).get("s")
            if got is not None:
                assert set(got[1].tolist()) == {4}
                demoted.append(got[0].tolist())
            held_16 = min(t + 1, w)
            assert p.resident_bytes() == (t + 1 - held_16) * C4 + held_16 * C16
        assert demoted == [[i] for i in range(10 - w)]

    def test_window_counts_its_16_bit_tokens_in_the_budget(self) -> None:
        """The window is paid for at 16 bits: never over the budget, fewer tokens held
        than without it, and each stream keeps its own newest tokens."""
        budget = 20 * C4
        with_window = UniformPrecision(FIFOPolicy(), bits=4, window=2)
        plain = UniformPrecision(FIFOPolicy(), bits=4)
        for p in (plain, with_window):
            last = _drive(p, steps=41, budget=budget, streams=2)[-1]
            assert p.resident_bytes() <= budget
        for held in last.values():  # the windowed policy's last step
            assert [held[t] for t in (39, 40)] == [16, 16]
            assert {b for t, b in held.items() if t < 39} == {4}
        assert plain.resident_tokens() == 20
        assert with_window.resident_tokens() < 20
        assert with_window.resident_tokens() * C4 + 4 * (C16 - C4) <= budget

    def test_bad_window(self) -> None:
        """A negative, non-int or 16-bit window, or one beside a residual, is refused."""
        for bad in (-1, 2.0, True):
            with pytest.raises(ValueError, match="'window' must be an int >= 0"):
                UniformPrecision(FIFOPolicy(), 4, window=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'window' = 4 needs bits below 16"):
            UniformPrecision(FIFOPolicy(), 16, window=4)
        with pytest.raises(ValueError, match="give 'residual' or 'window', not both"):
            UniformPrecision(FIFOPolicy(), 4, residual=4, window=4)

    def test_bad_residual(self) -> None:
        """A negative, non-int or 16-bit residual is refused, naming the field."""
        for bad in (-1, 2.0, True):
            with pytest.raises(ValueError, match="'residual' must be an int >= 0"):
                UniformPrecision(FIFOPolicy(), 4, residual=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="'residual' = 4 needs bits below 16"):
            UniformPrecision(FIFOPolicy(), 16, residual=4)

    def test_bad_base_or_bits(self) -> None:
        """A base that is not an eviction policy, or unsupported bits, is refused."""
        with pytest.raises(TypeError, match="'policy' must be an EvictionPolicy"):
            UniformPrecision(object(), 4)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="among"):
            UniformPrecision(FIFOPolicy(), 3)


class TestGroupedPrecision:
    """Token-PD's demotions held back until a group shares a precision (keys per channel)."""

    @pytest.mark.parametrize("g", [1, 3, 8])
    def test_demotions_come_in_whole_groups(self, g: int) -> None:
        """Every allocate demotes whole groups of G tokens per stream and precision, the
        lowest positions of their queue first; fewer than G of each wait; the bytes held
        stay within the budget and equal what the changes say (``_drive``)."""
        inner = TokenPDMixed(TokenPDConfig(keep_rule=False), MixedConfig(precisions=(16, 8, 4, 2)))
        p = GroupedPrecision(inner, DEFAULT_COSTS, residual=g)
        assert (p.key_axis, p.residual, p.base) == ("channel", g, inner)
        seen: list[tuple[str, int, list[int]]] = []
        real = p.allocate

        def allocate(budget: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
            out = dict(real(budget))
            for stream, (pos, bits) in out.items():
                for b in set(bits.tolist()) - {0}:
                    group = pos[bits == b].tolist()
                    assert len(group) % g == 0, (stream, b, group)
                    seen.append((stream, b, group))
            for (_, _), queue in p._waiting.items():
                assert len(queue) < g
            return out

        p.allocate = allocate  # type: ignore[method-assign]
        history = _drive(p, steps=80, budget=(4 * g + 12) * C16, streams=2)
        assert seen, "nothing was demoted"
        assert p.waiting_tokens() == sum(len(q) for q in p._waiting.values())
        # The groups hold what the inner policy chose: every held token's bits are at or
        # above its inner target, and above it only while it waits.
        final = history[-1]
        for stream, held in final.items():
            pos = np.array(sorted(held), dtype=np.int64)
            targets = inner.precisions_of(stream, pos)
            for q, t in zip(pos.tolist(), targets.tolist(), strict=True):
                assert held[q] >= t
                assert (held[q] > t) == ((stream, q) in p._target)

    def test_evicting_a_waiting_token_forgets_it(self) -> None:
        """Tokens evicted while they wait leave their queues and the bytes."""
        for steps in range(30, 60):
            p = GroupedPrecision(
                TokenPDMixed(TokenPDConfig(keep_rule=False)), DEFAULT_COSTS, residual=4
            )
            _drive(p, steps=steps, budget=28 * C16, streams=2)
            if p.waiting_tokens():
                break
        assert p.waiting_tokens() > 0, "no demotion ever waited"
        p.evict(0)
        assert p.waiting_tokens() == 0
        assert p.resident_bytes() == 0.0
        assert p.resident_tokens() == 0
        assert dict(p.allocate(12 * C16)) == {}

    def test_bad_arguments(self) -> None:
        """A policy that does not demote, costs of another type, a bad residual: named."""
        with pytest.raises(TypeError, match="'policy' must be a DemotingPolicy"):
            GroupedPrecision(FIFOPolicy(), DEFAULT_COSTS, residual=4)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="'costs' must be PrecisionCosts"):
            GroupedPrecision(TokenPDMixed(), {16: 1}, residual=4)  # type: ignore[arg-type]
        for bad in (0, -1, 2.0, True):
            with pytest.raises(ValueError, match="'residual' must be an int >= 1"):
                GroupedPrecision(TokenPDMixed(), DEFAULT_COSTS, residual=bad)  # type: ignore[arg-type]
