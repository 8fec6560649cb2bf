"""The token table shared by every token policy: batch-global storage and selection.

Every resident token owns a *slot* in flat, growable numpy arrays (its stream, position,
insertion number, eviction key). Each stream owns a segment of one flat ``map`` array,
indexed by position, that holds the slot (``-1`` when not resident), so that mapping the
positions of many streams to slots is one gather::

    map:  | stream 0: slot of pos 0, 1, ... span0-1 | stream 1: ... | (garbage) | ... |
            ^ base[0]                                ^ base[1]

A stream that outgrows its segment moves to a new one twice as large at the end; the
garbage is compacted away when it exceeds the live part (amortised O(1) per token).

Eviction takes the tokens of smallest key across every stream. A full selection over a
million keys costs milliseconds, so the table keeps a *candidate set*: every resident token
whose key is below a threshold ``tau`` is in it (it may also hold stale or larger entries).
The ``k`` smallest candidates below ``tau`` are then exactly the ``k`` smallest tokens
overall. When fewer than ``k`` candidates lie below ``tau``, the set is rebuilt with one
pass over all keys, its threshold estimated from a sample, sized so that the rebuild is
amortised over many steps::

    keys (all resident)   |  candidates (key < tau)  |  everything else (key >= tau)  |
                          0 ------------------------ tau -------------------------- +inf

Ties are broken by insertion number (older first), so the order is deterministic; ``tau``
is a (key, insertion number) pair so that many equal keys (H2O before any attention) do not
defeat the candidate set. Free slots hold key ``+inf``.
Protected tokens (attention sinks, a recent window) carry ``PROTECTED_OFFSET`` on their key:
they go last, and only when the hard budget cannot be met otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["PROTECTED_OFFSET", "ScoredPolicy"]

PROTECTED_OFFSET = 2.0**60
"""Added to the key of a protected token, so that it is evicted after every other token."""

_MIN_CANDIDATES = 16384
_CANDIDATE_FACTOR = 64
_SAMPLE = 4096
_SEQ_MAX = np.iinfo(np.int64).max


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


def _grown(arr: NDArray[Any], new: int, fill: Any = 0) -> NDArray[Any]:
    out = np.full(new, fill, dtype=arr.dtype)
    out[: arr.size] = arr
    return out


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
        # Per-slot columns.
        cap = 1024
        self._cap = cap
        self._raw = np.zeros(cap, dtype=np.float64)
        self._key = np.full(cap, math.inf, dtype=np.float64)
        self._seq = np.zeros(cap, dtype=np.int64)
        self._sid = np.zeros(cap, dtype=np.int64)
        self._pos = np.zeros(cap, dtype=np.int64)
        self._prot = np.zeros(cap, dtype=bool)
        self._in_cand = np.zeros(cap, dtype=bool)
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self._nfree = cap
        self._next_seq = 0
        self._resident = 0
        # Per-stream columns, indexed by stream index.
        self._index: dict[str, int] = {}
        self._names: list[str | None] = []
        self._base = np.zeros(16, dtype=np.int64)
        self._span = np.zeros(16, dtype=np.int64)
        self._maxpos = np.full(16, -1, dtype=np.int64)
        self._live = np.zeros(16, dtype=np.int64)
        self._map = np.full(4096, -1, dtype=np.int64)
        self._map_used = 0
        self._map_garbage = 0
        # Candidate set and its (key, insertion number) threshold.
        self._cand = np.zeros(0, dtype=np.int64)
        self._tau_key = -math.inf
        self._tau_seq = 0
        self._rng = np.random.default_rng(0)

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
        self._insert(_check_stream(stream), pos, signals)

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
        self._insert(names, pos, signals)

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
        pos = _as_positions(positions)
        slots = self._lookup(stream, pos)
        att = _as_values(attention, pos.size, "attention")
        if slots.size:
            self._on_observe(slots, att)

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        """Evict the smallest keys until at most ``budget_tokens`` remain.

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
        pos = _as_positions(positions)
        if pos.size > 1 and np.unique(pos).size != pos.size:
            raise ValueError(f"'positions' must be distinct: {pos.tolist()[:10]}")
        slots = self._lookup(stream, pos)
        if slots.size:
            self._release(slots)

    def remove(self, stream: str) -> None:
        """Forget a finished or preempted stream and all its tokens (unknown: no-op)."""
        sid = self._index.get(_check_stream(stream))
        if sid is None:
            return
        seg = self._segment(sid)
        slots = seg[seg >= 0]
        if slots.size:
            self._release(slots)
        del self._index[stream]
        self._names[sid] = None
        self._map_garbage += int(self._span[sid])
        self._span[sid] = 0

    def resident_tokens(self) -> int:
        """Tokens resident across every stream."""
        return self._resident

    def stream_tokens(self, stream: str) -> int:
        """Tokens resident in ``stream`` (0 when unknown)."""
        sid = self._index.get(_check_stream(stream))
        return 0 if sid is None else int(self._live[sid])

    def resident_positions(self, stream: str) -> NDArray[np.int64]:
        """(m,) int64 resident positions of ``stream``, ascending (empty when unknown)."""
        sid = self._index.get(_check_stream(stream))
        if sid is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self._segment(sid) >= 0).astype(np.int64)

    @property
    def streams(self) -> tuple[str, ...]:
        """Ids of the streams known now, in order of first insertion."""
        return tuple(self._index)

    # -------------------------------------------------------------- internals
    @staticmethod
    def _check_budget(budget_tokens: object) -> int:
        if not isinstance(budget_tokens, int | np.integer) or isinstance(budget_tokens, bool):
            raise TypeError(f"'budget_tokens' must be int: {budget_tokens!r}")
        budget = int(budget_tokens)
        if budget < 0:
            raise ValueError(f"'budget_tokens' must be >= 0: {budget}")
        return budget

    def _segment(self, sid: int) -> NDArray[np.int64]:
        b = int(self._base[sid])
        return self._map[b : b + int(self._span[sid])]

    def _lookup(self, stream: object, pos: NDArray[np.int64]) -> NDArray[np.int64]:
        """Slots of resident ``pos`` of ``stream``; ValueError when one is not resident."""
        sid = self._index.get(_check_stream(stream))
        if sid is None:
            raise ValueError(f"unknown stream: {stream!r}")
        span = int(self._span[sid])
        if pos.size and int(pos.max()) >= span:
            bad = pos[pos >= span]
            raise ValueError(f"positions not resident in stream {stream!r}: {bad[:5].tolist()}")
        slots = self._map[int(self._base[sid]) + pos]
        if slots.size and int(slots.min()) < 0:
            bad = pos[slots < 0]
            raise ValueError(f"positions not resident in stream {stream!r}: {bad[:5].tolist()}")
        return slots

    def _insert(self, names: str | list[str], pos: NDArray[np.int64], signals: object) -> None:
        """Validate everything, then write; ``names`` is one stream or one per token."""
        n = pos.size
        sig = self._validate_signals(signals, n)
        if n == 0:
            return
        index = self._index
        if isinstance(names, str):
            one = index.get(names, -1)
            if n > 1 and np.unique(pos).size != n:
                raise ValueError(f"'positions' must be distinct per stream: {pos.tolist()[:10]}")
            if one >= 0:
                self._check_free(names, np.full(n, one, dtype=np.int64), pos, [])
            else:
                one = self._new_stream(names)
                index[names] = one
            sid = np.full(n, one, dtype=np.int64)
        else:
            try:
                sid_list = [index.get(name, -1) for name in names]
            except TypeError:  # an unhashable id
                bad = next(name for name in names if not isinstance(name, str))
                raise TypeError(f"'streams' must hold str ids: {bad!r}") from None
            sid = np.asarray(sid_list, dtype=np.int64)
            # Known ids are str (dict keys); only unknown ones need the type check.
            new_names = [
                _check_stream(name) for name, i in zip(names, sid_list, strict=True) if i < 0
            ]
            if n > 1:
                tag = sid.copy()
                if new_names:
                    fresh = {name: -2 - j for j, name in enumerate(dict.fromkeys(new_names))}
                    for j in np.flatnonzero(sid < 0).tolist():
                        tag[j] = fresh[names[j]]
                order = np.lexsort((pos, tag))
                same = (np.diff(tag[order]) == 0) & (np.diff(pos[order]) == 0)
                if same.any():
                    dup = pos[order][1:][same]
                    raise ValueError(f"'positions' must be distinct per stream: {dup[:5].tolist()}")
            known = sid >= 0
            self._check_free(names, sid[known], pos[known], np.flatnonzero(known))
            if new_names:
                for name in dict.fromkeys(new_names):
                    index[name] = self._new_stream(name)
                sid = np.asarray([index[name] for name in names], dtype=np.int64)
        grow = pos >= self._span[sid]
        if grow.any():
            streams, inv = np.unique(sid[grow], return_inverse=True)
            top = np.full(streams.size, -1, dtype=np.int64)
            np.maximum.at(top, inv, pos[grow])
            for s_, p_ in zip(streams.tolist(), top.tolist(), strict=True):
                self._ensure(s_, p_)
        slots = self._alloc(n)
        self._write(slots, sid, pos, sig)

    def _check_free(
        self,
        names: str | list[str],
        sid: NDArray[np.int64],
        pos: NDArray[np.int64],
        where: NDArray[np.int64] | list[int],
    ) -> None:
        """ValueError when a (known stream, position) pair is already resident."""
        inside = pos < self._span[sid]
        taken = self._map[self._base[sid[inside]] + pos[inside]] >= 0
        if not taken.any():
            return
        hit = np.flatnonzero(inside)[taken]
        if isinstance(names, str):
            raise ValueError(
                f"positions already resident in stream {names!r}: {pos[hit][:5].tolist()}"
            )
        rows = np.asarray(where)[hit]
        stream = names[int(rows[0])]
        bad = [int(p) for p, r in zip(pos[hit], rows, strict=True) if names[int(r)] == stream]
        raise ValueError(f"positions already resident in stream {stream!r}: {bad[:5]}")

    def _new_stream(self, name: str) -> int:
        sid = len(self._names)
        self._names.append(name)
        if sid >= self._base.size:
            new = 2 * self._base.size
            self._base = _grown(self._base, new)
            self._span = _grown(self._span, new)
            self._maxpos = _grown(self._maxpos, new, -1)
            self._live = _grown(self._live, new)
        self._span[sid] = 0
        self._maxpos[sid] = -1
        self._live[sid] = 0
        self._ensure(sid, 15)
        return sid

    def _ensure(self, sid: int, max_position: int) -> None:
        """Give stream ``sid`` a segment that ``max_position`` indexes (doubling)."""
        span = int(self._span[sid])
        if max_position < span:
            return
        new = max(2 * span, max_position + 1, 16)
        base = self._reserve(new)  # may compact, moving this stream's old segment
        old_base = int(self._base[sid])
        self._map[base : base + span] = self._map[old_base : old_base + span]
        self._map_garbage += span
        self._base[sid] = base
        self._span[sid] = new

    def _reserve(self, n: int) -> int:
        """Start of ``n`` fresh map entries (all -1) at the end of the map."""
        if self._map_used + n > self._map.size:
            live = self._map_used - self._map_garbage
            if self._map_garbage > live:
                self._compact_map()
            if self._map_used + n > self._map.size:
                self._map = _grown(self._map, max(2 * self._map.size, self._map_used + n), -1)
        base = self._map_used
        self._map[base : base + n] = -1
        self._map_used += n
        return base

    def _compact_map(self) -> None:
        new = np.full(self._map.size, -1, dtype=np.int64)
        at = 0
        for sid in self._index.values():
            b, s = int(self._base[sid]), int(self._span[sid])
            new[at : at + s] = self._map[b : b + s]
            self._base[sid] = at
            at += s
        self._map = new
        self._map_used = at
        self._map_garbage = 0

    def _alloc(self, n: int) -> NDArray[np.int64]:
        if n > self._nfree:
            self._grow(max(2 * self._cap, self._cap + n))
        self._nfree -= n
        return self._free[self._nfree : self._nfree + n][::-1].copy()

    def _grow(self, new: int) -> None:
        old = self._cap
        for name in ("_raw", "_seq", "_sid", "_pos", "_prot", "_in_cand"):
            setattr(self, name, _grown(getattr(self, name), new))
        self._key = _grown(self._key, new, math.inf)
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
    ) -> None:
        n = slots.size
        self._sid[slots] = sid
        self._pos[slots] = pos
        self._seq[slots] = np.arange(self._next_seq, self._next_seq + n)
        self._next_seq += n
        self._map[self._base[sid] + pos] = slots
        streams, counts = np.unique(sid, return_counts=True)
        self._live[streams] += counts
        self._resident += n
        old_max = self._maxpos[streams].copy()
        if streams.size == n:  # one token per stream: plain fancy indexing is exact
            self._maxpos[sid] = np.maximum(self._maxpos[sid], pos)
        else:
            np.maximum.at(self._maxpos, sid, pos)
        prot = pos < self._num_sink
        gone = np.zeros(0, dtype=np.int64)
        w = self._recent
        if w:
            new_max = self._maxpos[streams]
            prot |= pos > self._maxpos[sid] - w
            # Positions in (old_max - w, new_max - w] leave the recent window now.
            lo = np.maximum(old_max - w + 1, self._num_sink)
            length = np.maximum(new_max - w + 1 - lo, 0)
            total = int(length.sum())
            if total:
                starts = self._base[streams] + lo
                offsets = np.cumsum(length) - length
                idx = np.repeat(starts - offsets, length) + np.arange(total)
                gone = self._map[idx]
                gone = gone[gone >= 0]
        self._prot[slots] = prot
        raw = self._new_keys(slots, sig)
        self._raw[slots] = raw
        self._key[slots] = raw + PROTECTED_OFFSET * prot
        self._admit_candidates(slots)
        if gone.size:
            gone = gone[self._prot[gone] & (self._pos[gone] >= self._num_sink)]
            if gone.size:
                self._prot[gone] = False
                self._key[gone] = self._raw[gone]
                self._admit_candidates(gone)

    def _set_raw(self, slots: NDArray[np.int64], raw: NDArray[np.float64]) -> None:
        """Change the raw key of resident ``slots``, keeping the candidate invariant."""
        self._raw[slots] = raw
        self._key[slots] = raw + PROTECTED_OFFSET * self._prot[slots]
        self._admit_candidates(slots)

    def _under_tau(self, slots: NDArray[np.int64]) -> NDArray[np.bool_]:
        key = self._key[slots]
        tk = self._tau_key
        if self._tau_seq == _SEQ_MAX:
            return key <= tk
        under: NDArray[np.bool_] = (key < tk) | ((key == tk) & (self._seq[slots] < self._tau_seq))
        return under

    def _admit_candidates(self, slots: NDArray[np.int64]) -> None:
        new = slots[self._under_tau(slots) & ~self._in_cand[slots]]
        if new.size:
            self._in_cand[new] = True
            self._cand = np.concatenate((self._cand, new))

    def _prune_candidates(self) -> NDArray[np.int64]:
        cand = self._cand
        keep = self._under_tau(cand)
        if self._tau_key == math.inf:
            keep &= self._key[cand] < math.inf
        if not keep.all():
            self._in_cand[cand[~keep]] = False
            cand = cand[keep]
            self._cand = cand
        return cand

    def _rebuild_candidates(self, k: int) -> None:
        """Make the candidate set the ~m smallest tokens, m amortising the full pass."""
        self._in_cand[self._cand] = False
        # A rebuild is one sequential pass over every key and lasts ~m/k steps; each step
        # gathers the m candidates at random. Gathers cost ~20x a sequential element, so m
        # ~ sqrt(resident * k / 20) balances the two (measured: bench_evict_overhead).
        m = max(_CANDIDATE_FACTOR * k, _MIN_CANDIDATES, int(math.sqrt(self._resident * k / 20)))
        keys = self._key[: self._cap]
        if self._resident <= 2 * m:
            cand = np.flatnonzero(keys < math.inf)
            tk, ts = math.inf, _SEQ_MAX
        else:
            # Estimate the m-th smallest key from a sample, then take everything up to it.
            sample = np.sort(keys[self._rng.integers(0, self._cap, _SAMPLE)])
            frac = m / self._cap
            cand = np.zeros(0, dtype=np.int64)
            tk, ts = math.inf, _SEQ_MAX
            while frac < 1.0:
                est = float(sample[min(int(frac * _SAMPLE), _SAMPLE - 1)])
                if est == math.inf:
                    break
                cand = np.flatnonzero(keys <= est)
                if cand.size >= k:
                    tk, ts = est, _SEQ_MAX
                    break
                frac *= 4.0
            if tk == math.inf:
                cand = np.flatnonzero(keys < math.inf)
            if cand.size > 4 * m:
                cand, tk, ts = self._lex_smallest(cand, m)
        self._cand = cand
        self._tau_key = tk
        self._tau_seq = ts
        self._in_cand[cand] = True

    def _lex_smallest(self, idx: NDArray[np.int64], m: int) -> tuple[NDArray[np.int64], float, int]:
        """The ``m`` smallest of ``idx`` by (key, seq) and the first pair left out."""
        keys = self._key[idx]
        kth = float(np.partition(keys, m)[m])
        strict = idx[keys < kth]
        tied = idx[keys == kth]
        need = m - strict.size
        seqs = self._seq[tied]
        ts = int(np.partition(seqs, need)[need])
        return np.concatenate((strict, tied[seqs < ts])), kth, ts

    def _below(self, limit: float) -> NDArray[np.int64]:
        """Resident slots whose key is < ``limit``."""
        cand = self._prune_candidates()
        if limit > self._tau_key:
            self._rebuild_candidates(1)
            cand = self._cand
        if limit > self._tau_key:
            return np.flatnonzero(self._key[: self._cap] < limit)
        return cand[self._key[cand] < limit]

    def _smallest(self, k: int, pruned: bool = False) -> NDArray[np.int64]:
        """The ``k`` resident slots of smallest (key, insertion number).

        ``pruned`` says the candidate set was pruned since the last change of any key.
        """
        cand = self._cand if pruned else self._prune_candidates()
        if cand.size < k:
            self._rebuild_candidates(k)
            cand = self._cand
        if cand.size < k:  # cannot happen: a rebuild yields >= k or every resident slot
            cand = np.flatnonzero(self._key[: self._cap] < math.inf)
        if cand.size == k:
            return cand.copy()
        return self._lex_smallest(cand, k)[0]

    def _release(self, slots: NDArray[np.int64]) -> dict[str, NDArray[np.int64]]:
        """Free resident ``slots`` and report them per stream."""
        sid = self._sid[slots]
        pos = self._pos[slots]
        self._map[self._base[sid] + pos] = -1
        streams, counts = np.unique(sid, return_counts=True)
        self._live[streams] -= counts
        self._key[slots] = math.inf
        self._free[self._nfree : self._nfree + slots.size] = slots
        self._nfree += slots.size
        self._resident -= slots.size
        order = np.lexsort((pos, sid))
        sid = sid[order]
        pos = pos[order]
        cuts = (np.flatnonzero(sid[1:] != sid[:-1]) + 1).tolist()
        names = self._names
        starts = [0, *cuts]
        firsts = sid[starts].tolist()
        ends = [*cuts, pos.size]
        return {names[s]: pos[a:b] for s, a, b in zip(firsts, starts, ends, strict=True)}
