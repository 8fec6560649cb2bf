"""The baseline token policies: FIFO, LRU, H2O and sink+window (StreamingLLM).

Each one only says what its eviction key is (:class:`ScoredPolicy`'s hooks); storage,
protection of sinks and recent windows, the batch-global hard budget and rollback live in
its :class:`TokenTable`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict._scored import ScoredPolicy

__all__ = ["FIFOPolicy", "H2OPolicy", "LRUPolicy", "SinkWindowPolicy"]


class FIFOPolicy(ScoredPolicy):
    """First in, first out across every stream: the earliest inserted token goes first."""

    def __init__(self) -> None:
        super().__init__()

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """The insertion order: the oldest token goes first."""
        return self.table.insertion_order(slots).astype(np.float64)


class LRUPolicy(ScoredPolicy):
    """Least recently used across every stream.

    A token is *used* when it is inserted and whenever :meth:`observe` reports for it more
    than ``access_threshold`` times the mean attention of the positions observed in that
    call. Softmax gives every cached token some attention at every step, so an absolute
    threshold of 0 would refresh every token and make LRU the same as FIFO; the default 1.0
    counts above-average attention as a use (0 restores "any attention"). Each use takes the
    next value of a counter, so the order is exact: among tokens used in one call, lower
    positions count as used first.
    """

    def __init__(self, access_threshold: float = 1.0) -> None:
        if isinstance(access_threshold, bool) or not isinstance(access_threshold, int | float):
            raise TypeError(f"'access_threshold' must be a float: {access_threshold!r}")
        if not math.isfinite(access_threshold) or access_threshold < 0:
            raise ValueError(f"'access_threshold' must be finite and >= 0: {access_threshold!r}")
        super().__init__()
        self._threshold = float(access_threshold)
        self._clock = 0

    def _tick(self, n: int) -> NDArray[np.float64]:
        stamps = np.arange(self._clock, self._clock + n, dtype=np.float64)
        self._clock += n
        return stamps

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """The next values of the use counter: inserting is a use."""
        return self._tick(slots.size)

    def observed(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """Tokens with more than the threshold times the mean attention are used now."""
        if attention.size == 0:
            return
        used = slots[attention > self._threshold * float(attention.mean())]
        if used.size:
            used = used[np.argsort(self.table.positions_of(used), kind="stable")]
            self.table.set_keys(used, self._tick(used.size))


class H2OPolicy(ScoredPolicy):
    """Heavy-Hitter Oracle (Zhang et al., 2023) made batch-global.

    The key of a token is the attention it has accumulated since insertion; the
    ``recent_window`` newest positions of each stream (and ``num_sink`` leading ones) are
    kept as long as the hard budget allows. Per-head H2O is the same policy with one stream
    per request and KV head (``"req7/h3"``).

    Args:
        recent_window: newest positions of each stream kept while the budget allows. The
            default 32 is twice the 16 newest keys that draw 31% of a query's attention on
            SmolLM2 (``ATTENTION.md`` of kvpolicy-evict-quality): a token is judged by its
            accumulated attention only once ~32 queries could attend to it, since a younger
            token's sum does not compare with an older one's. H2O's even split of a budget
            ``B`` between recent and heavy tokens is ``recent_window=B // 2`` (what the
            quality harness uses).
        num_sink: leading positions of each stream kept while the budget allows.
    """

    DEFAULT_RECENT_WINDOW = 32
    """``recent_window`` when none is given."""

    def __init__(self, recent_window: int = DEFAULT_RECENT_WINDOW, num_sink: int = 0) -> None:
        super().__init__(num_sink=num_sink, recent_window=recent_window)

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """No attention accumulated yet."""
        return np.zeros(slots.size, dtype=np.float64)

    def observed(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """Accumulate the attention received."""
        self.table.set_keys(slots, self.table.keys(slots) + attention)

    def accumulated_attention(
        self, stream: str, positions: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """(n,) float64 attention accumulated by resident ``positions`` of ``stream``."""
        return self.table.keys(self.table.lookup(stream, positions))


class SinkWindowPolicy(ScoredPolicy):
    """StreamingLLM (Xiao et al., 2023): attention sinks plus the most recent tokens.

    Positions below ``num_sink`` of every stream are sinks and stay; among the rest the
    oldest inserted token across every stream goes first, so each stream keeps a window of
    its newest tokens. Sinks go only when the hard budget cannot be met otherwise.
    """

    def __init__(self, num_sink: int = 4) -> None:
        super().__init__(num_sink=num_sink)

    def new_keys(
        self, slots: NDArray[np.int64], signals: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """The insertion order: the oldest token goes first."""
        return self.table.insertion_order(slots).astype(np.float64)
