"""Which token positions of each running request are resident: the eviction ledger.

A serving engine that evicts tokens (not just whole requests) needs the same bookkeeping
whatever the engine: the positions each stream has written, which of them were reported to
the :class:`~kvpolicy.kvmodel.EvictionPolicy`, which are still resident after its rounds,
and when the next round is due. :class:`ResidencyLedger` is that bookkeeping, for the
simulator and for a real engine's integration alike; the engine keeps its own blocks and
asks the ledger after each round how many tokens each stream still holds.

One stream's positions, as the ledger sees them::

    0 ............ inserted ........ written
    |  reported to the policy  |  pending  |
    |  (resident unless evicted)           |

``pending`` tokens were written since the last report; they are resident and count against
the budget, and are reported at the next round (or when the stream leaves). One rule
triggers a round: the iteration's growth would pass the budget, or the policy's cadence is
due. The cadence is the policy's, not the ledger's: a policy that implements kvmodel's
:class:`~kvpolicy.kvmodel.Scheduled` (kvpolicy-evict's ``Periodic(policy, interval)``) is
told the iterations that pass and asked when its next round is due; any other policy gets a
round only when the budget needs one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel._errors import KVModelError
from kvpolicy.kvmodel._protocols import EvictionPolicy, Scheduled

__all__ = ["AttentionSource", "ResidencyError", "ResidencyLedger"]

_EMPTY = np.empty(0, dtype=np.int64)
_NEVER = 2**62  # the step of the next cadence round of a policy without a cadence


class ResidencyError(KVModelError):
    """An eviction policy broke its contract (left more tokens than its budget)."""


@runtime_checkable
class AttentionSource(Protocol):
    """Where a ledger's per-token signals and observed attention come from (a model's
    attention, or a simulator's synthetic model)."""

    def signals(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> NDArray[np.float64] | None:
        """(n, k) float64 features of new ``positions`` (e.g. a predicted return) when the
        stream is ``length`` tokens long, or None."""
        ...

    def attention(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> tuple[NDArray[np.float64], float]:
        """``(weights, normaliser)``: (n,) float64 attention weights of resident
        ``positions`` from one query at ``length``, and the sum of the weights over every
        position ``< length`` (resident or not), so that ``weights / normaliser`` is the
        attention mass each position receives."""
        ...


class _Stream:
    __slots__ = ("held", "inserted", "observed_at", "positions")

    def __init__(self, step: int) -> None:
        self.held = 0  # written tokens of a suspended stream never reported
        self.inserted = 0
        self.observed_at = step
        self.positions: NDArray[np.int64] = _EMPTY


class ResidencyLedger:
    """Resident token positions of every stream under one eviction policy and budget.

    Args:
        policy: the batch-global eviction policy; when it implements
            :class:`~kvpolicy.kvmodel.Scheduled`, its cadence adds rounds (the ledger ticks
            it by the iterations between rounds), else rounds run only when the budget
            needs one.
        budget: most tokens resident after a round (> 0).
        source: signals of new tokens and the attention resident tokens receive.
        evict_ahead: iterations of growth a round leaves room for (at most a quarter of the
            budget), so that under pressure rounds come every ``evict_ahead`` iterations.
        idle_rounds: run the cadence's rounds while resident tokens are well under the
            budget (True), or only once they come within one round's headroom of it
            (False: far cheaper when memory is plentiful; tokens that join meanwhile are
            reported at the next round, and a policy then sees the attention accumulated
            since its last round at once).

    Raises:
        TypeError / ValueError: a bad argument, named.
    """

    def __init__(
        self,
        policy: EvictionPolicy,
        budget: int,
        source: AttentionSource,
        *,
        evict_ahead: int = 16,
        idle_rounds: bool = True,
    ) -> None:
        if not isinstance(policy, EvictionPolicy):
            raise TypeError(f"'policy' must implement EvictionPolicy: {policy!r}")
        if not isinstance(source, AttentionSource):
            raise TypeError(f"'source' must implement AttentionSource: {source!r}")
        for name, value, low in (
            ("budget", budget, 1),
            ("evict_ahead", evict_ahead, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"'{name}' must be int: {value!r}")
            if value < low:
                raise ValueError(f"'{name}' must be >= {low}: {value}")
        if not isinstance(idle_rounds, bool):
            raise TypeError(f"'idle_rounds' must be bool: {idle_rounds!r}")
        self._policy = policy
        self._cadence: Scheduled | None = policy if isinstance(policy, Scheduled) else None
        self._clock = 0  # the step the cadence was last ticked to
        self._source = source
        self._idle_rounds = idle_rounds
        self._streams: dict[str, _Stream] = {}
        self.budget = budget
        """Most tokens resident after a round."""
        self.evict_ahead = evict_ahead
        """Iterations of growth a round leaves room for."""
        self.resident_total = 0
        """Tokens reported to the policy and still resident."""
        self.pending = 0
        """Tokens written to open streams and not yet reported."""
        self.next_round = _NEVER if self._cadence is None else self._cadence.steps_until_due
        """Iteration at which the policy's cadence makes the next round due (``2**62`` for
        a policy without a cadence)."""
        self.rounds = 0
        """Rounds run."""
        self.evicted = 0
        """Tokens the policy evicted."""
        self.recall_sum = 0.0
        self.recall_n = 0

    # ------------------------------------------------------------------ queries
    @property
    def resident_now(self) -> int:
        """Tokens resident now: reported and still resident, plus pending."""
        return self.resident_total + self.pending

    @property
    def attention_recall(self) -> float:
        """Mean share of attention mass that fell on resident tokens, over the iterations
        observed (1.0 before any observation)."""
        return self.recall_sum / self.recall_n if self.recall_n else 1.0

    def resident(self, stream: str) -> int:
        """Reported positions of ``stream`` still resident (0 for an unknown stream)."""
        s = self._streams.get(stream)
        return 0 if s is None else len(s.positions)

    def inserted(self, stream: str) -> int:
        """Positions of ``stream`` reported to the policy so far."""
        s = self._streams.get(stream)
        return 0 if s is None else s.inserted

    def positions(self, stream: str) -> NDArray[np.int64]:
        """(n,) int64 resident reported positions of ``stream``, ascending."""
        s = self._streams.get(stream)
        return _EMPTY if s is None else s.positions

    def headroom(self, batch: int) -> int:
        """Tokens a round leaves free below the budget for ``batch`` streams' growth."""
        return min(batch * self.evict_ahead, self.budget // 4)

    def due(self, step: int, growth: int) -> bool:
        """Whether a round must run before an iteration at ``step`` adding ``growth``
        tokens: the cadence is due, or the growth would pass the budget."""
        # Asked before every iteration: the properties are spelled out.
        budget = self.budget
        need = self.resident_total + self.pending + growth
        if need > budget:
            return True
        if step < self.next_round:
            return False
        # Without idle rounds, the cadence applies only above three quarters of the budget.
        return self._idle_rounds or need > budget - budget // 4

    def steps_free(self, step: int, batch: int) -> int:
        """Decode iterations of ``batch`` streams that can run from ``step`` before the next
        round is due (at least 1)."""
        b = batch if batch > 1 else 1
        budget = self.budget
        resident = self.resident_total + self.pending
        if not self._idle_rounds:
            calm = budget - budget // 4 - resident
            if calm > 0:  # no round is due before the calm ends, whatever the cadence
                return calm // b if calm >= b else 1
        by_room = (budget - resident) // b
        cadence = self.next_round - step
        return max(1, min(cadence, by_room))

    # ---------------------------------------------------------------- lifecycle
    def open(self, stream: str, step: int, written: int = 0) -> None:
        """A stream joins the batch at ``step`` with ``written`` positions already held
        (e.g. prefix-cache hits), which are reported now."""
        if stream in self._streams:
            raise KVModelError(f"stream {stream!r} is already open")
        self._streams[stream] = _Stream(step)
        if written and self._idle_rounds:
            self.report(stream, written, from_pending=False)
        else:
            self.pending += written  # reported at the next round

    def wrote(self, tokens: int) -> None:
        """``tokens`` new positions were written across the open streams."""
        self.pending += tokens

    def report(self, stream: str, upto: int, *, from_pending: bool = True) -> None:
        """Report positions ``inserted .. upto`` of ``stream`` to the policy."""
        s = self._streams[stream]
        if upto <= s.inserted:
            return
        pos = np.arange(s.inserted, upto, dtype=np.int64)
        self._policy.insert(stream, pos, self._source.signals(stream, pos, upto))
        s.positions = np.concatenate((s.positions, pos)) if len(s.positions) else pos
        self.resident_total += len(pos)
        if from_pending:
            self.pending -= len(pos)
        s.inserted = upto

    def suspend(self, stream: str, written: int) -> None:
        """The stream leaves the batch keeping its KV elsewhere (swapped out): its tokens
        leave the policy and the budget, its positions are remembered for :meth:`resume`."""
        s = self._streams[stream]
        if not self._idle_rounds and not s.inserted:
            # Never reported: nothing to take back from the policy.
            self.pending -= written
            s.held = written
            return
        self.report(stream, written)
        self._policy.remove(stream)
        self.resident_total -= len(s.positions)

    def resume(self, stream: str, step: int) -> None:
        """A suspended stream returns at ``step`` with the positions it had."""
        s = self._streams[stream]
        s.observed_at = step
        if s.held:
            self.pending += s.held
            s.held = 0
            return
        if len(s.positions):
            self._policy.insert(
                stream, s.positions, self._source.signals(stream, s.positions, s.inserted)
            )
        self.resident_total += len(s.positions)

    def drop(self, stream: str, written: int) -> None:
        """The stream loses its KV (preempted for recomputation); it may :meth:`open`
        again."""
        if not self._idle_rounds and not self._streams[stream].inserted:
            self._streams.pop(stream)
            self.pending -= written
            return
        self.report(stream, written)
        self._policy.remove(stream)
        s = self._streams.pop(stream)
        self.resident_total -= len(s.positions)

    def close(self, stream: str, written: int) -> None:
        """The stream finished with ``written`` positions written; forget it."""
        s = self._streams.pop(stream)
        if s.inserted:  # a stream the policy never saw needs no removal
            self._policy.remove(stream)
        self.resident_total -= len(s.positions)
        self.pending -= written - s.inserted

    # -------------------------------------------------------------------- rounds
    def round(
        self, step: int, running: Iterable[tuple[str, int]], growth: int
    ) -> Mapping[str, int]:
        """Report, observe and evict down to ``budget - growth``.

        Args:
            step: the iteration now.
            running: ``(stream, written)`` of every stream in the batch.
            growth: tokens to leave free below the budget (the coming iterations' growth).

        Returns:
            For each stream that lost tokens, how many positions it still has resident.

        Raises:
            ResidencyError: the policy left more tokens resident than it was asked to.
        """
        batch = list(running)
        policy, source = self._policy, self._source
        for stream, written in batch:
            self.report(stream, written)
        for stream, _ in batch:
            s = self._streams[stream]
            steps = step - s.observed_at
            if steps <= 0 or not len(s.positions):
                continue
            w, norm = source.attention(stream, s.positions, s.inserted)
            self.recall_sum += float(w.sum()) / norm * steps
            self.recall_n += steps
            policy.observe(stream, s.positions, w * (steps / norm))
            s.observed_at = step
        target = max(0, self.budget - growth)
        cadence = self._cadence
        if cadence is not None and step > self._clock:
            cadence.tick(step - self._clock)
            self._clock = step
        evicted = policy.evict(target)
        self.rounds += 1
        out: dict[str, int] = {}
        for stream, pos in evicted.items():
            held = self._streams.get(stream)
            if held is None or not len(pos):
                continue
            # Resident positions ascend and the evicted ones are among them: a binary
            # search marks them (the same result as np.isin, without sorting both).
            keep = np.ones(len(held.positions), dtype=np.bool_)
            keep[np.searchsorted(held.positions, pos)] = False
            dropped = len(pos)
            held.positions = held.positions[keep]
            self.resident_total -= dropped
            self.evicted += dropped
            out[stream] = len(held.positions)
        resident = policy.resident_tokens()
        if resident > target:
            raise ResidencyError(
                f"eviction policy left {resident} tokens resident, over its budget {target}"
            )
        if cadence is not None:
            self.next_round = step + cadence.steps_until_due
        return out
