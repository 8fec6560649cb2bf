"""Routers: which replica of a fleet serves a request (kvmodel's :class:`Router`).

Every router here picks among the replicas that are not draining, returns None only when
there is none, and never returns an id that is not in the list it was given. Ties go to the
replica that comes first in that list, so a router without a seed is deterministic, and a
seeded one is deterministic under its seed.

The scorers of :class:`WeightedRouter` give each replica a score in [0, 1], higher better;
the weighted sum picks the replica, as llm-d's scheduler does with its prefix-cache, queue
and KV-cache scorers (weights 3, 2, 2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Protocol, cast, runtime_checkable

import attrs
from attrs import define, field, frozen

from kvpolicy.admit._fused import FusedTotals
from kvpolicy.admit._mixing import RoutingPlan, plan_routing
from kvpolicy.admit._policies import RequestClass
from kvpolicy.admit._prefix import TierCredit
from kvpolicy.kvmodel import (
    ReplicaView,
    ReplicaViews,
    Router,
    RoutingRequest,
    reads_kv_usage,
    reads_prefix_blocks,
)

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "ChoiceScorer",
    "KVScorer",
    "LeastKVRouter",
    "LeastRequestsRouter",
    "MixingRouter",
    "PowerOfTwoRouter",
    "PrefixAwareRouter",
    "PrefixScorer",
    "QueueScorer",
    "RandomRouter",
    "ReplicaScorer",
    "RequestsScorer",
    "RoundRobinRouter",
    "WeightedRouter",
    "eligible_replicas",
    "prefix_match",
]

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"gpu": 1.0, "host": 0.75, "disk": 0.25}
)
"""Credit of one matched block by the tier it is resident in (Dynamo's KV router counts a
host-tier hit at 0.75 and a disk hit at 0.25 of a GPU hit)."""


def eligible_replicas(
    request: RoutingRequest, replicas: Sequence[ReplicaView]
) -> tuple[ReplicaView, ...]:
    """The replicas of ``replicas`` that may take a new request (not draining), in order.

    A :class:`ReplicaViews` was checked when it was made and is taken as it is (returned
    itself when none drains); any other sequence is checked item by item.

    Raises:
        TypeError: ``request`` is not a :class:`RoutingRequest`, or an item of ``replicas``
            is not a :class:`ReplicaView`.
        ValueError: two replicas share an id.
    """
    if not isinstance(request, RoutingRequest):
        raise TypeError(f"'request' must be a RoutingRequest: {request!r}")
    if type(replicas) is ReplicaViews:  # checked when made (or a fleet's own): as it is
        for view in replicas:
            if view.draining:
                return tuple([view for view in replicas if not view.draining])
        return replicas
    # The common case checked in one comprehension (a routing decision at 64 replicas
    # spends its budget of tens of microseconds here otherwise): a list or tuple of plain
    # ReplicaView with unique ids is one whose set of plain views' ids is as large as it.
    # Anything else takes the item-by-item check, which names what is wrong.
    if type(replicas) in (list, tuple) and len(
        {view.replica_id for view in replicas if type(view) is ReplicaView}
    ) == len(replicas):
        live = [view for view in replicas if not view.draining]
        return tuple(replicas) if len(live) == len(replicas) else tuple(live)
    if isinstance(cast(object, replicas), str | bytes) or not isinstance(replicas, Sequence):
        raise TypeError(f"'replicas' must be a sequence of ReplicaView: {replicas!r}")
    seen: set[str] = set()
    for i, view in enumerate(replicas):
        if not isinstance(view, ReplicaView):
            raise TypeError(f"'replicas[{i}]' must be a ReplicaView: {view!r}")
        if view.replica_id in seen:
            raise ValueError(f"'replicas' has replica id {view.replica_id!r} twice")
        seen.add(view.replica_id)
    return tuple(view for view in replicas if not view.draining)


def _tier_weights(value: Mapping[str, float]) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"'tier_weights' must map tier names to weights: {value!r}")
    out: dict[str, float] = {}
    for tier, weight in value.items():
        if not isinstance(tier, str) or not tier:
            raise TypeError(f"'tier_weights' tier names must be non-empty str: {tier!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"'tier_weights[{tier!r}]' must be a number: {weight!r}")
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"'tier_weights[{tier!r}]' must be in [0, 1]: {weight!r}")
        out[tier] = float(weight)
    return MappingProxyType(out)


def prefix_match(
    request: RoutingRequest, replica: ReplicaView, tier_weights: Mapping[str, float]
) -> float:
    """Tier-weighted matched blocks of ``request``'s prompt on ``replica`` ÷ its total blocks.

    The match is the leading run of the prompt's block hashes resident in some tier; each
    block counts the weight of the best tier that holds it, and the run ends at the first
    block no tier holds (a chained hash names its whole prefix). A prompt without full
    blocks matches 0.

    Returns:
        A fraction in [0, 1] (1: every block resident on the GPU tier at weight 1).
    """
    return TierCredit(tier_weights).match(request.block_hashes, replica.prefix_blocks)


def _least_requests(eligible: Sequence[ReplicaView]) -> ReplicaView:
    """The first of the fewest outstanding (``min`` by ``outstanding``, without a call of
    the property per replica)."""
    loads = [r.running + r.waiting for r in eligible]
    return eligible[loads.index(min(loads))]


@define
class RoundRobinRouter:
    """Each eligible replica in turn, in the order of the list (a cursor that keeps counting)."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""
    reads_load: ClassVar[bool] = False
    """It reads no load at all, only ids, order and draining (kvmodel's :func:`reads_load`)."""

    _next: int = field(init=False, default=0)

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The replica at the cursor modulo the eligible replicas; the cursor advances."""
        eligible = eligible_replicas(request, replicas)
        if not eligible:
            return None
        choice = eligible[self._next % len(eligible)]
        self._next += 1
        return choice.replica_id


def _seed(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")


@define
class _Seeded:
    """A router's own generator, seeded: the same seed and inputs, the same choices."""

    seed: int = field(default=0, validator=_seed)
    """Seed of the router's generator (the same seed, the same choices)."""
    _rng: random.Random = field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.seed)


@define
class RandomRouter(_Seeded):
    """An eligible replica drawn uniformly at random, from a generator of its own seed."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""
    reads_load: ClassVar[bool] = False
    """It reads no load at all, only ids, order and draining (kvmodel's :func:`reads_load`)."""

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """A uniformly drawn eligible replica."""
        eligible = eligible_replicas(request, replicas)
        if not eligible:
            return None
        return self._rng.choice(eligible).replica_id


@frozen
class LeastRequestsRouter:
    """The eligible replica with the fewest outstanding (running plus waiting) requests."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The least-loaded eligible replica, the first in the list on a tie."""
        eligible = eligible_replicas(request, replicas)
        return _least_requests(eligible).replica_id if eligible else None


@frozen
class LeastKVRouter:
    """The eligible replica with the lowest KV usage; fewer outstanding requests break ties."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The eligible replica of least ``(kv_usage, outstanding)``, first on a tie."""
        eligible = eligible_replicas(request, replicas)
        if not eligible:
            return None
        usage = [r.kv_usage for r in eligible]
        if usage.count(usage[0]) == len(usage):  # all alike (no KV signal): least requests
            return _least_requests(eligible).replica_id
        low = min(usage)
        ties = usage.count(low)
        if ties == 1:
            return eligible[usage.index(low)].replica_id
        if math.isnan(sum(usage)):
            # A NaN usage (a view built unchecked): the pairs' own order, as it always was.
            keys = [(r.kv_usage, r.running + r.waiting) for r in eligible]
            return eligible[keys.index(min(keys))].replica_id
        tied = [r for r, u in zip(eligible, usage, strict=True) if u == low]
        return _least_requests(tied).replica_id


@define
class PowerOfTwoRouter(_Seeded):
    """Power of two choices: two eligible replicas drawn at random, the less loaded wins."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """Of two distinct drawn replicas, the one with fewer outstanding requests (the first
        drawn on a tie); the only one when one is eligible."""
        eligible = eligible_replicas(request, replicas)
        if len(eligible) <= 1:
            return eligible[0].replica_id if eligible else None
        a, b = self._rng.sample(eligible, 2)
        return (a if a.outstanding <= b.outstanding else b).replica_id


@frozen
class PrefixAwareRouter:
    """The eligible replica holding most of the prompt's prefix; least requests on no hit.

    The score is :func:`prefix_match`: matched ÷ total blocks, each hit weighted by the tier
    it is resident in. Fewer outstanding requests break ties; when no replica holds the
    prompt's first block, the least-requests replica takes it (AIBrix's prefix-cache router
    with its least-request fallback).
    """

    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    tier_weights: Mapping[str, float] = field(default=DEFAULT_TIER_WEIGHTS, converter=_tier_weights)
    """Credit of a matched block by tier name (default GPU 1.0, host 0.75, disk 0.25)."""
    _credit: TierCredit = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_credit", TierCredit(self.tier_weights))

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The eligible replica of highest match, then fewest outstanding, then first."""
        eligible = eligible_replicas(request, replicas)
        if not eligible:
            return None
        hashes = request.block_hashes
        if hashes:
            # Only the replicas reporting blocks can match (the others score 0).
            held = [r for r in eligible if r.prefix_blocks]
            if held:
                match = self._credit.match
                scores = [match(hashes, r.prefix_blocks) for r in held]
                best = max(scores)
                if best != 0.0:
                    if len(held) == 1:
                        return held[0].replica_id
                    hits = [r for r, s in zip(held, scores, strict=True) if s == best]
                    return _least_requests(hits).replica_id
        return _least_requests(eligible).replica_id


@runtime_checkable
class ReplicaScorer(Protocol):
    """Scores replicas for one request, each in [0, 1], higher better."""

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """One score in [0, 1] per replica, in the order of ``replicas`` (non-empty)."""
        ...


def _min_max(values: Sequence[int]) -> tuple[float, ...]:
    """``(max - v) / (max - min)`` per value: 1 for the least, 0 for the most, 1 if all equal."""
    low, high = min(values), max(values)
    if high == low:
        return (1.0,) * len(values)
    span = high - low
    return tuple([(high - v) / span for v in values])


@frozen
class PrefixScorer:
    """Tier-weighted matched ÷ total prompt blocks (llm-d's prefix-cache scorer)."""

    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    tier_weights: Mapping[str, float] = field(default=DEFAULT_TIER_WEIGHTS, converter=_tier_weights)
    """Credit of a matched block by tier name (default GPU 1.0, host 0.75, disk 0.25)."""
    _credit: TierCredit = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_credit", TierCredit(self.tier_weights))

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """:func:`prefix_match` of each replica."""
        hashes, match = request.block_hashes, self._credit.match
        if not hashes:
            return (0.0,) * len(replicas)
        return tuple([match(hashes, r.prefix_blocks) if r.prefix_blocks else 0.0 for r in replicas])


@frozen
class QueueScorer:
    """Shorter waiting queue scores higher, min-max normalised (llm-d's queue scorer)."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """``(max - waiting) / (max - min)`` over the replicas; 1 for all when equal."""
        return _min_max([r.waiting for r in replicas])


@frozen
class RequestsScorer:
    """Fewer outstanding (running plus waiting) requests score higher, min-max normalised."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """``(max - outstanding) / (max - min)`` over the replicas; 1 for all when equal."""
        return _min_max([r.running + r.waiting for r in replicas])


@frozen
class KVScorer:
    """Free KV scores higher: ``1 - kv_usage`` (llm-d's KV-cache utilisation scorer)."""

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """``1 - kv_usage`` of each replica."""
        return tuple([1.0 - r.kv_usage for r in replicas])


def _router(_inst: object, attribute: attrs.Attribute[Router], value: object) -> None:
    if not isinstance(value, Router):
        raise TypeError(f"'{attribute.name}' must be a Router: {value!r}")


@frozen
class ChoiceScorer:
    """A router as a scorer: 1 for the replica it picks, 0 for the others, so that a
    :class:`WeightedRouter` composes routers as well as scores."""

    router: Router = field(validator=_router)
    """The router whose choice scores 1."""

    @property
    def reads_prefix_blocks(self) -> bool:
        """Whether its router reads the views' prefix blocks."""
        return reads_prefix_blocks(self.router)

    @property
    def reads_kv_usage(self) -> bool:
        """Whether its router reads the views' KV memory."""
        return reads_kv_usage(self.router)

    def score(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> tuple[float, ...]:
        """1.0 for ``router``'s choice among ``replicas``, 0.0 for the rest."""
        choice = self.router.route(request, replicas)
        return tuple(1.0 if r.replica_id == choice else 0.0 for r in replicas)


_SCORERS: Mapping[str, type[ReplicaScorer]] = MappingProxyType(
    {"kv": KVScorer, "prefix": PrefixScorer, "queue": QueueScorer, "requests": RequestsScorer}
)


def _scorers(value: object) -> tuple[tuple[ReplicaScorer, float], ...]:
    """Scorers by name (``{"prefix": 3, ...}``) or as ``(scorer, weight)`` pairs."""
    pairs: Iterable[object]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'scorers' must map scorers to weights: {value!r}")
    else:
        pairs = value
    out: list[tuple[ReplicaScorer, float]] = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"'scorers' must hold (scorer, weight) pairs: {pair!r}")
        scorer, weight = pair
        if isinstance(scorer, str):
            if scorer not in _SCORERS:
                known = ", ".join(sorted(_SCORERS))
                raise ValueError(f"'scorers' names unknown scorer {scorer!r}; known: {known}")
            scorer = _SCORERS[scorer]()
        if not isinstance(scorer, ReplicaScorer):
            raise TypeError(f"'scorers' must hold ReplicaScorer values: {scorer!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"'scorers' weight of {scorer!r} must be a number: {weight!r}")
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"'scorers' weight of {scorer!r} must be finite and >= 0: {weight!r}")
        out.append((scorer, float(weight)))
    if not out or math.fsum(w for _, w in out) == 0.0:
        raise ValueError(f"'scorers' must give some scorer a weight > 0: {value!r}")
    return tuple(out)


_LLMD_WEIGHTS: Mapping[str, float] = MappingProxyType({"prefix": 3.0, "queue": 2.0, "kv": 2.0})


@frozen
class WeightedRouter:
    """The eligible replica of highest weighted score; a composition of scorers.

    ``WeightedRouter()`` is llm-d's default: prefix-cache 3, queue 2, KV-cache 2.
    ``WeightedRouter({"prefix": 1, "requests": 1})`` or ``WeightedRouter([(PrefixScorer(
    {"gpu": 1.0}), 2.0), (KVScorer(), 1.0)])`` compose others, and
    ``(ChoiceScorer(router), weight)`` adds any router's choice.
    """

    scorers: tuple[tuple[ReplicaScorer, float], ...] = field(
        default=_LLMD_WEIGHTS, converter=_scorers
    )
    """``(scorer, weight)`` pairs, or a mapping of scorer names (``kv``, ``prefix``,
    ``queue``, ``requests``) or scorers to weights (>= 0, not all 0)."""
    _fused: FusedTotals | None = field(init=False, repr=False, eq=False)
    _reads_prefix: bool = field(init=False, repr=False, eq=False)
    _reads_kv: bool = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        # Scorers of this module's own types are computed inline (see _fused).
        fused = None
        if all(type(scorer) in _INLINE for scorer, _ in self.scorers):
            fused = FusedTotals(
                [
                    (_INLINE[type(scorer)], weight, getattr(scorer, "_credit", None))
                    for scorer, weight in self.scorers
                ]
            )
        object.__setattr__(self, "_fused", fused)
        # What it reads, asked of its scorers once (a gateway asks at every decision).
        reads = any(reads_prefix_blocks(scorer) for scorer, _ in self.scorers)
        object.__setattr__(self, "_reads_prefix", reads)
        object.__setattr__(self, "_reads_kv", any(reads_kv_usage(s) for s, _ in self.scorers))

    @property
    def reads_prefix_blocks(self) -> bool:
        """Whether one of its scorers reads the views' prefix blocks (asked when built)."""
        return self._reads_prefix

    @property
    def reads_kv_usage(self) -> bool:
        """Whether one of its scorers reads the views' KV memory (asked when built)."""
        return self._reads_kv

    @property
    def follows_changed_since(self) -> bool:
        """Whether it follows views that say what changed (``changed_since``): with its
        built-in scorers only (a fleet shows such views to a router that says so)."""
        return self._fused is not None

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The eligible replica maximising ``sum(weight * score)``, the first on a tie."""
        fused = self._fused
        if fused is not None and isinstance(replicas, ReplicaViews) and replicas:
            # Checked when made: the fused totals follow its draining replicas themselves.
            if not isinstance(request, RoutingRequest):
                raise TypeError(f"'request' must be a RoutingRequest: {request!r}")
            best = fused.best(request.block_hashes, replicas)
            return replicas[best].replica_id if best >= 0 else None
        eligible = eligible_replicas(request, replicas)
        if not eligible:
            return None
        if fused is not None:
            return eligible[fused.best(request.block_hashes, eligible)].replica_id
        totals = self._totals(request, eligible)
        if math.isnan(sum(totals)):  # a NaN score: the general rule orders it as before
            best = max(range(len(eligible)), key=lambda i: (totals[i], -i))
        else:  # the first of the highest totals
            best = totals.index(max(totals))
        return eligible[best].replica_id

    def _totals(self, request: RoutingRequest, eligible: Sequence[ReplicaView]) -> list[float]:
        """``sum(weight * score)`` per replica, each scorer asked in turn."""
        totals: list[float] | None = None
        for scorer, weight in self.scorers:
            scores = scorer.score(request, eligible)
            if len(scores) != len(eligible):
                raise ValueError(
                    f"scorer {scorer!r} gave {len(scores)} scores, not {len(eligible)}"
                )
            if totals is None:  # 0.0 + x orders as x does (only a -0.0 would differ)
                totals = [weight * s for s in scores]
            else:
                totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
        assert totals is not None  # the converter keeps at least one scorer
        return totals


_INLINE: Mapping[type, str] = MappingProxyType(
    {KVScorer: "kv", PrefixScorer: "prefix", QueueScorer: "queue", RequestsScorer: "requests"}
)
"""The scorers a weighted router sums itself (:class:`FusedTotals`), exact types only."""


def _request_class(value: object) -> RequestClass:
    if isinstance(value, RequestClass):
        return value
    if isinstance(value, Mapping):
        return RequestClass(**value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) == 3:
        return RequestClass(*value)
    raise TypeError(
        f"'classes' must hold RequestClass values, {{input_len, decode_len, share}} mappings "
        f"or (input_len, decode_len, share) triples: {value!r}"
    )


def _classes(value: Iterable[object]) -> tuple[RequestClass, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'classes' must be a sequence of request classes: {value!r}")
    out = tuple(_request_class(v) for v in value)
    if not out:
        raise ValueError(f"'classes' must not be empty: {value!r}")
    return out


def _labels(value: Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'labels' must be a sequence of str: {value!r}")
    out = tuple(value)
    for label in out:
        if not isinstance(label, str) or not label:
            raise TypeError(f"'labels' must hold non-empty str values: {label!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"'labels' must be unique: {out!r}")
    return out


def _margin(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"'{attribute.name}' must be in [0, 1): {value!r}")


@define
class MixingRouter:
    """Seed 002's request mixing (§5.2) as a router: each class to replicas in the fractions
    of :func:`plan_routing`.

    The plan is made for the eligible replicas, the ``g``-th in the list's order being GPU
    ``g`` of the plan (one plan per replica count, cached). Within a class the replica is
    the one furthest behind its share (the largest ``fraction * n - sent``, first on a tie,
    counted afresh whenever the set of eligible replicas changes), so after ``n`` requests
    of a class each replica has had its fraction of them to within one request.
    """

    reads_prefix_blocks: ClassVar[bool] = False
    """It never reads the views' prefix blocks (kvmodel's :class:`Router`)."""
    reads_kv_usage: ClassVar[bool] = False
    """It never reads the views' KV memory (kvmodel's :func:`reads_kv_usage`)."""
    reads_load: ClassVar[bool] = False
    """It reads no load at all, only ids, order and draining (kvmodel's :func:`reads_load`)."""

    classes: tuple[RequestClass, ...] = field(converter=_classes)
    """The request classes (lengths and shares summing to 1): :class:`RequestClass`
    values, ``{input_len, decode_len, share}`` mappings or triples."""
    labels: tuple[str, ...] | None = field(default=None, converter=_labels)
    """The :attr:`RoutingRequest.label` of each class, in order (default ``"0"``, ``"1"``,
    ...)."""
    margin: float = field(default=1e-3, converter=float, validator=_margin)
    """Spectral gap each replica's mix must keep (``plan_routing``'s ``margin``)."""
    _plans: dict[int, RoutingPlan] = field(init=False, factory=dict)
    _replicas: tuple[str, ...] = field(init=False, default=())
    _sent: list[list[int]] = field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        if self.labels is None:
            self.labels = tuple(str(k) for k in range(len(self.classes)))
        elif len(self.labels) != len(self.classes):
            raise ValueError(
                f"'labels' must name each of the {len(self.classes)} classes: {self.labels!r}"
            )
        total = math.fsum(c.share for c in self.classes)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"'classes' shares must sum to 1: they sum to {total}")

    def plan(self, replicas: int) -> RoutingPlan:
        """The routing plan over ``replicas`` replicas (computed once per count)."""
        if replicas not in self._plans:
            self._plans[replicas] = plan_routing(self.classes, replicas, margin=self.margin)
        return self._plans[replicas]

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        """The eligible replica furthest behind its share of ``request``'s class.

        Raises:
            ValueError: ``request.label`` names none of the classes.
        """
        eligible = eligible_replicas(request, replicas)
        labels = self.labels or ()
        if request.label not in labels:
            raise ValueError(
                f"'label' of request {request.request_id!r} names no mixing class "
                f"(one of {', '.join(labels)}): {request.label!r}"
            )
        if not eligible:
            return None
        k = labels.index(request.label)
        fractions = self.plan(len(eligible)).fractions
        key = tuple(r.replica_id for r in eligible)
        if key != self._replicas:
            self._replicas = key
            self._sent = [[0] * len(eligible) for _ in self.classes]
        sent = self._sent[k]
        n = sum(sent) + 1
        g = max(range(len(eligible)), key=lambda i: (fractions[i][k] * n - sent[i], -i))
        sent[g] += 1
        return eligible[g].replica_id
