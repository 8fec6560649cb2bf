"""Iteration-level continuous batching over a paged KV pool, like vLLM's scheduler.

The engine is a loop over phases, each a collaborator that owns one concern and gets only
its own config::

    front door  (_frontdoor.FrontDoor)  arrivals, the gateway (429 + Retry-After), retries
    batch       (_batch.Batch)          swap-in, admission with prefix-cache and tier hits,
                                        preemption when blocks run out
    residency   (_residency)            the eviction ledger: tokens reported to the policy,
                                        rounds with one trigger rule, blocks given back
    step        (_step.Step)            prefill chunks and decodes, KV growth, the clock
    recorder    (_recorder.Recorder)    per-request times, counters, the memory series

One iteration: requests that arrive (or retry) pass the front door into the waiting queue;
the batch brings swapped requests back and admits waiting ones; the step preempts if the
decodes' next slots don't fit, runs an eviction round if one is due, computes, and retires
finished requests; the recorder samples memory; cached prompt blocks the pool reused are
offered to the tiers below HBM.

The engine holds no policy: gateway, admission, eviction, preemption and the tiers below HBM
arrive built, as one :class:`~kvpolicy.sim.Stack`. Without an admission policy it admits
while blocks last; without a preemption policy it preempts the last admitted request first,
as vLLM does; without an eviction policy it keeps every token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel import BlockPool, ReplicaView, Request, rechunk_hashes
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._batch import Batch
from kvpolicy.sim._config import (
    EngineConfig,
    EvictionConfig,
    GatewayConfig,
    PreemptionConfig,
    SLOConfig,
)
from kvpolicy.sim._errors import ConfigError, SimError
from kvpolicy.sim._frontdoor import FrontDoor
from kvpolicy.sim._recorder import Recorder, RunRecord
from kvpolicy.sim._residency import Evicting, KeepAll, Residency
from kvpolicy.sim._seq import Seq
from kvpolicy.sim._stack import Stack
from kvpolicy.sim._step import DecodeRun, Step
from kvpolicy.sim._timing import TimingModel
from kvpolicy.sim._views import make_view
from kvpolicy.tenancy import RefreshConfig

__all__ = ["Engine", "RunRecord", "Server", "pool_capacity_tokens"]

ProgressFn = Callable[[int, int], None]


def pool_capacity_tokens(timing: TimingModel, engine: EngineConfig) -> int:
    """Tokens of the KV pool (whole blocks) that ``engine`` gets for ``timing``'s model and GPU.

    Raises:
        ConfigError: the pool holds less than one block.
    """
    bs = engine.block_size
    cap = engine.kv_capacity_tokens
    if cap is None:
        from kvpolicy.kvmodel import kv_budget_bytes

        budget = kv_budget_bytes(
            timing.model, timing.gpu, engine.gpu_memory_utilization, tp=timing.tp
        )
        cap = budget // timing.kv_bytes_per_token
    if cap // bs < 1:
        hint = ""
        if engine.kv_capacity_tokens is None:
            from kvpolicy.kvmodel import kv_budget_bytes

            model, util = timing.model, engine.gpu_memory_utilization
            for tp in model.tensor_parallel_sizes():
                per_token = model.kv_bytes_per_token_per_gpu(tp)
                if (
                    tp > timing.tp
                    and kv_budget_bytes(model, timing.gpu, util, tp=tp) >= bs * per_token
                ):
                    hint = f"; it fits with tensor parallelism tp >= {tp} (--tp {tp}, timing.tp)"
                    break
        raise ConfigError(
            f"no KV memory: {timing.model.name} on {timing.gpu.name} at "
            f"gpu_memory_utilization={engine.gpu_memory_utilization} (tp={timing.tp}) leaves "
            f"{cap} tokens, less than one block of {bs}{hint}"
        )
    return (cap // bs) * bs


_NO_BLOCKS: frozenset[int] = frozenset()
"""The resident blocks of a view that asks for none."""


class Engine:
    """Continuous-batching simulator of one GPU serving one workload.

    Args:
        timing: the roofline time model (it fixes the model and the GPU).
        engine: engine limits.
        stack: the built policies (gateway, admission, eviction, preemption, tiers); the
            default is the engine's own mechanics only.
        eviction_config: budget and cadence of eviction.
        preemption_config: recomputation or swap, and the CPU tier.
        gateway_config: how the gateway's clients retry, and how often its throughput
            estimate is refreshed.
        slo_config: the latency targets; a refresh raises the gateway's estimate only
            while the requests finishing meet them.
        attention: synthetic attention-return model fed to the eviction policy.
        seed: seed of the heavy-hitter scores.

    Raises:
        ConfigError: the KV pool holds less than one block, or the eviction budget is smaller
            than twice one iteration's token budget.
    """

    def __init__(
        self,
        timing: TimingModel,
        engine: EngineConfig,
        stack: Stack | None = None,
        *,
        eviction_config: EvictionConfig | None = None,
        preemption_config: PreemptionConfig | None = None,
        gateway_config: GatewayConfig | None = None,
        slo_config: SLOConfig | None = None,
        attention: AttentionModel | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(timing, TimingModel):
            raise TypeError(f"'timing' must be a TimingModel: {timing!r}")
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"'engine' must be an EngineConfig: {engine!r}")
        stack = Stack() if stack is None else stack
        if not isinstance(stack, Stack):
            raise TypeError(f"'stack' must be a Stack: {stack!r}")
        self._timing = timing
        self._cfg = engine
        self._stack = stack
        self._ev_cfg = eviction_config or EvictionConfig()
        self._pre_cfg = preemption_config or PreemptionConfig()
        self._gw_cfg = gateway_config or GatewayConfig()
        self._refresh: RefreshConfig | None = None
        if self._gw_cfg.refresh_s > 0:
            slo = slo_config or SLOConfig()
            self._refresh = RefreshConfig(
                window_s=self._gw_cfg.refresh_s, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s
            )
        self._attention = attention or AttentionModel()
        self._seed = seed
        self._capacity = pool_capacity_tokens(timing, engine)
        self._budget: int | None = None
        if stack.eviction is not None:
            self._budget = int(self._ev_cfg.budget_fraction * self._capacity)
            if self._budget < 2 * engine.token_budget:
                raise ConfigError(
                    f"eviction budget {self._budget} tokens (budget_fraction="
                    f"{self._ev_cfg.budget_fraction} of {self._capacity}) must be at least twice "
                    f"the token_budget {engine.token_budget}"
                )

    @property
    def timing(self) -> TimingModel:
        """The roofline time model (its model and GPU)."""
        return self._timing

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._cfg.block_size

    @property
    def capacity_tokens(self) -> int:
        """KV pool size in tokens."""
        return self._capacity

    def max_request_tokens(self) -> int:
        """Longest request (prompt plus output) this engine can ever hold."""
        if self._budget is not None:
            return self._timing.model.max_context
        return min(self._timing.model.max_context, self._capacity)

    def check_fits(self, requests: Sequence[Request]) -> NDArray[np.bool_]:
        """Which requests can never run: longer than the model's context or, without token
        eviction, than the KV pool.

        Returns:
            (n,) bool, True for a request that must be rejected.

        Raises:
            ConfigError: no request at all fits (the message gives the sizes).
        """
        limit = self.max_request_tokens()
        n = len(requests)
        total = np.fromiter((min(r.total_len, 2**62) for r in requests), np.int64, count=n)
        prompt = np.fromiter((min(r.prompt_len, 2**62) for r in requests), np.int64, count=n)
        bad = (total > limit) | (prompt + 1 > self._capacity)
        if n and bool(bad.all()):
            raise ConfigError(
                f"no request fits: the shortest needs {int(total.min())} tokens but "
                f"{self._timing.model.name} on {self._timing.gpu.name} holds at most {limit} "
                f"(KV pool {self._capacity} tokens, context {self._timing.model.max_context})"
            )
        return bad

    def hashes(self, request: Request) -> tuple[int, ...]:
        """The request's prefix hashes at this engine's block size."""
        if not request.prefix_hashes:
            return ()
        try:
            return rechunk_hashes(
                request.prefix_hashes, request.hash_block_size, self._cfg.block_size
            )
        except ValueError as exc:
            raise ConfigError(f"request {request.request_id!r}: {exc}") from exc

    # ------------------------------------------------------------------------------ run
    def run(
        self,
        requests: Sequence[Request],
        *,
        progress: ProgressFn | None = None,
        max_time: float | None = None,
    ) -> RunRecord:
        """Serve ``requests`` (sorted by arrival time) to completion.

        Args:
            requests: the workload, in arrival order.
            progress: called as ``progress(done, total)`` now and then.
            max_time: stop once simulated time passes this (requests left unfinished).

        Raises:
            ValueError: ``requests`` is not sorted by arrival time or repeats an id.
            ConfigError: no request fits at all, or prefix hashes of a granularity the
                engine's block size is not a multiple of.
        """
        reqs, arrivals, rejected = self.check_workload(requests)
        return self._loop(reqs, arrivals, rejected, progress, max_time)

    def check_workload(
        self, requests: Sequence[Request]
    ) -> tuple[tuple[Request, ...], NDArray[np.float64], NDArray[np.bool_]]:
        """Check ``requests`` before a run: the workload as a tuple, its (n,) float64
        arrival times and the (n,) bool requests that can never run on this engine.

        Raises:
            TypeError: an item is not a Request.
            ValueError: ``requests`` is not sorted by arrival time or repeats an id.
            ConfigError: no request fits at all, or prefix hashes of a granularity the
                engine's block size is not a multiple of.
        """
        reqs = tuple(requests)
        for r in reqs:
            if not isinstance(r, Request):
                raise TypeError(f"'requests' must hold Request objects: {r!r}")
        arrivals = np.fromiter((r.arrival_time for r in reqs), dtype=np.float64, count=len(reqs))
        if len(reqs) > 1 and bool(np.any(np.diff(arrivals) < 0)):
            raise ValueError("'requests' must be sorted by arrival_time")
        if len({r.request_id for r in reqs}) != len(reqs):
            raise ValueError("'requests' repeat a request_id")
        for r in reqs:
            if r.prefix_hashes and self._cfg.block_size % r.hash_block_size:
                self.hashes(r)  # raises, naming the request and both sizes
        return reqs, arrivals, self.check_fits(reqs)

    def too_long(self, requests: Sequence[Request]) -> NDArray[np.bool_]:
        """(n,) bool requests longer than the model's context (rejected whatever the pool)."""
        ctx = self._timing.model.max_context
        return np.fromiter((r.total_len > ctx for r in requests), np.bool_, count=len(requests))

    def _loop(
        self,
        reqs: tuple[Request, ...],
        arrivals: NDArray[np.float64],
        rejected: NDArray[np.bool_],
        progress: ProgressFn | None,
        max_time: float | None,
    ) -> RunRecord:
        rec = Recorder(reqs, rejected, rejected & self.too_long(reqs))
        door = FrontDoor(reqs, arrivals, rec, self._stack.gate, self._gw_cfg, self._refresh)
        server = self.server(rec, door.release)
        n = len(reqs)
        report_every = max(1, n // 200)
        last_report = -1
        if progress is not None:
            progress(0, n)
        while rec.done < n:
            if max_time is not None and server.now > max_time:
                break
            if server.idle:
                nxt = door.next_event()
                if nxt == np.inf:
                    break
                server.advance_to(nxt)
            for i in door.arrive(server.now):
                server.accept(i, reqs[i])
            ran = server.iterate(door.next_event())
            if ran is None:
                continue
            door.server_iteration(ran[0], server.now, ran[1])
            if progress is not None and rec.done // report_every != last_report:
                last_report = rec.done // report_every
                progress(rec.done, n)
        if progress is not None:
            progress(rec.done, n)
        return server.record()

    def server(self, recorder: Recorder, release: Callable[[int, float], None]) -> Server:
        """A fresh, steppable server of this engine (its own pool, prefix cache, residency
        and batch) that writes per-request times to ``recorder`` and calls
        ``release(index, now)`` when a request finishes (the front door's gateway gets back
        what the request held)."""
        return Server(self, recorder, release)


class Server:
    """One engine's iteration loop, one iteration at a time, for a caller that owns the
    clock of arrivals: :meth:`Engine.run` (one server) or a fleet of them.

    The caller hands it requests (:meth:`accept`), moves an idle server's clock
    (:meth:`advance_to`) and runs one iteration (:meth:`iterate`); the server reports what
    it holds as a :class:`~kvpolicy.kvmodel.ReplicaView` (:meth:`view`).

    Args:
        engine: the engine whose limits, time model and policies it runs.
        recorder: where per-request times and counters go (indexed like the workload).
        release: called as ``release(index, now)`` when a request finishes.
    """

    def __init__(
        self, engine: Engine, recorder: Recorder, release: Callable[[int, float], None]
    ) -> None:
        cfg, tm, stack = engine._cfg, engine._timing, engine._stack
        self._engine = engine
        self._rec = recorder
        self._series: list[tuple[float, int, int, int, int]] = []
        pool = BlockPool(
            engine._capacity // cfg.block_size,
            cfg.block_size,
            enable_prefix_caching=cfg.prefix_caching,
            record_dropped=stack.prefix_store is not None,
        )
        self._pool = pool
        residency: Residency = KeepAll()
        if stack.eviction is not None:
            assert engine._budget is not None
            residency = Evicting(
                stack.eviction,
                engine._budget,
                engine._ev_cfg,
                engine._attention,
                engine._seed,
                pool,
            )
        self._residency = residency
        batch = Batch(
            cfg,
            pool,
            residency,
            recorder,
            tm,
            stack.admission,
            stack.preemption,
            engine._pre_cfg,
            stack.prefix_store,
        )
        self._batch = batch
        observer = batch.observer

        def on_finish(s: Seq, now: float, iteration: int) -> None:
            recorder.finished(s.idx, now, iteration)
            release(s.idx, now)
            if observer is not None:
                observer.observe_completion(s.req, now)

        self._step = Step(cfg, tm, batch, residency, on_finish)
        self._max_batch = cfg.max_batch
        self._token_budget = cfg.token_budget
        self._pending: DecodeRun | None = None
        self._started = 0.0

    @property
    def now(self) -> float:
        """The server's clock, seconds: the end of its last iteration (or later, idle)."""
        return self._step.now

    @property
    def idle(self) -> bool:
        """No request is running, waiting or swapped out."""
        return self._batch.idle

    @property
    def outstanding(self) -> int:
        """Requests on the server: running, waiting and swapped out."""
        batch = self._batch
        return len(batch.running) + len(batch.waiting) + len(batch.swapped)

    @property
    def peak_kv_tokens(self) -> int:
        """Most KV slots held in used blocks at any sample so far."""
        return max((p[1] for p in self._series), default=0)

    def advance_to(self, time: float) -> None:
        """An idle server's clock moves on to ``time`` (never back)."""
        self._step.now = max(self._step.now, time)

    def accept(self, index: int, request: Request) -> None:
        """Request ``index`` of the workload joins the waiting queue."""
        self._batch.waiting.append(Seq(index, request, self._engine.hashes(request)))

    def iterate(self, next_event: float) -> tuple[float, bool] | None:
        """Run one iteration (or a run of decode-only ones that ``next_event``, the next
        arrival or retry, bounds) from :attr:`now`.

        Returns:
            ``(started, busy)``: when it started and whether requests waited, the batch was
            full or it used its whole token budget; None when nothing could run (an empty
            batch, nothing waiting).

        Raises:
            SimError: the admission policy admitted nothing into an empty batch while
                requests wait.
        """
        if self.begin() is None:
            return None
        return self.settle(next_event)

    def begin(self) -> float | None:
        """Start the next iteration from :attr:`now`: a mixed one runs whole; a run of
        decode-only ones is planned and left pending (:attr:`pending`) until
        :meth:`settle` says where it ends. Nothing else may reach the server in between
        but :meth:`view` (which sees it as it was at the run's start).

        Returns:
            When it started; None when nothing could run (an empty batch, nothing waiting).

        Raises:
            SimError: the admission policy admitted nothing into an empty batch while
                requests wait.
        """
        batch, step = self._batch, self._step
        preempted, budget, reserve, decoding = step.prepare()
        if preempted:
            budget = 0  # vLLM admits no new request in an iteration that preempts
        before, swapped = len(batch.running), len(batch.swapped)
        batch.admit(step.now, step.step, budget, reserve)
        running = batch.running
        if not running:
            if batch.waiting or batch.swapped:
                raise SimError(
                    f"nothing runs at t={step.now:.3f}s with {len(batch.waiting)} waiting: "
                    "the admission policy admitted none into an empty batch"
                )
            return None
        self._started = step.now
        # Admission only appends: the requests before it are as prepare() found them, and
        # their decodes need the same blocks unless a swapped request came back among them.
        need = reserve if len(batch.swapped) == swapped else None
        if decoding is None:
            decoding = all(s.computed >= s.target for s in running)
        elif decoding and len(running) > before:
            decoding = all(s.computed >= s.target for s in running[before:])
        if decoding:
            self._pending = step.plan_decode(need)
        else:
            step.mixed(self._rec.first_output, need)
        return self._started

    @property
    def pending(self) -> bool:
        """A run of decode-only iterations is planned and not yet settled."""
        return self._pending is not None

    def end_of_run(self, until: float) -> float:
        """The clock :meth:`settle` with ``until`` would leave (:attr:`now` with nothing
        pending)."""
        run = self._pending
        if run is None:
            return self._step.now
        return run.end(run.steps_until(until))

    def run_progress(self, t: float) -> tuple[int, float, float]:
        """Iterations of the pending decode run that have ended by ``t``, when the last of
        them ended and when the next ends (``(0, now, inf)`` with none pending)."""
        run = self._pending
        if run is None:
            return 0, self._step.now, math.inf
        return run.done_by(t)

    def next_growth(self, k: int) -> float:
        """When the pending decode run's next iteration after its ``k``-th that takes a
        new KV block ends (``inf``: none, or none pending)."""
        run = self._pending
        return run.next_growth(k) if run is not None else math.inf

    def kv_growth(self, t: float) -> tuple[int, float]:
        """New KV blocks the pending decode run's requests hold after its iterations over
        by ``t``, and when the next of its iterations that takes a block ends (``(0,
        inf)``: none pending)."""
        run = self._pending
        return run.growth_by(t) if run is not None else (0, math.inf)

    def grown_blocks(self, k: int) -> int:
        """New KV blocks the pending decode run's requests hold after ``k`` of its
        iterations (0 with none pending)."""
        run = self._pending
        return run.blocks_after(k) if run is not None and k else 0

    @property
    def num_blocks(self) -> int:
        """Blocks of its KV pool."""
        return self._pool.num_blocks

    @property
    def run_start(self) -> float:
        """When the pending decode run started (:attr:`now` with none pending)."""
        return self._step.now

    def settle(self, until: float = math.inf) -> tuple[float, bool]:
        """Finish the iteration :meth:`begin` started: a pending decode run ends with its
        first iteration that ends at or after ``until`` (all of it by default).

        Returns:
            ``(started, busy)`` as :meth:`iterate` does.
        """
        batch, step = self._batch, self._step
        run = self._pending
        if run is not None:
            self._pending = None
            step.commit(run, run.steps_until(until))
        waiting = len(batch.waiting) + len(batch.swapped)
        self._series.append(
            (
                step.now,
                batch.used_tokens(),
                self._residency.resident_now(batch.running),
                len(batch.running),
                waiting,
            )
        )
        # Busy: requests wait, the batch is full, or the iteration used its whole token
        # budget (compute-bound prefill).
        busy = (
            waiting > 0
            or len(batch.running) >= self._max_batch
            or step.last_tokens >= self._token_budget
        )
        batch.offload(step.now)
        return self._started, busy

    def view(
        self,
        replica_id: str,
        *,
        draining: bool = False,
        age_s: float = 0.0,
        queued: int = 0,
        among: Sequence[int] | None = None,
    ) -> ReplicaView:
        """What a router sees of this server now: its load (``queued`` requests on their way
        to it count as waiting), KV usage and the prefix blocks resident in its GPU pool, all
        of them or only those of ``among`` (the blocks of the request being routed, all a
        router can match; the tiers below HBM are not reported). A pending decode run is
        seen as it starts."""
        batch, pool = self._batch, self._pool
        free = pool.num_free_blocks
        tm = self._engine._timing
        return make_view(
            replica_id,
            len(batch.running),
            len(batch.waiting) + len(batch.swapped) + queued,
            free,
            pool.num_blocks,
            pool.block_size,
            pool.cached_hashes(among) if among is None or among else _NO_BLOCKS,
            draining,
            age_s,
            tm.model.name,
            tm.gpu.name,
        )

    def resident_blocks(self, among: Sequence[int]) -> frozenset[int]:
        """The hashes of ``among`` whose blocks are in its GPU pool's prefix cache now."""
        return self._pool.cached_hashes(among)

    def record(self) -> RunRecord:
        """The run so far as a :class:`RunRecord` (with the shared recorder's per-request
        arrays and this server's own memory series)."""
        engine, step, residency = self._engine, self._step, self._residency
        return self._rec.record(
            capacity_tokens=engine._capacity,
            eviction_budget=engine._budget,
            bytes_per_token=engine._timing.kv_bytes_per_token,
            iterations=step.step,
            end_time=step.now,
            evicted_tokens=residency.evicted,
            eviction_rounds=residency.rounds,
            attention_recall=residency.attention_recall,
            series=self._series,
        )
