"""Iteration-level continuous batching over a paged KV pool, like vLLM's scheduler.

One iteration, in order::

    arrivals (and clients' retries) -> the gateway, if one runs in front: admitted requests
        join the waiting queue; a denied one (429) comes back after its Retry-After, until
        its client gives up
    swapped requests resume (blocks permitting), then the admission policy says how many
        waiting requests join; each must get blocks for its prompt (prefix-cache hits are
        shared), else admission stops at it (vLLM's head-of-line rule)
    every decoding request needs one more KV slot; if the pool cannot give them, the
        preemption policy orders the running requests and the first ones are preempted
        (recomputation: KV dropped, request back at the head of the queue; or swap to a CPU
        tier at PCIe speed) until the rest fit
    prefill chunks fill the token budget left after one token per decoding request
    the roofline gives the iteration's time; tokens are produced; finished requests free
        their blocks (full prompt blocks stay cached for reuse, least-recently freed first)
    every ``interval`` iterations the eviction policy observes the attention each resident
        token received and evicts down to its budget; evicted tokens leave the pool
    cached prompt blocks the pool reuses for other content are offered to the prefix store
        (DRAM/disk tiers), if one is given; a new prompt's blocks that HBM misses are looked
        up there and loaded at the tier's speed when that beats recomputing them

When only decoding requests run and the waiting queue is empty, nothing but KV growth
changes between iterations, so the engine advances ``k`` iterations at once, with ``k`` the
distance to the next arrival, completion, eviction round or block shortage. Each of those
``k`` iterations keeps its own roofline time, so the result equals ``k`` single steps.

The engine holds no policy: gateway, admission, eviction, preemption and the tiers below HBM
are Protocol calls. Without
an admission policy it admits while blocks last; without a preemption policy it preempts the
last admitted request first, as vLLM does; without an eviction policy it keeps every token.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import attrs
import numpy as np
from attrs import frozen
from numpy.typing import NDArray

from kvpolicy.kvmodel import (
    AdmissionPolicy,
    BlockPool,
    CompletionObserver,
    EvictionPolicy,
    PreemptionPolicy,
    PrefixStore,
    PromptObserver,
    Request,
    RequestGate,
    SchedulerState,
    SequenceView,
)
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._config import EngineConfig, EvictionConfig, GatewayConfig, PreemptionConfig
from kvpolicy.sim._errors import ConfigError, SimError
from kvpolicy.sim._timing import TimingModel

__all__ = ["Engine", "RunRecord", "pool_capacity_tokens"]

ProgressFn = Callable[[int, int], None]


@frozen(eq=False)
class RunRecord:
    """Everything one run measured: per-request times and a memory time series.

    Per-request arrays are indexed like the workload's requests; times are seconds and NaN
    where the event never happened (a rejected request has no first token).
    """

    requests: tuple[Request, ...]
    """The workload, in arrival order."""
    first_token: NDArray[np.float64]
    """(n,) float64 time of each request's first output token."""
    finish: NDArray[np.float64]
    """(n,) float64 time each request finished."""
    first_admitted: NDArray[np.float64]
    """(n,) float64 time each request first joined the running batch."""
    preemptions: NDArray[np.int64]
    """(n,) int64 times each request was preempted."""
    rejected: NDArray[np.bool_]
    """(n,) bool requests refused because they can never fit (context or memory)."""
    series_time: NDArray[np.float64]
    """(m,) float64 sample times (one per engine step)."""
    series_kv_tokens: NDArray[np.int64]
    """(m,) int64 KV slots held in used blocks (``used_blocks · block_size``)."""
    series_resident: NDArray[np.int64]
    """(m,) int64 tokens resident after token eviction."""
    series_running: NDArray[np.int64]
    """(m,) int64 running requests."""
    series_waiting: NDArray[np.int64]
    """(m,) int64 waiting requests."""
    capacity_tokens: int
    """KV pool size in tokens."""
    eviction_budget: int | None
    """Token eviction budget, ``None`` without eviction."""
    bytes_per_token: int
    """KV bytes of one token."""
    iterations: int
    """Engine iterations simulated."""
    end_time: float
    """Time the last request finished (or the run stopped)."""
    evicted_tokens: int
    """Tokens dropped by the eviction policy."""
    eviction_rounds: int
    """Calls to the eviction policy's ``evict``."""
    recomputed_tokens: int
    """Tokens computed again after preemption by recomputation."""
    swapped_tokens: int
    """Tokens moved to and from the CPU tier."""
    prefix_hit_tokens: int
    """Prompt tokens served from the prefix cache."""
    attention_recall: float
    """Mean share of the synthetic model's attention mass on resident tokens (1.0 without
    eviction)."""
    gate_denials: NDArray[np.int64]
    """(n,) int64 times the gateway denied each request (HTTP 429)."""
    gave_up: NDArray[np.bool_]
    """(n,) bool requests whose client stopped retrying after ``max_retries`` denials."""
    tier_hit_tokens: int = 0
    """Prompt tokens loaded from the tiers below HBM instead of recomputed."""
    tier_load_s: float = 0.0
    """Seconds spent loading them."""


def pool_capacity_tokens(timing: TimingModel, engine: EngineConfig) -> int:
    """Tokens of the KV pool (whole blocks) that ``engine`` gets for ``timing``'s model and GPU.

    Raises:
        ConfigError: the pool holds less than one block.
    """
    bs = engine.block_size
    cap = engine.kv_capacity_tokens
    if cap is None:
        from kvpolicy.kvmodel import kv_budget_bytes

        budget = kv_budget_bytes(timing.model, timing.gpu, engine.gpu_memory_utilization)
        cap = budget // timing.kv_bytes_per_token
    if cap // bs < 1:
        raise ConfigError(
            f"no KV memory: {timing.model.name} on {timing.gpu.name} at "
            f"gpu_memory_utilization={engine.gpu_memory_utilization} leaves {cap} tokens, "
            f"less than one block of {bs}"
        )
    return (cap // bs) * bs


class _Seq:
    """Engine-side state of one admitted (or preempted) request."""

    __slots__ = (
        "computed",
        "generated",
        "idx",
        "inserted",
        "observed_at",
        "order",
        "pool_reserved",
        "pool_tokens",
        "positions",
        "req",
        "rid",
        "target",
        "z",
        "z_cum",
    )

    def __init__(self, idx: int, req: Request) -> None:
        self.idx = idx
        self.req = req
        self.rid = req.request_id
        self.generated = 0  # output tokens produced
        self.target = req.prompt_len  # tokens to compute before the next output token
        self.computed = 0  # of ``target``, computed (or found cached)
        self.pool_tokens = 0  # tokens of KV held for this request in the block pool
        self.pool_reserved = 0  # tokens the pool has recorded: pool_tokens up to its block end
        self.order = 0  # admission counter (vLLM preempts the largest first)
        self.inserted = 0  # logical positions reported to the eviction policy
        self.observed_at = 0  # iteration of the last attention observation
        self.positions: NDArray[np.int64] = np.empty(0, dtype=np.int64)  # resident positions
        self.z: NDArray[np.float64] | None = None
        # z_cum[k] = sum(z[:k]): the heavy-hitter mass of the first k positions, for the
        # attention model's normaliser in O(1).
        self.z_cum: NDArray[np.float64] = np.zeros(1)

    @property
    def decoding(self) -> bool:
        return self.computed >= self.target

    @property
    def written(self) -> int:
        """Logical positions whose KV has been written (prompt computed, outputs fed back)."""
        if self.computed < self.target:
            return self.computed
        return self.req.prompt_len + self.generated - 1


class _WaitingView(Sequence[Request]):
    """The waiting queue as the admission policy sees it: requests, head first."""

    __slots__ = ("_q",)

    def __init__(self, q: deque[_Seq]) -> None:
        self._q = q

    def __len__(self) -> int:
        return len(self._q)

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Request]: ...
    def __getitem__(self, i: int | slice) -> Request | Sequence[Request]:
        if isinstance(i, slice):
            return [s.req for s in list(self._q)[i]]
        return self._q[i].req

    def __iter__(self) -> Iterator[Request]:
        return (s.req for s in self._q)


class Engine:
    """Continuous-batching simulator of one GPU serving one workload.

    Args:
        timing: the roofline time model (it fixes the model and the GPU).
        engine: engine limits.
        admission: how many waiting requests join each iteration, or ``None`` (admit while
            blocks last).
        eviction: token eviction policy, or ``None`` (keep every token).
        eviction_config: budget and cadence of eviction.
        preemption: order of preemption, or ``None`` (last admitted first).
        preemption_config: recomputation or swap, and the CPU tier.
        attention: synthetic attention-return model fed to the eviction policy.
        seed: seed of the heavy-hitter scores.
        gate: the gateway in front (429 + Retry-After), or ``None`` (every request enters).
        gateway_config: how the gateway's clients retry.
        prefix_store: KV prefix tiers below HBM, or ``None`` (blocks the prefix cache drops
            are lost).

    Raises:
        ConfigError: the KV pool holds less than one block, or the eviction budget is smaller
            than one iteration's token budget.
    """

    def __init__(
        self,
        timing: TimingModel,
        engine: EngineConfig,
        *,
        admission: AdmissionPolicy | None = None,
        eviction: EvictionPolicy | None = None,
        eviction_config: EvictionConfig | None = None,
        preemption: PreemptionPolicy | None = None,
        preemption_config: PreemptionConfig | None = None,
        attention: AttentionModel | None = None,
        seed: int = 0,
        gate: RequestGate | None = None,
        gateway_config: GatewayConfig | None = None,
        prefix_store: PrefixStore | None = None,
    ) -> None:
        if not isinstance(timing, TimingModel):
            raise TypeError(f"'timing' must be a TimingModel: {timing!r}")
        if not isinstance(engine, EngineConfig):
            raise TypeError(f"'engine' must be an EngineConfig: {engine!r}")
        for name, obj, proto in (
            ("admission", admission, AdmissionPolicy),
            ("eviction", eviction, EvictionPolicy),
            ("preemption", preemption, PreemptionPolicy),
            ("gate", gate, RequestGate),
            ("prefix_store", prefix_store, PrefixStore),
        ):
            if obj is not None and not isinstance(obj, proto):
                raise TypeError(f"'{name}' must implement {proto.__name__}: {obj!r}")
        self._timing = timing
        self._cfg = engine
        self._admission = admission
        self._eviction = eviction
        self._ev_cfg = eviction_config or EvictionConfig()
        self._preemption = preemption
        self._pre_cfg = preemption_config or PreemptionConfig()
        self._attention = attention or AttentionModel()
        self._seed = seed
        self._gate = gate
        self._gw_cfg = gateway_config or GatewayConfig()
        self._store = prefix_store
        bs = engine.block_size
        self._capacity = pool_capacity_tokens(timing, engine)
        self._num_blocks = self._capacity // bs
        self._budget: int | None = None
        if eviction is not None:
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
        total = np.fromiter((r.total_len for r in requests), dtype=np.int64, count=len(requests))
        prompt = np.fromiter((r.prompt_len for r in requests), dtype=np.int64, count=len(requests))
        bad = (total > limit) | (prompt + 1 > self._capacity)
        if len(requests) and bool(bad.all()):
            raise ConfigError(
                f"no request fits: the shortest needs {int(total.min())} tokens but "
                f"{self._timing.model.name} on {self._timing.gpu.name} holds at most {limit} "
                f"(KV pool {self._capacity} tokens, context {self._timing.model.max_context})"
            )
        return bad

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
            ConfigError: no request fits at all.
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
        rejected = self.check_fits(reqs)
        return _Run(self, reqs, arrivals, rejected, progress, max_time).execute()


class _Run:
    """The mutable state of one :meth:`Engine.run`."""

    def __init__(
        self,
        eng: Engine,
        reqs: tuple[Request, ...],
        arrivals: NDArray[np.float64],
        rejected: NDArray[np.bool_],
        progress: ProgressFn | None,
        max_time: float | None,
    ) -> None:
        self.e = eng
        self.cfg = eng._cfg
        self.tm = eng._timing
        self.reqs = reqs
        self.arrivals = arrivals
        self.rejected = rejected
        self.progress = progress
        self.max_time = max_time
        n = len(reqs)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.first_admitted = np.full(n, np.nan)
        self.preempt_count = np.zeros(n, dtype=np.int64)
        self.pool = BlockPool(
            eng._num_blocks,
            self.cfg.block_size,
            enable_prefix_caching=self.cfg.prefix_caching,
            record_dropped=eng._store is not None,
        )
        self.bs = self.cfg.block_size
        self.waiting: deque[_Seq] = deque()
        self.swapped: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.now = 0.0
        self.step = 0
        self.next_arrival = 0
        self.gate = eng._gate
        self.store = eng._store
        store: object = eng._store
        self.prompt_observer: PromptObserver | None = (
            store if isinstance(store, PromptObserver) else None
        )
        self.retries: list[tuple[float, int]] = []  # (time, request index): clients' retries
        self.denials = np.zeros(n, dtype=np.int64)
        self.gave_up = np.zeros(n, dtype=np.bool_)
        self.tier_hit = 0
        self.tier_load = 0.0
        self.admit_counter = 0
        self.done = 0
        self.total = n
        self.evicting = eng._eviction is not None
        self.budget = eng._budget
        self.interval = eng._ev_cfg.interval
        self.next_round = self.interval
        self.swap_used = 0
        self.pending_swap_time = 0.0
        self.rng = np.random.default_rng(eng._seed)
        self.counters = {
            "evicted": 0,
            "rounds": 0,
            "recomputed": 0,
            "swapped": 0,
            "prefix_hit": 0,
        }
        self.recall_sum = 0.0
        self.recall_n = 0
        self.series: list[tuple[float, int, int, int, int]] = []
        self.resident_total = 0  # tokens reported to the eviction policy and still resident
        self.pending = 0  # tokens written to running requests and not yet reported
        adm: object = eng._admission
        self.observer: CompletionObserver | None = (
            adm if isinstance(adm, CompletionObserver) else None
        )

    # ----------------------------------------------------------------------- helpers
    def used_tokens(self) -> int:
        return (self.pool.num_blocks - self.pool.num_free_blocks) * self.bs

    def resident_now(self) -> int:
        if self.evicting:
            return self.resident_total + self.pending
        return sum(s.pool_tokens for s in self.running)

    def views(self) -> tuple[SequenceView, ...]:
        # Every field comes from the engine's own checked state; validating each of the
        # batch's views at every iteration would cost more than the iteration itself.
        with attrs.validators.disabled():
            return self._views()

    def _views(self) -> tuple[SequenceView, ...]:
        return tuple(
            SequenceView(
                request_id=s.rid,
                prompt_len=s.req.prompt_len,
                generated=s.generated,
                kv_tokens=s.pool_tokens,
                tenant=s.req.tenant,
                priority=s.req.priority,
                arrival_time=s.req.arrival_time,
                admitted_time=float(self.first_admitted[s.idx]),
                computed_tokens=s.computed + (s.generated if s.decoding else 0),
            )
            for s in self.running
        )

    def sample(self) -> None:
        self.series.append(
            (
                self.now,
                self.used_tokens(),
                self.resident_now(),
                len(self.running),
                len(self.waiting) + len(self.swapped),
            )
        )

    def next_event(self) -> float:
        """Time of the next arrival or client retry (``inf`` when none is left)."""
        t = math.inf
        if self.next_arrival < len(self.reqs):
            t = float(self.arrivals[self.next_arrival])
        if self.retries and self.retries[0][0] < t:
            t = self.retries[0][0]
        return t

    def arrive(self) -> None:
        n = len(self.reqs)
        i = self.next_arrival
        while i < n and self.arrivals[i] <= self.now:
            if self.rejected[i]:
                self.done += 1
            elif self.gate is None:
                self.waiting.append(_Seq(i, self.reqs[i]))
            else:
                self._knock(i)
            i += 1
        self.next_arrival = i
        while self.retries and self.retries[0][0] <= self.now:
            self._knock(heapq.heappop(self.retries)[1])

    def _knock(self, i: int) -> None:
        """Request ``i`` reaches the gateway now (first arrival or a retry)."""
        assert self.gate is not None
        decision = self.gate.check(self.reqs[i], self.now)
        if decision.admitted:
            self.waiting.append(_Seq(i, self.reqs[i]))
            return
        self.denials[i] += 1
        if self.denials[i] > self.e._gw_cfg.max_retries:
            self.gave_up[i] = True
            self.done += 1
            return
        # A client honours Retry-After; a zero Retry-After is retried after min_backoff_s.
        wait = max(decision.retry_after, self.e._gw_cfg.min_backoff_s)
        heapq.heappush(self.retries, (self.now + wait, i))

    # -------------------------------------------------------------------- admission
    def _allocate(self, s: _Seq) -> bool:
        req = s.req
        if (
            self.prompt_observer is not None
            and req.prefix_hashes
            and math.isnan(self.first_admitted[s.idx])
        ):
            # A store that places blocks by prefix group learns the chain first.
            self.prompt_observer.observe_prompt(req.prefix_hashes, self.now)
        alloc = self.pool.allocate(s.rid, s.target, req.prefix_hashes)
        if alloc is None:
            return False
        s.pool_tokens = s.pool_reserved = s.target
        # The last token is always computed, to produce logits (as vLLM does).
        s.computed = min(alloc.cached_tokens, s.target - 1)
        self.counters["prefix_hit"] += s.computed
        if self.store is not None:
            self._offload()
            hbm = alloc.cached_tokens // self.bs
            full = min(len(req.prefix_hashes), s.target // self.bs)
            if hbm < full:
                # The blocks HBM missed, looked up below it; the pool has already
                # registered them as cached (they are being written now).
                got = self.store.fetch(req.prefix_hashes[hbm:full], self.now)
                loaded = min((hbm + got.blocks) * self.bs, s.target - 1) - s.computed
                start = s.computed
                pairs = loaded * start + loaded * (loaded + 1) // 2
                # Load only when the transfer beats recomputing the same tokens (a slow
                # disk can lose to a fast GPU); otherwise they are recomputed as usual.
                if loaded > 0 and got.seconds < self.tm.compute_time(loaded, pairs):
                    s.computed += loaded
                    self.tier_hit += loaded
                    self.tier_load += got.seconds
                    self.pending_swap_time += got.seconds
        return True

    def _offload(self) -> None:
        """Offer the prefix store the cached blocks the pool reused since the last call."""
        assert self.store is not None
        dropped = self.pool.pop_dropped_hashes()
        if dropped:
            self.store.offload(dropped, self.now)

    def _join(self, s: _Seq) -> None:
        s.order = self.admit_counter
        self.admit_counter += 1
        s.observed_at = self.step
        if math.isnan(self.first_admitted[s.idx]):
            self.first_admitted[s.idx] = self.now
        if self.evicting and s.z is None:
            s.z = self.e._attention.token_scores(self.rng, s.req.total_len)
            s.z_cum = np.concatenate(([0.0], np.cumsum(s.z)))
        self.running.append(s)
        if self.evicting and s.computed:
            self._insert(s, s.computed, from_pending=False)

    def admit(self) -> None:
        cap = self.cfg.max_batch
        # Swapped requests come back first, as in vLLM.
        while self.swapped and len(self.running) < cap:
            s = self.swapped[0]
            if self.pool.allocate(s.rid, s.pool_tokens) is None:
                return
            s.pool_reserved = s.pool_tokens
            self.swapped.popleft()
            self.swap_used -= s.pool_tokens
            self.counters["swapped"] += s.pool_tokens
            self.pending_swap_time += self.tm.transfer_time(
                s.pool_tokens, self.e._pre_cfg.pcie_bandwidth
            )
            s.order = self.admit_counter
            self.admit_counter += 1
            s.observed_at = self.step
            self.running.append(s)
            if self.evicting:
                self._reinsert(s)
        if not self.waiting or self.swapped:
            return
        if self.e._admission is None:
            n = len(self.waiting)
        else:
            state = SchedulerState(
                step=self.step,
                time=self.now,
                used_tokens=min(self.used_tokens(), self.e._capacity),
                capacity_tokens=self.e._capacity,
                running=self.views(),
            )
            n = self.e._admission.admit(state, _WaitingView(self.waiting))
            if isinstance(n, bool) or not isinstance(n, int | np.integer):
                raise SimError(f"admission policy returned a non-integer count: {n!r}")
            if not 0 <= n <= len(self.waiting):
                raise SimError(f"admission policy returned {n}, outside [0, {len(self.waiting)}]")
        for _ in range(int(n)):
            if len(self.running) >= cap:
                break
            s = self.waiting[0]
            if not self._allocate(s):
                break
            self.waiting.popleft()
            self._join(s)

    # ------------------------------------------------------------------- preemption
    def _order(self) -> list[_Seq]:
        by_id = {s.rid: s for s in self.running}
        if self.e._preemption is None:
            return sorted(self.running, key=lambda s: -s.order)
        ids = self.e._preemption.order(self.views())
        out = []
        for rid in ids:
            s = by_id.pop(rid, None)
            if s is None:
                raise SimError(f"preemption policy ordered an unknown or repeated id {rid!r}")
            out.append(s)
        return out

    def preempt_until(self, fits: Callable[[], bool]) -> None:
        """Preempt running requests in policy order until ``fits()`` holds."""
        if fits():
            return
        for s in self._order():
            self._preempt(s)
            if fits():
                return

    def _preempt(self, s: _Seq) -> None:
        if self.evicting:
            assert self.e._eviction is not None
            self._insert(s, s.written)
            self.e._eviction.remove(s.rid)
        self.running.remove(s)
        self.preempt_count[s.idx] += 1
        cfg = self.e._pre_cfg
        swap_bytes = s.pool_tokens * self.tm.kv_bytes_per_token
        if (
            cfg.mode == "swap"
            and s.decoding
            and self.swap_used * self.tm.kv_bytes_per_token + swap_bytes <= cfg.cpu_swap_bytes
        ):
            self.pool.free(s.rid)
            self.swap_used += s.pool_tokens
            self.counters["swapped"] += s.pool_tokens
            self.pending_swap_time += self.tm.transfer_time(s.pool_tokens, cfg.pcie_bandwidth)
            if self.evicting:
                self.resident_total -= len(s.positions)
            self.swapped.appendleft(s)
            return
        self.pool.free(s.rid)
        if self.evicting:
            self.resident_total -= len(s.positions)
        # Recomputation: the prompt and every output fed back so far are computed again.
        lost = s.computed + (s.generated if s.decoding else 0)
        self.counters["recomputed"] += lost
        if cfg.mode == "restart":
            s.generated = 0  # the outputs are lost too: decode starts over
        s.target = s.req.prompt_len + s.generated
        s.computed = 0
        s.pool_tokens = s.pool_reserved = 0
        s.inserted = 0
        s.positions = np.empty(0, dtype=np.int64)
        self.waiting.appendleft(s)

    # --------------------------------------------------------------------- eviction
    def _insert(self, s: _Seq, upto: int, *, from_pending: bool = True) -> None:
        """Report logical positions ``s.inserted .. upto`` to the eviction policy."""
        ev = self.e._eviction
        assert ev is not None
        assert s.z is not None
        if upto <= s.inserted:
            return
        pos = np.arange(s.inserted, upto, dtype=np.int64)
        ev.insert(s.rid, pos, self._signals(s, pos, upto))
        s.positions = np.concatenate((s.positions, pos)) if len(s.positions) else pos
        self.resident_total += len(pos)
        if from_pending:
            self.pending -= len(pos)
        s.inserted = upto

    def _signals(self, s: _Seq, pos: NDArray[np.int64], length: int) -> NDArray[np.float64]:
        """(n, 1) predicted return of each token (the role of seed 000's predictor): the
        heavy-hitter attention the synthetic model expects it to draw from a query at
        ``length``, without the recency and sink terms that fade or do not apply."""
        assert s.z is not None
        am = self.e._attention
        n = max(length, 1)
        norm = am.normaliser(n, float(s.z_cum[n]))
        out: NDArray[np.float64] = (am.body_weight(n) * s.z[pos] / norm)[:, None]
        return out

    def _reinsert(self, s: _Seq) -> None:
        ev = self.e._eviction
        assert ev is not None
        assert s.z is not None
        pos = s.positions
        if len(pos):
            ev.insert(s.rid, pos, self._signals(s, pos, s.inserted))
        self.resident_total += len(pos)

    def eviction_round(self, growth: int) -> None:
        """Observe attention since the last round, then evict to ``budget - growth``."""
        ev = self.e._eviction
        assert ev is not None
        assert self.budget is not None
        am = self.e._attention
        for s in self.running:
            self._insert(s, s.written)
        for s in self.running:
            steps = self.step - s.observed_at
            if steps <= 0 or not len(s.positions):
                continue
            assert s.z is not None
            length = s.inserted
            w = am.weights(s.positions, length, s.z)
            norm = am.normaliser(length, float(s.z_cum[length]))
            kept = float(w.sum()) / norm
            self.recall_sum += kept * steps
            self.recall_n += steps
            ev.observe(s.rid, s.positions, w * (steps / norm))
            s.observed_at = self.step
        target = max(0, self.budget - growth)
        evicted = ev.evict(target)
        self.counters["rounds"] += 1
        by_id = {s.rid: s for s in self.running}
        for rid, pos in evicted.items():
            seq = by_id.get(rid)
            if seq is None or not len(pos):
                continue
            keep = ~np.isin(seq.positions, pos, assume_unique=True)
            dropped = int(len(seq.positions) - keep.sum())
            seq.positions = seq.positions[keep]
            self.resident_total -= dropped
            self.counters["evicted"] += dropped
            self._shrink(seq)
        resident = ev.resident_tokens()
        if resident > target:
            raise SimError(
                f"eviction policy left {resident} tokens resident, over its budget {target}"
            )
        self.next_round = self.step + self.interval

    def _shrink(self, s: _Seq) -> None:
        """Release the blocks of evicted tokens (the cache is compacted, as a paged
        eviction kernel does); a token written but not yet reported stays held."""
        # Prompt blocks allocated but not yet computed stay held.
        want = len(s.positions) + (s.target - s.computed if not s.decoding else 0)
        if want >= s.pool_tokens:
            return
        if self.pool.num_free_blocks == 0:
            # No block to copy a shared partial block into: stop at a block boundary.
            want = -(-want // self.bs) * self.bs
            if want >= s.pool_tokens:
                return
        if want < s.pool_reserved:
            self.pool.truncate(s.rid, want)
            s.pool_reserved = want
        s.pool_tokens = want

    def grow(self, s: _Seq, k: int) -> None:
        """Add ``k`` tokens of KV to ``s``. The pool is told a block at a time: it records
        tokens up to the end of the last block, so one call serves ``block_size`` decode
        steps; its block count (the memory) is the same as with one call per token."""
        new = s.pool_tokens + k
        if new > s.pool_reserved:
            end = -(-new // self.bs) * self.bs
            ok = self.pool.append(s.rid, end - s.pool_reserved)
            assert ok, "blocks were counted before the step"
            s.pool_reserved = end
        s.pool_tokens = new

    # -------------------------------------------------------------------- iteration
    def finish_seq(self, s: _Seq) -> None:
        self.finish[s.idx] = self.now
        self.pool.free(s.rid)
        if self.gate is not None:
            self.gate.release(s.req, self.now)
        if self.evicting:
            assert self.e._eviction is not None
            if s.inserted:  # a stream the policy never saw needs no removal
                self.e._eviction.remove(s.rid)
            self.resident_total -= len(s.positions)
            self.pending -= s.written - s.inserted
        self.done += 1
        if self.observer is not None:
            self.observer.observe_completion(s.req, self.now)

    def headroom(self, batch: int) -> int:
        """Tokens left free below the budget at a round, for growth until the next one."""
        assert self.budget is not None
        return min(batch * self.e._ev_cfg.evict_ahead, self.budget // 4)

    def blocks_for(self, seqs: Sequence[_Seq], k: int) -> int:
        bs = self.bs
        return sum(-(-(s.pool_tokens + k) // bs) - (-(-s.pool_tokens // bs)) for s in seqs)

    def mixed_step(self) -> None:
        """One iteration with prefill chunks (and any decodes)."""
        self.preempt_until(
            lambda: (
                self.blocks_for([s for s in self.running if s.decoding], 1)
                <= self.pool.num_free_blocks
            )
        )
        dec = [s for s in self.running if s.decoding]
        budget = self.cfg.token_budget - len(dec)
        chunks: list[tuple[_Seq, int]] = []
        for s in self.running:
            if s.decoding or budget <= 0:
                continue
            c = min(s.target - s.computed, budget)
            budget -= c
            chunks.append((s, c))
        if self.evicting and self.budget is not None:
            growth = len(dec) + sum(c for _, c in chunks)
            over = self.resident_total + self.pending + growth > self.budget
            if self.step >= self.next_round or over:
                self.eviction_round(growth + self.headroom(len(self.running)))
        n_tok = len(dec) + sum(c for _, c in chunks)
        kv_read = sum(s.pool_tokens for s in self.running)
        pairs = sum(s.pool_tokens for s in dec) + sum(
            c * s.computed + c * (c + 1) // 2 for s, c in chunks
        )
        for s in dec:
            self.grow(s, 1)
        dt = self.tm.iteration_time(n_tok, kv_read, pairs) + self.pending_swap_time
        self.pending_swap_time = 0.0
        self.now += dt
        self.step += 1
        finished: list[_Seq] = []
        self.pending += len(dec) if self.evicting else 0
        for s, c in chunks:
            s.computed += c
            if self.evicting:
                self.pending += c
            if s.decoding:
                s.generated += 1
                if math.isnan(self.first_token[s.idx]):
                    self.first_token[s.idx] = self.now
                if s.generated >= s.req.decode_len:
                    finished.append(s)
        for s in dec:
            s.generated += 1
            if s.generated >= s.req.decode_len:
                finished.append(s)
        self._retire(finished)

    def _retire(self, finished: list[_Seq]) -> None:
        if not finished:
            return
        gone = set()
        for s in finished:
            self.finish_seq(s)
            gone.add(id(s))
        self.running = [s for s in self.running if id(s) not in gone]

    def decode_steps(self) -> None:
        """``k >= 1`` decode-only iterations of an unchanged batch."""
        run = self.running
        free = self.pool.num_free_blocks
        if self.blocks_for(run, 1) > free:
            self.preempt_until(
                lambda: self.blocks_for(self.running, 1) <= self.pool.num_free_blocks
            )
            run = self.running
            free = self.pool.num_free_blocks
            kmax = 1
            if not run:
                return
        else:
            kmax = self.cfg.max_macro_steps
        if self.waiting or self.swapped or self.pending_swap_time:
            kmax = 1
        remaining = min(s.req.decode_len - s.generated for s in run)
        kmax = min(kmax, remaining)
        if self.evicting and self.budget is not None:
            room = self.budget - self.resident_total - self.pending
            if self.step >= self.next_round or room < len(run):
                self.eviction_round(len(run) + self.headroom(len(run)))
                room = self.budget - self.resident_total - self.pending
            kmax = min(kmax, max(1, self.next_round - self.step), max(1, room // len(run)))
        if kmax > 1:
            lo, hi = 1, kmax  # largest k whose blocks fit
            if self.blocks_for(run, hi) > free:
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if self.blocks_for(run, mid) <= free:
                        lo = mid
                    else:
                        hi = mid - 1
                kmax = lo
        kv = sum(s.pool_tokens for s in run)
        times = self.tm.decode_times(len(run), kv, kv, kmax)
        if self.pending_swap_time:
            times[0] += self.pending_swap_time
            self.pending_swap_time = 0.0
        k = kmax
        nxt = self.next_event()
        if nxt < math.inf and kmax > 1:
            ends = self.now + np.cumsum(times)
            # Stop at the first iteration that ends at or after the next arrival or retry.
            k = min(kmax, int(np.searchsorted(ends, nxt)) + 1)
        self.now += float(times[:k].sum())
        self.step += k
        if self.evicting:
            self.pending += len(run) * k
        finished: list[_Seq] = []
        for s in run:
            self.grow(s, k)
            s.generated += k
            if s.generated >= s.req.decode_len:
                finished.append(s)
        self._retire(finished)

    # -------------------------------------------------------------------------- loop
    def execute(self) -> RunRecord:
        n = len(self.reqs)
        report_every = max(1, n // 200)
        last_report = -1
        if self.progress is not None:
            self.progress(0, n)
        while self.done < n:
            if self.max_time is not None and self.now > self.max_time:
                break
            if not self.running and not self.waiting and not self.swapped:
                nxt = self.next_event()
                if nxt == math.inf:
                    break
                self.now = max(self.now, nxt)
            self.arrive()
            self.admit()
            if not self.running:
                if self.waiting or self.swapped:
                    raise SimError(
                        f"nothing runs at t={self.now:.3f}s with {len(self.waiting)} waiting: "
                        "the admission policy admitted none into an empty batch"
                    )
                continue
            if all(s.decoding for s in self.running):
                self.decode_steps()
            else:
                self.mixed_step()
            self.sample()
            if self.store is not None:
                self._offload()
            if self.progress is not None and self.done // report_every != last_report:
                last_report = self.done // report_every
                self.progress(self.done, n)
        if self.progress is not None:
            self.progress(self.done, n)
        series = np.array(self.series, dtype=np.float64).reshape(-1, 5)
        return RunRecord(
            requests=self.reqs,
            first_token=self.first_token,
            finish=self.finish,
            first_admitted=self.first_admitted,
            preemptions=self.preempt_count,
            rejected=self.rejected,
            series_time=series[:, 0].copy(),
            series_kv_tokens=series[:, 1].astype(np.int64),
            series_resident=series[:, 2].astype(np.int64),
            series_running=series[:, 3].astype(np.int64),
            series_waiting=series[:, 4].astype(np.int64),
            capacity_tokens=self.e._capacity,
            eviction_budget=self.budget,
            bytes_per_token=self.tm.kv_bytes_per_token,
            iterations=self.step,
            end_time=self.now,
            evicted_tokens=self.counters["evicted"],
            eviction_rounds=self.counters["rounds"],
            recomputed_tokens=self.counters["recomputed"],
            swapped_tokens=self.counters["swapped"],
            prefix_hit_tokens=self.counters["prefix_hit"],
            attention_recall=self.recall_sum / self.recall_n if self.recall_n else 1.0,
            gate_denials=self.denials,
            gave_up=self.gave_up,
            tier_hit_tokens=self.tier_hit,
            tier_load_s=self.tier_load,
        )
