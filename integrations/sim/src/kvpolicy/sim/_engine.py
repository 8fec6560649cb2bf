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

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel import BlockPool, Request, rechunk_hashes
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
from kvpolicy.sim._step import Step
from kvpolicy.sim._timing import TimingModel
from kvpolicy.tenancy import RefreshConfig

__all__ = ["Engine", "RunRecord", "pool_capacity_tokens"]

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

    def _hashes(self, request: Request) -> tuple[int, ...]:
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
                self._hashes(r)  # raises, naming the request and both sizes
        rejected = self.check_fits(reqs)
        return self._loop(reqs, arrivals, rejected, progress, max_time)

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
        cfg, tm, stack = self._cfg, self._timing, self._stack
        rec = Recorder(reqs, rejected, rejected & self.too_long(reqs))
        pool = BlockPool(
            self._capacity // cfg.block_size,
            cfg.block_size,
            enable_prefix_caching=cfg.prefix_caching,
            record_dropped=stack.prefix_store is not None,
        )
        residency: Residency = KeepAll()
        if stack.eviction is not None:
            assert self._budget is not None
            residency = Evicting(
                stack.eviction, self._budget, self._ev_cfg, self._attention, self._seed, pool
            )
        batch = Batch(
            cfg,
            pool,
            residency,
            rec,
            tm,
            stack.admission,
            stack.preemption,
            self._pre_cfg,
            stack.prefix_store,
        )
        door = FrontDoor(reqs, arrivals, rec, stack.gate, self._gw_cfg, self._refresh)
        observer = batch.observer

        def on_finish(s: Seq, now: float, iteration: int) -> None:
            rec.finished(s.idx, now, iteration)
            door.release(s.idx, now)
            if observer is not None:
                observer.observe_completion(s.req, now)

        step = Step(cfg, tm, batch, residency, on_finish)
        n = len(reqs)
        report_every = max(1, n // 200)
        last_report = -1
        if progress is not None:
            progress(0, n)
        while rec.done < n:
            if max_time is not None and step.now > max_time:
                break
            if batch.idle:
                nxt = door.next_event()
                if nxt == np.inf:
                    break
                step.now = max(step.now, nxt)
            for i in door.arrive(step.now):
                batch.waiting.append(Seq(i, reqs[i], self._hashes(reqs[i])))
            preempted, budget, reserve = step.prepare()
            if preempted:
                budget = 0  # vLLM admits no new request in an iteration that preempts
            batch.admit(step.now, step.step, budget, reserve)
            if not batch.running:
                if batch.waiting or batch.swapped:
                    raise SimError(
                        f"nothing runs at t={step.now:.3f}s with {len(batch.waiting)} waiting: "
                        "the admission policy admitted none into an empty batch"
                    )
                continue
            started = step.now
            step.run(door.next_event(), rec.first_output)
            waiting = len(batch.waiting) + len(batch.swapped)
            rec.sample(
                step.now,
                batch.used_tokens(),
                residency.resident_now(batch.running),
                len(batch.running),
                waiting,
            )
            # Busy: requests wait, the batch is full, or the iteration used its whole token
            # budget (compute-bound prefill).
            busy = (
                waiting > 0
                or len(batch.running) >= cfg.max_batch
                or step.last_tokens >= cfg.token_budget
            )
            door.server_iteration(started, step.now, busy)
            batch.offload(step.now)
            if progress is not None and rec.done // report_every != last_report:
                last_report = rec.done // report_every
                progress(rec.done, n)
        if progress is not None:
            progress(rec.done, n)
        return rec.record(
            capacity_tokens=self._capacity,
            eviction_budget=self._budget,
            bytes_per_token=tm.kv_bytes_per_token,
            iterations=step.step,
            end_time=step.now,
            evicted_tokens=residency.evicted,
            eviction_rounds=residency.rounds,
            attention_recall=residency.attention_recall,
        )
