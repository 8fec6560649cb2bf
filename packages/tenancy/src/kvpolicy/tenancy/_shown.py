"""The views a gateway's fleet shows a router for one decision, saying what changed.

A module of its own, kept out of the compiled ones (``tools/mypyc_hook.py``): it subclasses
kvmodel's :class:`~kvpolicy.kvmodel.ReplicaViews`, a tuple, which mypyc cannot compile.
"""

from __future__ import annotations

from kvpolicy.kvmodel import ReplicaViews

__all__ = ["ShownViews"]


class ShownViews(ReplicaViews):
    """The candidates' views the fleet shows for one decision, saying which of them may
    differ from those of the decision before: ``changed_since`` is ``(the views shown
    before, positions)`` (None: not known), a superset of the positions whose view shows
    another load (counts, KV usage, draining, signal age: a rebuilt view); ``prefix_shown``
    names the positions whose view shows prefix blocks (the holders of the prompt's first
    block, each shown with its index; the hints of kvmodel's :class:`~kvpolicy.kvmodel.Router`).
    Shown to a router that says it follows them (``follows_changed_since``:
    kvpolicy-admit's ``weighted``, which finds them by identity otherwise)."""

    changed_since: tuple[ReplicaViews, tuple[int, ...]] | None
    prefix_shown: tuple[int, ...]
