"""The gateway's backends as one fleet: the router's views, in-flight counts, health, scrapes.

:class:`Fleet` keeps, per backend, a keep-alive :class:`~kvpolicy.tenancy._upstream.Upstream`,
the gateway's own in-flight requests and tokens (exact: :meth:`Fleet.begin` and
:meth:`Fleet.end` bracket every proxied request), its last scrape, its
:class:`~kvpolicy.tenancy._health.BackendHealth` and its approximate
:class:`~kvpolicy.tenancy._prefix_index.PrefixIndex`. :meth:`Fleet.pick` asks the router
(a ``kvpolicy.routing`` entry point, the simulator's classes) for one of the backends that
may take a new request, from kvmodel :class:`~kvpolicy.kvmodel.ReplicaView` s.

A view is an attrs object validated when built, which costs microseconds: each backend's
view is cached and rebuilt only when what it shows changes (its in-flight counts, a new
scrape, its signal's age by one scrape interval), so a decision over 64 backends rebuilds
one or two. A backend holding the first block of the request's prompt is shown with its
prefix index as its GPU tier's ``prefix_blocks`` (a live read-only set of the index, not a
copy: a router walks the prompt's blocks through it, and the leading run it finds is the
backend's match); the others are shown holding nothing, since a chained hash names its
prefix and a backend without the first block can reuse none of the prompt. Nothing about a
decision is copied or hashed per backend, so it costs what the router costs plus a few
microseconds.

The background loops (:meth:`Fleet.start`) scrape every backend's ``/metrics``, check its
health, follow the healthy share with the token pool, export the autoscaler's target and
follow the KV cache events of the backends that publish them (``kv_events`` of their
spec): a block a backend stores joins its prefix index, a block it evicts leaves it, a
cleared cache empties it. The gateway still adds a prompt's blocks when it sends the
prompt (the events come after the backend ran it; a conversation's next turn may come
sooner), so the events make the index drop what the backend dropped, which its guess
alone cannot see.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any, TypeVar

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvpolicy.kvmodel import (
    Autoscaler,
    FleetView,
    ReplicaView,
    ReplicaViews,
    Router,
    RoutingRequest,
    reads_prefix_blocks,
)
from kvpolicy.tenancy._backends import BackendSpec, RoutingConfig
from kvpolicy.tenancy._fleet_pool import PoolFollower, healthy_share
from kvpolicy.tenancy._health import BackendHealth
from kvpolicy.tenancy._kv_events import CLEARED, REMOVED, STORED, KVEvent, KVEventFollower
from kvpolicy.tenancy._prefix_index import (
    _NOBODY,
    FleetPrefixIndex,
    PrefixIndex,
    prompt_text,
    text_block_hashes,
)
from kvpolicy.tenancy._shown import ShownViews
from kvpolicy.tenancy._signals import MetricsError, ScrapedMetrics, load_view, parse_vllm_metrics
from kvpolicy.tenancy._upstream import Upstream, UpstreamError

__all__ = ["Backend", "Fleet"]

_log = logging.getLogger("kvpolicy.tenancy")
_NO_BLOCKS: frozenset[int] = frozenset()


_VIEW_FIELDS = (
    "replica_id",
    "running",
    "waiting",
    "kv_usage",
    "free_blocks",
    "block_size",
    "draining",
    "signal_age_s",
    "model",
    "gpu",
)
"""The fields of a view but its prefix blocks, in the order :meth:`Backend._base` gives."""
if set(_VIEW_FIELDS) | {"prefix_blocks"} != {a.name for a in attrs.fields(ReplicaView)}:
    raise ImportError("kvpolicy-tenancy's fleet views do not match kvmodel's ReplicaView fields")
T = TypeVar("T")


def _unchecked(cls: type[T], fields: Mapping[str, Any]) -> T:
    """An instance of the frozen attrs ``cls`` with ``fields`` (every one, already in their
    converted form), built without its validators and converters.

    kvmodel's view types validate every field when built, which costs about ten times what
    the gateway's routing decision may spend per backend; the gateway builds each kind of
    view validated once and then only with values of the same making, so nothing a
    validator would catch can occur (its tests compare both ways of building).
    """
    new = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(new, name, value)
    return new


# The slots' own setters and getters, bound once (a view is built field by field on the
# request path: looking each method up per field would cost as much as the calls).
_VIEW_SET = tuple(ReplicaView.__dict__[name].__set__ for name in _VIEW_FIELDS)
_VIEW_GET = tuple(ReplicaView.__dict__[name].__get__ for name in _VIEW_FIELDS)
_SET_BLOCKS = ReplicaView.__dict__["prefix_blocks"].__set__


def _view_of(values: Sequence[Any], prefix_blocks: Any) -> ReplicaView:
    """A :class:`ReplicaView` of ``values`` (in the order of ``_VIEW_FIELDS``, already in
    their converted form) and ``prefix_blocks``, built unchecked as :func:`_unchecked`
    does, through the class's slots (no mapping built per view)."""
    new = object.__new__(ReplicaView)
    for set_field, value in zip(_VIEW_SET, values, strict=True):
        set_field(new, value)
    _SET_BLOCKS(new, prefix_blocks)
    return new


_REQUEST_SLOTS = tuple(
    RoutingRequest.__dict__[name] for name in ("request_id", "prompt_len", "block_hashes", "label")
)
if {a.name for a in attrs.fields(RoutingRequest)} != {
    "request_id",
    "prompt_len",
    "block_hashes",
    "label",
}:
    raise ImportError("kvpolicy-tenancy's routing requests do not match kvmodel's RoutingRequest")


def _request_of(
    request_id: str, prompt_len: int, hashes: tuple[int, ...], label: str
) -> RoutingRequest:
    """A :class:`RoutingRequest` of checked values, built unchecked (see :func:`_unchecked`)."""
    new = object.__new__(RoutingRequest)
    rid, plen, blocks, lab = _REQUEST_SLOTS
    rid.__set__(new, request_id)
    plen.__set__(new, prompt_len)
    blocks.__set__(new, hashes)
    lab.__set__(new, label)
    return new


_SAY_FROM = 16
"""The fewest candidates whose views say what changed: below, a router reads a few views
for less than following what changed costs."""


def _follows_changes(router: object) -> bool:
    """Whether ``router`` says it follows views that say what changed
    (``follows_changed_since``, True: kvpolicy-admit's ``weighted``); to any other router
    the fleet shows a plain :class:`ReplicaViews` (saying what changed costs an object
    per decision, which only a router following it wins back)."""
    return getattr(router, "follows_changed_since", False) is True


def with_blocks(view: ReplicaView, blocks: Set[int]) -> ReplicaView:
    """``view`` holding ``blocks`` (the prefix blocks it holds) in its GPU tier."""
    return _view_of([get(view) for get in _VIEW_GET], (("gpu", blocks),))


class Backend:
    """One backend of the fleet and what the gateway knows of it."""

    __slots__ = (
        "_indexed",
        "_key",
        "_view",
        "events",
        "health",
        "in_flight",
        "index",
        "kv_capacity_tokens",
        "routed",
        "scrape_error",
        "scrape_version",
        "scraped",
        "scraped_at",
        "spec",
        "tokens",
        "upstream",
        "version",
    )

    def __init__(
        self, spec: BackendSpec, upstream: Upstream, health: BackendHealth, index: PrefixIndex
    ) -> None:
        """A backend of ``spec`` reached through ``upstream``; ``index`` is its prefix index
        (changed through the fleet's :class:`FleetPrefixIndex`)."""
        self.spec = spec
        self.upstream = upstream
        self.health = health
        self.in_flight = 0
        """Requests this gateway has on it now."""
        self.tokens = 0
        """Their charged tokens (prompt and output bound)."""
        self.routed = 0
        """Requests sent to it since the start."""
        self.scraped: ScrapedMetrics | None = None
        self.scraped_at = 0.0
        self.scrape_version = 0
        self.scrape_error = ""
        self.kv_capacity_tokens: int | None = None
        self.index = index
        self.version = 0
        """Raised whenever what the view shows changes (counts, scrape, draining)."""
        self._view: ReplicaView | None = None
        # (the view it was made of, the view showing the prefix index)
        self._indexed: tuple[ReplicaView, ReplicaView] | None = None
        self.events: KVEventFollower | None = None
        """The follower of its KV events (None: it publishes none, or not started)."""
        self._key: tuple[int, int] = (-1, -1)

    @property
    def id(self) -> str:
        """The backend's id: its URL."""
        return self.spec.url

    def view(
        self, now: float, config: RoutingConfig, matched: Set[int] = _NO_BLOCKS
    ) -> ReplicaView:
        """The router's view of the backend now, holding ``matched`` prefix blocks (the view
        without them is cached while what it shows is the same)."""
        base = self._base(now, config)
        return with_blocks(base, matched) if matched else base

    def indexed(self, base: ReplicaView) -> ReplicaView:
        """``base`` (this backend's current view) showing its prefix index as the GPU
        tier's blocks (live, not copied); kept while ``base`` is."""
        held = self._indexed
        if held is None or held[0] is not base:
            held = self._indexed = (base, with_blocks(base, self.index.resident()))
        return held[1]

    def _base(self, now: float, config: RoutingConfig) -> ReplicaView:
        scraped = self.scraped
        age = now - self.scraped_at
        bucket = int(age / max(config.scrape_interval_s, 0.1)) if scraped else -1
        key = (self.version, bucket)
        view = self._view
        if view is not None and key == self._key:
            return view
        load = load_view(
            self.in_flight,
            self.tokens,
            scraped,
            age,
            config.max_signal_age_s,
            self.kv_capacity_tokens,
        )
        block_size = scraped.block_size if scraped and scraped.block_size else 16
        blocks = scraped.num_gpu_blocks if scraped and scraped.num_gpu_blocks else 0
        spec = self.spec
        values = (
            spec.url,
            load.running,
            load.waiting,
            load.kv_usage,
            round(blocks * (1.0 - load.kv_usage)),
            block_size,
            self.health.draining,
            load.age_s,
            spec.model,
            spec.gpu,
        )
        if view is None:
            # The first view of a backend is validated; later ones hold values of the same
            # making (counts >= 0, usage clamped to [0, 1]) and are built unchecked.
            fields: dict[str, Any] = dict(zip(_VIEW_FIELDS, values, strict=True))
            view = ReplicaView(**fields)
        else:
            view = _view_of(values, ())
        self._view, self._key, self._indexed = view, key, None
        return view


class _BackendCounts:
    """``kvpolicy_backend_in_flight`` and ``kvpolicy_backend_routed`` read from the backends'
    own counts when ``/metrics`` is read (nothing to update per request)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self._backends = backends

    def collect(self) -> Iterator[Metric]:
        """The counts now (the ``Collector`` protocol)."""
        in_flight = GaugeMetricFamily(
            "kvpolicy_backend_in_flight", "Requests in flight per backend", labels=["backend"]
        )
        routed = CounterMetricFamily(
            "kvpolicy_backend_routed", "Requests routed per backend", labels=["backend"]
        )
        for b in self._backends:
            in_flight.add_metric([b.id], b.in_flight)
            routed.add_metric([b.id], b.routed)
        return iter((in_flight, routed))


class Fleet:
    """The backends behind one gateway, their router and their watchers.

    Args:
        specs: the backends (at least one).
        config: routing, scrapes and health checks.
        router: picks a backend for each request (None with a single backend: it takes
            everything).
        registry: where the per-backend metrics go (the gateway's ``/metrics``).
        pool_name: the pool's name, a label of ``kvpolicy_desired_replicas``.
        follower: scales the gate's token rates to the healthy share (None: it is not).
        autoscaler: its target replica count is exported as ``kvpolicy_desired_replicas``
            (None: not exported).
        upstream: ``url -> Upstream`` for each backend (the gateway's timeouts).
    """

    def __init__(
        self,
        specs: Sequence[BackendSpec],
        config: RoutingConfig,
        router: Router | None,
        registry: CollectorRegistry,
        *,
        pool_name: str = "pool",
        follower: PoolFollower | None = None,
        autoscaler: Autoscaler | None = None,
        upstream: Callable[[str], Upstream] = Upstream,
    ) -> None:
        """See the class docstring."""
        if not specs:
            raise ValueError("'backends' must name at least one backend: []")
        if router is None and len(specs) > 1:
            raise ValueError(f"'router' is required with {len(specs)} backends: None")
        self.config = config
        self._router = router
        self._reads_prefix = router is not None and reads_prefix_blocks(router)
        self._says = _follows_changes(router)
        self.follower = follower
        self.autoscaler = autoscaler
        self.pool_name = pool_name
        self.prefix = FleetPrefixIndex([s.url for s in specs], config.index_blocks)
        """The approximate prefix index of every backend."""
        self.backends = tuple(
            Backend(s, upstream(s.url), BackendHealth(config.health), self.prefix[s.url])
            for s in specs
        )
        self._by_id = {b.id: b for b in self.backends}
        self._active = config.health.interval_s > 0
        self._cands: list[Backend] = list(self.backends)
        self._cand_pos: dict[str, int] = {b.id: i for i, b in enumerate(self.backends)}
        now = time.monotonic()
        self._view_cache = {b: b._base(now, config) for b in self.backends}
        self._cand_views = [self._view_cache[b] for b in self._cands]
        """The candidates' views in their order, each replaced as it changes."""
        self._shown: ShownViews | None = None
        """The candidates' views last shown to the router (None: none since the candidates
        changed)."""
        self._dirty: set[int] = set()
        """The candidates' positions whose view was replaced since :attr:`_shown`."""
        self._recheck_at = float("inf")  # when an ejection's backoff ends (passive only)
        self._t0 = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self._arrivals = 0
        self._served_tokens = 0
        reg = registry
        reg.register(_BackendCounts(self.backends))  # kvpolicy_backend_in_flight, _routed
        self.m_up = Gauge(
            "kvpolicy_backend_up",
            "1 when the backend takes new requests (not ejected or draining)",
            ["backend"],
            registry=reg,
        )
        self.m_failures = Counter(
            "kvpolicy_backend_failures",
            "Failed requests and checks per backend",
            ["backend", "kind"],
            registry=reg,
        )
        self.m_age = Gauge(
            "kvpolicy_backend_signal_age_seconds",
            "Age of the backend's last good scrape (-1: none)",
            ["backend"],
            registry=reg,
        )
        self.m_kv_events = Counter(
            "kvpolicy_backend_kv_events",
            "KV cache events applied to the prefix index per backend",
            ["backend", "kind"],
            registry=reg,
        )
        self.m_failovers = Counter(
            "kvpolicy_failovers", "Requests sent to a second backend", registry=reg
        )
        self.m_share = Gauge(
            "kvpolicy_pool_healthy_share",
            "Share of the fleet's capacity on healthy backends",
            ["pool"],
            registry=reg,
        )
        self.m_desired = Gauge(
            "kvpolicy_desired_replicas",
            "Replicas the autoscaler asks for (KEDA or an HPA acts on it)",
            ["pool"],
            registry=reg,
        )
        for b in self.backends:
            self.m_up.labels(b.id).set(1)
            self.m_age.labels(b.id).set(-1)
        self.m_share.labels(pool_name).set(1.0)

    # -- routing -------------------------------------------------------------------------

    @property
    def router(self) -> Router | None:
        """Picks a backend for each request (None with a single backend)."""
        return self._router

    @router.setter
    def router(self, router: Router | None) -> None:
        # Whether it reads prefix blocks is asked once here, not at every decision.
        self._router = router
        self._reads_prefix = router is not None and reads_prefix_blocks(router)
        self._says = _follows_changes(router)

    def routable(self, now: float | None = None) -> list[Backend]:
        """The backends that may take a new request now."""
        now = time.monotonic() if now is None else now
        return [b for b in self.backends if b.health.routable(now, self._active)]

    def pick(
        self,
        request_id: str,
        prompt_len: int,
        hashes: Sequence[int] = (),
        label: str = "default",
        exclude: Backend | None = None,
    ) -> Backend | None:
        """The backend for one request (None: no backend may take it), chosen by the router
        from the routable backends (``exclude`` left out: the one that just failed it).

        A router that fails, or answers a backend that is not a candidate, is logged and
        replaced for this request by the candidate with the fewest requests in flight.
        """
        now = time.monotonic()
        if now >= self._recheck_at:
            self._candidates(now)
        cands = self._cands
        if exclude is not None:
            cands = [b for b in cands if b is not exclude]
        if not cands:
            only = self.backends[0]
            if len(self.backends) == 1 and exclude is None and not only.health.draining:
                return only  # nothing else to try: a lone backend is never ejected
            return None
        router = self._router
        if len(cands) == 1 or router is None:
            return cands[0]
        # A router that never reads prefix blocks (``reads_prefix_blocks = False``) is
        # shown none: finding the holders would be work for nothing.
        holders = self.prefix.holders(hashes[0]) if hashes and self._reads_prefix else _NOBODY
        views = self._views(now, cands, holders)
        try:
            request = _request_of(
                request_id or "request",
                max(1, int(prompt_len)),
                hashes if type(hashes) is tuple else tuple(hashes),
                label or "default",
            )
            rid = router.route(request, views)
        except Exception:
            _log.exception(
                "router %s failed: least in-flight backend instead", type(router).__name__
            )
            rid = None
        chosen = self._by_id.get(rid) if rid is not None else None
        if chosen is None or (
            rid not in self._cand_pos if cands is self._cands else chosen not in cands
        ):
            if rid is not None:
                _log.warning("router answered %r, not a candidate: least in-flight instead", rid)
            chosen = min(cands, key=lambda b: b.in_flight)
        return chosen

    def _views(self, now: float, cands: list[Backend], holders: Set[str]) -> ReplicaViews:
        """The candidates' views for one request, as :meth:`_touch` and :meth:`refresh`
        keep them; the holders of the prompt's first block are shown with their prefix
        index. The fleet built each (one per backend, whose URLs are unique), so they go
        to the router as a :class:`ReplicaViews` it need not check again."""
        if cands is self._cands:
            views = self._cand_views
            held: list[int] = []
            if holders:
                views = views.copy()
                pos = self._cand_pos
                for url in holders:
                    i = pos.get(url)
                    if i is not None:
                        views[i] = cands[i].indexed(views[i])
                        held.append(i)
            if len(cands) < _SAY_FROM or not self._says:
                return ReplicaViews.trusted(views)
            shown = tuple.__new__(ShownViews, views)  # (ReplicaViews.trusted, without a call)
            last, dirty = self._shown, self._dirty
            if last is None:
                shown.changed_since = None
            else:
                last.changed_since = None  # (a chain of views shown would be kept alive)
                shown.changed_since = (last, tuple(dirty))
                dirty.clear()
            # A holder's view is its current view with its prefix index: another object
            # than the one shown before, with the same load (not a change).
            shown.prefix_shown = tuple(held)
            self._shown = shown
            return shown
        cache = self._view_cache
        return ReplicaViews.trusted(
            [b.indexed(cache[b]) if b.id in holders else cache[b] for b in cands]
        )

    async def refresh(self) -> None:
        """Rebuild the views of the scraped backends whose signal aged by a scrape interval
        (the age they show; a scrape older than ``max_signal_age_s`` is dropped for the
        gateway's own counts): run every scrape interval by :meth:`start`, off the path
        of the routing decisions."""
        now = time.monotonic()
        for b in self.backends:
            if b.scraped is not None:
                self._set_view(b, b._base(now, self.config))

    def _set_view(self, backend: Backend, view: ReplicaView) -> None:
        self._view_cache[backend] = view
        i = self._cand_pos.get(backend.id)
        if i is not None:
            self._cand_views[i] = view
            self._dirty.add(i)

    def _touch(self, backend: Backend) -> None:
        """What ``backend``'s view shows changed (its counts, scrape or draining): its view
        is rebuilt now, when the change happens, and not by the next routing decision
        (without a router no decision reads it: :meth:`Backend.view` rebuilds it when
        asked)."""
        backend.version += 1
        if self._router is None:
            return
        view = backend._base(time.monotonic(), self.config)
        self._set_view(backend, view)
        if self._reads_prefix and len(backend.index):
            backend.indexed(view)  # when it holds a prompt's first block, it is shown so

    def hashes(self, doc: Mapping[str, Any] | None, chat: bool) -> tuple[int, ...]:
        """The approximate prefix index's block hashes of a request body's prompt (none
        with a single backend: there is nothing to choose)."""
        if doc is None or len(self.backends) == 1:
            return ()
        return text_block_hashes(prompt_text(doc, chat), self.config.block_chars)

    def begin(self, backend: Backend, tokens: int, hashes: Sequence[int] = ()) -> None:
        """A request of ``tokens`` goes to ``backend`` (its prompt's ``hashes`` now held)."""
        backend.in_flight += 1
        backend.tokens += tokens
        backend.routed += 1
        self._touch(backend)
        self._arrivals += 1
        if hashes:
            self.prefix.add(backend.id, hashes)

    def end(self, backend: Backend, tokens: int, served: int = 0) -> None:
        """The request :meth:`begin` counted is over (``served`` tokens it produced)."""
        backend.in_flight -= 1
        backend.tokens -= tokens
        self._touch(backend)
        self._served_tokens += served

    def failed(self, backend: Backend, kind: str, why: str) -> None:
        """A request or check to ``backend`` failed as a dead server fails (``kind``:
        ``connect``, ``timeout``, ``5xx``, ``broken`` or ``check``)."""
        self.m_failures.labels(backend.id, kind).inc()
        if backend.health.failed(time.monotonic(), why):
            _log.warning(
                "backend %s ejected for %.1f s (%s: %s)",
                backend.id,
                backend.health.ejected_until - time.monotonic(),
                kind,
                why,
            )
            self._changed()

    def succeeded(self, backend: Backend) -> None:
        """A request or check to ``backend`` succeeded."""
        if backend.health.succeeded():
            _log.warning("backend %s is back", backend.id)
            self._changed()

    def drain(self, backend_id: str, draining: bool = True) -> bool:
        """Drain ``backend_id`` (nothing new; what it has finishes), or stop draining it;
        False for an unknown id."""
        b = self._by_id.get(backend_id)
        if b is None:
            return False
        if b.health.draining != draining:
            b.health.draining = draining
            self._touch(b)
            self._changed()
        return True

    def share(self) -> float:
        """Share of the fleet's capacity on backends that take new requests."""
        now = time.monotonic()
        return healthy_share(
            (b.spec.weight, b.health.routable(now, self._active) and not b.health.ejected)
            for b in self.backends
        )

    def _candidates(self, now: float) -> None:
        """The routable backends, and when that changes by the clock alone (an ejection's
        backoff ending, without active checks)."""
        self._cands = [b for b in self.backends if b.health.routable(now, self._active)]
        self._cand_pos = {b.id: i for i, b in enumerate(self._cands)}
        self._cand_views = [self._view_cache[b] for b in self._cands]
        self._shown = None
        self._dirty.clear()
        ends = [b.health.ejected_until for b in self.backends if b.health.ejected]
        self._recheck_at = min(ends) if ends and not self._active else float("inf")

    def _changed(self) -> None:
        now = time.monotonic()
        self._candidates(now)
        for b in self.backends:
            self.m_up.labels(b.id).set(1 if b.health.routable(now, self._active) else 0)
        share = self.share()
        self.m_share.labels(self.pool_name).set(share)
        if self.follower is not None:
            self.follower.follow(share, now - self._t0)

    def retry_after_s(self) -> float:
        """Seconds until an ejected backend may be tried again (at least 1)."""
        now = time.monotonic()
        waits = [b.health.ejected_until - now for b in self.backends if b.health.ejected]
        return max(1.0, min(waits)) if waits else 1.0

    def state(self) -> list[dict[str, Any]]:
        """Each backend's state, load and signals (the admin ``/backends`` page)."""
        now = time.monotonic()
        out = []
        for b in self.backends:
            s = b.scraped
            out.append(
                {
                    "url": b.id,
                    "state": b.health.state,
                    "weight": b.spec.weight,
                    "model": b.spec.model,
                    "gpu": b.spec.gpu,
                    "in_flight": b.in_flight,
                    "in_flight_tokens": b.tokens,
                    "routed": b.routed,
                    "failures": b.health.failures,
                    "last_error": b.health.last_error,
                    "scraped": None
                    if s is None
                    else {
                        "running": s.running,
                        "waiting": s.waiting,
                        "kv_usage": s.kv_usage,
                        "age_s": round(now - b.scraped_at, 3),
                    },
                    "scrape_error": b.scrape_error,
                    "prefix_blocks": len(b.index),
                    "kv_events": None
                    if b.events is None
                    else {
                        "endpoint": b.events.endpoint,
                        "batches": b.events.batches,
                        "skipped": b.events.errors,
                        "missed": b.events.gaps,
                    },
                }
            )
        return out

    # -- background loops --------------------------------------------------------------------

    def start(self) -> None:
        """Start the scrapes, health checks and autoscaler (on the running event loop)."""
        if self._tasks:
            return
        if self.config.scrape_interval_s > 0:
            interval = self.config.scrape_interval_s
            self._tasks.append(asyncio.create_task(self._every(interval, self.scrape)))
            self._tasks.append(asyncio.create_task(self._every(interval, self.refresh)))
        if self._active:
            self._tasks.append(
                asyncio.create_task(self._every(self.config.health.interval_s, self.check))
            )
        if self.autoscaler is not None:
            interval = max(self.config.scrape_interval_s, 1.0)
            self._tasks.append(asyncio.create_task(self._autoscale(interval)))
        for b in self.backends:
            if b.spec.kv_events:
                b.events = KVEventFollower(b.spec.kv_events, functools.partial(self.kv_events, b))
                self._tasks.append(b.events.start())

    def kv_events(self, backend: Backend, events: Sequence[KVEvent]) -> None:
        """Apply ``backend``'s KV cache events to its prefix index, in order."""
        prefix, counts = self.prefix, {STORED: 0, REMOVED: 0, CLEARED: 0}
        for e in events:
            if e.kind == STORED:
                prefix.add(backend.id, e.hashes)
            elif e.kind == REMOVED:
                prefix.remove(backend.id, e.hashes)
            elif e.kind == CLEARED:
                prefix.clear(backend.id)
            counts[e.kind] += 1
        for kind, n in counts.items():
            if n:
                self.m_kv_events.labels(backend.id, kind).inc(n)

    async def stop(self) -> None:
        """Stop the loops and close the idle connections."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for b in self.backends:
            b.upstream.close()

    @staticmethod
    async def _every(interval: float, what: Callable[[], Any]) -> None:
        while True:
            try:
                await what()
            except Exception:
                _log.exception("fleet loop failed; going on")
            await asyncio.sleep(interval)

    async def _get(self, b: Backend, path: str, timeout: float) -> tuple[int, bytes]:
        async with asyncio.timeout(timeout):
            reply = await b.upstream.request("GET", path)
            try:
                return reply.status, await reply.read()
            finally:
                reply.release()

    async def scrape(self) -> None:
        """Scrape every backend's metrics once (concurrently)."""
        await asyncio.gather(*(self._scrape(b) for b in self.backends))

    async def _scrape(self, b: Backend) -> None:
        timeout = max(0.5, min(self.config.max_signal_age_s, 5.0))
        try:
            status, body = await self._get(b, self.config.metrics_path, timeout)
            if status != 200:
                raise MetricsError(f"status {status}")
            metrics = parse_vllm_metrics(body.decode("utf-8", "replace"))
        except (UpstreamError, MetricsError, TimeoutError) as err:
            why = f"{type(err).__name__}: {err}"
            if why != b.scrape_error:  # log each new reason once, not every interval
                _log.warning(
                    "metrics of %s ignored (%s): the router uses the gateway's counts once "
                    "the last good scrape is %.1f s old",
                    b.id,
                    why,
                    self.config.max_signal_age_s,
                )
            b.scrape_error = why
            return
        if b.scrape_error:
            _log.warning("metrics of %s readable again", b.id)
        b.scrape_error = ""
        b.scraped, b.scraped_at = metrics, time.monotonic()
        b.scrape_version += 1
        self._touch(b)
        self.m_age.labels(b.id).set(0)
        if metrics.num_gpu_blocks and metrics.block_size:
            b.kv_capacity_tokens = metrics.num_gpu_blocks * metrics.block_size
            # Index blocks are text chunks: about block_chars / 4 tokens each.
            chunk_tokens = max(1, self.config.block_chars // 4)
            self.prefix.resize(b.id, max(1, b.kv_capacity_tokens // chunk_tokens))

    async def check(self) -> None:
        """Check every backend's health once (an ejected one only after its backoff)."""
        now = time.monotonic()
        due = [b for b in self.backends if not b.health.ejected or b.health.probe_due(now)]
        await asyncio.gather(*(self._check(b) for b in due))
        for b in self.backends:
            if b.scraped is not None:
                self.m_age.labels(b.id).set(round(time.monotonic() - b.scraped_at, 3))

    async def _check(self, b: Backend) -> None:
        cfg = self.config.health
        try:
            status, _ = await self._get(b, cfg.path, cfg.timeout_s)
        except (UpstreamError, TimeoutError) as err:
            self.failed(b, "check", f"{type(err).__name__}: {err}")
            return
        if status == 200:
            was = b.health.ejected
            self.succeeded(b)
            if was:
                self.prefix.clear(b.id)  # a restarted server's cache is empty
        else:
            self.failed(b, "check", f"health status {status}")

    def fleet_view(self, interval_s: float) -> FleetView:
        """The fleet as an autoscaler sees it, with the rates of the last ``interval_s``."""
        now = time.monotonic()
        up: list[ReplicaView] = []
        draining: list[ReplicaView] = []
        for b in self.backends:
            if b.health.ejected:
                continue
            view = b.view(now, self.config, _NO_BLOCKS)
            (draining if b.health.draining else up).append(view)
        rate = self._arrivals / interval_s
        tps = self._served_tokens / interval_s
        self._arrivals = self._served_tokens = 0
        return FleetView(
            time=now - self._t0, up=up, draining=draining, arrival_rate=rate, tokens_per_s=tps
        )

    async def _autoscale(self, interval: float) -> None:
        assert self.autoscaler is not None
        while True:
            await asyncio.sleep(interval)
            try:
                target = self.autoscaler.target(self.fleet_view(interval))
            except Exception:
                _log.exception("autoscaler failed; keeping the last target")
                continue
            self.m_desired.labels(self.pool_name).set(target)
