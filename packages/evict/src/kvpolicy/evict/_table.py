"""The token table under every token policy: batch-global storage and selection.

:class:`TokenTable` holds the resident tokens of every stream on a GPU and their eviction
keys; a policy (:class:`~kvpolicy.evict.ScoredPolicy`) only says what the keys are.

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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["PROTECTED_OFFSET", "TokenTable", "check_budget"]

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


def check_budget(budget_tokens: object) -> int:
    """``budget_tokens`` as an int; TypeError / ValueError unless it is an int >= 0."""
    if not isinstance(budget_tokens, int | np.integer) or isinstance(budget_tokens, bool):
        raise TypeError(f"'budget_tokens' must be int: {budget_tokens!r}")
    budget = int(budget_tokens)
    if budget < 0:
        raise ValueError(f"'budget_tokens' must be >= 0: {budget}")
    return budget


def _check_counts(num_sink: object, recent_window: object) -> None:
    for name, value in (("num_sink", num_sink), ("recent_window", recent_window)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"'{name}' must be int: {value!r}")
        if value < 0:
            raise ValueError(f"'{name}' must be >= 0: {value!r}")


def _check_stream(stream: object) -> str:
    if not isinstance(stream, str):
        raise TypeError(f"'stream' must be str: {stream!r}")
    return stream


def _grown(arr: NDArray[Any], new: int, fill: Any = 0) -> NDArray[Any]:
    out = np.full(new, fill, dtype=arr.dtype)
    out[: arr.size] = arr
    return out


class TokenTable:
    """The resident tokens of every stream on a GPU, each with an eviction key.

    Each resident token owns a *slot*: an index into the table's per-token columns (its
    stream, position, insertion number, key, and the columns a policy adds with
    :meth:`add_column`). Slots are what a policy's hooks receive; they stay valid while the
    token is resident. Smaller keys are evicted first, ties by insertion order; the
    ``num_sink`` leading positions and the ``recent_window`` newest positions of each stream
    are *protected* (their key carries :data:`PROTECTED_OFFSET`), so they go only when the
    hard budget cannot be met otherwise.

    Positions are token indices within a stream (dense from 0): memory per stream grows
    with its highest position.

    Args:
        num_sink: leading positions of each stream to protect (>= 0).
        recent_window: newest positions of each stream to protect (>= 0).

    Raises:
        TypeError, ValueError: ``num_sink`` or ``recent_window`` is not an int >= 0.
    """

    def __init__(self, *, num_sink: int = 0, recent_window: int = 0) -> None:
        _check_counts(num_sink, recent_window)
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
        self._columns: dict[str, NDArray[Any]] = {}
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
        # Candidate set and its (key, insertion number) threshold; `_pruned` says no key
        # changed since the set was last pruned (pruning again would change nothing).
        self._cand = np.zeros(0, dtype=np.int64)
        self._tau_key = -math.inf
        self._tau_seq = 0
        self._pruned = True
        self._rng = np.random.default_rng(0)

    # ------------------------------------------------------------- contents
    @property
    def num_sink(self) -> int:
        """Leading positions of each stream that are protected."""
        return self._num_sink

    @property
    def recent_window(self) -> int:
        """Newest positions of each stream that are protected."""
        return self._recent

    @property
    def streams(self) -> tuple[str, ...]:
        """Ids of the streams known now, in order of first insertion."""
        return tuple(self._index)

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

    def resident_slots(self, stream: str | None = None) -> NDArray[np.int64]:
        """(m,) int64 slots of the resident tokens of ``stream`` in position order, or of
        every stream (streams in order of first insertion) when None."""
        if stream is not None:
            sid = self._index.get(_check_stream(stream))
            if sid is None:
                return np.zeros(0, dtype=np.int64)
            seg = self._segment(sid)
            return seg[seg >= 0].astype(np.int64)
        parts = [self._segment(sid) for sid in self._index.values()]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        flat = np.concatenate(parts)
        return flat[flat >= 0].astype(np.int64)

    def protected(self, slots: NDArray[np.int64]) -> NDArray[np.bool_]:
        """(n,) bool: which resident ``slots`` are protected now (sinks, recent window)."""
        out: NDArray[np.bool_] = self._prot[slots]
        return out

    def protect(self, *, num_sink: int = 0, recent_window: int = 0) -> None:
        """Protect at least ``num_sink`` leading and ``recent_window`` newest positions.

        Each setting becomes the larger of the current one and the one given.

        Raises:
            TypeError, ValueError: a count is not an int >= 0.
            ValueError: the table has held tokens already.
        """
        _check_counts(num_sink, recent_window)
        if self._next_seq:
            raise ValueError("protection can change only before the first token is added")
        self._num_sink = max(self._num_sink, num_sink)
        self._recent = max(self._recent, recent_window)

    # ------------------------------------------------------------ changing
    def add(
        self,
        streams: str | Sequence[str],
        positions: NDArray[np.int64],
        new_keys: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    ) -> NDArray[np.int64]:
        """Make tokens resident and give them keys; nothing changes when it raises.

        Args:
            streams: one stream id for every token, or a length-n sequence of ids (one per
                token); a stream is created on first use.
            positions: (n,) int64 positions, distinct per stream and not resident.
            new_keys: called once with the (n,) int64 slots just given to the tokens (in
                the order of ``positions``), after their stream, position and insertion
                number are written and before they can be evicted; returns their (n,)
                float64 keys (smaller is evicted first).

        Returns:
            (n,) int64 slots of the tokens, in the order of ``positions``.

        Raises:
            TypeError: a stream id is not a str or ``positions`` not integers.
            ValueError: a position is negative, repeated or already resident, or
                ``streams`` and ``positions`` differ in length.
        """
        pos = _as_positions(positions)
        if isinstance(streams, str):
            return self._insert(streams, pos, new_keys)
        names = list(streams)
        if len(names) != pos.size:
            raise ValueError(
                f"'streams' has {len(names)} ids but 'positions' has {pos.size} entries"
            )
        return self._insert(names, pos, new_keys)

    def release(self, slots: NDArray[np.int64]) -> dict[str, NDArray[np.int64]]:
        """Evict the resident tokens at ``slots``: (n,) int64 distinct resident slots.

        Returns:
            For each stream that lost tokens, its (m,) int64 evicted positions, ascending.
        """
        return self._release(np.asarray(slots, dtype=np.int64))

    def remove(self, stream: str) -> None:
        """Forget a stream and all its tokens (unknown: no-op)."""
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

    # ------------------------------------------------------ per-token data
    def lookup(self, stream: str, positions: NDArray[np.int64]) -> NDArray[np.int64]:
        """(n,) int64 slots of resident ``positions`` of ``stream``.

        Raises:
            TypeError: ``stream`` is not a str or ``positions`` not integers.
            ValueError: an unknown stream, or a position that is not resident.
        """
        return self._lookup(stream, _as_positions(positions))

    def keys(self, slots: NDArray[np.int64]) -> NDArray[np.float64]:
        """(n,) float64 keys of resident ``slots``, without the protection offset."""
        out: NDArray[np.float64] = self._raw[slots]
        return out

    def set_keys(self, slots: NDArray[np.int64], keys: NDArray[np.float64]) -> None:
        """Change the keys of resident ``slots``: (n,) int64 slots, (n,) float64 keys."""
        self._raw[slots] = keys
        self._key[slots] = keys + PROTECTED_OFFSET * self._prot[slots]
        self._pruned = False
        self._admit_candidates(slots)

    def insertion_order(self, slots: NDArray[np.int64]) -> NDArray[np.int64]:
        """(n,) int64 insertion numbers of ``slots``: 0 for the first token ever added."""
        out: NDArray[np.int64] = self._seq[slots]
        return out

    def positions_of(self, slots: NDArray[np.int64]) -> NDArray[np.int64]:
        """(n,) int64 positions of ``slots`` within their streams."""
        out: NDArray[np.int64] = self._pos[slots]
        return out

    def add_column(self, name: str, fill: float = 0.0, dtype: type = np.float64) -> None:
        """Add a per-token column a policy keeps its own state in (see :meth:`column`).

        Raises:
            ValueError: a column of that name exists.
        """
        if name in self._columns:
            raise ValueError(f"column {name!r} exists")
        self._columns[name] = np.full(self._cap, fill, dtype=dtype)

    def column(self, name: str) -> NDArray[Any]:
        """The per-token column ``name``, indexed by slot.

        Read and write it in place (``table.column("risk")[slots] = ...``); the array is
        replaced when the table grows, so fetch it again after :meth:`add`.
        """
        return self._columns[name]

    # ------------------------------------------------------------ selection
    def smallest(self, k: int) -> NDArray[np.int64]:
        """(k,) int64 slots of the ``k`` resident tokens of smallest (key, insertion order).

        Protected tokens come after every other one. ``k`` must not exceed
        :meth:`resident_tokens`.
        """
        return self._smallest(k)

    def below(self, limit: float) -> NDArray[np.int64]:
        """int64 slots of the resident tokens whose key is < ``limit`` (protection counted)."""
        return self._below(limit)

    # -------------------------------------------------------------- internals
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

    def _insert(
        self,
        names: str | list[str],
        pos: NDArray[np.int64],
        new_keys: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    ) -> NDArray[np.int64]:
        """Validate everything, then write; ``names`` is one stream or one per token."""
        n = pos.size
        if n == 0:
            return np.zeros(0, dtype=np.int64)
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
        self._write(slots, sid, pos, new_keys)
        return slots

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
        for name, col in self._columns.items():
            self._columns[name] = _grown(col, new)

    def _write(
        self,
        slots: NDArray[np.int64],
        sid: NDArray[np.int64],
        pos: NDArray[np.int64],
        new_keys: Callable[[NDArray[np.int64]], NDArray[np.float64]],
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
        raw = new_keys(slots)
        self._raw[slots] = raw
        self._key[slots] = raw + PROTECTED_OFFSET * prot
        self._admit_candidates(slots)
        if gone.size:
            gone = gone[self._prot[gone] & (self._pos[gone] >= self._num_sink)]
            if gone.size:
                self._prot[gone] = False
                self._key[gone] = self._raw[gone]
                self._admit_candidates(gone)

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
        self._pruned = True
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
        self._pruned = True

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

    def _smallest(self, k: int) -> NDArray[np.int64]:
        """The ``k`` resident slots of smallest (key, insertion number)."""
        cand = self._cand if self._pruned else self._prune_candidates()
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
        self._pruned = False
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
