"""A weighted router's totals for its built-in scorers, without asking them one by one.

:class:`FusedTotals` gives, bit for bit, what summing each scorer's ``weight * score`` in
the scorers' order gives for kvpolicy-admit's own scorers (``kv``: ``1 - kv_usage``;
``queue`` and ``requests``: min-max normalised ``waiting`` and ``running + waiting``;
``prefix``: the tier-weighted match), for many fewer operations:

* each total is the same float operations in the same order: each load scorer's term is
  the product its ``score`` gives, added to the running total in the scorers' order;
* a prefix score is 0 on a replica reporting no blocks, and adding ``weight * 0.0`` to a
  sum of non-negative terms changes nothing, so the load totals leave the prefix terms
  out, and the replicas with blocks have theirs summed again with every term;
* the load totals depend on a view's own values and, for a min-max scorer, on the
  column's maximum and span: they are kept with the views (:class:`ViewMemo`), with the
  columns' bounds and the positions of the replicas reporting blocks, and while the
  maxima and spans stay the same only the totals of the views that changed are summed
  again (the bounds read afresh only when a changed view held one);
* the first of the highest load totals is the top of a heap of ``(-total, position)``
  (an entry whose total changed since is stale and skipped), so beyond finding the
  changed views (one pass in C) a decision costs what they and the replicas holding the
  prompt cost, not passes of arithmetic over the fleet;
  where most views changed the totals are summed and searched as a list, and the heap is
  made when the next views differ in a few places.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from itertools import compress
from typing import Any

from kvpolicy.admit._columns import BLOCKS, LOADS, USAGE, WAITING, Column, ViewMemo
from kvpolicy.admit._prefix import TierCredit
from kvpolicy.kvmodel import ReplicaView

__all__ = ["FusedTotals", "Term"]

Term = tuple[str, float, TierCredit | None]
"""One scorer: its kind (``kv``, ``prefix``, ``queue``, ``requests``), its weight, and the
:class:`TierCredit` of a prefix scorer."""

_Step = tuple[str, float, TierCredit | None, int, int]

_COLUMN = {"queue": WAITING, "requests": LOADS, "kv": USAGE}


def _heap(totals: list[float]) -> list[tuple[float, int]]:
    """``(-total, position)`` of each total, a heap: its top is the first of the highest."""
    heap = [(-t, i) for i, t in enumerate(totals)]
    heapify(heap)
    return heap


class _Kept:
    """What a fused router keeps with the views last shown (never changed once kept)."""

    __slots__ = ("bounds", "cols", "heap", "held", "nan", "spans", "totals")

    def __init__(
        self,
        bounds: tuple[tuple[int, int], ...],
        spans: tuple[tuple[int, int], ...],
        totals: list[float],
        heap: list[tuple[float, int]] | None,
        held: tuple[int, ...],
        nan: bool,
        cols: tuple[list[Any], ...] = (),
    ) -> None:
        self.bounds = bounds
        self.spans = spans
        self.totals = totals
        self.heap = heap
        self.held = held
        self.nan = nan
        self.cols = cols


class FusedTotals:
    """``sum(weight * score)`` per replica for built-in scorers, in the scorers' order.

    Args:
        terms: the scorers, in order.
    """

    __slots__ = ("_kinds", "_load", "_memo", "_minmax", "_prefix", "_steps")

    def __init__(self, terms: Sequence[Term]) -> None:
        """See the class docstring."""
        for kind, _, credit in terms:
            if kind not in ("prefix", *_COLUMN):
                raise ValueError(f"unknown scorer kind {kind!r}")
            if (kind == "prefix") != (credit is not None):
                raise ValueError(f"a prefix scorer, and only one, has a TierCredit: {kind!r}")
        self._prefix = any(kind == "prefix" for kind, _, _ in terms)
        kinds: list[Column] = [BLOCKS] if self._prefix else []
        for kind, _, _ in terms:
            if kind != "prefix" and _COLUMN[kind] not in kinds:
                kinds.append(_COLUMN[kind])
        self._kinds = tuple(kinds)
        # Each scorer as (kind, weight, its TierCredit, the position of its column, the
        # position of its (max, span) among the min-max scorers'), -1 where it has none.
        steps: list[_Step] = []
        spans = 0
        for kind, w, credit in terms:
            pos = kinds.index(_COLUMN[kind]) if kind != "prefix" else -1
            si = spans if kind in ("queue", "requests") else -1
            spans += si >= 0
            steps.append((kind, w, credit, pos, si))
        self._steps = tuple(steps)
        self._load = tuple(step for step in steps if step[0] != "prefix")
        self._minmax = tuple(step for step in steps if step[4] >= 0)
        self._memo = ViewMemo()

    def best(self, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> int:
        """The position among ``views`` (a tuple, non-empty) of the first of the highest
        totals for a prompt of ``hashes``; a NaN total (a view built unchecked) orders as
        ``(total, -position)`` does."""
        cols, changed, kept = self._memo.columns(views, self._kinds)
        n = len(views)
        last = kept if changed is not None and isinstance(kept, _Kept) else None
        bounds = self._bounds(cols, changed, last)
        spans = tuple([(high, high - low) for low, high in bounds])
        if last is not None and last.spans == spans:
            totals = last.totals
            heap = last.heap
            held = last.held
            nan = last.nan
            if changed:
                totals = totals.copy()
                # The last heap, copied, takes the changed totals (a NaN orders nothing, nor
                # a heap made with one: then, or without a heap, one is made afresh).
                grown = None if heap is None or last.nan else heap.copy()
                for i in changed:
                    t = self._total(cols, i, spans)
                    if t != totals[i]:  # (the heap holds a valid entry of every position)
                        totals[i] = t
                        if grown is not None:
                            heappush(grown, (-t, i))
                        nan = nan or t != t
                if nan:
                    nan = math.isnan(sum(totals))
                if grown is None or len(grown) > 2 * n:
                    grown = _heap(totals)
                while not nan and totals[grown[0][1]] != -grown[0][0]:  # stale: changed since
                    heappop(grown)
                heap = grown
                if self._prefix:
                    blocks = cols[0]
                    now = set(held)
                    for i in changed:
                        if blocks[i]:
                            now.add(i)
                        else:
                            now.discard(i)
                    held = tuple(sorted(now))
        else:
            totals = self._load_totals(cols, spans, n)
            heap = None  # made when the next views differ in a few places
            nan = math.isnan(sum(totals))
            held = tuple(compress(range(n), cols[0])) if self._prefix else ()
        self._memo.keep(views, cols, _Kept(bounds, spans, totals, heap, held, nan, cols))
        if not (self._prefix and hashes):
            held = ()
        if nan or heap is None:  # every total at once
            out = totals.copy() if held else totals
            for i in held:
                out[i] = self._total(cols, i, spans, hashes, views[i])
            if nan:  # the general rule
                return max(range(n), key=lambda i: (out[i], -i))
            return out.index(max(out))  # the first of the highest
        # The kept heap's top is valid (the first of the highest load totals): the answer
        # unless replicas report blocks. Then the first of the highest not among them (a
        # copy of the heap popped down to it), against their own totals.
        if not held:
            return heap[0][1]
        best_total, best = -math.inf, n
        if heap[0][1] in held:
            heap = heap.copy()
            while heap:
                neg, i = heappop(heap)
                if totals[i] == -neg and i not in held:
                    best_total, best = -neg, i
                    break
        else:
            best_total, best = -heap[0][0], heap[0][1]
        for i in held:
            t = self._total(cols, i, spans, hashes, views[i])
            if t > best_total or (t == best_total and i < best):
                best_total, best = t, i
        return best

    def _bounds(
        self, cols: tuple[list[Any], ...], changed: list[int] | None, last: _Kept | None
    ) -> tuple[tuple[int, int], ...]:
        """``(min, max)`` of each min-max scorer's column: from the last ones where the
        changed values leave them standing, afresh otherwise."""
        out = []
        for k, (_, _, _, pos, _) in enumerate(self._minmax):
            col = cols[pos]
            if last is None or changed is None:
                out.append((min(col), max(col)))
                continue
            low, high = last.bounds[k]
            old = last.cols[pos]
            for i in changed:
                was, now = old[i], col[i]
                if (was == low and now > was) or (was == high and now < was):
                    low, high = min(col), max(col)  # an extreme left: read them all
                    break
                low = min(low, now)
                high = max(high, now)
            out.append((low, high))
        return tuple(out)

    def _load_totals(
        self, cols: tuple[list[Any], ...], spans: tuple[tuple[int, int], ...], n: int
    ) -> list[float]:
        """Every replica's load total, a column at a time (a column of equal values is one
        product, added to each total)."""
        totals: list[float] | None = None
        base: float | None = None  # every total while each column so far held equal values
        for kind, weight, _, pos, si in self._load:
            col = cols[pos]
            if kind == "kv":
                if totals is not None:
                    totals = [t + weight * (1.0 - u) for t, u in zip(totals, col, strict=True)]
                elif base is not None:
                    totals = [base + weight * (1.0 - u) for u in col]
                else:
                    totals = [weight * (1.0 - u) for u in col]
                continue
            high, span = spans[si]
            if not span:  # all equal: 1 for every replica
                term = weight * 1.0
                if totals is not None:
                    totals = [t + term for t in totals]
                else:
                    base = term if base is None else base + term
            elif totals is not None:
                totals = [
                    t + weight * ((high - v) / span) for t, v in zip(totals, col, strict=True)
                ]
            elif base is not None:
                totals = [base + weight * ((high - v) / span) for v in col]
            else:
                totals = [weight * ((high - v) / span) for v in col]
        if totals is None:
            return [0.0 if base is None else base] * n
        return totals

    def _total(
        self,
        cols: tuple[list[Any], ...],
        i: int,
        spans: tuple[tuple[int, int], ...],
        hashes: tuple[int, ...] = (),
        view: ReplicaView | None = None,
    ) -> float:
        """Replica ``i``'s total: its terms added in the scorers' order, the prefix terms
        with ``view`` (a replica reporting blocks), left out without (0 there)."""
        total: float | None = None
        for kind, weight, credit, pos, si in self._steps:
            if kind == "prefix":
                if view is None:
                    continue
                assert credit is not None
                term = weight * credit.match(hashes, view.prefix_blocks)
            elif kind == "kv":
                term = weight * (1.0 - cols[pos][i])
            else:
                high, span = spans[si]
                term = weight * 1.0 if not span else weight * ((high - cols[pos][i]) / span)
            total = term if total is None else total + term
        return 0.0 if total is None else total
