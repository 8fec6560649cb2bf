"""Replica views built from the simulator's own counts, without attrs' checks.

A fleet builds a :class:`~kvpolicy.kvmodel.ReplicaView` of a replica each time one of its
iterations ends and a router looks: millions in a long run of a large fleet. The checked
constructor (validators and converters, there to name a bad value from outside) costs ten
times the copy of the fields; the values here are the simulator's own counts and a
fraction of them, right by construction, so they are set as they are. Tests check that a
view made here equals the checked one.
"""

from __future__ import annotations

import attrs

from kvpolicy.kvmodel import ReplicaView

__all__ = ["make_view", "replace_view", "with_free_blocks"]

_FIELDS = tuple(a.name for a in attrs.fields(ReplicaView))
_new = object.__new__
_set = object.__setattr__


def _build(
    replica_id: str,
    running: int,
    waiting: int,
    kv_usage: float,
    free_blocks: int,
    block_size: int,
    prefix_blocks: tuple[tuple[str, frozenset[int]], ...],
    draining: bool,
    signal_age_s: float,
    model: str,
    gpu: str,
) -> ReplicaView:
    # Every field set by name, one statement each (a loop over the fields costs twice
    # this; a view is built about ten times per routed request in a large fleet).
    view: ReplicaView = _new(ReplicaView)
    _set(view, "replica_id", replica_id)
    _set(view, "running", running)
    _set(view, "waiting", waiting)
    _set(view, "kv_usage", kv_usage)
    _set(view, "free_blocks", free_blocks)
    _set(view, "block_size", block_size)
    _set(view, "prefix_blocks", prefix_blocks)
    _set(view, "draining", draining)
    _set(view, "signal_age_s", signal_age_s)
    _set(view, "model", model)
    _set(view, "gpu", gpu)
    return view


def make_view(
    replica_id: str,
    running: int,
    waiting: int,
    free_blocks: int,
    num_blocks: int,
    block_size: int,
    gpu_blocks: frozenset[int],
    draining: bool,
    signal_age_s: float,
    model: str,
    gpu: str,
) -> ReplicaView:
    """The view the checked constructor gives for these values (``kv_usage`` is
    ``1 - free_blocks / num_blocks``; ``gpu_blocks`` the GPU tier's resident hashes)."""
    return _build(
        replica_id,
        running,
        waiting,
        1.0 - free_blocks / num_blocks,
        free_blocks,
        block_size,
        (("gpu", gpu_blocks),),
        draining,
        float(signal_age_s),
        model,
        gpu,
    )


def replace_view(
    view: ReplicaView,
    *,
    draining: bool,
    signal_age_s: float,
    gpu_blocks: frozenset[int],
) -> ReplicaView:
    """``view`` as another router sees it: draining or not, that old, with these resident
    GPU blocks."""
    return _build(
        view.replica_id,
        view.running,
        view.waiting,
        view.kv_usage,
        view.free_blocks,
        view.block_size,
        (("gpu", gpu_blocks),),
        draining,
        float(signal_age_s),
        view.model,
        view.gpu,
    )


def with_free_blocks(view: ReplicaView, free_blocks: int, num_blocks: int) -> ReplicaView:
    """``view`` with ``free_blocks`` of its ``num_blocks`` free (its KV usage follows)."""
    return _build(
        view.replica_id,
        view.running,
        view.waiting,
        1.0 - free_blocks / num_blocks,
        free_blocks,
        view.block_size,
        view.prefix_blocks,
        view.draining,
        view.signal_age_s,
        view.model,
        view.gpu,
    )
