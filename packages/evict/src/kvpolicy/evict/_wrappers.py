"""Policies built from policies: eviction cadence (:class:`Periodic`) and protected tokens
(:class:`Protected`), each itself a kvmodel ``EvictionPolicy``; and :func:`default_policies`,
every registered policy plus the wrappers and compositions, for conformance suites.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._baselines import H2OPolicy, LRUPolicy, SinkWindowPolicy
from kvpolicy.evict._compose import Composed
from kvpolicy.evict._scored import ScoredPolicy
from kvpolicy.evict._table import check_budget
from kvpolicy.evict._tokenpd import TokenPDPolicy
from kvpolicy.kvmodel import EVICTION, EvictionPolicy, build, describe, names

__all__ = ["Periodic", "Protected", "default_policies"]


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{name}' must be int: {value!r}")
    if value < low:
        raise ValueError(f"'{name}' must be >= {low}: {value!r}")
    return value


def _check_policy(policy: object) -> EvictionPolicy:
    if not isinstance(policy, EvictionPolicy):
        raise TypeError(f"'policy' must implement EvictionPolicy: {policy!r}")
    return policy


class Periodic:
    """Runs ``policy``'s eviction round every ``interval`` steps, or when over the budget.

    Cadence is this wrapper's, never a caller's setting: it implements kvmodel's
    ``Scheduled``, through which kvmodel's ``ResidencyLedger`` ticks it by the iterations
    that pass and runs a round when it is due (a policy without it gets rounds only when the
    budget needs one).

    The caller counts steps with :meth:`tick` (one per decode iteration, or ``n`` for a
    jump) and calls :meth:`evict` as often as it likes: a call costs O(1) unless a round
    runs. A round runs when it is *due* (``interval`` steps have passed since the last one)
    or when the resident tokens exceed the budget, so the hard budget always holds; either
    way the next round is due ``interval`` steps later. :attr:`steps_until_due` and
    :meth:`steps_free` let a simulator plan multi-step jumps without calling :meth:`evict`
    at every step.

    Args:
        policy: the eviction policy whose rounds this schedules (it is owned: insert,
            observe and remove go through the wrapper).
        interval: steps between two rounds when the budget holds (>= 1; 1 is every step).

    Raises:
        TypeError: ``policy`` is not an EvictionPolicy or ``interval`` not an int.
        ValueError: ``interval`` < 1.
    """

    def __init__(self, policy: EvictionPolicy, interval: int = 16) -> None:
        self._policy = _check_policy(policy)
        self._interval = _check_int(interval, "interval", 1)
        self._step = 0
        self._due = interval
        self._rounds = 0

    def __repr__(self) -> str:
        return f"Periodic({self._policy!r}, interval={self._interval})"

    @property
    def policy(self) -> EvictionPolicy:
        """The wrapped policy."""
        return self._policy

    @property
    def interval(self) -> int:
        """Steps between two rounds when the budget holds."""
        return self._interval

    @property
    def step(self) -> int:
        """Steps counted by :meth:`tick` so far."""
        return self._step

    @property
    def rounds(self) -> int:
        """Rounds of the wrapped policy run so far."""
        return self._rounds

    @property
    def steps_until_due(self) -> int:
        """Steps until the cadence makes a round due (0: due now)."""
        return max(0, self._due - self._step)

    def tick(self, n: int = 1) -> None:
        """Count ``n`` >= 0 steps."""
        self._step += _check_int(n, "n", 0)

    def steps_free(self, budget_tokens: int, tokens_per_step: int) -> int:
        """Steps that can pass with no round, adding ``tokens_per_step`` tokens each.

        The smaller of :attr:`steps_until_due` and the steps until the resident tokens
        would pass ``budget_tokens``; 0 when a call to :meth:`evict` now would run a round.
        """
        budget = check_budget(budget_tokens)
        per_step = _check_int(tokens_per_step, "tokens_per_step", 0)
        room = budget - self._policy.resident_tokens()
        if room < 0:
            return 0
        by_budget = room // per_step if per_step else self.steps_until_due
        return min(self.steps_until_due, by_budget)

    def evict(self, budget_tokens: int, headroom: int = 0) -> Mapping[str, NDArray[np.int64]]:
        """Run a round of the wrapped policy if one is due or the budget is exceeded.

        Args:
            budget_tokens: hard budget in tokens, >= 0.
            headroom: tokens a round leaves free below the budget, for the growth until the
                next one (the round evicts down to ``max(0, budget_tokens - headroom)``), so
                that under memory pressure rounds come every ``headroom / growth`` steps
                rather than at every step.

        Returns:
            The round's evicted positions per stream; empty when no round ran.

        Raises:
            TypeError, ValueError: ``budget_tokens`` or ``headroom`` is not an int >= 0.
        """
        budget = check_budget(budget_tokens)
        room = _check_int(headroom, "headroom", 0)
        if self._step < self._due and self._policy.resident_tokens() <= budget:
            return {}
        self._due = self._step + self._interval
        self._rounds += 1
        return self._policy.evict(max(0, budget - room))

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens (the wrapped policy's :meth:`insert`)."""
        self._policy.insert(stream, positions, signals)

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """Record attention (the wrapped policy's :meth:`observe`)."""
        self._policy.observe(stream, positions, attention)

    def remove(self, stream: str) -> None:
        """Forget a stream (the wrapped policy's :meth:`remove`)."""
        self._policy.remove(stream)

    def resident_tokens(self) -> int:
        """Tokens resident across every stream."""
        return self._policy.resident_tokens()


class Protected(ScoredPolicy):
    """``base`` with attention sinks and a recent window that it evicts last.

    The ``num_sink`` leading positions and the ``recent_window`` newest positions of each
    stream go only when the hard budget cannot be met otherwise (StreamingLLM's sinks,
    H2O's recent window), whatever the base policy's keys say: ``Protected(LRUPolicy(),
    num_sink=4)`` is LRU that keeps 4 attention sinks per stream. Protection composes: a
    base that protects positions itself keeps the larger of the two settings.

    The base's keys decide everything else; its hooks run unchanged, on its own table,
    which this policy shares (``base`` must be empty and is owned from then on).

    Args:
        base: the policy whose keys order the unprotected tokens; no token inserted yet.
        num_sink: leading positions of each stream to protect (>= 0).
        recent_window: newest positions of each stream to protect (>= 0).

    Raises:
        TypeError: ``base`` is not a :class:`ScoredPolicy` (protection lives in its token
            table), or a count is not an int.
        ValueError: a count < 0, or ``base`` holds tokens.
    """

    def __init__(self, base: ScoredPolicy, *, num_sink: int = 0, recent_window: int = 0) -> None:
        if not isinstance(base, ScoredPolicy):
            raise TypeError(f"'base' must be a ScoredPolicy: {base!r}")
        if base.resident_tokens() or base.table.streams:
            raise ValueError(f"'base' must hold no tokens yet: {base.resident_tokens()}")
        base.table.protect(num_sink=num_sink, recent_window=recent_window)
        super().__init__(table=base.table)
        self._base = base

    def __repr__(self) -> str:
        t = self.table
        return f"Protected({self._base!r}, num_sink={t.num_sink}, recent_window={t.recent_window})"

    @property
    def base(self) -> ScoredPolicy:
        """The wrapped policy."""
        return self._base

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """The base policy's keys."""
        return self._base.new_keys(slots, signals)

    def observed(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """The base policy learns."""
        self._base.observed(slots, attention)

    def check_signals(self, signals: object, n: int) -> NDArray[np.float64] | None:
        """The base policy's check."""
        return self._base.check_signals(signals, n)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """The base policy's round (Token-PD's keep rule and price included)."""
        return self._base.evict(budget_tokens)


def default_policies() -> dict[str, EvictionPolicy]:
    """A fresh instance of every registered eviction policy, wrapper and composition, by label.

    Every ``kvpolicy.eviction`` entry point that needs no params, built with its defaults
    (labelled by its name),
    plus :class:`Periodic`, :class:`Protected` and :class:`~kvpolicy.evict.Composed` around
    some of them: what a conformance suite of kvmodel's ``EvictionPolicy`` Protocol runs
    over.
    """
    out: dict[str, EvictionPolicy] = {
        name: build(EVICTION, name)
        for name in names(EVICTION)
        if not any(p.required for p in describe(EVICTION, name))  # composed names members
    }
    out["periodic(token-pd, 4)"] = Periodic(build(EVICTION, "token-pd"), interval=4)
    out["periodic(h2o, 1)"] = Periodic(build(EVICTION, "h2o"), interval=1)
    out["protected(lru, 2, 3)"] = Protected(LRUPolicy(), num_sink=2, recent_window=3)
    out["periodic(protected(token-pd, 1, 2), 3)"] = Periodic(
        Protected(TokenPDPolicy(), num_sink=1, recent_window=2), interval=3
    )
    out["composed(h2o, token-pd)"] = Composed([H2OPolicy(recent_window=2), TokenPDPolicy()])
    out["composed(sink-window, lru, fifo; 1:2:1)"] = Composed(
        [SinkWindowPolicy(num_sink=1), LRUPolicy(), build(EVICTION, "fifo")], shares=[1, 2, 1]
    )
    out["periodic(composed(protected(lru, 1, 0), token-pd), 2)"] = Periodic(
        Composed([Protected(LRUPolicy(), num_sink=1), TokenPDPolicy()]), interval=2
    )
    # Demoting policies (kvmodel's DemotingPolicy) are eviction policies too.
    from kvpolicy.evict._mixed import TokenPDMixed, UniformPrecision

    out["token-pd-mixed(16+8+4)"] = TokenPDMixed()
    out["uniform(h2o, 4)"] = UniformPrecision(build(EVICTION, "h2o"), bits=4)
    return out
