"""A fleet: replicas of the engine behind one front door and one router, in one loop.

Each replica is a steppable :class:`~kvpolicy.sim._engine.Server` of its own engine (its
model, GPU, pool, prefix cache, residency and tiers). The fleet only orchestrates, in time
order::

    control     a provisioned replica starts serving; the autoscaler is asked for a target
                every ``decision_interval_s`` (replicas start after a provisioning delay or
                drain: no new requests, running ones finish, then it stops)
    front door  arrivals and retries pass the gateway (one for the fleet) at the clock of
                the earliest busy replica, as one engine takes them at its own clock;
                the router places each admitted request on a replica
    iteration   the busy replica whose clock is earliest runs one iteration, bounded by the
                next arrival and the next control event

The router and the autoscaler see each replica as a :class:`~kvpolicy.kvmodel.ReplicaView`
observed ``signal_delay_s`` ago (a scrape's lag): views are snapshots taken after a
replica's iterations, at most one per ``signal_delay_s / 8``, so the one a router gets is
the last taken at or before ``now - signal_delay_s`` (its ``signal_age_s`` says how old it
is). With no delay the router sees every replica as it is now, the requests placed on it
included. A view's resident prefix blocks are those of the request being routed (all a
router can match against it; the autoscaler's views carry none), which keeps a view as
cheap as the prompt is long rather than the pool is large.

With one replica and round-robin, the fleet runs exactly the single engine's iterations and
its record is the engine's.
"""

from __future__ import annotations

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
    Request,
    RequestGate,
    Router,
    RoutingRequest,
)
from kvpolicy.sim._config import FleetConfig, GatewayConfig, SLOConfig
from kvpolicy.sim._engine import Engine, ProgressFn, Server
from kvpolicy.sim._errors import SimError
from kvpolicy.sim._frontdoor import FrontDoor
from kvpolicy.sim._metrics import FleetSummary, ReplicaSummary, Summary, summarize
from kvpolicy.sim._recorder import Recorder, RunRecord
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
        "down",
        "draining",
        "engine",
        "history",
        "inbox",
        "index",
        "requests",
        "rid",
        "server",
        "start",
        "up",
    )

    def __init__(self, index: int, engine: Engine, server: Server, start: float, up: float):
        self.index = index
        self.rid = f"r{index}"
        self.engine = engine
        self.server = server
        self.start = start
        self.up = up
        self.down = math.inf
        self.draining = False
        self.requests = 0
        self.history: deque[tuple[float, ReplicaView]] = deque()
        self.inbox: deque[tuple[float, int, Request]] = deque()
        """Requests routed to it that knocked after its clock: (time, index, request)."""

    def view(self, among: Sequence[int] | None = None) -> ReplicaView:
        return self.server.view(
            self.rid, draining=self.draining, queued=len(self.inbox), among=among
        )

    def next_time(self) -> float:
        """When its next iteration starts: now if it has work, else its next request's
        time (``inf``: nothing to do)."""
        if not self.server.idle:
            return self.server.now
        if self.inbox:
            return max(self.server.now, self.inbox[0][0])
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
    """One fleet run's state (the loop of :meth:`Fleet.run`)."""

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
        self._queue: list[int] = []
        self._knocked: list[float] = []  # when each queued request knocked
        self._now = float(arrivals[0]) if len(reqs) else 0.0
        self._peak = 0
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
        self._loop(progress)

    # ------------------------------------------------------------------ replicas
    def _start(self, engine: Engine | None, start: float, up: float) -> _Replica:
        k = len(self._replicas)
        engine = engine if engine is not None else self._fleet._engines(k)
        server = engine.server(self._rec, self._release)
        server.advance_to(up)
        r = _Replica(k, engine, server, start, up)
        self._replicas.append(r)
        self._peak = max(self._peak, sum(1 for x in self._replicas if x.down == math.inf))
        if up <= self._now and self._delay > 0:
            r.history.append((up, r.view()))
        return r

    def _release(self, i: int, now: float) -> None:
        self._door.release(i, now)
        req = self._reqs[i]
        self._window_served_tokens += req.prompt_len + req.decode_len

    def _serving(self) -> list[_Replica]:
        """Replicas up (draining or not) and not stopped."""
        now = self._now
        return [r for r in self._replicas if r.up <= now and r.down == math.inf]

    def _stop(self, r: _Replica, at: float) -> None:
        r.down = at

    # ------------------------------------------------------------------ views
    def _observed(self, r: _Replica, now: float, among: Sequence[int]) -> ReplicaView:
        """``r`` as seen at ``now``: as it was ``signal_delay_s`` ago (its last snapshot by
        then), with the resident blocks among ``among`` (the routed request's)."""
        if self._delay == 0 or not r.history:
            return r.view(among)
        seen = now - self._delay
        hist = r.history
        while len(hist) > 1 and hist[1][0] <= seen:
            hist.popleft()
        at, view = hist[0]
        return evolve(
            view,
            draining=r.draining,
            signal_age_s=max(now - at, 0.0),
            prefix_blocks={"gpu": view.resident("gpu").intersection(among)},
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
        serving = self._serving()
        by_id = {r.rid: r for r in serving}
        engine0 = self._replicas[0].engine
        keep: list[int] = []
        knocked: list[float] = []
        router = self._fleet._router
        for i, at in zip(self._queue, self._knocked, strict=True):
            req = self._reqs[i]
            hashes = engine0.hashes(req)
            # Views per request: with no delay each counts the requests just placed.
            views = [self._observed(r, now, hashes) for r in serving]
            rid = router.route(
                RoutingRequest(
                    request_id=req.request_id,
                    prompt_len=max(req.prompt_len, 1),
                    block_hashes=hashes,
                    label=req.tenant or "default",
                ),
                views,
            )
            if rid is None:
                keep.append(i)
                knocked.append(at)
                continue
            r = by_id.get(rid)
            if r is None or r.draining:
                raise SimError(
                    f"router {type(router).__name__} placed request {req.request_id!r} on "
                    f"{rid!r}, not a serving replica of {sorted(by_id)}"
                )
            # It joins when its replica's clock reaches the time it knocked (a replica
            # started later joins it at its start).
            r.inbox.append((at, i, req))
            r.requests += 1
            self._assigned[i] = r.index
        self._queue = keep
        self._knocked = knocked

    # ------------------------------------------------------------------ control
    def _control_time(self) -> float:
        t = self._next_decision
        for r in self._replicas:
            if r.up > self._now and r.down == math.inf:
                t = min(t, r.up)
        return t

    def _control(self, t: float) -> None:
        self._now = max(self._now, t)
        for r in self._replicas:
            if r.up == t and r.down == math.inf and not r.history and self._delay > 0:
                r.history.append((t, r.view()))
        if t >= self._next_decision:
            self._decide(t)
            self._next_decision = t + self._cfg.decision_interval_s
        self._dispatch(t)

    def _decide(self, t: float) -> None:
        fleet, cfg = self._fleet, self._cfg
        assert fleet._autoscaler is not None
        live = [r for r in self._replicas if r.down == math.inf]
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
        for _ in range(target - current):
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

        def load(x: _Replica) -> tuple[int, int]:
            return x.server.outstanding + len(x.inbox), -x.index

        for r in sorted(up, key=load)[: max(surplus, 0)]:
            r.draining = True
            if r.finished:
                self._stop(r, max(t, r.server.now))

    # ------------------------------------------------------------------ loop
    def _loop(self, progress: ProgressFn | None) -> None:
        rec, door, reqs = self._rec, self._door, self._reqs
        n = len(reqs)
        report_every = max(1, n // 200)
        last_report = -1
        if progress is not None:
            progress(0, n)
        while rec.done < n:
            busy: _Replica | None = None
            t_rep = math.inf
            for r in self._replicas:
                if r.down == math.inf:
                    t = r.next_time()
                    if t < t_rep:
                        busy, t_rep = r, t
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
                # The door opens at the earliest busy replica's clock, as one engine takes
                # arrivals at its own; an idle replica starts a request when it knocked.
                now = t_rep if busy is not None else t_door
                self._now = max(self._now, now)
                for r in self._serving():
                    if r.server.idle:
                        r.server.advance_to(t_door)
                times: list[float] = []
                entered = door.arrive(now, times)
                for i in entered:
                    self._window_entered += 1
                    self._window_prompt += reqs[i].prompt_len
                    self._window_output += reqs[i].decode_len
                self._queue.extend(entered)
                self._knocked.extend(times)
                self._dispatch(now)
                continue
            assert busy is not None
            t_next = busy.deliver()
            ran = busy.server.iterate(min(t_door, t_ctl, t_next))
            if ran is not None:
                door.server_iteration(ran[0], busy.server.now, ran[1])
                self._snapshot(busy)
            if busy.draining and busy.finished:
                self._stop(busy, busy.server.now)
            if progress is not None and rec.done // report_every != last_report:
                last_report = rec.done // report_every
                progress(rec.done, n)
        if progress is not None:
            progress(rec.done, n)

    # ------------------------------------------------------------------ result
    def result(self) -> FleetRecord:
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
        )


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
            gpu_hours=fleet.gpu_hours, peak_replicas=fleet.peak_replicas, replicas=rows
        ),
    )
