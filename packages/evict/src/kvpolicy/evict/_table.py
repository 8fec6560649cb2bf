"""The token table shared by every token policy: batch-global storage and selection.

Every resident token owns a *slot* in flat, growable numpy arrays (its stream, position,
insertion number, eviction key). A stream keeps a dense ``slot_of`` array indexed by
position (``-1`` when not resident), so that mapping positions to slots is one gather.

Eviction takes the tokens of smallest key across every stream. A full selection over a
million keys costs milliseconds, so the table keeps a *candidate set*: every resident token
whose key is below a threshold ``tau`` is in it (it may also hold stale or larger entries).
The ``k`` smallest candidates below ``tau`` are then exactly the ``k`` smallest tokens
overall. When fewer than ``k`` candidates lie below ``tau``, the set is rebuilt from one
``np.partition`` over all keys, sized so that the rebuild is amortised over many steps::

    keys (all resident)   |  candidates (key < tau)  |  everything else (key >= tau)  |
                          0 ------------------------ tau -------------------------- +inf

Ties are broken by insertion number (older first), so the order is deterministic.
Protected tokens (attention sinks, a recent window) carry ``PROTECTED_OFFSET`` on their key:
they go last, and only when the hard budget cannot be met otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["PROTECTED_OFFSET", "ScoredPolicy"]

PROTECTED_OFFSET = 2.0**60
"""Added to the key of a protected token, so that it is evicted after every other token."""

_MIN_CANDIDATES = 8192
_CANDIDATE_FACTOR = 32


def _as_positions(positions: object, name: str = "positions") -> NDArray[np.int64]:
    """Validate a (n,) array of non-negative integer positions and return it as int64."""
    arr = np.asarray(positions)
    if arr.ndim != 1:
        raise ValueError(f"'{name}' must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"'{name}' must hold integers, got dtype {arr.dtype}")
    out = arr.astype(np.int64, copy=False)
    if out.size and int(out.min()) < 0:
        raise ValueError(f"'{name}' must be non-negative: {out[out < 0][:5].tolist()}")
    return out


def _as_values(values: object, n: int, name: str) -> NDArray[np.float64]:
    """Validate a (n,) array of finite non-negative floats."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"'{name}' must have shape ({n},), got {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        raise ValueError(f"'{name}' must be finite and >= 0: {arr[bad][:5].tolist()}")
    return arr


def _check_stream(stream: object) -> str:
    if not isinstance(stream, str):
        raise TypeError(f"'stream' must be str: {stream!r}")
    return stream


class _Stream:
    """Per-stream bookkeeping: position -> slot, the highest position seen, live count."""

    __slots__ = ("index", "live", "max_pos", "slot_of")

    def __init__(self, index: int) -> None:
        self.index = index
        self.slot_of: NDArray[np.int64] = np.full(16, -1, dtype=np.int64)
        self.max_pos = -1
        self.live = 0

    def ensure(self, max_position: int) -> None:
        """Grow ``slot_of`` (doubling) so that ``max_position`` indexes it."""
        size = self.slot_of.size
        if max_position < size:
            return
        new = max(2 * size, max_position + 1)
        grown = np.full(new, -1, dtype=np.int64)
        grown[:size] = self.slot_of
        self.slot_of = grown


class ScoredPolicy:
    """Batch-global token eviction by smallest key; subclasses say what the key is.

    A subclass implements :meth:`_new_keys` (the raw key of freshly inserted tokens) and,
    when attention matters to it, :meth:`_on_observe`. The base class stores the tokens,
    protects ``num_sink`` leading positions and the ``recent_window`` newest positions of
    each stream, enforces the hard budget in :meth:`evict`, and implements the rest of
    kvmodel's ``EvictionPolicy`` Protocol plus :meth:`rollback` and :meth:`insert_many`.

    Positions are token indices within a stream (dense from 0): memory per stream grows
    with its highest position.
    """

    def __init__(self, *, num_sink: int = 0, recent_window: int = 0) -> None:
        for name, value in (("num_sink", num_sink), ("recent_window", recent_window)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"'{name}' must be int: {value!r}")
            if value < 0:
                raise ValueError(f"'{name}' must be >= 0: {value!r}")
        self._num_sink = num_sink
        self._recent = recent_window
        cap = 1024
        self._cap = cap
        self._raw = np.zeros(cap, dtype=np.float64)
        self._key = np.zeros(cap, dtype=np.float64)
        self._seq = np.zeros(cap, dtype=np.int64)
        self._sid = np.zeros(cap, dtype=np.int64)
        self._pos = np.zeros(cap, dtype=np.int64)
        self._alive = np.zeros(cap, dtype=bool)
        self._prot = np.zeros(cap, dtype=bool)
        self._in_cand = np.zeros(cap, dtype=bool)
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self._nfree = cap
        self._next_seq = 0
        self._resident = 0
        self._streams: dict[str, _Stream] = {}
        self._names: list[str | None] = []
        self._cand = np.zeros(0, dtype=np.int64)
        self._tau = -math.inf

    # ------------------------------------------------------------------ hooks
    def _new_keys(
        self,
        slots: NDArray[np.int64],
        signals: NDArray[np.float64] | None,
    ) -> NDArray[np.float64]:
        """Raw keys of tokens just written to ``slots`` (smaller is evicted first).

        ``signals`` is None or the already validated (n, k) float64 signals of those tokens.
        """
        raise NotImplementedError

    def _validate_signals(self, signals: object, n: int) -> NDArray[np.float64] | None:
        """Check ``signals`` before anything changes; the default ignores them."""
        if signals is None:
            return None
        arr = np.asarray(signals, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] != n:
            raise ValueError(f"'signals' must have shape ({n}, k), got {arr.shape}")
        return arr

    def _on_observe(self, slots: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        """Learn from attention; subclasses call :meth:`_set_raw` when keys change."""

    def _on_grow(self, old: int, new: int) -> None:
        """Subclasses grow their own per-slot columns to ``new`` entries."""

    def _on_free(self, slots: NDArray[np.int64]) -> None:
        """Subclasses forget per-slot state of ``slots``."""

    # ------------------------------------------------------------ public API
    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add tokens of one stream to the cache (vLLM's ``CacheInsert`` hook).

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
        stream = _check_stream(stream)
        pos = _as_positions(positions)
        n = pos.size
        sig = self._validate_signals(signals, n)
        if n == 0:
            return
        if n > 1 and np.unique(pos).size != n:
            raise ValueError(f"'positions' must be distinct: {pos.tolist()[:10]}")
        st = self._streams.get(stream)
        if st is not None:
            inside = pos[pos < st.slot_of.size]
            taken = inside[st.slot_of[inside] >= 0]
            if taken.size:
                raise ValueError(
                    f"positions already resident in stream {stream!r}: {taken[:5].tolist()}"
                )
        else:
            st = self._new_stream(stream)
        slots = self._alloc(n)
        sid = np.full(n, st.index, dtype=np.int64)
        self._write(slots, sid, pos, sig, [(st, pos, slots)])

    def insert_many(
        self,
        streams: Sequence[str],
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        """Add one decode step's tokens of many streams in one vectorised call.

        Equivalent to calling :meth:`insert` once per stream, in the order given.

        Args:
            streams: length-n stream ids, one per token.
            positions: (n,) int64 positions, one per token.
            signals: optional (n, k) float64 per-token features.

        Raises:
            TypeError, ValueError: as :meth:`insert`; nothing changes then.
        """
        names = list(streams)
        pos = _as_positions(positions)
        n = pos.size
        if len(names) != n:
            raise ValueError(f"'streams' has {len(names)} ids but 'positions' has {n} entries")
        sig = self._validate_signals(signals, n)
        if n == 0:
            return
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            _check_stream(name)
            groups.setdefault(name, []).append(i)
        plan: list[tuple[str, NDArray[np.int64]]] = []
        for name, idx_list in groups.items():
            idx = np.asarray(idx_list, dtype=np.int64)
            p = pos[idx]
            if p.size > 1 and np.unique(p).size != p.size:
                raise ValueError(f"'positions' of stream {name!r} must be distinct")
            st = self._streams.get(name)
            if st is not None:
                inside = p[p < st.slot_of.size]
                taken = inside[st.slot_of[inside] >= 0]
                if taken.size:
                    raise ValueError(
                        f"positions already resident in stream {name!r}: {taken[:5].tolist()}"
                    )
            plan.append((name, idx))
        slots = self._alloc(n)
        sid = np.empty(n, dtype=np.int64)
        updates: list[tuple[_Stream, NDArray[np.int64], NDArray[np.int64]]] = []
        for name, idx in plan:
            st = self._streams.get(name) or self._new_stream(name)
            sid[idx] = st.index
            updates.append((st, pos[idx], slots[idx]))
        self._write(slots, sid, pos, sig, updates)

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
        st = self._stream(stream)
        pos = _as_positions(positions)
        att = _as_values(attention, pos.size, "attention")
        slots = self._slots_of(st, stream, pos)
        if slots.size:
            self._on_observe(slots, att)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Evict the smallest keys until at most ``budget_tokens`` remain (``CacheEvict``).

        Args:
            budget_tokens: hard budget in tokens, >= 0.

        Returns:
            For each stream that lost tokens, its (m,) int64 evicted positions, ascending.

        Raises:
            TypeError, ValueError: ``budget_tokens`` is not an int >= 0.
        """
        budget = self._check_budget(budget_tokens)
        excess = self._resident - budget
        if excess <= 0:
            return {}
        return self._release(self._smallest(excess))

    def rollback(self, stream: str, positions: NDArray[np.int64]) -> None:
        """Flag speculative tokens dead and reclaim their memory at once.

        Args:
            stream: stream id.
            positions: (n,) int64 resident positions of rejected draft tokens.

        Raises:
            ValueError: unknown stream or a position not resident; nothing changes then.
        """
        st = self._stream(stream)
        pos = _as_positions(positions)
        if pos.size > 1 and np.unique(pos).size != pos.size:
            raise ValueError(f"'positions' must be distinct: {pos.tolist()[:10]}")
        slots = self._slots_of(st, stream, pos)
        if slots.size:
            self._release(slots)

    def remove(self, stream: str) -> None:
        """Forget a finished or preempted stream and all its tokens (unknown: no-op)."""
        st = self._streams.get(_check_stream(stream))
        if st is None:
            return
        so = st.slot_of
        slots = so[so >= 0]
        if slots.size:
            self._release(slots)
        del self._streams[stream]
        self._names[st.index] = None

    def resident_tokens(self) -> int:
        """Tokens resident across every stream."""
        return self._resident

    def stream_tokens(self, stream: str) -> int:
        """Tokens resident in ``stream`` (0 when unknown)."""
        st = self._streams.get(_check_stream(stream))
        return 0 if st is None else st.live

    def resident_positions(self, stream: str) -> NDArray[np.int64]:
        """(m,) int64 resident positions of ``stream``, ascending (empty when unknown)."""
        st = self._streams.get(_check_stream(stream))
        if st is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(st.slot_of >= 0).astype(np.int64)

    @property
    def streams(self) -> tuple[str, ...]:
        """Ids of the streams known now, in order of first insertion."""
        return tuple(self._streams)

    # -------------------------------------------------------------- internals
    @staticmethod
    def _check_budget(budget_tokens: object) -> int:
        if not isinstance(budget_tokens, int | np.integer) or isinstance(budget_tokens, bool):
            raise TypeError(f"'budget_tokens' must be int: {budget_tokens!r}")
        budget = int(budget_tokens)
        if budget < 0:
            raise ValueError(f"'budget_tokens' must be >= 0: {budget}")
        return budget

    def _stream(self, stream: object) -> _Stream:
        st = self._streams.get(_check_stream(stream))
        if st is None:
            raise ValueError(f"unknown stream: {stream!r}")
        return st

    def _new_stream(self, name: str) -> _Stream:
        st = _Stream(len(self._names))
        self._names.append(name)
        self._streams[name] = st
        return st

    @staticmethod
    def _slots_of(st: _Stream, stream: str, pos: NDArray[np.int64]) -> NDArray[np.int64]:
        so = st.slot_of
        if pos.size and int(pos.max()) >= so.size:
            bad = pos[pos >= so.size]
            raise ValueError(f"positions not resident in stream {stream!r}: {bad[:5].tolist()}")
        slots = so[pos]
        if slots.size and int(slots.min()) < 0:
            bad = pos[slots < 0]
            raise ValueError(f"positions not resident in stream {stream!r}: {bad[:5].tolist()}")
        return slots

    def _alloc(self, n: int) -> NDArray[np.int64]:
        if n > self._nfree:
            self._grow(max(2 * self._cap, self._cap + n))
        self._nfree -= n
        return self._free[self._nfree : self._nfree + n][::-1].copy()

    def _grow(self, new: int) -> None:
        old = self._cap
        for name in ("_raw", "_key", "_seq", "_sid", "_pos", "_alive", "_prot", "_in_cand"):
            arr = getattr(self, name)
            grown = np.zeros(new, dtype=arr.dtype)
            grown[:old] = arr
            setattr(self, name, grown)
        free = np.empty(new, dtype=np.int64)
        free[: self._nfree] = self._free[: self._nfree]
        # Newly created slots are handed out lowest first (the stack pops from its end).
        free[self._nfree : self._nfree + new - old] = np.arange(new - 1, old - 1, -1)
        self._free = free
        self._nfree += new - old
        self._cap = new
        self._on_grow(old, new)

    def _write(
        self,
        slots: NDArray[np.int64],
        sid: NDArray[np.int64],
        pos: NDArray[np.int64],
        sig: NDArray[np.float64] | None,
        updates: list[tuple[_Stream, NDArray[np.int64], NDArray[np.int64]]],
    ) -> None:
        n = slots.size
        self._sid[slots] = sid
        self._pos[slots] = pos
        self._seq[slots] = np.arange(self._next_seq, self._next_seq + n)
        self._next_seq += n
        self._alive[slots] = True
        self._resident += n
        prot = pos < self._num_sink
        unprotect: list[NDArray[np.int64]] = []
        w = self._recent
        for st, p, s in updates:
            hi = int(p.max())
            st.ensure(hi)
            st.slot_of[p] = s
            st.live += p.size
            old_max = st.max_pos
            if hi > old_max:
                st.max_pos = hi
                if w:
                    # Positions in (old_max - w, hi - w] leave the recent window now.
                    lo = max(old_max - w + 1, self._num_sink, 0)
                    top = hi - w + 1
                    if top > lo:
                        seg = st.slot_of[lo : min(top, st.slot_of.size)]
                        unprotect.append(seg[seg >= 0])
        if w:
            # The window is judged against each stream's highest position after the write.
            self._prot[slots] = prot
            for st, p, s in updates:
                self._prot[s] |= p > st.max_pos - w
            prot = self._prot[slots]
        else:
            self._prot[slots] = prot
        raw = self._new_keys(slots, sig)
        self._raw[slots] = raw
        self._key[slots] = raw + PROTECTED_OFFSET * prot
        self._admit_candidates(slots)
        if unprotect:
            gone = np.concatenate(unprotect)
            gone = gone[self._prot[gone]]
            if gone.size:
                self._prot[gone] = False
                self._key[gone] = self._raw[gone]
                self._admit_candidates(gone)

    def _set_raw(self, slots: NDArray[np.int64], raw: NDArray[np.float64]) -> None:
        """Change the raw key of resident ``slots``, keeping the candidate invariant."""
        self._raw[slots] = raw
        self._key[slots] = raw + PROTECTED_OFFSET * self._prot[slots]
        self._admit_candidates(slots)

    def _admit_candidates(self, slots: NDArray[np.int64]) -> None:
        new = slots[(self._key[slots] < self._tau) & ~self._in_cand[slots]]
        if new.size:
            self._in_cand[new] = True
            self._cand = np.concatenate((self._cand, new))

    def _rebuild_candidates(self, k: int) -> None:
        alive = np.flatnonzero(self._alive[: self._cap])
        self._in_cand[self._cand] = False
        m = max(_CANDIDATE_FACTOR * k, _MIN_CANDIDATES)
        if alive.size <= m:
            self._cand = alive
            self._tau = math.inf
        else:
            keys = self._key[alive]
            kth = float(np.partition(keys, m)[m])
            self._cand = alive[keys <= kth]
            self._tau = float(np.nextafter(kth, math.inf))
        self._in_cand[self._cand] = True

    def _below(self, limit: float | None, k: int = 0) -> NDArray[np.int64]:
        """Resident slots whose key is < ``limit`` (None: ``tau``), exact for any limit.

        Prunes dead and out-of-range entries from the candidate set on the way, and
        rebuilds it when fewer than ``k`` candidates lie below ``tau``.
        """
        cand = self._cand
        keep = self._alive[cand] & (self._key[cand] < self._tau)
        if not keep.all():
            self._in_cand[cand[~keep]] = False
            cand = cand[keep]
            self._cand = cand
        if cand.size < k:
            self._rebuild_candidates(k)
            cand = self._cand
        if limit is None:
            return cand
        if limit > self._tau:
            alive = np.flatnonzero(self._alive[: self._cap])
            return alive[self._key[alive] < limit]
        return cand[self._key[cand] < limit]

    def _smallest(self, k: int) -> NDArray[np.int64]:
        """The ``k`` resident slots of smallest (key, insertion number)."""
        below = self._below(None, k)
        if below.size < k:  # the rebuild found fewer than k below tau: only on ties
            below = np.flatnonzero(self._alive[: self._cap])
        keys = self._key[below]
        if below.size > k:
            kth = np.partition(keys, k - 1)[k - 1]
            strict = below[keys < kth]
            tied = below[keys == kth]
            need = k - strict.size
            if tied.size > need:
                tied = tied[np.argsort(self._seq[tied], kind="stable")[:need]]
            return np.concatenate((strict, tied))
        return below

    def _release(self, slots: NDArray[np.int64]) -> dict[str, NDArray[np.int64]]:
        """Free resident ``slots`` and report them per stream."""
        sid = self._sid[slots]
        pos = self._pos[slots]
        order = np.lexsort((pos, sid))
        sid = sid[order]
        pos = pos[order]
        slots = slots[order]
        cuts = np.flatnonzero(np.diff(sid)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [sid.size]))
        out: dict[str, NDArray[np.int64]] = {}
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            name = self._names[int(sid[a])]
            assert name is not None
            st = self._streams[name]
            p = pos[a:b]
            st.slot_of[p] = -1
            st.live -= b - a
            out[name] = p.copy()
        self._alive[slots] = False
        self._on_free(slots)
        self._free[self._nfree : self._nfree + slots.size] = slots
        self._nfree += slots.size
        self._resident -= slots.size
        return out
