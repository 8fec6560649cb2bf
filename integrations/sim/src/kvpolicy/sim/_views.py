"""Replica views built from the simulator's own counts, without attrs' checks.

A fleet builds a :class:`~kvpolicy.kvmodel.ReplicaView` of a replica each time one of its
iterations ends and a router looks: millions in a long run of a large fleet. The checked
constructor (validators and converters, there to name a bad value from outside) costs ten
times the copy of the fields; the values here are the simulator's own counts and a
fraction of them, right by construction, so they are set as they are. Tests check that a
view made here equals the checked one.
"""

from __future__ import annotations

import operator

import attrs

from kvpolicy.kvmodel import ReplicaView

__all__ = ["make_view", "replace_view", "with_free_blocks"]

_FIELDS = tuple(a.name for a in attrs.fields(ReplicaView))
_values = operator.attrgetter(*_FIELDS)
_set = object.__setattr__


def _build(values: tuple[object, ...] | list[object]) -> ReplicaView:
    view: ReplicaView = object.__new__(ReplicaView)
    for name, value in zip(_FIELDS, values, strict=True):
        _set(view, name, value)
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
    fields = {
        "replica_id": replica_id,
        "running": running,
        "waiting": waiting,
        "kv_usage": 1.0 - free_blocks / num_blocks,
        "free_blocks": free_blocks,
        "block_size": block_size,
        "prefix_blocks": (("gpu", gpu_blocks),),
        "draining": draining,
        "signal_age_s": float(signal_age_s),
        "model": model,
        "gpu": gpu,
    }
    values = [fields[name] for name in _FIELDS]
    return _build(values)


def replace_view(
    view: ReplicaView,
    *,
    draining: bool,
    signal_age_s: float,
    gpu_blocks: frozenset[int],
) -> ReplicaView:
    """``view`` as another router sees it: draining or not, that old, with these resident
    GPU blocks."""
    values = list(_values(view))
    values[_DRAINING] = draining
    values[_AGE] = float(signal_age_s)
    values[_PREFIX] = (("gpu", gpu_blocks),)
    return _build(values)


def with_free_blocks(view: ReplicaView, free_blocks: int, num_blocks: int) -> ReplicaView:
    """``view`` with ``free_blocks`` of its ``num_blocks`` free (its KV usage follows)."""
    values = list(_values(view))
    values[_FREE] = free_blocks
    values[_USAGE] = 1.0 - free_blocks / num_blocks
    return _build(values)


_DRAINING, _AGE, _PREFIX, _FREE, _USAGE = (
    _FIELDS.index(name)
    for name in ("draining", "signal_age_s", "prefix_blocks", "free_blocks", "kv_usage")
)
