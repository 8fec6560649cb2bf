"""The per-replica values a router reads, kept while the views say what changed.

The gateway's fleet shows its router views that name the views shown before and the
positions that may hold another view since (``changed_since``:
:data:`~kvpolicy.admit._fused.CHANGES`). A router reading a column of every view at every
decision (``least-requests``: ``running + waiting``) then need only read those positions
again: :class:`KeptColumns` keeps the columns of the views last shown and patches a copy at
the positions named. Views that say nothing (the simulator's, a list from outside) are read
afresh, as a router always read them: finding the changed views by identity would cost
about what reading one column again does.

The state is one tuple replaced whole, and lists once stored are never changed (a patch
copies), so a router shared between threads sees either the old or the new state, each
consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvpolicy.admit._fused import CHANGES
from kvpolicy.kvmodel import ReplicaView

__all__ = ["BLOCKS", "KEEP_FROM", "LOADS", "USAGE", "Column", "KeptColumns"]

KEEP_FROM = 16
"""The fewest views whose columns are kept: a router reads fewer afresh for less than
keeping them costs."""


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
USAGE = Column(lambda vs: [r.kv_usage for r in vs], lambda r: r.kv_usage)
"""KV usage."""
BLOCKS = Column(lambda vs: [r.prefix_blocks for r in vs], lambda r: r.prefix_blocks)
"""The prefix blocks (a router reads only their truth from here: whether the view reports
any; a live set inside may change, the tuple holding it does not)."""


class KeptColumns:
    """The columns of the views a router was last shown, kept while views say what changed.

    Args:
        kinds: the columns, in order.
    """

    __slots__ = ("_kinds", "_state")

    def __init__(self, *kinds: Column) -> None:
        """See the class docstring."""
        self._kinds = kinds
        self._state: tuple[Sequence[ReplicaView], tuple[list[Any], ...]] | None = None

    def columns(self, views: Sequence[ReplicaView]) -> tuple[list[Any], ...] | None:
        """The columns of ``views`` (read-only: they may be kept), or None for views that
        do not say what changed, or fewer than :data:`KEEP_FROM` (the caller reads them
        itself); where more than a quarter changed they are read afresh (and kept)."""
        said = getattr(views, CHANGES, None)
        if said is None or len(views) < KEEP_FROM:
            return None
        state = self._state
        if (
            state is not None
            and said[0] is state[0]
            and len(views) == len(state[0])
            and len(said[1]) * 4 <= len(views)
        ):
            cols = state[1]
            changed = said[1]
            if changed:
                patched = []
                for kind, col in zip(self._kinds, cols, strict=True):
                    col = col.copy()
                    one = kind.one
                    for i in changed:
                        col[i] = one(views[i])
                    patched.append(col)
                cols = tuple(patched)
        else:
            cols = tuple([kind.every(views) for kind in self._kinds])
        self._state = (views, cols)
        return cols
