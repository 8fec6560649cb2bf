"""What a router and an autoscaler see of a fleet of replicas behind one front door.

A router picks a replica for one request from per-replica views (which may be stale: each
carries the age of its signal); an autoscaler returns a target replica count from the
fleet's view at a decision time. The views are frozen, slotted attrs classes validated when
built: a wrong type raises ``TypeError`` and a wrong value ``ValueError``, naming the field
and the value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import cast

import attrs
from attrs import field, frozen
from attrs.validators import ge, instance_of, le

__all__ = [
    "FleetView",
    "ReplicaView",
    "ReplicaViews",
    "RoutingRequest",
    "reads_kv_usage",
    "reads_load",
]

TierBlocks = tuple[tuple[str, frozenset[int]], ...]


def _finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{attribute.name}' must be finite: {value!r}")


def _count(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")
    if value < 0:
        raise ValueError(f"'{attribute.name}' must be >= 0: {value!r}")


def _number(value: object) -> float:
    # A bool is an int to Python but never a rate or a fraction here.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"must be a number: {value!r}")
    return float(value)


def _non_empty_str(_inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be a str: {value!r}")
    if not value:
        raise ValueError(f"'{attribute.name}' must not be empty: {value!r}")


def _hashes(value: object) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'block_hashes' must be a sequence of int: {value!r}")
    out = tuple(value)
    for h in out:
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"'block_hashes' must hold int values: {h!r}")
    return out


def _tier_blocks(value: object) -> TierBlocks:
    """``{tier: hashes}`` (or its pairs) as pairs sorted by tier, each set frozen."""
    pairs: Iterable[object]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'prefix_blocks' must map tier names to block hashes: {value!r}")
    else:
        pairs = value
    out: dict[str, frozenset[int]] = {}
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"'prefix_blocks' must map tier names to block hashes: {value!r}")
        tier, hashes = pair
        if not isinstance(tier, str) or not tier:
            raise TypeError(f"'prefix_blocks' tier names must be non-empty str: {tier!r}")
        if tier in out:
            raise ValueError(f"'prefix_blocks' names tier {tier!r} twice")
        out[tier] = frozenset(_hashes(hashes))
    return tuple(sorted(out.items()))


@frozen
class ReplicaView:
    """One replica as a router sees it: load, KV memory, resident prefix blocks, state.

    The prefix blocks are named by their chained hashes (:func:`chain_block_hashes`), so a
    block stands for its whole prefix, at the granularity of ``block_size``.
    """

    replica_id: str = field(validator=_non_empty_str)
    """Identifier of the replica, unique in its fleet."""
    running: int = field(validator=_count)
    """Requests in the running batch."""
    waiting: int = field(validator=_count)
    """Requests queued on the replica, not yet admitted to its batch."""
    kv_usage: float = field(converter=_number, validator=[ge(0.0), le(1.0)])
    """Fraction of the replica's KV blocks in use, in [0, 1]."""
    free_blocks: int = field(validator=_count)
    """KV blocks free now."""
    block_size: int = field(validator=[instance_of(int), ge(1)])
    """Tokens per KV block."""
    prefix_blocks: TierBlocks = field(default=(), converter=_tier_blocks)
    """Hashes of the prefix blocks resident in each tier, ``{"gpu": {...}, "host": {...}}``
    (stored as pairs sorted by tier); empty when the replica reports none."""
    draining: bool = field(default=False, validator=instance_of(bool))
    """Whether the replica is draining: it finishes its requests and takes no new ones."""
    signal_age_s: float = field(default=0.0, converter=_number, validator=[_finite, ge(0.0)])
    """Seconds since this view was observed (0: fresh)."""
    model: str = field(default="", validator=instance_of(str))
    """Label of the model the replica serves (empty: unlabelled)."""
    gpu: str = field(default="", validator=instance_of(str))
    """Label of the replica's GPU (empty: unlabelled)."""

    @property
    def outstanding(self) -> int:
        """Requests on the replica: ``running + waiting``."""
        return self.running + self.waiting

    @property
    def tiers(self) -> tuple[str, ...]:
        """Names of the tiers that report resident blocks, sorted."""
        return tuple(tier for tier, _ in self.prefix_blocks)

    def resident(self, tier: str) -> frozenset[int]:
        """Hashes of the blocks resident in ``tier`` (empty for a tier not reported)."""
        for name, hashes in self.prefix_blocks:
            if name == tier:
                return hashes
        return frozenset()


@frozen
class RoutingRequest:
    """One request as a router sees it: its size, its prompt's blocks and its class."""

    request_id: str = field(validator=_non_empty_str)
    """Identifier of the request."""
    prompt_len: int = field(validator=[instance_of(int), ge(1)])
    """Prompt length in tokens."""
    block_hashes: tuple[int, ...] = field(default=(), converter=_hashes)
    """Chained hashes of the prompt's full blocks, first block first, at the replicas'
    block granularity (may be empty)."""
    label: str = field(default="default", validator=_non_empty_str)
    """Class or tenant label (a mixing router routes by it)."""


class ReplicaViews(tuple[ReplicaView, ...]):
    """The views of a fleet's replicas, checked once: each a :class:`ReplicaView`, no id
    twice.

    A router checks the views it is shown at every decision (a list from outside may hold
    anything); a tuple of this type was checked when it was made and cannot change since,
    so a router may take it as it is. ``ReplicaViews(views)`` checks; a fleet that built
    every view itself, with unique ids by construction, may make one with
    :meth:`trusted` without the check (the simulator and the gateway do, per decision).

    Raises:
        TypeError: ``views`` is not an iterable, or an item is not a :class:`ReplicaView`
            (naming its index).
        ValueError: two views share an id.
    """

    __slots__ = ()

    def __new__(cls, views: Iterable[ReplicaView] = ()) -> ReplicaViews:
        if isinstance(cast(object, views), str | bytes) or not isinstance(views, Iterable):
            raise TypeError(f"'views' must be a sequence of ReplicaView: {views!r}")
        items = tuple(views)
        seen: set[str] = set()
        for i, view in enumerate(items):
            if not isinstance(view, ReplicaView):
                raise TypeError(f"'views[{i}]' must be a ReplicaView: {view!r}")
            if view.replica_id in seen:
                raise ValueError(f"'views' has replica id {view.replica_id!r} twice")
            seen.add(view.replica_id)
        return tuple.__new__(cls, items)

    @classmethod
    def trusted(cls, views: Iterable[ReplicaView]) -> ReplicaViews:
        """``views`` as a :class:`ReplicaViews` without the check: for a caller whose views
        are all :class:`ReplicaView` with unique ids by construction (its own)."""
        return tuple.__new__(cls, views)


def reads_kv_usage(router: object) -> bool:
    """Whether ``router`` may read its views' KV memory (:attr:`ReplicaView.kv_usage` and
    :attr:`ReplicaView.free_blocks`): False only for a router (or a scorer) that says so
    with ``reads_kv_usage = False``.

    Its choices must then not depend on them, and a caller may show it views whose KV
    memory is as of the replica's last change rather than now (the simulator then spares
    rebuilding a view each time one of a replica's decode iterations takes a block).
    Optional, as ``reads_prefix_blocks`` is.
    """
    return getattr(router, "reads_kv_usage", True) is not False


def reads_load(router: object) -> bool:
    """Whether ``router``'s choices may depend on its views' load (``running``,
    ``waiting``, ``kv_usage``, ``free_blocks``, ``prefix_blocks``, ``signal_age_s``): False
    only for a router that says so with ``reads_load = False`` (round-robin, seeded random,
    seed 002's mixing).

    Its choices must then depend only on the requests (in their order), the views' ids,
    order, draining and labels (``model``, ``gpu``, ``block_size``) and its own state, and
    a caller may show it views of any time: with a fixed fleet and no gateway the simulator
    then routes every request first and serves each replica's share as one engine,
    replica by replica (replicas sharing nothing, each runs exactly as in the fleet's
    loop). Optional, as ``reads_prefix_blocks`` is.
    """
    return getattr(router, "reads_load", True) is not False


def _views(value: object) -> tuple[ReplicaView, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"must be a sequence of ReplicaView: {value!r}")
    return tuple(value)


def _ids(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'provisioning' must be a sequence of replica ids: {value!r}")
    return tuple(value)


@frozen
class FleetView:
    """The fleet as an autoscaler sees it at one decision time."""

    time: float = field(converter=_number, validator=[_finite, ge(0.0)])
    """Decision time in seconds since the start."""
    up: tuple[ReplicaView, ...] = field(default=(), converter=_views)
    """Replicas serving and taking new requests (none of them draining)."""
    provisioning: tuple[str, ...] = field(default=(), converter=_ids)
    """Ids of replicas asked for and still starting (no view yet)."""
    draining: tuple[ReplicaView, ...] = field(default=(), converter=_views)
    """Replicas finishing their requests before they stop (each ``draining``)."""
    arrival_rate: float = field(default=0.0, converter=_number, validator=[_finite, ge(0.0)])
    """Requests per second arriving at the front door (observed)."""
    queued: int = field(default=0, validator=_count)
    """Requests waiting at the front door for a replica."""
    tokens_per_s: float = field(default=0.0, converter=_number, validator=[_finite, ge(0.0)])
    """Tokens per second (prompt and output) the fleet served (observed)."""
    mean_prompt_tokens: float = field(default=0.0, converter=_number, validator=[_finite, ge(0.0)])
    """Mean prompt length of the arriving requests in tokens (0: unknown)."""
    mean_output_tokens: float = field(default=0.0, converter=_number, validator=[_finite, ge(0.0)])
    """Mean output length of the arriving requests in tokens (0: unknown)."""
    prefix_hit_rate: float = field(default=0.0, converter=_number, validator=[ge(0.0), le(1.0)])
    """Fraction of prompt tokens served from a prefix cache, in [0, 1]."""

    def __attrs_post_init__(self) -> None:
        seen: set[str] = set()
        for name, views, draining in (("up", self.up, False), ("draining", self.draining, True)):
            for i, view in enumerate(views):
                if not isinstance(view, ReplicaView):
                    raise TypeError(f"'{name}[{i}]' must be a ReplicaView: {view!r}")
                if view.draining is not draining:
                    raise ValueError(
                        f"'{name}[{i}]' must have draining={draining}: {view.replica_id!r}"
                    )
                seen.add(view.replica_id)
        for i, rid in enumerate(self.provisioning):
            if not isinstance(rid, str) or not rid:
                raise TypeError(f"'provisioning[{i}]' must be a non-empty str: {rid!r}")
            seen.add(rid)
        total = len(self.up) + len(self.provisioning) + len(self.draining)
        if len(seen) != total:
            raise ValueError(f"replica ids must be unique across the fleet: {sorted(seen)!r}")

    @property
    def replicas(self) -> int:
        """Replicas counted toward the target: up plus provisioning (draining ones leave)."""
        return len(self.up) + len(self.provisioning)
