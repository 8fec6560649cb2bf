"""A weighted router's totals for its built-in scorers, kept from one decision to the next.

:class:`FusedTotals` gives, bit for bit, what summing each scorer's ``weight * score`` in
the scorers' order gives for kvpolicy-admit's own scorers (``kv``: ``1 - kv_usage``;
``queue`` and ``requests``: min-max normalised ``waiting`` and ``running + waiting``;
``prefix``: the tier-weighted match), for many fewer operations:

* each total is the same float operations in the same order: each load scorer's term is
  the product its ``score`` gives, added to the running total in the scorers' order;
* a prefix score is 0 on a replica reporting no blocks, and adding ``weight * 0.0`` to a
  sum of non-negative terms changes nothing, so the load totals leave the prefix terms
  out, and the replicas reporting blocks have theirs summed again with every term;
* a fleet shows its router the same view objects decision after decision, rebuilding only
  the views of the replicas whose state changed (the gateway's fleet, the simulator's), so
  the load totals are kept with the views last shown, with the min-max columns' values and
  bounds and the positions of the replicas reporting blocks; shown new views, only the
  positions whose view object is another one are read again (found by identity, in C, or
  named by the fleet: :data:`CHANGES`), and while the columns' maxima and spans stay the
  same only their totals are summed again;
* a view replaced by one showing the same load (what the totals read of it: ``waiting``,
  ``running``, ``kv_usage``), as a gateway re-shows a replica with its prefix blocks shown
  or hidden, moves no total: only its draining and whether it reports blocks are noted;
* a total is one expression per shape of the scorers (their kinds, compiled once; the
  weights, spans and matchers bound when the spans change), the same float operations in
  the same order as adding each term in turn;
* a decision is then one pass in C over the kept totals (a copy with the totals of the
  replicas reporting blocks summed again for the prompt, ``max`` and ``index``: the first
  of the highest), so it costs what the changed views and the replicas holding the prompt
  cost in Python, not passes of arithmetic over the fleet. (A heap of the totals was tried
  before: at 64 replicas it cost more than the pass, being made again whenever a column's
  extremes moved, as they do at one decision in seven when the gateway's own counts are
  the queue.)

The kept state is changed in place under a lock; a decision that finds the lock held (a
router shared between threads) decides from its views alone, and one that fails drops
the state, so the next decision reads every view again.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from itertools import compress
from operator import is_not
from typing import Any

from kvpolicy.admit._prefix import TierCredit
from kvpolicy.kvmodel import ReplicaView

__all__ = ["CHANGES", "SHOWN", "FusedTotals", "Term"]

Term = tuple[str, float, TierCredit | None]
"""One scorer: its kind (``kv``, ``prefix``, ``queue``, ``requests``), its weight, and the
:class:`TierCredit` of a prefix scorer."""

_KV, _QUEUE, _REQUESTS, _PREFIX, _CONST = 0, 1, 2, 3, 4
_KINDS = {"kv": _KV, "queue": _QUEUE, "requests": _REQUESTS, "prefix": _PREFIX}

_Step = tuple[int, float, TierCredit | None, int]
"""A scorer as (kind, weight, its TierCredit or None, the position of its min-max column
among the min-max scorers' or -1)."""

_Term = tuple[int, float, int, int, TierCredit | None]
"""A scorer's term under the min-max columns' spans: (kind, weight, the column's max, its
span, the TierCredit of a prefix scorer); a min-max scorer over equal values is the
constant kind, its weight ``weight * 1.0``."""
_SMALL = 16
"""Fewest replicas whose state a decision keeps: over fewer, every view is read at each
decision (a few views cost less to read than what keeping them costs: at 4, 8 and 12
backends of the gateway's benchmark stream p50 12.5, 14 and 15.5 us read whole against
18.6, 19.6 and 17.2 kept; at 16 and 20, 16 kept against 18.6 and 20.7 read whole)."""
_PLANS_KEPT = 256
"""Most compiled plans a :class:`FusedTotals` keeps (one per columns' extremes seen)."""

_Plan = tuple[float | None, tuple[_Term, ...]]
"""A total's terms: the sum of its leading constant terms (added in order; None: none), and
the terms after them, added to it in order."""

CHANGES = "changed_since"
"""The optional attribute of a views sequence naming what changed since the views a fleet
showed before: ``(the views shown before, positions)``, the positions a superset of those
whose view object is another one (where the sequence also says :data:`SHOWN`: of those
whose view shows another load, every field but its prefix blocks). Taken as it is when the
views named are the ones last shown (it then costs nothing); otherwise the views are
compared by identity (a view is frozen, and the router holds the old ones, so an id is
never reused while compared), one pass in C."""

SHOWN = "prefix_shown"
"""The optional attribute, beside :data:`CHANGES`, of a views sequence naming the positions
whose views report prefix blocks (the others report none). With it, the positions of
:data:`CHANGES` need name only the views showing another load: a gateway shows the holders
of a prompt's first block as their view with its index, another object with the same load,
and need not name them, nor their views of the decision before."""


def _folded(terms: Sequence[_Term]) -> _Plan:
    """``terms`` as a plan: the leading constants summed in order (the same additions a
    total makes first), the rest as they are."""
    start: float | None = None
    k = 0
    while k < len(terms) and terms[k][0] == _CONST:
        w = terms[k][1]
        start = w if start is None else start + w
        k += 1
    return start, tuple(terms[k:])


Total = Callable[[ReplicaView, tuple[int, ...]], float]
"""A replica's total for a prompt's block hashes, compiled from a :data:`_Plan`."""
Totals = Callable[[Sequence[ReplicaView], tuple[int, ...]], list[float]]
"""Every replica's total (the same expression as :data:`Total`, in one comprehension)."""

_SHAPES: dict[tuple[bool, tuple[int, ...]], Callable[..., tuple[Total, Totals]]] = {}
"""The maker of each plan's shape (whether it has leading constants, its terms' kinds)."""


def _shape_maker(shape: tuple[bool, tuple[int, ...]]) -> Callable[..., tuple[Total, Totals]]:
    """A function that, given a plan's constants, returns its total as one expression (of
    one replica, and of every replica in one comprehension): the
    plan's start, then each term added in order (Python's ``+`` is left-associative, so the
    expression makes the same float operations, in the same order, as adding the terms one
    by one), ``w * (1.0 - r.kv_usage)`` for ``kv``, ``w * match(hashes, r.prefix_blocks)``
    for ``prefix``, ``w * ((high - r.waiting) / span)`` for ``queue``, ``w * ((high -
    (r.running + r.waiting)) / span)`` for ``requests``, ``w`` for a constant. The source
    is built from the kinds alone (the values are the maker's arguments), once per shape."""
    has_start, kinds = shape
    params = ["start"] if has_start else []
    parts = ["start"] if has_start else []
    for k, kind in enumerate(kinds):
        params.append(f"w{k}")
        if kind == _KV:
            parts.append(f"w{k} * (1.0 - r.kv_usage)")
        elif kind == _PREFIX:
            params.append(f"m{k}")
            parts.append(f"w{k} * m{k}(hashes, r.prefix_blocks)")
        elif kind == _QUEUE:
            params += [f"h{k}", f"s{k}"]
            parts.append(f"w{k} * ((h{k} - r.waiting) / s{k})")
        elif kind == _REQUESTS:
            params += [f"h{k}", f"s{k}"]
            parts.append(f"w{k} * ((h{k} - (r.running + r.waiting)) / s{k})")
        else:
            parts.append(f"w{k}")
    expr = " + ".join(parts) or "0.0"
    source = (
        f"def make({', '.join(params)}):\n"
        "    def total(r, hashes):\n"
        f"        return {expr}\n"
        "    def totals(views, hashes):\n"
        f"        return [{expr} for r in views]\n"
        "    return total, totals\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<kvpolicy.admit fused total {kinds}>", "exec"), namespace)
    maker: Callable[..., tuple[Total, Totals]] = namespace["make"]
    return maker


def _compiled(plan: _Plan) -> tuple[Total, Totals]:
    """``plan`` as a function of a replica's view and a prompt's block hashes: its total,
    the terms in the scorers' order (a prefix term matched on the replica's blocks); and
    as a function of every replica's view."""
    start, terms = plan
    shape = (start is not None, tuple(term[0] for term in terms))
    maker = _SHAPES.get(shape)
    if maker is None:
        maker = _SHAPES[shape] = _shape_maker(shape)
    args: list[Any] = [] if start is None else [start]
    for kind, w, high, span, credit in terms:
        args.append(w)
        if kind == _PREFIX:
            assert credit is not None
            args.append(credit.match)
        elif kind in (_QUEUE, _REQUESTS):
            args += [high, span]
    return maker(*args)


def _column(code: int, views: Sequence[ReplicaView]) -> list[int]:
    """A min-max scorer's column over ``views``: ``waiting`` (queue) or ``running +
    waiting`` (requests)."""
    if code == _QUEUE:
        return [r.waiting for r in views]
    return [r.running + r.waiting for r in views]


def _track(i: int, r: ReplicaView, drained: set[int], held: set[int] | None) -> None:
    """Note view ``i``'s draining and (with ``held``) whether it reports prefix blocks."""
    if r.draining:
        drained.add(i)
    elif drained:
        drained.discard(i)
    if held is None:
        return
    if r.prefix_blocks:
        held.add(i)
    elif held:
        held.discard(i)


class _State:
    """What a fused router keeps with the views last shown."""

    __slots__ = (
        "bounds",
        "drained",
        "held",
        "load",
        "load_all",
        "nan",
        "plan",
        "spans",
        "totals",
        "values",
        "views",
    )

    def __init__(
        self,
        views: Sequence[ReplicaView],
        values: list[list[int]],
        bounds: list[tuple[int, int]],
        spans: tuple[tuple[int, int], ...],
        plans: tuple[Total, Total, Totals],
        totals: list[float],
        held: set[int],
        drained: set[int],
    ) -> None:
        self.views = views
        """The views last shown (held: their ids are not reused while compared)."""
        self.values = values
        """Each min-max scorer's column."""
        self.bounds = bounds
        """Each min-max column's ``(min, max)``."""
        self.spans = spans
        """Each min-max column's ``(max, max - min)``."""
        self.plan, self.load, self.load_all = plans
        """A replica's total under ``spans`` with every scorer, with the load scorers' only,
        and every replica's load total (:meth:`FusedTotals._plans`)."""
        self.totals = totals
        """Each replica's load total (the prefix terms left out)."""
        self.held = held
        """The positions of the replicas reporting prefix blocks."""
        self.drained = drained
        """The positions of the draining replicas."""
        self.nan = math.isnan(sum(totals))
        """Whether a total is NaN (a view built unchecked): then the general rule orders
        them."""


class FusedTotals:
    """``sum(weight * score)`` per replica for built-in scorers, in the scorers' order.

    Args:
        terms: the scorers, in order.
    """

    __slots__ = (
        "_live",
        "_lock",
        "_minmax",
        "_plan_cache",
        "_prefix",
        "_reads",
        "_state",
        "_steps",
        "_terms",
    )

    def __init__(self, terms: Sequence[Term]) -> None:
        """See the class docstring."""
        self._terms = tuple(terms)
        steps: list[_Step] = []
        minmax: list[int] = []
        for kind, w, credit in terms:
            if kind not in _KINDS:
                raise ValueError(f"unknown scorer kind {kind!r}")
            if (kind == "prefix") != (credit is not None):
                raise ValueError(f"a prefix scorer, and only one, has a TierCredit: {kind!r}")
            code = _KINDS[kind]
            si = -1
            if code in (_QUEUE, _REQUESTS):
                si = len(minmax)
                minmax.append(code)
            steps.append((code, w, credit, si))
        self._steps = tuple(steps)
        self._minmax = tuple(minmax)
        self._prefix = any(step[0] == _PREFIX for step in steps)
        codes = {step[0] for step in steps}
        self._reads = (bool(codes & {_QUEUE, _REQUESTS}), _REQUESTS in codes, _KV in codes)
        """Whether a total reads each of ``waiting``, ``running`` and ``kv_usage``."""
        self._state: _State | None = None
        self._plan_cache: dict[tuple[tuple[int, int], ...], tuple[Total, Total, Totals]] = {}
        self._lock = threading.Lock()
        self._live: FusedTotals | None = None  # decides among the live views while some drain

    def best(self, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> int:
        """The position among ``views`` (a tuple of views checked as a router checks them)
        of the first of the highest totals among the replicas not draining, for a prompt
        of ``hashes`` (-1: every replica drains); a NaN total (a view built unchecked)
        orders as ``(total, -position)`` does."""
        if len(views) < _SMALL:
            return self._few(hashes, views)
        lock = self._lock
        if not lock.acquire(blocking=False):  # another thread is deciding
            return self._pick(self._fresh(views), hashes, views)
        try:
            state = self._state
            if state is None or len(state.views) != len(views):
                state = self._state = self._fresh(views)
            elif state.views is not views:
                last = state.views
                said = getattr(views, CHANGES, None)
                shown = None
                if said is not None and said[0] is last:
                    changed = said[1]
                    shown = getattr(views, SHOWN, None)
                else:  # by identity, one pass in C
                    changed = list(compress(range(len(views)), map(is_not, last, views)))
                if len(changed) * 4 > len(views):
                    state = self._state = self._fresh(views)
                else:
                    state.views = views
                    if changed:
                        self._update(state, last, views, changed, shown is None)
                    if shown is not None and self._prefix:
                        state.held = set(shown)
            if state.drained:
                return self._pick(state, hashes, views)
            return self._decide(state, hashes, views)
        except BaseException:
            self._state = None  # half updated: read every view again next time
            raise
        finally:
            lock.release()

    def _pick(self, state: _State, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> int:
        """:meth:`best` from ``state`` (``views``'s): among the live views while some drain
        (as a tuple of their own, whose positions another :class:`FusedTotals` follows)."""
        drained = state.drained
        if not drained:
            return self._decide(state, hashes, views)
        live = [i for i in range(len(views)) if i not in drained]
        if not live:
            return -1
        among = self._live
        if among is None:
            among = self._live = FusedTotals(self._terms)
        return live[among.best(hashes, tuple([views[i] for i in live]))]

    def _few(self, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> int:
        """:meth:`best` over a few views, each read: every live replica's total with every
        scorer (a prefix term matched on each), the min-max columns over the live ones."""
        live = [i for i, r in enumerate(views) if not r.draining]
        if not live:
            return -1
        shown = [views[i] for i in live]
        spans = []
        for code in self._minmax:
            col = _column(code, shown)
            high = max(col)
            spans.append((high, high - min(col)))
        plan = self._plans(tuple(spans))[0]
        totals = [plan(views[i], hashes) for i in live]
        if math.isnan(sum(totals)):  # the general rule
            return live[max(range(len(totals)), key=lambda k: (totals[k], -k))]
        return live[totals.index(max(totals))]  # the first of the highest

    def _plans(self, spans: tuple[tuple[int, int], ...]) -> tuple[Total, Total, Totals]:
        """A replica's total with every scorer's terms under ``spans`` (a min-max scorer
        over equal values is the constant ``weight * 1.0``), with the load scorers' alone,
        and every replica's load total; kept per ``spans`` (the columns' extremes come
        back: a fleet's busiest replica gains and loses a request)."""
        cached = self._plan_cache.get(spans)
        if cached is not None:
            return cached
        terms: list[_Term] = []
        for code, weight, credit, si in self._steps:
            if si >= 0:
                high, span = spans[si]
                if span:
                    terms.append((code, weight, high, span, None))
                else:
                    terms.append((_CONST, weight * 1.0, 0, 0, None))
            else:
                terms.append((code, weight, 0, 0, credit))
        plan, _ = _compiled(_folded(terms))
        load, load_all = _compiled(_folded([t for t in terms if t[0] != _PREFIX]))
        if len(self._plan_cache) >= _PLANS_KEPT:
            self._plan_cache.clear()
        out = self._plan_cache[spans] = (plan, load, load_all)
        return out

    def _fresh(self, views: Sequence[ReplicaView]) -> _State:
        """The state of ``views`` read afresh."""
        values = [_column(code, views) for code in self._minmax]
        bounds = [(min(col), max(col)) for col in values]
        spans = tuple([(high, high - low) for low, high in bounds])
        held: set[int] = set()
        if self._prefix:
            held = set(compress(range(len(views)), [r.prefix_blocks for r in views]))
        drained = set(compress(range(len(views)), [r.draining for r in views]))
        plans = self._plans(spans)
        totals = plans[2](views, ())
        return _State(views, values, bounds, spans, plans, totals, held, drained)

    def _update(
        self,
        state: _State,
        last: Sequence[ReplicaView],
        views: Sequence[ReplicaView],
        changed: Sequence[int],
        track_held: bool = True,
    ) -> None:
        """Bring ``state`` from the views ``last`` to ``views``, whose positions ``changed``
        (some) hold other views (``track_held`` False: the views say which report prefix
        blocks, :data:`SHOWN`)."""
        drained = state.drained
        held, prefix = state.held, self._prefix and track_held
        reads_waiting, reads_running, reads_kv = self._reads
        # A view that shows the load its last one showed (most often the same replica with
        # its prefix blocks shown or hidden) moves no total and no column: only its draining
        # and whether it reports blocks are noted (NaN loads compare unequal: moved).
        moved: list[int] = []
        for i in changed:
            r, o = views[i], last[i]
            if r is o:
                continue
            if (
                (not reads_waiting or r.waiting == o.waiting)
                and (not reads_running or r.running == o.running)
                and (not reads_kv or r.kv_usage == o.kv_usage)
            ):
                _track(i, r, drained, held if prefix else None)
            else:
                moved.append(i)
        if not moved:
            return
        changed = moved
        spans = state.spans
        rebound = False
        for k, code in enumerate(self._minmax):
            col = state.values[k]
            low, high = state.bounds[k]
            again = False
            for i in changed:
                r = views[i]
                now = r.waiting if code == _QUEUE else r.running + r.waiting
                was = col[i]
                if now != was:
                    col[i] = now
                    if (was == low and now > was) or (was == high and now < was):
                        again = True  # an extreme left: read them all
                    elif now < low:
                        low = now
                    elif now > high:
                        high = now
            if again:
                low, high = min(col), max(col)
            if (low, high) != state.bounds[k]:
                state.bounds[k] = (low, high)
                rebound = True
        if rebound:
            spans = tuple([(high, high - low) for low, high in state.bounds])
        if spans != state.spans:  # every total moves: summed again
            state.spans = spans
            state.plan, state.load, state.load_all = self._plans(spans)
            for i in changed:
                _track(i, views[i], drained, held if prefix else None)
            state.totals = state.load_all(views, ())
            state.nan = math.isnan(sum(state.totals))
            return
        totals, load = state.totals, state.load
        nan = state.nan
        for i in changed:
            r = views[i]
            _track(i, r, drained, held if prefix else None)
            t = load(r, ())  # the load total: the prefix terms left out
            if t != totals[i]:
                totals[i] = t
                nan = nan or t != t
        if state.nan:  # a NaN total may have been replaced
            nan = math.isnan(sum(totals))
        state.nan = nan

    def _decide(self, state: _State, hashes: tuple[int, ...], views: Sequence[ReplicaView]) -> int:
        """The first of the highest totals of ``state`` (``views``'s, none draining) for
        ``hashes``, every total at once."""
        totals, held = state.totals, state.held
        out = totals
        if held and hashes:
            out = totals.copy()
            for i in held:
                out[i] = state.plan(views[i], hashes)
        if state.nan:  # the general rule
            return max(range(len(out)), key=lambda i: (out[i], -i))
        return out.index(max(out))  # the first of the highest
