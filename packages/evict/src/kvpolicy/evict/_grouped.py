"""Demotions held back until a whole group of tokens shares a precision (keys per channel).

KIVI quantizes keys per channel: a group of ``G`` tokens shares one scale and zero point
per channel, so a token can only be quantized once ``G`` tokens are demoted together. A
policy that chooses each token's precision on its own (:class:`~kvpolicy.evict.TokenPDMixed`)
does not make groups. :class:`GroupedPrecision` wraps one: the inner policy chooses every
token's *target* precision as before; a token whose target falls below the precision it is
held at waits, still held (and paid for) at that precision, in a queue of its stream and
target, and each queue is demoted ``G`` tokens at a time, the oldest (lowest positions)
first. Evictions pass through at once.

Waiting tokens cost more bytes than the inner policy counts; :meth:`GroupedPrecision.allocate`
gives the inner policy the budget less that excess and, while what is held would still
overrun the budget, asks again with a smaller one (the cut doubling each time; its choices
only go down), so the bytes held stay within the budget whenever the inner policy can meet
one.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._mixed import StateChanges, _add, _check_budget_bytes, _merge
from kvpolicy.evict._precision import EVICTED, PrecisionCosts
from kvpolicy.kvmodel import DemotingPolicy

__all__ = ["GroupedPrecision"]

_ROUNDS = 24
"""Most times :meth:`GroupedPrecision.allocate` asks the inner policy in one call."""


class GroupedPrecision:
    """A demoting policy whose demotions come ``residual`` tokens at a time per stream and
    precision (see the module docstring); :attr:`key_axis` is ``"channel"``.

    Args:
        policy: the inner policy (it chooses each token's target state).
        costs: bytes per token at each precision the inner policy uses.
        residual: tokens demoted together (``G``), >= 1.

    Raises:
        TypeError: ``policy`` is not a DemotingPolicy, ``costs`` not PrecisionCosts.
        ValueError: ``residual`` not an int >= 1.
    """

    def __init__(self, policy: DemotingPolicy, costs: PrecisionCosts, *, residual: int) -> None:
        if not isinstance(policy, DemotingPolicy):
            raise TypeError(f"'policy' must be a DemotingPolicy: {policy!r}")
        if not isinstance(costs, PrecisionCosts):
            raise TypeError(f"'costs' must be PrecisionCosts: {costs!r}")
        if isinstance(residual, bool) or not isinstance(residual, int) or residual < 1:
            raise ValueError(f"'residual' must be an int >= 1: {residual!r}")
        self._inner = policy
        self._costs = costs
        self._residual = residual
        # (stream, target bits) -> {position: bits it is held at}, waiting to be demoted.
        self._waiting: dict[tuple[str, int], dict[int, int]] = {}
        # (stream, position) -> its target while it waits.
        self._target: dict[tuple[str, int], int] = {}
        # (stream, position) -> the bits a token demoted here is held at (absent: 16).
        self._held: dict[tuple[str, int], int] = {}

    @property
    def base(self) -> DemotingPolicy:
        """The inner policy."""
        return self._inner

    @property
    def residual(self) -> int:
        """Tokens demoted together."""
        return self._residual

    @property
    def key_axis(self) -> str:
        """``"channel"``: each demotion is whole groups of :attr:`residual` tokens."""
        return "channel"

    def waiting_tokens(self) -> int:
        """Tokens held above their target precision, waiting for a group."""
        return len(self._target)

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """The inner policy's insert (tokens enter at 16 bits)."""
        self._inner.insert(stream, positions, signals)

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """The inner policy's observe."""
        self._inner.observe(stream, positions, attention)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """The inner policy's evict, counted in tokens (evicted tokens stop waiting)."""
        out = self._inner.evict(budget_tokens)
        for stream, pos in out.items():
            self._drop(stream, pos.tolist())
        return out

    def _drop(self, stream: str, positions: list[int]) -> None:
        """Forget evicted tokens: they no longer wait nor are held."""
        for p in positions:
            target = self._target.pop((stream, p), None)
            if target is not None:
                del self._waiting[(stream, target)][p]
            self._held.pop((stream, p), None)

    def _excess(self) -> float:
        """Bytes the waiting tokens hold above their targets' cost."""
        c = self._costs.token_bytes
        return float(
            sum(
                c[held] - c[target]
                for (_, target), queue in self._waiting.items()
                for held in queue.values()
            )
        )

    def _excess_after_flush(self) -> float:
        """:meth:`_excess` once every queue gave its whole groups (its newest tokens,
        fewer than a group, wait on)."""
        c, g = self._costs.token_bytes, self._residual
        total = 0.0
        for (_, target), queue in self._waiting.items():
            left = len(queue) % g
            if left:
                for p in sorted(queue)[-left:]:
                    total += c[queue[p]] - c[target]
        return total

    def _absorb(self, changes: StateChanges, evicted: dict[str, list[int]]) -> None:
        """The inner policy's state changes: evictions noted (and no longer waiting),
        lower targets queued (a token keeps the precision it is held at)."""
        for stream, (positions, bits) in changes.items():
            gone: list[int] = []
            for p, b in zip(positions.tolist(), bits.tolist(), strict=True):
                if b == EVICTED:
                    gone.append(p)
                    continue
                key = (stream, p)
                old = self._target.pop(key, None)
                if old is not None:
                    held = self._waiting[(stream, old)].pop(p)
                else:
                    held = self._held.get(key, 16)
                if b >= held:  # at (or above) what it is held at: nothing to wait for
                    continue
                self._target[key] = b
                self._waiting.setdefault((stream, b), {})[p] = held
            if gone:
                self._drop(stream, gone)
                evicted.setdefault(stream, []).extend(gone)

    def allocate(self, budget_bytes: float) -> StateChanges:
        """The inner policy's choice at the budget less the waiting tokens' excess (asked
        again, smaller, while the bytes held would overrun), then every queue's whole
        groups demoted, oldest first.

        Returns:
            Per stream, positions ascending, the tokens evicted (0) or demoted (their
            target bits).
        """
        budget = _check_budget_bytes(budget_bytes)
        evicted: dict[str, list[int]] = {}
        inner_budget = budget - self._excess()
        cut = 1.0
        for _ in range(_ROUNDS):
            self._absorb(self._inner.allocate(max(inner_budget, 0.0)), evicted)
            over = self._inner.resident_bytes() + self._excess_after_flush() - budget
            if over <= 1e-9 * (1.0 + budget) or inner_budget <= 0.0:
                break
            # A demotion that must wait frees nothing yet: only evictions and whole groups
            # do, so the cut doubles until they cover the overrun.
            inner_budget -= over * cut
            cut *= 2.0
        out: dict[str, tuple[list[NDArray[np.int64]], list[NDArray[np.int64]]]] = {}
        for stream, gone in evicted.items():
            _add(out, {stream: np.array(sorted(gone), dtype=np.int64)}, EVICTED)
        g = self._residual
        for (stream, target), queue in list(self._waiting.items()):
            whole = len(queue) - len(queue) % g
            if not whole:
                continue
            group = sorted(queue)[:whole]
            for p in group:
                del queue[p]
                del self._target[(stream, p)]
                self._held[(stream, p)] = target
            _add(out, {stream: np.array(group, dtype=np.int64)}, target)
        self._waiting = {k: q for k, q in self._waiting.items() if q}
        return _merge(out)

    def resident_bytes(self) -> float:
        """The inner policy's bytes plus what the waiting tokens hold above their targets."""
        return self._inner.resident_bytes() + self._excess()

    def resident_tokens(self) -> int:
        """The inner policy's resident tokens."""
        return self._inner.resident_tokens()

    def remove(self, stream: str) -> None:
        """Forget a stream."""
        self._inner.remove(stream)
        self._waiting = {k: q for k, q in self._waiting.items() if k[0] != stream}
        self._target = {k: t for k, t in self._target.items() if k[0] != stream}
        self._held = {k: b for k, b in self._held.items() if k[0] != stream}
