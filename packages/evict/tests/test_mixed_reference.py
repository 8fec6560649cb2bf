"""TokenPDMixed's allocate and ScaledChains against the rule they implement, decision for
decision: the allocation of kvpolicy-evict 0.2.0's first TokenPDMixed (kept below as
``_ReferenceMixed``: values per stream, every token's state by ``choose_states``) on many
seeded runs, and ``choose_states`` itself on random knapsacks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.evict import (
    EVICTED,
    MixedConfig,
    PrecisionCosts,
    TokenPDConfig,
    TokenPDMixed,
    choose_states,
    retained_fraction,
)
from kvpolicy.evict._chains import ScaledChains
from kvpolicy.evict._mixed import StateChanges
from kvpolicy.kvmodel import ModelSpec

# One decoder layer of SmolLM2-135M (3 KV heads of 64): 768, 432, 240, 144 bytes.
SMOL = PrecisionCosts.of(ModelSpec("SmolLM2-135M, one layer", 1, 3, 64))


class _ReferenceMixed(TokenPDMixed):
    """TokenPDMixed with the allocate it first shipped with (the reference rule)."""

    def allocate(self, budget_bytes: float) -> StateChanges:
        """Every resident token's state by choose_states over all of them, as first shipped."""
        from kvpolicy.evict._mixed import _check_budget_bytes

        budget = _check_budget_bytes(budget_bytes)
        table = self.table
        slots = table.resident_slots()
        if not slots.size:
            return {}
        self._steps += 1
        value = np.empty(slots.size)
        start = 0
        for stream in table.streams:
            own = table.resident_slots(stream)
            value[start : start + own.size] = self._value(own, stream)
            start += own.size
        value = np.maximum(value, 0.0)
        prot = table.protected(slots)
        value = np.where(prot, value + 1.0 + value.sum(), value)
        bits_col = table.column("bits")
        current = bits_col[slots].astype(np.int64)
        allowed = np.isin(self._states, (EVICTED, *self.mixed.precisions))
        available = allowed[None, :] & (self._states[None, :] <= current[:, None])
        available[:, 0] = True
        available |= self._states[None, :] == current[:, None]
        choice = choose_states(
            value[:, None] * self._keeps[None, :],
            self._state_cost,
            budget,
            available,
            priority=table.insertion_order(slots).astype(np.float64),
        )
        self._byte_price = choice.price
        new = self._states[choice.state]
        changed = new != current
        if not changed.any():
            return {}
        positions = table.positions_of(slots)
        counts = [table.stream_tokens(name) for name in table.streams]
        sids = np.repeat(np.arange(len(counts)), counts)
        out = {}
        for sid in np.unique(sids[changed]):
            hit = changed & (sids == sid)
            p, b = positions[hit], new[hit]
            order = np.argsort(p, kind="stable")
            out[table.streams[int(sid)]] = (p[order], b[order])
        demoted = changed & (new != EVICTED)
        bits_col[slots[demoted]] = new[demoted].astype(np.float64)
        gone = slots[changed & (new == EVICTED)]
        if gone.size:
            table.release(gone)
        return out


def _same(got: StateChanges, want: StateChanges) -> None:
    assert list(got) == list(want), "the same streams, in the same order"
    for name in want:
        for g, w in zip(got[name], want[name], strict=True):
            assert g.dtype == np.int64
            assert g.tolist() == w.tolist()


def _lockstep(
    config: TokenPDConfig | None,
    mixed: MixedConfig,
    prompts: tuple[int, ...],
    new: int,
    fraction: float,
    attention: str,
    seed: int,
    signals: str = "none",
) -> int:
    """PolicyCache's order of calls (a left-padded prompt per row replayed token by token,
    then ``new`` decoded tokens per row; insert and observe each row, then allocate) on the
    policy and on the reference at once, checking every allocation and price; the steps."""
    rng = np.random.default_rng(seed)
    fast, ref = TokenPDMixed(config, mixed), _ReferenceMixed(config, mixed)
    rows = len(prompts)
    longest = max(prompts)
    budget = fraction * (sum(prompts) + rows * new) * mixed.costs.token_bytes[16]
    held: list[list[int]] = [[] for _ in range(rows)]
    for i in range(longest + new):
        for r in range(rows):
            if i < longest - prompts[r]:
                continue
            p = len(held[r]) and held[r][-1] + 1
            pos = np.array([p], dtype=np.int64)
            sig = None
            if signals == "ties":
                sig = np.array([[0.01 * rng.integers(0, 3), 0.0]])
            elif signals == "random":
                sig = np.array([[rng.random() * 0.05, rng.random() * 1e-3]])
            for pol in (fast, ref):
                pol.insert(f"row{r}", pos, sig)
            held[r].append(p)
            n = len(held[r])
            if attention == "zeros":
                att = np.zeros(n)
            elif attention == "uniform":
                att = np.full(n, 1.0 / n)
            elif attention == "ties":
                att = rng.integers(0, 3, n) / 4.0
            else:
                att = rng.random(n) ** 4
                att /= att.sum()
            for pol in (fast, ref):
                pol.observe(f"row{r}", np.array(held[r], dtype=np.int64), att)
        got, want = fast.allocate(budget), ref.allocate(budget)
        _same(got, want)
        assert fast.byte_price == ref.byte_price
        for name, (pos, bits) in want.items():
            r = int(name[3:])
            gone = set(pos[bits == EVICTED].tolist())
            held[r] = [q for q in held[r] if q not in gone]
    assert fast.resident_bytes() == ref.resident_bytes()
    return longest + new


CONFIGS: dict[str, TokenPDConfig | None] = {
    "default": None,
    "keep_rule=false:memory=32": TokenPDConfig(keep_rule=False, memory=32),
    "sinks and window": TokenPDConfig(num_sink=4, recent_window=8),
    "risk": TokenPDConfig(risk_aversion=0.5),
    "age prior": TokenPDConfig(age_prior=4.0, memory=16),
    "copy bonus": TokenPDConfig(copy_bonus=1.0),
    "pool": TokenPDConfig(pool=2),
}

MIXES: dict[str, MixedConfig] = {
    "16+8+4 (SmolLM2)": MixedConfig((16, 8, 4), SMOL),
    "16+8+4+2 (SmolLM2)": MixedConfig((16, 8, 4, 2), SMOL),
    "8+4 (SmolLM2)": MixedConfig((8, 4), SMOL),
    "4 alone": MixedConfig((4,), SMOL),
    "16 alone": MixedConfig((16,), SMOL),
    "2 alone": MixedConfig((2,), SMOL),
    "default costs": MixedConfig(),
    "loss_scale 0 (equal shares)": MixedConfig((16, 8, 4, 2), SMOL, loss_scale=0.0),
    "loss_scale 3 (2 bits keep nothing)": MixedConfig((16, 8, 4, 2), SMOL, loss_scale=3.0),
    "loss_scale 1e3": MixedConfig((16, 8, 4, 2), SMOL, loss_scale=1e3),
    "loss_scale 1e-14 (near ties)": MixedConfig((16, 8, 4), SMOL, loss_scale=1e-14),
}


class TestAllocateAgainstReference:
    """Every allocation and price equals the first TokenPDMixed's, step by step."""

    @pytest.mark.parametrize("mix", sorted(MIXES))
    @pytest.mark.parametrize("fraction", [0.0, 0.25, 1.0])
    def test_every_precision_set_and_budget(self, mix: str, fraction: float) -> None:
        """Each set of precisions (single ones too), from a budget below the cheapest state
        of any token (0) to one that fits every token at 16 bits (1.0), rows of 23 and 9
        prompt tokens."""
        _lockstep(None, MIXES[mix], (23, 9), 6, fraction, "random", seed=int(fraction * 100))

    @pytest.mark.parametrize("config", sorted(CONFIGS))
    @pytest.mark.parametrize("attention", ["random", "zeros", "uniform", "ties"])
    def test_every_config_and_attention(self, config: str, attention: str) -> None:
        """Token-PD's options, and attention that ties every value (zeros, uniform) or many
        (a few levels)."""
        _lockstep(CONFIGS[config], MIXES["16+8+4+2 (SmolLM2)"], (17, 30, 5), 5, 0.25, attention, 1)

    @pytest.mark.parametrize("seed", range(12))
    def test_random_cases(self, seed: int) -> None:
        """Seeded draws of everything: rows and their lengths, precisions, loss scale,
        budget, signals with ties, protection."""
        rng = np.random.default_rng(100 + seed)
        rows = tuple(int(x) for x in rng.integers(1, 40, rng.integers(1, 4)))
        sets = [(16, 8, 4), (16, 8, 4, 2), (16, 4), (8, 4, 2), (8,), (16, 2)]
        precisions = sets[int(rng.integers(len(sets)))]
        scale = float(rng.choice([0.0, 0.5, 1.0, 2.0, 7.0]))
        config = TokenPDConfig(
            num_sink=int(rng.integers(0, 3)),
            recent_window=int(rng.integers(0, 4)),
            keep_rule=bool(rng.integers(2)),
            memory=int(rng.choice([0, 8])),
        )
        _lockstep(
            config,
            MixedConfig(precisions, SMOL, loss_scale=scale),
            rows,
            int(rng.integers(1, 8)),
            float(rng.uniform(0.0, 0.8)),
            str(rng.choice(["random", "ties", "uniform"])),
            seed,
            signals=str(rng.choice(["none", "ties", "random"])),
        )

    def test_realistic_run(self) -> None:
        """SmolLM2's costs, two rows of 171 and 125 prompt tokens and 16 new ones, a quarter
        of the bytes: the case of the README's timing."""
        _lockstep(None, MIXES["16+8+4 (SmolLM2)"], (171, 125), 16, 0.25, "random", 7)

    def test_non_finite_value_is_the_same_error(self) -> None:
        """A value that overflows (huge predicted returns of protected tokens) raises
        choose_states's error in both, after the same bookkeeping."""
        for cls in (TokenPDMixed, _ReferenceMixed):
            p = cls(TokenPDConfig(num_sink=1))
            p.insert("a", np.arange(3, dtype=np.int64), np.full((3, 1), 1e308))
            with (
                np.errstate(over="ignore", invalid="ignore"),
                pytest.raises(ValueError, match="'values' must be finite"),
            ):
                p.allocate(1000.0)
            assert p.steps == 1
            assert p.resident_tokens() == 3


def _knapsack_cases() -> list[tuple[str, dict[str, Any]]]:
    """Random knapsacks of the form ScaledChains solves: values v * keeps, patterns."""
    cases = []
    rng = np.random.default_rng(5)
    smol = np.array([0.0, *(SMOL.token_bytes[b] for b in (2, 4, 8, 16))])
    collinear = smol.copy()
    keeps4 = np.array([retained_fraction(b, 1.0) for b in (0, 2, 4, 8, 16)])
    collinear[3] = collinear[2] * keeps4[3] / keeps4[2]  # 0, 4 and 8 bits on one line
    for k in range(60):
        n = int(rng.integers(1, 60))
        costs = collinear if k % 5 == 4 else smol
        scale = float(rng.choice([0.0, 1.0, 3.0, 1e-12, 50.0]))
        keeps = np.array([retained_fraction(b, scale) for b in (0, 2, 4, 8, 16)])
        kind = k % 4
        if kind == 0:
            v = rng.random(n)
        elif kind == 1:
            v = rng.integers(0, 3, n).astype(np.float64)  # ties, zeros
        elif kind == 2:
            v = rng.choice([0.0, 1e-310, 5e-324, 1e-200, 1e300, 1.0], n)  # the float ends
        else:
            v = np.full(n, 0.25)
        patterns = rng.random((6, 5)) < 0.6
        patterns[:, 0] = True
        pattern = rng.integers(0, 6, n)
        budget = float(rng.choice([0.0, 1.0, 100.0, rng.uniform(0, n * 768), 1e9]))
        priority = rng.integers(0, 4, n).astype(np.float64)  # ties too
        cases.append(
            (
                f"case{k}",
                {
                    "value": v,
                    "keeps": keeps,
                    "costs": costs,
                    "patterns": patterns,
                    "pattern": pattern,
                    "budget": budget,
                    "priority": priority,
                    # Only values at the ends of float64 or states on one line may be
                    # declined.
                    "may_decline": kind == 2 or costs is collinear,
                },
            )
        )
    return cases


class TestScaledChains:
    """ScaledChains.choose is choose_states bit for bit, or declines."""

    @pytest.mark.parametrize(("name", "case"), _knapsack_cases())
    def test_equals_choose_states(self, name: str, case: Mapping[str, Any]) -> None:
        """States, price and bytes spent equal choose_states's wherever it answers."""
        chains = ScaledChains(case["keeps"], case["costs"], case["patterns"])
        got = chains.choose(case["value"], case["pattern"], case["budget"], case["priority"])
        want = choose_states(
            case["value"][:, None] * case["keeps"][None, :],
            case["costs"],
            case["budget"],
            case["patterns"][case["pattern"]],
            priority=case["priority"],
        )
        if got is None:
            assert case["may_decline"]
            return
        assert got.state.tolist() == want.state.tolist()
        assert got.price == want.price
        assert got.spent == want.spent

    def test_answers_the_usual_case(self) -> None:
        """With TokenPDMixed's shares and SmolLM2's costs every pattern is safe and ordinary
        values are answered, not declined."""
        p = TokenPDMixed(mixed=MIXES["16+8+4+2 (SmolLM2)"])
        chains = p._chains
        assert chains.safe.all()
        v = np.random.default_rng(0).random(50)
        assert chains.choose(v, np.full(50, 4), 1e4, np.arange(50.0)) is not None

    def test_declines_a_tie_of_distinct_slopes(self) -> None:
        """States on one line through the free state (equal slopes that rounding may
        order either way) make the pattern unsafe, and such values are declined."""
        costs = np.array([0.0, 100.0, 200.0])
        chains = ScaledChains(np.array([0.0, 0.3, 0.6]), costs, np.ones((1, 3), dtype=bool))
        assert not chains.safe[0]
        assert chains.choose(np.array([0.7]), np.array([0]), 150.0, np.zeros(1)) is None

    def test_declines_values_at_the_ends_of_float64(self) -> None:
        """Subnormal or huge values, whose products lose their relative precision, are
        declined; zero is answered (every slope exactly 0)."""
        p = TokenPDMixed(mixed=MIXES["16+8+4 (SmolLM2)"])
        chains = p._chains
        pat = np.full(1, 3)
        assert chains.choose(np.array([1e-310]), pat, 1e4, np.zeros(1)) is None
        assert chains.choose(np.array([1e305]), pat, 1e4, np.zeros(1)) is None
        got = chains.choose(np.array([0.0]), pat, 1e4, np.zeros(1))
        assert got is not None
        assert got.state.tolist() == [3]

    def test_bad_shapes_are_named(self) -> None:
        """Mismatched shapes and bad costs are ValueErrors naming them."""
        with pytest.raises(ValueError, match="disagree"):
            ScaledChains(np.zeros(3), np.array([0.0, 1.0]), np.ones((1, 2), dtype=bool))
        with pytest.raises(ValueError, match="'costs' must start at 0 and increase"):
            ScaledChains(np.zeros(2), np.array([0.0, 0.0]), np.ones((1, 2), dtype=bool))
        with pytest.raises(ValueError, match="free state"):
            ScaledChains(np.zeros(2), np.array([0.0, 1.0]), np.array([[False, True]]))


_FLOATS = st.floats(0.0, 1.0, allow_subnormal=True)


class TestScaledChainsProperty:
    """Arbitrary shares (not monotone either), costs, patterns and values."""

    @settings(max_examples=40, deadline=None)
    @given(
        keeps=st.lists(_FLOATS, min_size=1, max_size=4),
        steps=st.lists(st.floats(1e-3, 1e3), min_size=4, max_size=4),
        values=st.lists(
            st.one_of(_FLOATS, st.sampled_from([0.0, 1e-300, 5e-324, 1e300])),
            min_size=1,
            max_size=12,
        ),
        seed=st.integers(0, 2**16),
        budget=st.floats(0.0, 5e3),
    )
    def test_never_disagrees(
        self,
        keeps: list[float],
        steps: list[float],
        values: list[float],
        seed: int,
        budget: float,
    ) -> None:
        """Whenever ScaledChains answers, it is choose_states's answer."""
        k = np.array([0.0, *keeps])
        c = np.concatenate(([0.0], np.cumsum(steps[: len(keeps)])))
        rng = np.random.default_rng(seed)
        patterns = rng.random((3, k.size)) < 0.7
        patterns[:, 0] = True
        v = np.array(values)
        pattern = rng.integers(0, 3, v.size)
        priority = rng.integers(0, 3, v.size)
        got = ScaledChains(k, c, patterns).choose(v, pattern, budget, priority)
        if got is None:
            return
        want = choose_states(
            v[:, None] * k[None, :],
            c,
            budget,
            patterns[pattern],
            priority=priority.astype(np.float64),
        )
        assert got.state.tolist() == want.state.tolist()
        assert got.price == want.price
        assert got.spent == want.spent
