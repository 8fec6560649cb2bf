"""The routers against a plain transcription of each rule, on many seeded random fleets.

The routers take shortcuts for speed (one pass per load scorer, a single-tier match as the
run's length times its weight, the least-KV tie broken only when usage ties); each rule
is written here the obvious way, straight from its docstring, and every router must pick
the same replica as its rule on every fleet: ties on load and on usage, draining replicas,
stale and missing signals, tiers the weights do not name, weights whose sums round, views
given as a list, as :class:`ReplicaViews` and with a live set of blocks (as the gateway
shows its prefix index).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import attrs
import pytest

from kvpolicy.admit import (
    DEFAULT_TIER_WEIGHTS,
    ChoiceScorer,
    KVScorer,
    LeastKVRouter,
    LeastRequestsRouter,
    PowerOfTwoRouter,
    PrefixAwareRouter,
    PrefixScorer,
    QueueScorer,
    RandomRouter,
    RequestsScorer,
    RoundRobinRouter,
    WeightedRouter,
    prefix_match,
)
from kvpolicy.admit._fused import _compiled, _folded
from kvpolicy.admit._prefix import TierCredit, exact_multiples
from kvpolicy.kvmodel import ReplicaView, ReplicaViews, RoutingRequest

TIERS = ("gpu", "host", "disk", "nvme")  # "nvme": a tier no default weight names
WEIGHTS: tuple[Mapping[str, float], ...] = (
    DEFAULT_TIER_WEIGHTS,
    {"gpu": 1.0},
    {"gpu": 0.3, "host": 0.1, "disk": 0.7},  # sums of 0.1 and 0.3 round
    {"gpu": 0.5, "host": 0.5, "nvme": 0.0},  # equal weights; a weight of 0
    {"host": 1.0, "gpu": 0.9},
)
SCORERS: tuple[Mapping[str, float], ...] = (
    {"prefix": 3.0, "queue": 2.0, "kv": 2.0},
    {"prefix": 1.0, "requests": 1.0},
    {"kv": 0.1, "queue": 0.7, "prefix": 1.3},
    {"queue": 1.0, "requests": 0.3},
    {"prefix": 1.0},
    {"kv": 1.0, "prefix": 0.0},
)


# ------------------------------------------------------------------ the rules, plainly


def eligible(views: Sequence[ReplicaView]) -> list[ReplicaView]:
    return [v for v in views if not v.draining]


def match(hashes: Sequence[int], view: ReplicaView, weights: Mapping[str, float]) -> float:
    """Leading run of ``hashes`` held in a weighted tier, each block at its best tier's
    weight, added one by one, over the number of blocks."""
    if not hashes:
        return 0.0
    credit = 0.0
    for h in hashes:
        held = [weights[t] for t, blocks in view.prefix_blocks if t in weights and h in blocks]
        if not held:
            break
        credit += max(held)
    return credit / len(hashes)


def first_least(views: Sequence[ReplicaView], key: Callable[[ReplicaView], object]) -> str:
    best = views[0]
    for v in views[1:]:
        if key(v) < key(best):  # type: ignore[operator]
            best = v
    return best.replica_id


def least_requests(views: Sequence[ReplicaView]) -> str | None:
    live = eligible(views)
    return first_least(live, lambda v: v.running + v.waiting) if live else None


def least_kv(views: Sequence[ReplicaView]) -> str | None:
    live = eligible(views)
    return first_least(live, lambda v: (v.kv_usage, v.running + v.waiting)) if live else None


def prefix_aware(
    request: RoutingRequest, views: Sequence[ReplicaView], weights: Mapping[str, float]
) -> str | None:
    live = eligible(views)
    if not live:
        return None
    scores = [match(request.block_hashes, v, weights) for v in live]
    best = max(scores)
    if best == 0.0:
        return least_requests(live)
    return least_requests([v for v, s in zip(live, scores, strict=True) if s == best])


def min_max(values: Sequence[int]) -> list[float]:
    low, high = min(values), max(values)
    return [1.0 if high == low else (high - v) / (high - low) for v in values]


def weighted(
    request: RoutingRequest,
    views: Sequence[ReplicaView],
    scorers: Sequence[tuple[str, float, Mapping[str, float]]],
) -> str | None:
    """``sum(weight * score)`` in the scorers' order; the first of the highest."""
    live = eligible(views)
    if not live:
        return None
    columns = []
    for name, w, tiers in scorers:
        if name == "prefix":
            scores = [match(request.block_hashes, v, tiers) for v in live]
        elif name == "kv":
            scores = [1.0 - v.kv_usage for v in live]
        elif name == "queue":
            scores = min_max([v.waiting for v in live])
        else:
            scores = min_max([v.running + v.waiting for v in live])
        columns.append([w * s for s in scores])
    totals = []
    for i in range(len(live)):
        total = columns[0][i]
        for column in columns[1:]:
            total += column[i]
        totals.append(total)
    best = 0
    for i, t in enumerate(totals):
        if t > totals[best]:
            best = i
    return live[best].replica_id


# ------------------------------------------------------------------ random fleets


def _view(rng: random.Random, i: int) -> ReplicaView:
    prefix: dict[str, list[int]] = {}
    if rng.random() < 0.7:  # else: reports no blocks (a missing signal)
        for tier in rng.sample(TIERS, rng.randrange(1, 4)):
            prefix[tier] = [h for h in range(14) if rng.random() < 0.7]
    return ReplicaView(
        f"r{i}",
        running=rng.randrange(3),
        waiting=rng.randrange(3),
        kv_usage=rng.choice((0.0, 0.25, 0.5, 1.0, rng.random())),
        free_blocks=rng.randrange(100),
        block_size=16,
        prefix_blocks=prefix,
        draining=rng.random() < 0.15,
        signal_age_s=rng.choice((0.0, 0.0, 2.5, 600.0)),  # fresh, or stale
    )


def _live(view: ReplicaView) -> ReplicaView:
    """``view`` with its one tier's blocks as a live set (an OrderedDict's keys), as the
    gateway shows its prefix index."""
    if len(view.prefix_blocks) != 1:
        return view
    tier, blocks = view.prefix_blocks[0]
    keys = OrderedDict.fromkeys(sorted(blocks)).keys()
    live = attrs.evolve(view, prefix_blocks=())
    object.__setattr__(live, "prefix_blocks", ((tier, keys),))
    return live


def fleets(seed: int, count: int) -> list[tuple[RoutingRequest, list[ReplicaView]]]:
    rng = random.Random(seed)
    out = []
    for k in range(count):
        views = [_view(rng, i) for i in range(rng.randrange(1, 14))]
        if rng.random() < 0.3:
            views = [_live(v) for v in views]
        blocks = tuple(range(rng.randrange(0, 12)))
        out.append((RoutingRequest(f"q{k}", 16 * len(blocks) + 1, blocks), views))
    return out


CASES = fleets(2026, 1_000)


def _shapes(views: list[ReplicaView]) -> tuple[Sequence[ReplicaView], ...]:
    return (views, tuple(views), ReplicaViews(views))


# ------------------------------------------------------------------ the comparisons


def test_cases_cover_the_hard_parts() -> None:
    """The random fleets do hold ties, draining replicas, unweighted tiers and live sets."""
    flat = [v for _, views in CASES for v in views]
    assert sum(v.draining for v in flat) > 100
    assert sum(not v.prefix_blocks for v in flat) > 100
    assert sum(any(t == "nvme" for t, _ in v.prefix_blocks) for v in flat) > 100
    assert sum(not isinstance(b, frozenset) for v in flat for _, b in v.prefix_blocks) > 100
    assert sum(all(v.draining for v in views) for _, views in CASES) > 10
    ties = sum(len({v.kv_usage for v in eligible(vs)}) < len(eligible(vs)) for _, vs in CASES)
    assert ties > 300


def test_least_requests_and_least_kv() -> None:
    """Fewest outstanding, first on a tie; lowest usage, then fewest outstanding, first."""
    for request, views in CASES:
        for shown in _shapes(views):
            assert LeastRequestsRouter().route(request, shown) == least_requests(views)
            assert LeastKVRouter().route(request, shown) == least_kv(views)


@pytest.mark.parametrize(
    "weights", WEIGHTS, ids=lambda w: "-".join(f"{t}{v}" for t, v in w.items())
)
def test_prefix_aware(weights: Mapping[str, float]) -> None:
    """Highest tier-weighted match, least requests among the best; least requests on no
    hit."""
    router = PrefixAwareRouter(weights)
    for request, views in CASES:
        expected = prefix_aware(request, views, weights)
        for shown in _shapes(views):
            assert router.route(request, shown) == expected
        for view in views:
            assert prefix_match(request, view, weights) == match(
                request.block_hashes, view, weights
            )


@pytest.mark.parametrize(
    "scorers", SCORERS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items())
)
def test_weighted_named_scorers(scorers: Mapping[str, float]) -> None:
    """The weighted sum of the named scorers in their order; the first of the highest."""
    router = WeightedRouter(scorers)
    plan = [(name, w, DEFAULT_TIER_WEIGHTS) for name, w in scorers.items()]
    for request, views in CASES:
        expected = weighted(request, views, plan)
        for shown in _shapes(views):
            assert router.route(request, shown) == expected


def test_weighted_scorers_with_tier_weights() -> None:
    """Prefix scorers of other tier weights, twice in one router, weights that round."""
    for tiers in WEIGHTS:
        router = WeightedRouter(
            [(PrefixScorer(tiers), 0.3), (QueueScorer(), 0.1), (PrefixScorer(), 0.7)]
        )
        plan = [
            ("prefix", 0.3, tiers),
            ("queue", 0.1, tiers),
            ("prefix", 0.7, DEFAULT_TIER_WEIGHTS),
        ]
        for request, views in CASES[:500]:
            assert router.route(request, ReplicaViews(views)) == weighted(request, views, plan)


def test_weighted_through_scorer_objects_decides_alike() -> None:
    """A scorer the router cannot inline (a ChoiceScorer) takes the general path, which
    decides as the inline one does for the same plain scorers."""
    inline = WeightedRouter([(KVScorer(), 1.0), (RequestsScorer(), 2.0), (PrefixScorer(), 3.0)])
    general = WeightedRouter(
        [
            (KVScorer(), 1.0),
            (RequestsScorer(), 2.0),
            (PrefixScorer(), 3.0),
            (ChoiceScorer(RoundRobinRouter()), 0.0),
        ]
    )
    for request, views in CASES:
        assert inline.route(request, views) == general.route(request, views)


def _reshown(rng: random.Random, view: ReplicaView) -> ReplicaView:
    """``view`` shown again as a gateway shows its replicas: another object with the same
    ``waiting`` and ``kv_usage``, its prefix blocks shown or hidden (the holders of a
    prompt's first block), now and then its ``running`` changed (which only a scorer of
    requests reads) or its draining flipped."""
    blocks: dict[str, list[int]] = {}
    if rng.random() < 0.5:
        blocks["gpu"] = [h for h in range(14) if rng.random() < 0.7]
    return attrs.evolve(
        view,
        prefix_blocks=blocks,
        running=rng.randrange(3) if rng.random() < 0.3 else view.running,
        draining=not view.draining if rng.random() < 0.1 else view.draining,
    )


def _evolving(seed: int, steps: int) -> list[tuple[RoutingRequest, Sequence[ReplicaView]]]:
    """One fleet shown step after step as a fleet shows it: mostly the same view objects,
    a few replaced (a replica's load changed), sometimes the very same sequence again,
    sometimes a replica more or less, draining or not."""
    rng = random.Random(seed)
    views = [_view(rng, i) for i in range(rng.randrange(8, 24))]
    shown: Sequence[ReplicaView] = ReplicaViews(views)
    out: list[tuple[RoutingRequest, Sequence[ReplicaView]]] = []
    for k in range(steps):
        x = rng.random()
        if x < 0.6:
            for _ in range(rng.randrange(1, 4)):
                i = rng.randrange(len(views))
                if rng.random() < 0.4:
                    views[i] = _reshown(rng, views[i])
                else:
                    views[i] = _view(rng, int(views[i].replica_id[1:]))
                if rng.random() < 0.3:
                    views[i] = _live(views[i])
            shown = ReplicaViews(views) if rng.random() < 0.8 else list(views)
        elif x < 0.7:
            if len(views) > 1 and rng.random() < 0.5:
                del views[rng.randrange(len(views))]
            else:
                views.append(_view(rng, len(views) + 100 + k))
            shown = ReplicaViews(views)
        elif x < 0.75:
            views = [_view(rng, i) for i in range(len(views))]  # every view new
            shown = ReplicaViews(views)
        # else: the same sequence again
        blocks = tuple(range(rng.randrange(0, 12)))
        out.append((RoutingRequest(f"q{k}", 16 * len(blocks) + 1, blocks), shown))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_routers_follow_an_evolving_fleet(seed: int) -> None:
    """Routers that keep what they read of the views last shown decide, step after step,
    as the rules do on each step's views alone."""
    scorers = SCORERS[seed % len(SCORERS)]
    lk, lr, pa = LeastKVRouter(), LeastRequestsRouter(), PrefixAwareRouter()
    wd, wn = WeightedRouter(), WeightedRouter(scorers)
    plan = [(name, w, DEFAULT_TIER_WEIGHTS) for name, w in scorers.items()]
    llmd = [("prefix", 3.0, DEFAULT_TIER_WEIGHTS), ("queue", 2.0, {}), ("kv", 2.0, {})]
    for request, shown in _evolving(seed, 400):
        views = list(shown)
        assert lk.route(request, shown) == least_kv(views)
        assert lr.route(request, shown) == least_requests(views)
        assert pa.route(request, shown) == prefix_aware(request, views, DEFAULT_TIER_WEIGHTS)
        assert wd.route(request, shown) == weighted(request, views, llmd)
        assert wn.route(request, shown) == weighted(request, views, plan)


class _Said(ReplicaViews):
    """Views that say what changed since the views shown before (``changed_since``), and
    which report prefix blocks (``prefix_shown``), as the gateway's fleet shows them."""

    changed_since: tuple[Sequence[ReplicaView], tuple[int, ...]] | None
    prefix_shown: tuple[int, ...]


def _load(view: ReplicaView) -> tuple[object, ...]:
    """What a view shows but its prefix blocks."""
    return tuple(
        getattr(view, f.name) for f in attrs.fields(ReplicaView) if f.name != "prefix_blocks"
    )


def _saying(
    steps: list[tuple[RoutingRequest, Sequence[ReplicaView]]],
    rng: random.Random,
    shown_blocks: bool = False,
) -> list[tuple[RoutingRequest, Sequence[ReplicaView]]]:
    """``steps`` with each step's views saying which positions changed since the step
    before's: a superset of them (some unchanged positions named too), or, now and then,
    naming views that were not the ones shown before (to be ignored); with
    ``shown_blocks``, saying which positions report prefix blocks too, and then naming, of
    the positions that changed, only those whose view shows another load (a view shown
    with other blocks and the same load is not named)."""
    out: list[tuple[RoutingRequest, Sequence[ReplicaView]]] = []
    last: Sequence[ReplicaView] | None = None
    for request, shown in steps:
        said = tuple.__new__(_Said, shown)
        said.changed_since = None
        if shown_blocks:
            said.prefix_shown = tuple(i for i, v in enumerate(shown) if v.prefix_blocks)
        if last is not None and len(last) == len(shown):
            if shown_blocks:
                changed = {i for i in range(len(shown)) if _load(shown[i]) != _load(last[i])}
            else:
                changed = {i for i in range(len(shown)) if shown[i] is not last[i]}
            changed.update(rng.sample(range(len(shown)), min(2, len(shown))))
            before = last if rng.random() < 0.9 else ReplicaViews(last)
            said.changed_since = (before, tuple(sorted(changed)))
        out.append((request, said))
        last = said
    return out


@pytest.mark.parametrize("shown_blocks", [False, True])
@pytest.mark.parametrize("seed", [5, 6])
def test_routers_follow_views_that_say_what_changed(seed: int, shown_blocks: bool) -> None:
    """Views naming the positions that changed since the views before (the gateway's
    fleet), and, with ``shown_blocks``, those reporting prefix blocks (then naming only
    the views showing another load), are followed through those alone by ``weighted`` and
    ignored by the others, every router deciding as its rule does; a hint naming other
    views than those last shown is ignored."""
    rng = random.Random(seed)
    scorers = SCORERS[seed % len(SCORERS)]
    lk, lr, pa, rr = LeastKVRouter(), LeastRequestsRouter(), PrefixAwareRouter(), RoundRobinRouter()
    wd, wn = WeightedRouter(), WeightedRouter(scorers)
    plan = [(name, w, DEFAULT_TIER_WEIGHTS) for name, w in scorers.items()]
    llmd = [("prefix", 3.0, DEFAULT_TIER_WEIGHTS), ("queue", 2.0, {}), ("kv", 2.0, {})]
    cursor = 0
    for request, shown in _saying(_evolving(seed, 400), rng, shown_blocks):
        views = list(shown)
        live = eligible(views)
        assert lk.route(request, shown) == least_kv(views)
        assert lr.route(request, shown) == least_requests(views)
        assert pa.route(request, shown) == prefix_aware(request, views, DEFAULT_TIER_WEIGHTS)
        assert wd.route(request, shown) == weighted(request, views, llmd)
        assert wn.route(request, shown) == weighted(request, views, plan)
        assert rr.route(request, shown) == (live[cursor % len(live)].replica_id if live else None)
        cursor += 1 if live else 0


def test_routers_follow_replicas_that_drain_and_come_back() -> None:
    """Routers shown a fleet whose replicas drain and come back, a few views at a time,
    the views saying what changed, decide as the rules do at every step (``weighted``
    follows the live ones apart while some drain)."""
    rng = random.Random(11)
    views = [attrs.evolve(_view(rng, i), draining=False) for i in range(40)]
    steps: list[tuple[RoutingRequest, Sequence[ReplicaView]]] = []
    for k in range(300):
        if k % 50 == 0:  # the drained come back
            views = [attrs.evolve(v, draining=False) if v.draining else v for v in views]
        for _ in range(rng.randrange(1, 3)):
            i = rng.randrange(len(views))
            views[i] = attrs.evolve(_view(rng, i), draining=rng.random() < 0.03)
        if k % 50 == 49:
            views = [attrs.evolve(v, draining=True) for v in views]  # every one drains
        request = RoutingRequest(f"q{k}", 100, tuple(range(rng.randrange(0, 12))))
        steps.append((request, ReplicaViews(views)))
    router = WeightedRouter({"prefix": 1.0, "requests": 2.0, "kv": 0.5})
    plan = [("prefix", 1.0, DEFAULT_TIER_WEIGHTS), ("requests", 2.0, {}), ("kv", 0.5, {})]
    lr, pa = LeastRequestsRouter(), PrefixAwareRouter()
    for request, shown in _saying(steps, rng):
        views = list(shown)
        assert router.route(request, shown) == weighted(request, views, plan)
        assert lr.route(request, shown) == least_requests(views)
        assert pa.route(request, shown) == prefix_aware(request, views, DEFAULT_TIER_WEIGHTS)
    assert sum(not any(v.draining for v in shown) for _, shown in steps) > 100


def _nan_usage(view: ReplicaView) -> ReplicaView:
    """``view`` with a NaN KV usage, as only a view built unchecked can hold."""
    out = attrs.evolve(view)
    object.__setattr__(out, "kv_usage", math.nan)
    return out


def test_weighted_with_nan_usage_decides_as_the_general_rule() -> None:
    """A NaN total (an unchecked view's NaN usage) orders as ``(total, -position)``, on
    fresh fleets and on one evolving through NaN and back, and on small fleets (read
    whole at each decision)."""
    fused = WeightedRouter({"prefix": 1.0, "kv": 1.0, "queue": 0.5})
    general = WeightedRouter(
        [
            (PrefixScorer(), 1.0),
            (KVScorer(), 1.0),
            (QueueScorer(), 0.5),
            (ChoiceScorer(RoundRobinRouter()), 0.0),
        ]
    )
    rng = random.Random(9)
    for request, shown in _evolving(4, 400):
        views = list(shown)
        if rng.random() < 0.3:
            i = rng.randrange(len(views))
            views[i] = _nan_usage(views[i])
            shown = ReplicaViews(views)
        assert fused.route(request, shown) == general.route(request, views)
    for request, views in CASES[:300]:  # 1-13 replicas: a few are read whole
        views = list(views)
        i = rng.randrange(len(views))
        views[i] = _nan_usage(views[i])
        assert fused.route(request, ReplicaViews(views)) == general.route(request, views)


def test_cursor_and_seeded_routers() -> None:
    """Round robin: the cursor modulo the eligible; random and power of two: the draws of
    their seed's generator over the eligible (the first drawn on a tie)."""
    rr, rnd, p2 = RoundRobinRouter(), RandomRouter(seed=5), PowerOfTwoRouter(seed=5)
    rng_rnd, rng_p2 = random.Random(5), random.Random(5)
    cursor = 0
    for request, views in CASES:
        live = eligible(views)
        assert rr.route(request, ReplicaViews(views)) == (
            live[cursor % len(live)].replica_id if live else None
        )
        cursor += 1 if live else 0
        assert rnd.route(request, views) == (rng_rnd.choice(live).replica_id if live else None)
        if len(live) >= 2:
            a, b = rng_p2.sample(live, 2)
            pick = a if a.running + a.waiting <= b.running + b.waiting else b
            assert p2.route(request, views) == pick.replica_id
        else:
            assert p2.route(request, views) == (live[0].replica_id if live else None)


# ------------------------------------------------------------------ the match's arithmetic


@pytest.mark.parametrize(
    ("weight", "exact"),
    [(1.0, True), (0.75, True), (0.25, True), (0.0, True), (0.5 + 2**-19, True),
     (0.1, False), (0.3, False), (0.5 + 2**-25, False), (float("nan"), False)],
)  # fmt: skip
def test_exact_multiples(weight: float, exact: bool) -> None:
    """Few significant bits: every partial sum is exact, so ``k * w`` is the sum."""
    assert exact_multiples(weight) is exact


@pytest.mark.parametrize("weight", [1.0, 0.75, 0.25, 0.1, 0.3, 0.7, 1 / 3, 0.5 + 2**-19])
def test_single_tier_run_is_the_sequential_sum(weight: float) -> None:
    """Runs of 1 to 3,000 blocks on one tier: the credit is the weight added block by
    block, bit for bit (as a multiplication only where that is the same)."""
    credit = TierCredit({"gpu": weight})
    hashes = tuple(range(3_000))
    for run in (1, 2, 3, 7, 10, 99, 1_000, 2_999, 3_000):
        blocks = (("gpu", frozenset(range(run))),)
        total = 0.0
        for _ in range(run):
            total += weight
        assert credit.match(hashes, blocks) == total / len(hashes)


def test_compiled_totals_add_each_term_in_turn() -> None:
    """A fused total compiled from its terms is, bit for bit, each term's product added in
    turn to the sum of the leading constants, on random terms, weights and views (kinds:
    0 kv, 1 queue, 2 requests, 3 prefix, 4 constant); the totals of many views at once are
    each one's total."""
    rng = random.Random(29)
    credit = TierCredit(DEFAULT_TIER_WEIGHTS)
    for _ in range(300):
        terms = []
        for _ in range(rng.randrange(0, 6)):
            kind = rng.randrange(5)
            w = rng.choice((1.0, 2.0, 3.0, 0.1, 1 / 3, rng.random() * 5))
            high, span = rng.randrange(0, 9), rng.randrange(1, 9)
            terms.append((kind, w, high, span, credit if kind == 3 else None))
        plan = _folded(terms)
        total, totals = _compiled(plan)
        views = [_view(rng, i) for i in range(4)]
        hashes = tuple(range(rng.randrange(0, 12)))
        assert totals(views, hashes) == [total(v, hashes) for v in views]
        for _ in range(5):
            view = _view(rng, 0)
            hashes = tuple(range(rng.randrange(0, 12)))
            start, rest = plan
            want = start
            for kind, w, high, span, _credit in rest:
                if kind == 0:
                    term = w * (1.0 - view.kv_usage)
                elif kind == 1:
                    term = w * ((high - view.waiting) / span)
                elif kind == 2:
                    term = w * ((high - (view.running + view.waiting)) / span)
                elif kind == 3:
                    term = w * credit.match(hashes, view.prefix_blocks)
                else:
                    term = w
                want = term if want is None else want + term
            got = total(view, hashes)
            assert got == (0.0 if want is None else want), (terms, view)
