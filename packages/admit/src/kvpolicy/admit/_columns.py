"""The per-replica values a router reads, kept from one decision to the next.

A fleet shows its router the same view objects decision after decision, rebuilding only
the views of the replicas whose state changed (the gateway's :class:`Fleet`, the
simulator's): a router at 64 replicas that read every view's load at every decision
would spend most of its time on replicas that did not change. :class:`ViewMemo` keeps
the columns of the views last shown (``running + waiting``, ``waiting``, ``kv_usage``,
``prefix_blocks``, one list each) and, shown new views, finds the positions whose view
object is another one (identity: a view is frozen, and the memo holds the old ones, so an
id is never reused while compared) and reads only those; when more than a quarter
changed, or the count changed, it reads them all. The values are the views' own, so a
router deciding from them decides as it would from the views. Finding the changed views
costs about what reading one column does, so it pays for a router that reads several
and keeps what it derives from them (``weighted``: :mod:`kvpolicy.admit._fused`).

The state is one tuple replaced whole, and lists once stored are never changed (a patch
copies), so a router shared between threads sees either the old or the new state, each
consistent; at worst it reads the views again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress
from operator import is_not
from typing import Any

from kvpolicy.kvmodel import ReplicaView

__all__ = ["BLOCKS", "LOADS", "USAGE", "WAITING", "Column", "ViewMemo"]


class Column:
    """One per-replica value: read over all views, or from one view."""

    __slots__ = ("every", "one")

    def __init__(
        self,
        every: Callable[[Sequence[ReplicaView]], list[Any]],
        one: Callable[[ReplicaView], Any],
    ) -> None:
        """``every(views)`` reads all (a comprehension); ``one(view)`` reads one."""
        self.every = every
        self.one = one


LOADS = Column(lambda vs: [r.running + r.waiting for r in vs], lambda r: r.running + r.waiting)
"""Outstanding requests, ``running + waiting``."""
WAITING = Column(lambda vs: [r.waiting for r in vs], lambda r: r.waiting)
"""Requests waiting."""
USAGE = Column(lambda vs: [r.kv_usage for r in vs], lambda r: r.kv_usage)
"""KV usage."""
BLOCKS = Column(lambda vs: [r.prefix_blocks for r in vs], lambda r: r.prefix_blocks)
"""The prefix blocks (only their truth is read from the memo: whether the view reports any;
a live set inside may change, the tuple holding it does not)."""

_State = tuple[Sequence[ReplicaView], tuple[list[Any], ...], object]


class ViewMemo:
    """The columns of the views a router was last shown, and whatever it keeps with them."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        """An empty memo (the first decision reads every view)."""
        self._state: _State | None = None

    def columns(
        self, views: Sequence[ReplicaView], kinds: tuple[Column, ...]
    ) -> tuple[tuple[list[Any], ...], list[int] | None, object]:
        """The columns ``kinds`` of ``views`` (a tuple: the memo keeps it as it is).

        Returns:
            The columns (read-only: they may be the memo's own), the positions whose view
            changed since the last call (None: every column was read afresh) and what
            :meth:`keep` stored with the last views (None after a fresh read).
        """
        state = self._state
        n = len(views)
        if state is not None:
            last, cols, extra = state
            if last is views:
                return cols, [], extra
            if len(last) == n and len(cols) == len(kinds):
                changed = list(compress(range(n), map(is_not, last, views)))
                if len(changed) * 4 <= n:
                    if changed:
                        patched = []
                        for kind, col in zip(kinds, cols, strict=True):
                            col = col.copy()
                            one = kind.one
                            for i in changed:
                                col[i] = one(views[i])
                            patched.append(col)
                        cols = tuple(patched)
                    self._state = (views, cols, extra)
                    return cols, changed, extra
        cols = tuple([kind.every(views) for kind in kinds])
        self._state = (views, cols, None)
        return cols, None, None

    def keep(
        self, views: Sequence[ReplicaView], cols: tuple[list[Any], ...], extra: object
    ) -> None:
        """Store ``extra`` (a router's own derived values) with ``views`` and their columns,
        as :meth:`columns` just returned them."""
        self._state = (views, cols, extra)
