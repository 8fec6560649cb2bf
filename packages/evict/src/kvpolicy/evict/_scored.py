"""The key hook every token policy implements: say what a token's eviction key is.

:class:`ScoredPolicy` implements kvmodel's ``EvictionPolicy`` over a :class:`TokenTable`;
a policy subclasses it and implements :meth:`ScoredPolicy.new_keys` (and
:meth:`ScoredPolicy.observed` when attention matters to it). FIFO in full::

    class FIFOPolicy(ScoredPolicy):
        def new_keys(self, slots, signals):
            return self.table.insertion_order(slots).astype(np.float64)

Smaller keys are evicted first, across every stream, down to the hard budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._table import TokenTable, _as_positions, _as_values, check_budget

__all__ = ["ScoredPolicy"]


class ScoredPolicy:
    """Batch-global token eviction by smallest key; a subclass says what the key is.

    Hooks (public, all optional but :meth:`new_keys`):

    - :meth:`new_keys`: the keys of freshly inserted tokens;
    - :meth:`observed`: learn from attention, calling ``self.table.set_keys`` when keys change;
    - :meth:`check_signals`: validate the per-token signals of :meth:`insert`.

    The :attr:`table` stores the tokens, protects ``num_sink`` leading and ``recent_window``
    newest positions of each stream, and selects the smallest keys; this class implements
    the rest of kvmodel's ``EvictionPolicy`` Protocol plus :meth:`rollback` and
    :meth:`insert_many`. A policy keeps per-token state in table columns
    (``self.table.add_column``), so that it follows the tokens' slots.

    Args:
        num_sink: leading positions of each stream kept while the budget allows.
        recent_window: newest positions of each stream kept while the budget allows.
        table: a table to share instead of a new one (a wrapper such as
            :class:`Protected` shares its base policy's); ``num_sink`` and
            ``recent_window`` are the table's then.
    """

    def __init__(
        self, *, num_sink: int = 0, recent_window: int = 0, table: TokenTable | None = None
    ) -> None:
        if table is None:
            table = TokenTable(num_sink=num_sink, recent_window=recent_window)
        elif not isinstance(table, TokenTable):
            raise TypeError(f"'table' must be a TokenTable: {table!r}")
        self._table = table

    @property
    def table(self) -> TokenTable:
        """The resident tokens and their keys."""
        return self._table

    # ------------------------------------------------------------------ hooks
    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """Keys of tokens just inserted at ``slots`` (smaller is evicted first).

        Args:
            slots: (n,) int64 table slots of the new tokens.
            signals: None, or the (n, k) float64 signals :meth:`check_signals` returned.

        Returns:
            (n,) float64 keys.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement new_keys")

    def observed(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """Learn from attention received this step; the default ignores it.

        Args:
            slots: (n,) int64 table slots of resident tokens of one stream, in the order
                the caller gave their positions.
            attention: (n,) float64 attention mass each received (finite, >= 0).
        """

    def check_signals(self, signals: object, n: int) -> NDArray[np.float64] | None:
        """Validate the signals of ``n`` tokens before anything changes.

        Returns:
            None, or the signals as an (n, k) float64 array.

        Raises:
            ValueError: not an (n, k) array (a subclass may check values too).
        """
        if signals is None:
            return None
        arr = np.asarray(signals, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] != n:
            raise ValueError(f"'signals' must have shape ({n}, k), got {arr.shape}")
        return arr

    # ------------------------------------------------------------ public API
    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens of one stream to the cache (seed 000's ``CacheInsert`` hook).

        Args:
            stream: stream id, e.g. ``"req7"`` or ``"req7/h3"`` for one KV head; created on
                first use.
            positions: (n,) int64 distinct positions not resident in ``stream``.
            signals: optional (n, k) float64 per-token features; their meaning is the
                policy's (see :class:`TokenPDPolicy`).

        Raises:
            TypeError: ``stream`` is not a str or ``positions`` not integers.
            ValueError: a position is negative, repeated or already resident, or
                ``signals`` has the wrong shape or bad values. Nothing changes then.
        """
        pos = _as_positions(positions)
        if not isinstance(stream, str):
            raise TypeError(f"'stream' must be str: {stream!r}")
        sig = self.check_signals(signals, pos.size)
        self._table.add(stream, pos, lambda slots: self.new_keys(slots, sig))

    def insert_many(
        self,
        streams: Sequence[str],
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add one decode step's tokens of many streams in one vectorised call.

        Equivalent to one :meth:`insert` per stream, in order of first appearance.

        Args:
            streams: length-n stream ids, one per token.
            positions: (n,) int64 positions, one per token.
            signals: optional (n, k) float64 per-token features.

        Raises:
            TypeError, ValueError: as :meth:`insert`; nothing changes then.
        """
        names = list(streams)
        pos = _as_positions(positions)
        if len(names) != pos.size:
            raise ValueError(
                f"'streams' has {len(names)} ids but 'positions' has {pos.size} entries"
            )
        sig = self.check_signals(signals, pos.size)
        self._table.add(names, pos, lambda slots: self.new_keys(slots, sig))

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        """Record attention mass received this step by resident tokens of one stream.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions.
            attention: (n,) float64 attention mass each received this step (>= 0).

        Raises:
            ValueError: unknown stream, a position not resident, or attention of the wrong
                shape, NaN or negative. Nothing changes then.
        """
        slots = self._table.lookup(stream, positions)
        att = _as_values(attention, slots.size, "attention")
        if slots.size:
            self.observed(slots, att)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Evict the smallest keys until at most ``budget_tokens`` remain.

        Args:
            budget_tokens: hard budget in tokens, >= 0.

        Returns:
            For each stream that lost tokens, its (m,) int64 evicted positions, ascending.

        Raises:
            TypeError, ValueError: ``budget_tokens`` is not an int >= 0.
        """
        excess = self._table.resident_tokens() - check_budget(budget_tokens)
        if excess <= 0:
            return {}
        return self._table.release(self._table.smallest(excess))

    def rollback(self, stream: str, positions: NDArray[np.int64]) -> None:
        """Flag speculative tokens dead and reclaim their memory at once.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions of rejected draft tokens.

        Raises:
            ValueError: unknown stream or a position not resident; nothing changes then.
        """
        pos = _as_positions(positions)
        if pos.size > 1 and np.unique(pos).size != pos.size:
            raise ValueError(f"'positions' must be distinct: {pos.tolist()[:10]}")
        slots = self._table.lookup(stream, pos)
        if slots.size:
            self._table.release(slots)

    def remove(self, stream: str) -> None:
        """Forget a finished or preempted stream and all its tokens (unknown: no-op)."""
        self._table.remove(stream)

    def resident_tokens(self) -> int:
        """Tokens resident across every stream."""
        return self._table.resident_tokens()

    def stream_tokens(self, stream: str) -> int:
        """Tokens resident in ``stream`` (0 when unknown)."""
        return self._table.stream_tokens(stream)

    def resident_positions(self, stream: str) -> NDArray[np.int64]:
        """(m,) int64 resident positions of ``stream``, ascending (empty when unknown)."""
        return self._table.resident_positions(stream)

    @property
    def streams(self) -> tuple[str, ...]:
        """Ids of the streams known now, in order of first insertion."""
        return self._table.streams
