"""Policies that hold tokens at several precisions under one budget in bytes.

Both implement kvmodel's ``DemotingPolicy`` (and so ``EvictionPolicy``):

- :class:`UniformPrecision` holds every token of any eviction policy at one precision:
  ``UniformPrecision(H2OPolicy(), bits=4)`` is int4 quantization plus H2O eviction down to
  the tokens the byte budget buys at 4 bits; ``UniformPrecision(policy, bits=16)`` is the
  eviction policy alone, counted in bytes. An eviction-only policy reaches a byte budget
  this way, unchanged.
- :class:`TokenPDMixed` is Token-PD with a choice of states per token (16, 8, 4, 2 bits or
  evicted): each token's value in a state is its estimated return (Token-PD's ``R_hat -
  lambda sigma^2 + delta``) times the share a state keeps (:func:`retained_fraction`), and
  :func:`choose_states` prices a byte across every stream at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of
from numpy.typing import NDArray

from kvpolicy.evict._chains import ScaledChains
from kvpolicy.evict._precision import (
    EVICTED,
    PrecisionCosts,
    check_precisions,
    choose_states,
    retained_fraction,
)
from kvpolicy.evict._table import _as_positions
from kvpolicy.evict._tokenpd import TokenPDConfig, TokenPDPolicy
from kvpolicy.kvmodel import EvictionPolicy, ModelSpec

__all__ = ["DEFAULT_COSTS", "MixedConfig", "StateChanges", "TokenPDMixed", "UniformPrecision"]

StateChanges = Mapping[str, tuple[NDArray[np.int64], NDArray[np.int64]]]
"""What ``allocate`` returns: per stream, ``(positions, new bits)`` of the tokens that changed
state, positions ascending (0 bits: evicted)."""

DEFAULT_COSTS = PrecisionCosts.of(ModelSpec("one KV head, d_h = 128", 1, 1, 128))
"""Costs of one KV head of dimension 128 with groups of 32 and fp16 scales (512, 288, 160
and 96 bytes at 16, 8, 4 and 2 bits): a stand-in when the model is not known; the
harness passes its model's costs."""


def _check_budget_bytes(budget_bytes: object) -> float:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int | float | np.number):
        raise TypeError(f"'budget_bytes' must be a number: {budget_bytes!r}")
    b = float(budget_bytes)
    if not math.isfinite(b) or b < 0:
        raise ValueError(f"'budget_bytes' must be finite and >= 0: {budget_bytes!r}")
    return b


def _merge(
    out: dict[str, tuple[list[NDArray[np.int64]], list[NDArray[np.int64]]]],
) -> dict[str, tuple[NDArray[np.int64], NDArray[np.int64]]]:
    res = {}
    for stream, (pos, bits) in out.items():
        p, b = np.concatenate(pos), np.concatenate(bits)
        order = np.argsort(p, kind="stable")
        res[stream] = (p[order], b[order])
    return res


def _add(
    out: dict[str, tuple[list[NDArray[np.int64]], list[NDArray[np.int64]]]],
    changes: Mapping[str, NDArray[np.int64]],
    bits: int,
) -> None:
    """Append ``changes`` (stream -> positions) at ``bits`` (0: evicted) to ``out``."""
    for stream, pos in changes.items():
        if pos.size:
            got = out.setdefault(stream, ([], []))
            got[0].append(pos)
            got[1].append(np.full(pos.size, bits, dtype=np.int64))


class UniformPrecision:
    """Any eviction policy with every token held at ``bits``, under a budget in bytes.

    A token enters at 16 bits; the next :meth:`allocate` demotes it to ``bits`` (unless it
    is evicted) and evicts through the base policy down to the tokens the budget buys at
    ``bits`` bytes each. Every other call goes to the base policy unchanged.

    With ``residual = G > 0`` (KIVI's layout: keys quantized per channel over groups of
    ``G`` tokens), tokens stay at 16 bits until ``G`` of them wait, and then the oldest
    ``G`` are demoted together, so that a reader can quantize their keys per channel in one
    group; between 0 and ``G - 1`` tokens stay at 16 bits, and the budget counts them at
    16 bits (:attr:`key_axis` is then ``"channel"``).

    With ``window = W > 0`` (keys per token), the newest ``W`` tokens of each stream stay at
    16 bits, a full-precision residual that slides: a token is demoted once ``W`` newer
    ones are resident, one at a time, and the budget counts the window at 16 bits. The
    newest tokens are the ones a query attends most, so their quantization error costs
    most; this is the residual alone, without KIVI's per-channel groups.

    Args:
        policy: the eviction policy (it decides which tokens go).
        bits: the precision every token is held at (16, 8, 4 or 2).
        costs: bytes per token at 16 bits and at ``bits`` (:data:`DEFAULT_COSTS` when None).
        residual: tokens demoted together, 0 for one at a time (each at its first
            allocate).
        window: newest tokens per stream kept at 16 bits (0: none), demoted one at a time
            as they leave it; not with ``residual``.

    Raises:
        TypeError: ``policy`` is not an EvictionPolicy.
        ValueError: ``bits`` unsupported or without a cost, or ``residual`` or ``window``
            negative, not an int, or set with 16 bits, or both set.
    """

    def __init__(
        self,
        policy: EvictionPolicy,
        bits: int = 16,
        costs: PrecisionCosts | None = None,
        *,
        residual: int = 0,
        window: int = 0,
    ) -> None:
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(f"'policy' must be an EvictionPolicy: {policy!r}")
        for name, value in (("residual", residual), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"'{name}' must be an int >= 0: {value!r}")
        (b,) = check_precisions([bits])
        for name, value in (("residual", residual), ("window", window)):
            if value and b == 16:
                raise ValueError(f"'{name}' = {value} needs bits below 16: bits = {b}")
        if residual and window:
            raise ValueError(
                f"give 'residual' or 'window', not both: residual = {residual}, window = {window}"
            )
        cst = DEFAULT_COSTS if costs is None else costs
        if not isinstance(cst, PrecisionCosts):
            raise TypeError(f"'costs' must be PrecisionCosts: {costs!r}")
        for need in {16, b}:
            if need not in cst.token_bytes:
                raise ValueError(f"'costs' has no cost for {need} bits: {dict(cst.token_bytes)}")
        self._base = policy
        self._bits = b
        self._costs = cst
        self._residual = residual
        self._window = window
        # Tokens still at 16 bits (inserted since the last allocate, or in the window),
        # per stream, oldest first.
        self._pending: dict[str, NDArray[np.int64]] = {}

    @property
    def base(self) -> EvictionPolicy:
        """The eviction policy."""
        return self._base

    @property
    def bits(self) -> int:
        """The precision every token is held at after :meth:`allocate`."""
        return self._bits

    @property
    def costs(self) -> PrecisionCosts:
        """The bytes of a token at 16 bits and at :attr:`bits`."""
        return self._costs

    @property
    def residual(self) -> int:
        """Tokens demoted together (0: each at its first allocate)."""
        return self._residual

    @property
    def window(self) -> int:
        """Newest tokens per stream kept at 16 bits (0: none)."""
        return self._window

    @property
    def key_axis(self) -> str:
        """How a reader should quantize the keys of the tokens demoted together:
        ``"channel"`` with a residual (one group of :attr:`residual` tokens per channel),
        ``"token"`` without."""
        return "channel" if self._residual else "token"

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """The base policy's insert; the tokens are at 16 bits until :meth:`allocate`."""
        self._base.insert(stream, positions, signals)
        pos = _as_positions(positions)
        prev = self._pending.get(stream)
        self._pending[stream] = pos.copy() if prev is None else np.concatenate((prev, pos))

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """The base policy's observe."""
        self._base.observe(stream, positions, attention)

    def _forget(self, evicted: Mapping[str, NDArray[np.int64]]) -> None:
        for stream, pos in evicted.items():
            prev = self._pending.get(stream)
            if prev is not None and prev.size:
                self._pending[stream] = prev[~np.isin(prev, pos)]

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """The base policy's evict, counted in tokens."""
        out = self._base.evict(budget_tokens)
        self._forget(out)
        return out

    def allocate(self, budget_bytes: float) -> StateChanges:
        """Evict through the base policy to ``floor(budget_bytes / cost(bits))`` tokens, then
        demote every token still at 16 bits to ``bits`` (with a residual: the oldest
        whole groups of :attr:`residual` waiting tokens; with a window: all but the
        newest :attr:`window` of each stream; evicting further while the ones left at 16
        bits would overrun the budget)."""
        budget = _check_budget_bytes(budget_bytes)
        per = self._costs.token_bytes[self._bits]
        evicted = self.evict(int(budget // per))
        out: dict[str, tuple[list[NDArray[np.int64]], list[NDArray[np.int64]]]] = {}
        _add(out, evicted, 0)
        if self._residual or self._window:
            extra = self._costs.token_bytes[16] - per
            while True:
                left = sum(self._kept(p.size) for p in self._pending.values())
                tokens = self._base.resident_tokens()
                if (tokens - left) * per + left * (per + extra) <= budget or tokens == 0:
                    break
                more = self.evict(max(0, tokens - max(1, math.ceil(left * extra / per))))
                if not any(p.size for p in more.values()):
                    break
                _add(out, more, 0)
        if self._bits == 16:
            self._pending = {}
        else:
            demote: dict[str, NDArray[np.int64]] = {}
            for stream, pos in self._pending.items():
                take = pos.size - self._kept(pos.size)
                if take:
                    demote[stream] = pos[:take]
                    self._pending[stream] = pos[take:]
            _add(out, demote, self._bits)
        self._pending = {s: p for s, p in self._pending.items() if p.size}
        return _merge(out)

    def _kept(self, waiting: int) -> int:
        """How many of a stream's ``waiting`` tokens at 16 bits stay there this allocate."""
        if self._residual:
            return waiting % self._residual
        return min(waiting, self._window)

    def resident_bytes(self) -> float:
        """Tokens at ``bits`` times their cost, plus those still at 16 bits."""
        fresh = sum(int(p.size) for p in self._pending.values())
        held = self._base.resident_tokens() - fresh
        c = self._costs.token_bytes
        return float(held * c[self._bits] + fresh * c[16])

    def remove(self, stream: str) -> None:
        """Forget a stream."""
        self._base.remove(stream)
        self._pending.pop(stream, None)

    def resident_tokens(self) -> int:
        """Tokens resident in the base policy."""
        return self._base.resident_tokens()


@frozen
class MixedConfig:
    """The states :class:`TokenPDMixed` chooses between, and what each costs and keeps."""

    precisions: tuple[int, ...] = field(default=(16, 8, 4), converter=check_precisions)
    """Bits a resident token may be held at (highest first after conversion); a token
    enters at 16 bits and may also be evicted. Without 16 every token leaves 16 bits at
    its first allocation."""
    costs: PrecisionCosts = field(default=DEFAULT_COSTS, validator=instance_of(PrecisionCosts))
    """Bytes of a token of one stream at each precision (16 bits always needed)."""
    loss_scale: float = field(default=1.0, converter=float, validator=ge(0.0))
    """How much return quantization costs: a token at ``b`` bits keeps
    ``1 - loss_scale / (2**b - 1)`` of it (:func:`retained_fraction`)."""

    def __attrs_post_init__(self) -> None:
        if not math.isfinite(self.loss_scale):
            raise ValueError(f"'loss_scale' must be finite: {self.loss_scale!r}")
        for need in {16, *self.precisions}:
            if need not in self.costs.token_bytes:
                raise ValueError(
                    f"'costs' has no cost for {need} bits: {dict(self.costs.token_bytes)}"
                )


class TokenPDMixed(TokenPDPolicy):
    """Token-PD choosing each token's precision or eviction under one byte budget.

    Everything of :class:`TokenPDPolicy` (its return estimates, signals, sinks and recent
    window, ``evict`` in tokens) plus :meth:`allocate`: the value of a token in state ``b``
    is ``max(g + mu c, 0) * retained_fraction(b)`` (its return net of risk, as Token-PD
    prices it, times what ``b`` bits keep of it), its cost the bytes of ``b`` bits, and
    :func:`choose_states` picks every token's state across every stream with one price per
    byte (:attr:`byte_price`). A state only goes down; protected tokens (sinks, recent
    window) take their upgrades before any other.

    Args:
        config: Token-PD's parameters.
        mixed: the states, their costs and the loss model.
    """

    def __init__(
        self, config: TokenPDConfig | None = None, mixed: MixedConfig | None = None
    ) -> None:
        super().__init__(config)
        m = MixedConfig() if mixed is None else mixed
        if not isinstance(m, MixedConfig):
            raise TypeError(f"'mixed' must be a MixedConfig: {mixed!r}")
        self._mixed = m
        # States from the free one up, with their cost and the share of return kept.
        self._states = np.array([EVICTED, *sorted({16, *m.precisions})], dtype=np.int64)
        self._state_cost = m.costs.cost(self._states)
        self._keeps = np.array([retained_fraction(int(b), m.loss_scale) for b in self._states])
        allowed = np.isin(self._states, (EVICTED, *m.precisions))
        # Row i: the states a token held at self._states[i] may take (those offered up to
        # its own, the free one, and its own even when no longer offered).
        self._patterns = allowed[None, :] & (self._states[None, :] <= self._states[:, None])
        self._patterns[:, 0] = True
        self._patterns |= np.eye(self._states.size, dtype=bool)
        self._chains = ScaledChains(self._keeps, self._state_cost, self._patterns)
        self._pattern_of = np.zeros(17, dtype=np.int64)  # bits -> row of _patterns
        self._pattern_of[self._states] = np.arange(self._states.size)
        self._byte_price = 0.0
        self.table.add_column("bits", fill=16.0)

    @property
    def mixed(self) -> MixedConfig:
        """The states and their costs."""
        return self._mixed

    @property
    def byte_price(self) -> float:
        """The price of a byte at the last :meth:`allocate` (value per byte of the first
        upgrade the budget left out; 0 before any or when everything fitted)."""
        return self._byte_price

    def precisions_of(self, stream: str, positions: NDArray[np.int64]) -> NDArray[np.int64]:
        """(n,) int64 bits at which resident ``positions`` of ``stream`` are held."""
        slots = self.table.lookup(stream, positions)
        return self.table.column("bits")[slots].astype(np.int64)

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """Token-PD's keys; the tokens enter at 16 bits."""
        self.table.column("bits")[slots] = 16.0
        return super().new_keys(slots, signals)

    def resident_bytes(self) -> float:
        """Bytes of every resident token at its precision."""
        slots = self.table.resident_slots()
        bits = self.table.column("bits")[slots].astype(np.int64)
        return float(self._mixed.costs.cost(bits).sum())

    def _values(self, slots: NDArray[np.int64]) -> NDArray[np.float64]:
        """(n,) float64 ``g + mu c`` of resident ``slots`` (every stream, in table order)."""
        table = self.table
        cfg = self._cfg
        if not (cfg.copy_bonus or cfg.age_prior or cfg.pool):
            # Nothing per stream or per neighbourhood: every key is the token's value as
            # insert or its last observe computed it (new_keys, observed), and nothing
            # it depends on has changed since.
            return table.keys(slots)
        value = np.empty(slots.size)
        start = 0
        for stream in table.streams:
            own = table.resident_slots(stream)
            value[start : start + own.size] = self._value(own, stream)
            start += own.size
        return value

    def allocate(self, budget_bytes: float) -> StateChanges:
        """Choose every resident token's state at one price per byte (module docstring).

        The knapsack runs on :class:`~kvpolicy.evict._chains.ScaledChains` (each token's
        upgrades laid out from its pattern's hull at once), which gives
        :func:`choose_states`'s answer bit for bit; where it cannot vouch for that
        (a near tie of slopes, a value near the ends of float64) ``choose_states`` runs.

        Returns:
            Per stream, the positions whose state changed and their new bits (0: evicted),
            positions ascending.

        Raises:
            TypeError, ValueError: ``budget_bytes`` not a finite number >= 0; nothing
                changes then.
        """
        budget = _check_budget_bytes(budget_bytes)
        table = self.table
        slots = table.resident_slots()
        if not slots.size:
            return {}
        self._steps += 1
        value = np.maximum(self._values(slots), 0.0)
        prot = table.protected(slots)
        # Protected tokens are worth more than every other one together.
        value = np.where(prot, value + 1.0 + value.sum(), value)
        bits_col = table.column("bits")
        current = bits_col[slots].astype(np.int64)
        pattern = self._pattern_of[current]
        order = table.insertion_order(slots)
        # Declines values that are not finite too: choose_states then names them.
        choice = self._chains.choose(value, pattern, budget, order)
        if choice is None:
            choice = choose_states(
                value[:, None] * self._keeps[None, :],
                self._state_cost,
                budget,
                self._patterns[pattern],
                priority=order.astype(np.float64),
            )
        self._byte_price = choice.price
        new = self._states[choice.state]
        hit = np.flatnonzero(new != current)
        if not hit.size:
            return {}
        # Slots run stream by stream, positions ascending within each (resident_slots).
        new_hit, slots_hit = new[hit], slots[hit]
        positions = table.positions_of(slots_hit)
        ends = np.cumsum([table.stream_tokens(name) for name in table.streams])
        cuts = np.searchsorted(hit, ends).tolist()
        out: dict[str, tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
        a = 0
        for name, b in zip(table.streams, cuts, strict=True):
            if b > a:
                out[name] = (positions[a:b], new_hit[a:b])
            a = b
        gone = new_hit == EVICTED
        kept = ~gone
        bits_col[slots_hit[kept]] = new_hit[kept].astype(np.float64)
        if gone.any():
            table.release(slots_hit[gone])
        return out
