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
  column's maximum and span: they are kept with the views (:class:`ViewMemo`), and while
  the maxima and spans stay the same only the totals of the views that changed are
  summed again.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _span(values: list[int]) -> tuple[int, int]:
    high = max(values)
    return high, high - min(values)


class FusedTotals:
    """``sum(weight * score)`` per replica for built-in scorers, in the scorers' order.

    Args:
        terms: the scorers, in order.
    """

    __slots__ = ("_kinds", "_load", "_memo", "_prefix", "_steps")

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
        self._memo = ViewMemo()

    def totals(self, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> list[float]:
        """The total of each of ``views`` (a tuple, non-empty) for a prompt of ``hashes``
        (read-only: it may be kept for the next call)."""
        cols, changed, kept = self._memo.columns(views, self._kinds)
        # (max, max - min) of each min-max scorer's column, in order
        spans = tuple([_span(cols[pos]) for _, _, _, pos, si in self._load if si >= 0])
        if changed is not None and isinstance(kept, tuple) and kept[0] == spans:
            totals: list[float] = kept[1]
            if changed:
                totals = totals.copy()
                for i in changed:
                    totals[i] = self._total(cols, i, spans)
        else:
            totals = self._load_totals(cols, spans, len(views))
        self._memo.keep(views, cols, (spans, totals))
        if not (self._prefix and hashes):
            return totals
        held = list(compress(range(len(views)), cols[0]))
        if not held:
            return totals
        out = totals.copy()
        for i in held:
            out[i] = self._total(cols, i, spans, hashes, views[i])
        return out

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
