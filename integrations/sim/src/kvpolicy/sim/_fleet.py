"""A fleet: replicas of the engine behind one front door and one router, in one loop.

Each replica is a steppable :class:`~kvpolicy.sim._engine.Server` of its own engine (its
model, GPU, pool, prefix cache, residency and tiers). The fleet only orchestrates, in time
order, from a heap of every replica's next event::

    control     a provisioned replica starts serving; the autoscaler is asked for a target
                every ``decision_interval_s`` (replicas start after a provisioning delay or
                drain: no new requests, running ones finish, then it stops)
    front door  arrivals and retries pass the gateway (one for the fleet) at the end of an
                iteration of the replica whose next event comes first, as one engine takes
                them at its own clock; the router places each admitted request on a replica
    iteration   the replica whose next event comes first runs: a mixed iteration whole; a
                run of decode-only iterations is planned and left running until the loop
                reaches its end or a request routed to the replica ends it there

Each replica thus runs exactly as one engine given its requests: no other replica's
arrivals cut its decode runs (with a gateway the door's clock is the host replica's, whose
run ends there too, and a knock that lets nobody in ends the host's run as it would one
engine's).

The router and the autoscaler see each replica as a :class:`~kvpolicy.kvmodel.ReplicaView`
observed ``signal_delay_s`` ago (a scrape's lag): views are snapshots taken as iterations
settle, at most one per ``signal_delay_s / 8``, so the one a router gets is the last taken
at or before ``now - signal_delay_s``, or, when a decode run under way had started by
then, the replica after that run's iterations over by then (its ``signal_age_s`` says how
old it is). With no delay the router sees every replica as it is now: the requests placed
on it included, and the KV blocks taken by the iterations of its decode run over by now. A
view's resident prefix blocks are those of the request being routed (all a router can
match against it; the autoscaler's views carry none), which keeps a view as cheap as the
prompt is long rather than the pool is large; a replica's view is built again only when it
changed.

With one replica and round-robin, the fleet runs exactly the single engine's iterations and
its record is the engine's. With no gateway, no autoscaler and a router that reads no load
(kvmodel's ``reads_load``), nothing couples the replicas: every request is routed first
and each replica serves its share apart (:meth:`_Run._apart`), the same run.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from attrs import evolve, frozen
from numpy.typing import NDArray

from kvpolicy.kvmodel import (
    Autoscaler,
    FleetView,
    GPUSpec,
    ReplicaView,
    ReplicaViews,
    Request,
    RequestGate,
    Router,
    RoutingRequest,
    reads_kv_usage,
    reads_load,
    reads_prefix_blocks,
)
from kvpolicy.sim._config import FleetConfig, GatewayConfig, SLOConfig
from kvpolicy.sim._engine import Engine, ProgressFn, Server
from kvpolicy.sim._errors import SimError
from kvpolicy.sim._frontdoor import FrontDoor
from kvpolicy.sim._metrics import FleetSummary, ReplicaSummary, Summary, summarize
from kvpolicy.sim._recorder import Recorder, RunRecord
from kvpolicy.sim._views import replace_view, with_free_blocks
from kvpolicy.tenancy import RefreshConfig

__all__ = ["Fleet", "FleetRecord", "ReplicaRecord", "provisioning_delay", "summarize_fleet"]

EngineFactory = Callable[[int], Engine]
"""Builds the engine of replica ``k`` (in start order), with policies of its own."""


def provisioning_delay(weight_bytes: int, load_bandwidth: float, startup_s: float) -> float:
    """Seconds from asking for a replica to its first request: its model's weights loaded
    at ``load_bandwidth`` bytes per second, plus ``startup_s``."""
    return weight_bytes / load_bandwidth + startup_s


@frozen(eq=False)
class ReplicaRecord:
    """One replica of a fleet run: what it served and when it held its GPU."""

    replica_id: str
    """Identifier, ``r0``, ``r1``, ... in start order."""
    model: str
    """Model served."""
    gpu: str
    """GPU name."""
    price_per_hour: float
    """The GPU's price per hour."""
    start_s: float
    """When it was asked for (its GPU is held, and counted, from here)."""
    up_s: float
    """When it started serving (``start_s`` plus the provisioning delay)."""
    down_s: float
    """When it stopped: drained, cancelled while provisioning, or the end of the run."""
    requests: int
    """Requests the router placed on it."""
    peak_kv_tokens: int
    """Most KV slots it held in used blocks."""

    @property
    def gpu_hours(self) -> float:
        """Hours its GPU was held, from ``start_s`` to ``down_s``."""
        return (self.down_s - self.start_s) / 3600.0


@frozen(eq=False)
class FleetRecord:
    """Everything a fleet run measured."""

    record: RunRecord
    """The fleet as one server: per-request times, counters summed over the replicas, the
    memory series summed over them at every sample."""
    replicas: tuple[ReplicaRecord, ...]
    """Every replica ever asked for, in start order."""
    assignment: NDArray[np.int64]
    """(n,) int64 index in ``replicas`` of the replica each request went to (-1: none)."""
    peak_replicas: int
    """Most replicas holding a GPU at once (provisioning, serving or draining)."""
    reclaimed: int = 0
    """Times a draining replica was taken back (``reclaim_draining``)."""
    served_apart: bool = False
    """Whether every request was routed first and each replica served its share apart
    (no gateway, no autoscaler, a router that reads no load: the run the loop would give)."""

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of every replica, from start to stop."""
        return sum(r.gpu_hours for r in self.replicas)

    @property
    def cost_usd(self) -> float:
        """Price of those GPU-hours."""
        return sum(r.gpu_hours * r.price_per_hour for r in self.replicas)

    def slo_met(self, slo: SLOConfig) -> NDArray[np.int64]:
        """(replicas,) int64 requests each replica finished within ``slo``."""
        rec = self.record
        n = len(rec.requests)
        arrival = np.fromiter((r.arrival_time for r in rec.requests), np.float64, count=n)
        decode = np.fromiter((r.decode_len for r in rec.requests), np.float64, count=n)
        done = np.isfinite(rec.finish)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(
                decode > 1, (rec.finish - rec.first_token) / np.maximum(decode - 1, 1), 0.0
            )
            within = done & (rec.first_token - arrival <= slo.ttft_s) & (tpot <= slo.tpot_s)
        placed = self.assignment >= 0
        return np.bincount(self.assignment[placed & within], minlength=len(self.replicas)).astype(
            np.int64
        )


class _Replica:
    """A replica's engine, server and life: provisioning, up, draining, stopped."""

    __slots__ = (
        "bound",
        "down",
        "draining",
        "engine",
        "history",
        "inbox",
        "index",
        "key",
        "lagged",
        "lagged_until",
        "num_blocks",
        "requests",
        "rid",
        "server",
        "settled",
        "start",
        "up",
        "version",
        "view_until",
        "viewed",
    )

    def __init__(self, index: int, engine: Engine, server: Server, start: float, up: float):
        self.index = index
        self.rid = f"r{index}"
        self.engine = engine
        self.server = server
        self.num_blocks = server.num_blocks
        self.start = start
        self.up = up
        self.down = math.inf
        self.draining = False
        self.requests = 0
        self.history: deque[tuple[float, ReplicaView]] = deque()
        self.inbox: deque[tuple[float, int, Request]] = deque()
        """Requests routed to it that knocked after its clock: (time, index, request)."""
        self.bound = math.inf
        """Where its pending decode run ends at the latest: the first iteration that ends
        at or after this time (its next request's, the next control event's)."""
        self.key = math.inf
        """Its time in the run's heap of next events (``next_time`` when last changed)."""
        self.version = 0
        """Counts its changes; a heap entry of an older version is stale."""
        self.settled: ReplicaView | None = None
        """Its view as its last settled iteration left it (None: not built since)."""
        self.viewed: ReplicaView | None = None
        """Its view now, without prefix blocks (None: changed since last built)."""
        self.view_until = math.inf
        """When ``viewed`` goes out of date (the end of an iteration of a decode run)."""
        self.lagged: tuple[float, ReplicaView] | None = None
        """Its view as of a past time during its decode run, and when it was taken."""
        self.lagged_until = math.inf
        """When ``lagged`` goes out of date."""

    def view(self, among: Sequence[int] | None = None) -> ReplicaView:
        return self.server.view(
            self.rid, draining=self.draining, queued=len(self.inbox), among=among
        )

    def settled_view(self) -> ReplicaView:
        """Its view as its last settled iteration left it (no prefix blocks)."""
        view = self.settled
        if view is None:
            view = self.settled = self.view(())
        return view

    def _grown(self, k: int) -> ReplicaView:
        """Its view after ``k`` iterations of its decode run (the settled one: 0)."""
        view = self.settled_view()
        if k:
            server = self.server
            free = view.free_blocks - server.grown_blocks(k)
            view = with_free_blocks(view, free, self.num_blocks)
        return view

    def fresh_view(self, now: float, among: Sequence[int]) -> ReplicaView:
        """Its view at ``now`` (a decode run under way counts the KV of the iterations
        over by then) with the resident blocks among ``among``; built again only once the
        replica changed or one of its iterations took a block, and copied only when some
        of ``among`` is resident."""
        base = self.viewed
        if base is None or now >= self.view_until:
            grown, self.view_until = self.server.kv_growth(now)
            base = self.settled_view()
            if grown:
                free = base.free_blocks - grown
                base = with_free_blocks(base, free, self.num_blocks)
            self.viewed = base
        if not among:
            return base
        hits = self.server.resident_blocks(among)
        if not hits:
            return base
        return replace_view(base, draining=base.draining, signal_age_s=0.0, gpu_blocks=hits)

    def lagged_view(self, seen: float) -> tuple[float, ReplicaView]:
        """Its view as of ``seen``, during its pending decode run: when its last iteration
        over by then ended, and the view with their KV counted (kept until the next ends)."""
        lagged = self.lagged
        if lagged is None or seen >= self.lagged_until:
            k, at, self.lagged_until = self.server.run_progress(seen)
            lagged = self.lagged = (at, self._grown(k))
        return lagged

    def next_time(self) -> float:
        """When it next needs the loop: the end of its pending decode run, now if it has
        work, else its next request's time (``inf``: nothing to do)."""
        server = self.server
        if server.pending:
            return server.end_of_run(self.bound)
        if not server.idle:
            return server.now
        if self.inbox:
            return max(server.now, self.inbox[0][0])
        return math.inf

    def deliver(self) -> float:
        """Requests whose time came join its queue (an idle replica's clock moves to the
        first); returns the time of the next one left (``inf``: none)."""
        server, inbox = self.server, self.inbox
        if server.idle and inbox:
            server.advance_to(inbox[0][0])
        while inbox and inbox[0][0] <= server.now:
            _, i, req = inbox.popleft()
            server.accept(i, req)
        return inbox[0][0] if inbox else math.inf

    @property
    def finished(self) -> bool:
        """Nothing running, waiting or on its way."""
        return self.server.idle and not self.inbox


class Fleet:
    """Replicas of the engine behind one front door, one router and an optional autoscaler.

    Args:
        engines: builds the engine of replica ``k`` (each with its own policies).
        router: which replica serves each admitted request.
        config: replica count, bounds, signal delay and provisioning.
        autoscaler: the target replica count at each decision (None: a fixed fleet).
        gate: the fleet's gateway (None: none).
        gateway_config: how its clients retry.
        refresh: how its throughput estimate follows the service observed (None: never).
    """

    def __init__(
        self,
        engines: EngineFactory,
        router: Router,
        config: FleetConfig,
        *,
        autoscaler: Autoscaler | None = None,
        gate: RequestGate | None = None,
        gateway_config: GatewayConfig | None = None,
        refresh: RefreshConfig | None = None,
    ) -> None:
        if not isinstance(router, Router):
            raise TypeError(f"'router' must implement Router: {router!r}")
        if autoscaler is not None and not isinstance(autoscaler, Autoscaler):
            raise TypeError(f"'autoscaler' must implement Autoscaler: {autoscaler!r}")
        if not isinstance(config, FleetConfig):
            raise TypeError(f"'config' must be a FleetConfig: {config!r}")
        self._engines = engines
        self._router = router
        self._autoscaler = autoscaler
        self._cfg = config
        self._gate = gate
        self._gw_cfg = gateway_config or GatewayConfig()
        self._refresh = refresh

    def run(
        self, requests: Sequence[Request], *, progress: ProgressFn | None = None
    ) -> FleetRecord:
        """Serve ``requests`` (sorted by arrival time) to completion.

        Raises:
            ValueError: ``requests`` is not sorted by arrival time or repeats an id.
            ConfigError: no request fits the first replica at all.
            SimError: the router names a replica that is not in the fleet.
        """
        return _Run(self, requests, progress).result()


class _Run:
    """One fleet run's state (the loop of :meth:`Fleet.run`).

    Each replica runs as the single engine does, on its own: a run of decode-only
    iterations is planned when it starts and settled only when the loop reaches its end or
    a request routed to the replica (or the front door opening at its clock) ends it there.
    A heap holds every replica's next event, so a step of the loop costs the log of the
    fleet's size, not its size.
    """

    def __init__(
        self, fleet: Fleet, requests: Sequence[Request], progress: ProgressFn | None
    ) -> None:
        cfg = fleet._cfg
        self._fleet = fleet
        self._cfg = cfg
        first = fleet._engines(0)
        reqs, arrivals, rejected = first.check_workload(requests)
        self._reqs = reqs
        self._rec = Recorder(reqs, rejected, rejected & first.too_long(reqs))
        self._door = FrontDoor(
            reqs, arrivals, self._rec, fleet._gate, fleet._gw_cfg, fleet._refresh
        )
        self._assigned = np.full(len(reqs), -1, dtype=np.int64)
        self._replicas: list[_Replica] = []
        self._heap: list[tuple[float, int, int]] = []  # (next time, index, version)
        self._live: list[_Replica] = []  # up or provisioning, not stopped, in start order
        self._coming: list[_Replica] = []  # provisioning (up later than now)
        self._by_id: dict[str, _Replica] = {}
        self._serving_now: list[_Replica] | None = None  # None: to be listed again
        self._serving_until = math.inf  # when the next replica comes up
        # The views of the replicas serving as of now (fresh signals, no prefix blocks), in
        # their order: a replica's is built again only once it changed (dirty) or one of
        # its iterations took a block (its expiry, on a heap), not for every request.
        self._board: list[ReplicaView] = []
        self._slot: dict[int, int] = {}  # replica index -> its place on the board
        self._dirty: set[int] = set()
        self._expiry: list[tuple[float, int, int]] = []  # (view_until, index, version)
        self._queue: list[int] = []
        self._knocked: list[float] = []  # when each queued request knocked
        self._now = float(arrivals[0]) if len(reqs) else 0.0
        self._last_arrival = float(arrivals[-1]) if len(reqs) else 0.0
        self._last_door = -math.inf  # when the front door last opened
        self._peak = 0
        self._reclaimed = 0
        self._delay = cfg.signal_delay_s
        self._snap_every = cfg.signal_delay_s / 8
        self._next_decision = math.inf
        if fleet._autoscaler is not None:
            self._next_decision = self._now + cfg.decision_interval_s
        # What the autoscaler observes between two decisions.
        self._window_entered = 0
        self._window_prompt = 0
        self._window_output = 0
        self._window_served_tokens = 0
        self._window_hits = self._rec.prefix_hit
        for k in range(cfg.replicas):
            self._start(first if k == 0 else None, self._now, self._now)
        self._served_apart = (
            fleet._gate is None and fleet._autoscaler is None and not reads_load(fleet._router)
        )
        if self._served_apart:
            self._apart(progress)
        else:
            self._loop(progress)

    # ------------------------------------------------------------------ replicas
    def _start(self, engine: Engine | None, start: float, up: float) -> _Replica:
        k = len(self._replicas)
        engine = engine if engine is not None else self._fleet._engines(k)
        server = engine.server(self._rec, self._release)
        server.advance_to(up)
        r = _Replica(k, engine, server, start, up)
        self._replicas.append(r)
        self._live.append(r)
        self._serving_now = None
        self._by_id[r.rid] = r
        if up > self._now:
            self._coming.append(r)
        self._peak = max(self._peak, len(self._live))
        if up <= self._now and self._delay > 0:
            r.history.append((up, r.view()))
        return r

    def _release(self, i: int, now: float) -> None:
        self._door.release(i, now)
        req = self._reqs[i]
        self._window_served_tokens += req.prompt_len + req.decode_len

    def _serving(self) -> list[_Replica]:
        """Replicas up (draining or not) and not stopped, listed again only when one
        starts, comes up or stops (their board of views with them)."""
        now = self._now
        serving = self._serving_now
        if serving is None or now >= self._serving_until:
            serving = self._serving_now = [r for r in self._live if r.up <= now]
            self._serving_until = min((r.up for r in self._live if r.up > now), default=math.inf)
            self._slot = {r.index: pos for pos, r in enumerate(serving)}
            self._board = [r.fresh_view(now, ()) for r in serving]
            self._expiry = [
                (r.view_until, r.index, r.version) for r in serving if r.view_until < math.inf
            ]
            heapq.heapify(self._expiry)
            self._dirty.clear()
        return serving

    def _fresh_views(self, now: float, kv: bool = True) -> list[ReplicaView]:
        """The serving replicas' views as of ``now`` without prefix blocks (what
        :meth:`_Replica.fresh_view` gives), rebuilding only those that changed.

        With ``kv`` False (a router that never reads KV memory) a view is not rebuilt when
        an iteration of its decode run takes a block, only when the replica changes: its
        KV memory is then as of that change, everything else as of now."""
        self._serving()
        board, slot, dirty, expiry = self._board, self._slot, self._dirty, self._expiry
        replicas = self._replicas
        while kv and expiry and expiry[0][0] <= now:
            _, k, version = heapq.heappop(expiry)
            if replicas[k].version == version:
                dirty.add(k)
        for k in dirty:
            pos = slot.get(k)
            if pos is None:
                continue
            r = replicas[k]
            # A router blind to KV memory may be shown it as of the replica's last change.
            board[pos] = r.fresh_view(now, ()) if kv else r.settled_view()
            if kv and r.view_until < math.inf:
                heapq.heappush(expiry, (r.view_until, k, r.version))
        dirty.clear()
        return board

    def _stop(self, r: _Replica, at: float) -> None:
        r.down = at
        r.version += 1  # its heap entries go stale
        self._live.remove(r)
        self._serving_now = None

    def _sync(self, r: _Replica) -> None:
        """An idle replica's clock moves on to the front door's last opening (as if moved
        at each): a busy one's is already there."""
        if r.server.idle and r.down == math.inf:
            r.server.advance_to(self._last_door)

    def _touch(self, r: _Replica) -> None:
        """``r`` changed: its view is rebuilt when next asked for, its next event re-filed."""
        r.viewed = r.settled = r.lagged = None
        r.version += 1
        self._dirty.add(r.index)
        if r.down < math.inf:
            return
        if r.server.idle and r.inbox:
            self._sync(r)
        r.key = t = r.next_time()
        if t < math.inf:
            heapq.heappush(self._heap, (t, r.index, r.version))

    def _top(self) -> _Replica | None:
        """The replica with the earliest next event (the first started on a tie)."""
        heap, replicas = self._heap, self._replicas
        while heap:
            _, k, version = heap[0]
            r = replicas[k]
            if r.version == version:
                return r
            heapq.heappop(heap)
        return None

    def _settle(self, r: _Replica, until: float) -> None:
        """``r``'s pending decode run (if any) ends with its first iteration that ends at
        or after ``until``; the front door and the views learn of it."""
        if not r.server.pending:
            return
        started, busy = r.server.settle(min(until, r.bound))
        self._door.server_iteration(started, r.server.now, busy)
        self._snapshot(r)
        if r.draining and r.finished:
            self._stop(r, r.server.now)
        self._touch(r)

    # ------------------------------------------------------------------ views
    def _observed(self, r: _Replica, now: float, among: Sequence[int]) -> ReplicaView:
        """``r`` as seen at ``now``: as it was ``signal_delay_s`` ago (its last snapshot by
        then), with the resident blocks among ``among`` (the routed request's)."""
        if self._delay == 0 or not r.history:
            return r.fresh_view(now, among)
        seen = now - self._delay
        hist = r.history
        while len(hist) > 1 and hist[1][0] <= seen:
            hist.popleft()
        if r.server.pending and r.server.run_start <= seen:
            # Its decode run under way started by then: the iterations over by then are
            # newer than any snapshot, and its prefix cache is as the run found it.
            at, view = r.lagged_view(seen)
            blocks = r.server.resident_blocks(among)
        else:
            at, view = hist[0]
            blocks = view.resident("gpu").intersection(among)
        return replace_view(
            view, draining=r.draining, signal_age_s=max(now - at, 0.0), gpu_blocks=blocks
        )

    def _snapshot(self, r: _Replica) -> None:
        if self._delay == 0:
            return
        now = r.server.now
        if not r.history or now - r.history[-1][0] >= self._snap_every:
            r.history.append((now, r.view()))

    # ------------------------------------------------------------------ routing
    def _dispatch(self, now: float) -> None:
        if not self._queue:
            return
        engine0 = self._replicas[0].engine
        keep: list[int] = []
        knocked: list[float] = []
        router = self._fleet._router
        # A router that never reads prefix blocks is shown none (finding each replica's
        # would cost a lookup per replica per request for nothing).
        blind = not reads_prefix_blocks(router)
        # One that never reads KV memory is shown it as of each replica's last change.
        kv = reads_kv_usage(router)
        for i, at in zip(self._queue, self._knocked, strict=True):
            req = self._reqs[i]
            hashes = engine0.hashes(req)
            among = () if blind else hashes
            # Views per request: with no delay each counts the requests just placed. The
            # fleet built every view (one per replica, ids unique), so the router is shown
            # them as ReplicaViews, not checked again.
            views: ReplicaViews
            if self._delay == 0:
                serving = self._serving()
                board = self._fresh_views(now, kv)
                if among:
                    hit_views = list(board)
                    for pos, r in enumerate(serving):
                        hits = r.server.resident_blocks(among)
                        if hits:
                            base = hit_views[pos]
                            hit_views[pos] = replace_view(
                                base, draining=base.draining, signal_age_s=0.0, gpu_blocks=hits
                            )
                    views = ReplicaViews.trusted(hit_views)
                else:
                    views = ReplicaViews.trusted(board)
            else:
                serving = self._serving()
                views = ReplicaViews.trusted([self._observed(r, now, among) for r in serving])
            rid = router.route(_routing_request(req, hashes), views)
            if rid is None:
                keep.append(i)
                knocked.append(at)
                continue
            chosen = self._placed(i, rid, serving)
            # It joins when its replica's clock reaches the time it knocked (a replica
            # started later joins it at its start): a decode run under way ends there.
            chosen.inbox.append((at, i, req))
            if chosen.server.pending:
                self._settle(chosen, at)
            else:
                self._touch(chosen)
        self._queue = keep
        self._knocked = knocked

    def _placed(self, i: int, rid: str, serving: Sequence[_Replica]) -> _Replica:
        """The replica ``rid`` the router placed request ``i`` on, counted; a
        :class:`SimError` when it is not one of ``serving`` taking requests."""
        chosen = self._by_id.get(rid)
        if chosen is None or chosen.draining or chosen.down < math.inf or chosen.up > self._now:
            raise SimError(
                f"router {type(self._fleet._router).__name__} placed request "
                f"{self._reqs[i].request_id!r} on {rid!r}, not a serving replica of "
                f"{sorted(x.rid for x in serving)}"
            )
        chosen.requests += 1
        self._assigned[i] = chosen.index
        return chosen

    # ------------------------------------------------------------------ control
    def _control_time(self) -> float:
        t = self._next_decision
        if self._coming:
            now = self._now
            self._coming = [r for r in self._coming if r.up > now and r.down == math.inf]
            for r in self._coming:
                t = min(t, r.up)
        return t

    def _control(self, t: float) -> None:
        self._now = max(self._now, t)
        for r in self._live:
            if r.up == t and not r.history and self._delay > 0:
                r.history.append((t, r.view()))
        if t >= self._next_decision:
            self._decide(t)
            self._next_decision = t + self._cfg.decision_interval_s
        self._dispatch(t)

    def _decide(self, t: float) -> None:
        fleet, cfg = self._fleet, self._cfg
        assert fleet._autoscaler is not None
        live = list(self._live)
        up = [r for r in live if r.up <= t and not r.draining]
        provisioning = [r for r in live if r.up > t]
        draining = [r for r in live if r.up <= t and r.draining]
        window = cfg.decision_interval_s
        entered = self._window_entered
        hits = self._rec.prefix_hit - self._window_hits
        view = FleetView(
            time=t,
            up=[self._observed(r, t, ()) for r in up],
            provisioning=[r.rid for r in provisioning],
            draining=[self._observed(r, t, ()) for r in draining],
            arrival_rate=entered / window,
            queued=len(self._queue),
            tokens_per_s=self._window_served_tokens / window,
            mean_prompt_tokens=self._window_prompt / entered if entered else 0.0,
            mean_output_tokens=self._window_output / entered if entered else 0.0,
            prefix_hit_rate=min(1.0, hits / self._window_prompt) if self._window_prompt else 0.0,
        )
        self._window_entered = self._window_prompt = self._window_output = 0
        self._window_served_tokens = 0
        self._window_hits = self._rec.prefix_hit
        target = fleet._autoscaler.target(view)
        target = max(target, cfg.min_replicas)
        if cfg.max_replicas is not None:
            target = min(target, cfg.max_replicas)
        current = len(up) + len(provisioning)

        def load(x: _Replica) -> tuple[int, int]:
            return x.server.outstanding + len(x.inbox), -x.index

        missing = target - current
        if missing > 0 and cfg.reclaim_draining:
            # The draining replicas with the most requests on them (the furthest from
            # stopping; the latest started first on a tie) serve again.
            for r in sorted(draining, key=load, reverse=True)[:missing]:
                r.draining = False
                self._reclaimed += 1
                self._sync(r)
                self._touch(r)
                missing -= 1
                current += 1
        for _ in range(missing):
            k = len(self._replicas)
            engine = fleet._engines(k)
            weights = engine.timing.model.weight_bytes_per_gpu(engine.timing.tp)
            ready = t + provisioning_delay(weights, cfg.load_bandwidth, cfg.startup_s)
            self._start(engine, t, ready)
        surplus = current - target
        # Cancel the replicas still starting (the latest first), then drain the serving
        # ones with the fewest requests on them (the latest started first on a tie).
        for r in sorted(provisioning, key=lambda x: -x.index)[: max(surplus, 0)]:
            self._stop(r, t)
            surplus -= 1
        for r in sorted(up, key=load)[: max(surplus, 0)]:
            r.draining = True
            self._sync(r)
            if r.finished:
                self._stop(r, max(t, r.server.now))
            self._touch(r)

    # ------------------------------------------------------------------ loop
    def _loop(self, progress: ProgressFn | None) -> None:
        rec, door, reqs = self._rec, self._door, self._reqs
        n = len(reqs)
        report_every = max(1, n // 200)
        last_report = -1
        if progress is not None:
            progress(0, n)
        while rec.done < n:
            busy = self._top()
            t_rep = busy.key if busy is not None else math.inf
            t_door = door.next_event()
            t_ctl = self._control_time()
            if t_ctl <= t_rep and t_ctl <= t_door and t_ctl < math.inf:
                if busy is None and t_door == math.inf and not self._queue:
                    break  # nothing left that a control event could serve
                self._control(t_ctl)
                continue
            if t_door <= t_rep:
                if t_door == math.inf:
                    break
                # The door opens at the end of the iteration, at or after the knock, of
                # the replica whose next event comes first (the host), as one engine takes
                # arrivals at its own clock; with every replica idle, at the knock.
                now = t_door
                host = busy if busy is not None and busy.server.pending else None
                if host is not None and self._fleet._gate is not None:
                    # The gateway decides at the host's clock, having seen its iterations
                    # to there (as one engine's gateway does).
                    self._settle(host, t_door)
                    now, host = host.server.now, None
                elif host is not None:
                    now = host.server.end_of_run(min(t_door, host.bound))
                elif busy is not None:
                    now = busy.key
                self._now = max(self._now, now)
                self._last_door = t_door
                times: list[float] = []
                entered = door.arrive(now, times)
                if host is not None and not entered:
                    # A knock that lets nobody in still ends the host's decode run there,
                    # as it ends one engine's.
                    self._settle(host, t_door)
                for i in entered:
                    self._window_entered += 1
                    self._window_prompt += reqs[i].prompt_len
                    self._window_output += reqs[i].decode_len
                self._queue.extend(entered)
                self._knocked.extend(times)
                self._dispatch(now)
                continue
            assert busy is not None
            if busy.server.pending:
                self._settle(busy, math.inf)  # the loop reached its end
            else:
                self._sync(busy)
                busy.bound = min(t_ctl, busy.deliver())
                if busy.server.begin() is not None and not busy.server.pending:
                    started, full = busy.server.settle()
                    door.server_iteration(started, busy.server.now, full)
                    self._snapshot(busy)
                if busy.draining and busy.finished:
                    self._stop(busy, busy.server.now)
                self._touch(busy)
            if progress is not None and rec.done // report_every != last_report:
                last_report = rec.done // report_every
                progress(rec.done, n)
        if progress is not None:
            progress(rec.done, n)

    # ------------------------------------------------------------------ apart
    def _apart(self, progress: ProgressFn | None) -> None:
        """:meth:`_loop`'s run when nothing couples the replicas: no gateway, no autoscaler
        and a router that reads no load (kvmodel's ``reads_load``). Every request is routed
        first, in arrival order (the router shown each replica's view at the start: its
        choices do not depend on what the views say of load), then each replica serves its
        share as one engine serves its arrivals, replica after replica, so that one
        replica's state stays in the CPU's caches while it runs. Each replica runs exactly
        as in the loop, where only its own requests end its decode runs (the tests compare
        the two bit for bit)."""
        door, reqs, rec = self._door, self._reqs, self._rec
        n = len(reqs)
        if progress is not None:
            progress(0, n)
        times: list[float] = []
        entered = door.arrive(math.inf, times)
        if n:  # the door's last opening, as in the loop (there is no retry)
            self._now = max(self._now, self._last_arrival)
            self._last_door = self._last_arrival
        serving = self._serving()
        views = ReplicaViews.trusted([r.settled_view() for r in serving])
        router = self._fleet._router
        engine0 = self._replicas[0].engine
        shares: list[list[tuple[float, int, Request]]] = [[] for _ in self._replicas]
        for i, at in zip(entered, times, strict=True):
            req = reqs[i]
            rid = router.route(_routing_request(req, engine0.hashes(req)), views)
            if rid is None:  # no replica may take it (none drains here): it waits, as in the loop
                continue
            shares[self._placed(i, rid, serving).index].append((at, i, req))
        tick = None
        if progress is not None:
            every, last = max(1, n // 200), [-1]

            def tick() -> None:
                if rec.done // every != last[0]:
                    last[0] = rec.done // every
                    progress(rec.done, n)

        for r, share in zip(self._replicas, shares, strict=True):
            _serve(r.server, share, tick)
        if progress is not None:
            progress(rec.done, n)

    # ------------------------------------------------------------------ result
    def result(self) -> FleetRecord:
        for r in self._live:
            self._sync(r)
        records = [r.server.record() for r in self._replicas]
        end = max([self._now, *(rec.end_time for rec in records)])
        rows = []
        for r in self._replicas:
            tm = r.engine.timing
            down = r.down if r.down < math.inf else max(end, r.up)
            rows.append(
                ReplicaRecord(
                    replica_id=r.rid,
                    model=tm.model.name,
                    gpu=tm.gpu.name,
                    price_per_hour=tm.gpu.price_per_hour,
                    start_s=r.start,
                    up_s=r.up,
                    down_s=min(down, max(end, r.start)),
                    requests=r.requests,
                    peak_kv_tokens=r.server.peak_kv_tokens,
                )
            )
        return FleetRecord(
            record=records[0] if len(records) == 1 else _merge(records),
            replicas=tuple(rows),
            assignment=self._assigned,
            peak_replicas=self._peak,
            reclaimed=self._reclaimed,
            served_apart=self._served_apart,
        )


def _routing_request(req: Request, hashes: tuple[int, ...]) -> RoutingRequest:
    """``req`` as its router sees it, with its prompt's block ``hashes``."""
    return RoutingRequest(
        request_id=req.request_id,
        prompt_len=max(req.prompt_len, 1),
        block_hashes=hashes,
        label=req.tenant or "default",
    )


def _serve(
    server: Server,
    share: Sequence[tuple[float, int, Request]],
    tick: Callable[[], None] | None = None,
) -> None:
    """``server`` serves ``share`` ((arrival, index, request), in arrival order) as one
    engine serves its arrivals (:meth:`Engine._loop` without a gateway): an idle server's
    clock moves to the next arrival, arrivals due join, and each iteration (or run of
    decode iterations) ends at the first that ends at or after the next arrival; ``tick``
    is called after each (progress)."""
    pos, n = 0, len(share)
    while pos < n or not server.idle:
        if server.idle:
            server.advance_to(share[pos][0])
        now = server.now
        while pos < n and share[pos][0] <= now:
            _, i, req = share[pos]
            server.accept(i, req)
            pos += 1
        server.iterate(share[pos][0] if pos < n else math.inf)
        if tick is not None:
            tick()


def _merge(records: Sequence[RunRecord]) -> RunRecord:
    """The records of a fleet's replicas (sharing per-request arrays) as one record: counts
    summed, the memory series summed over the replicas at every sample time."""
    times = np.concatenate([r.series_time for r in records])
    order = np.argsort(times, kind="stable")

    def summed(name: str) -> NDArray[np.int64]:
        # Each replica's change at each of its samples; their running sum over all samples
        # in time order is the fleet's total.
        deltas = [np.diff(getattr(r, name), prepend=0) for r in records]
        return np.cumsum(np.concatenate(deltas)[order]).astype(np.int64)

    budgets = [r.eviction_budget for r in records]
    base = records[0]
    return evolve(
        base,
        series_time=times[order],
        series_kv_tokens=summed("series_kv_tokens"),
        series_resident=summed("series_resident"),
        series_running=summed("series_running"),
        series_waiting=summed("series_waiting"),
        capacity_tokens=sum(r.capacity_tokens for r in records),
        eviction_budget=None if any(b is None for b in budgets) else sum(b for b in budgets if b),
        iterations=sum(r.iterations for r in records),
        end_time=max(r.end_time for r in records),
        evicted_tokens=sum(r.evicted_tokens for r in records),
        eviction_rounds=sum(r.eviction_rounds for r in records),
        attention_recall=float(np.mean([r.attention_recall for r in records])),
    )


def summarize_fleet(fleet: FleetRecord, slo: SLOConfig, gpu: GPUSpec) -> Summary:
    """Figures of a fleet run: :func:`summarize` of the fleet as one server (latencies,
    throughput, memory summed over the replicas), its cost from every replica's GPU-hours
    at its own GPU's price, and the replicas' own figures."""
    base = summarize(fleet.record, slo, gpu)
    met = fleet.slo_met(slo)
    rows = tuple(
        ReplicaSummary(
            replica_id=r.replica_id,
            model=r.model,
            gpu=r.gpu,
            start_s=r.start_s,
            up_s=r.up_s,
            down_s=r.down_s,
            requests=r.requests,
            slo_met=int(met[k]),
            peak_kv_tokens=r.peak_kv_tokens,
            gpu_hours=r.gpu_hours,
        )
        for k, r in enumerate(fleet.replicas)
    )
    # Written as summarize() prices one GPU, so that one replica costs exactly the same.
    cost = sum(r.price_per_hour * (r.down_s - r.start_s) / 3600.0 for r in fleet.replicas)

    def per_1k(count: int) -> float:
        return 1000.0 * cost / count if count else math.nan

    return evolve(
        base,
        cost_usd=cost,
        cost_per_1k_completed_usd=per_1k(base.completed),
        cost_per_1k_slo_met_usd=per_1k(base.slo_met),
        fleet=FleetSummary(
            gpu_hours=fleet.gpu_hours,
            peak_replicas=fleet.peak_replicas,
            replicas=rows,
            reclaimed=fleet.reclaimed,
        ),
    )
