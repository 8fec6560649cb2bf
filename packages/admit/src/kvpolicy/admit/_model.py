"""The discrete-time model of seed 002 §2.2: execute, arrive, evict, admit.

Two variants share one loop. In *fluid* mode request masses are real numbers (the theory);
in *integer* mode requests are whole and admission goes through a real
:class:`~kvpolicy.kvmodel.AdmissionPolicy` fed with :class:`~kvpolicy.kvmodel.SchedulerState`
and the waiting queue, exactly as a server would call it.

The active state is kept as a ring buffer ``ring[k, t mod L]`` of the class-``k`` mass
admitted at iteration ``t`` and still alive; stage ``j`` at iteration ``n`` is column
``(head - j) mod L``, so executing a step moves ``head`` instead of copying the state:

    stage:    0       1       2     ...   L-1
    column: head  head-1  head-2  ...  head-L+1   (mod L)

The memory in use is updated incrementally (every survivor grows one token, every finished
request frees ``l0 + l1``), so one iteration costs ``O(K)`` numpy work unless it evicts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

import numpy as np
from attrs import field, frozen
from attrs.validators import ge
from numpy.typing import NDArray

from kvpolicy.admit._analysis import eviction_free_rate, stage_weights
from kvpolicy.admit._policies import GreedyAdmission, RateLimitedAdmission, RequestClass
from kvpolicy.admit._workload import StabilityWorkload
from kvpolicy.kvmodel import AdmissionPolicy, CompletionObserver, Request, SchedulerState

__all__ = [
    "ModelResult",
    "PoissonArrivals",
    "SaturatedArrivals",
    "TraceArrivals",
    "simulate_model",
]


@frozen
class SaturatedArrivals:
    """An infinite backlog (§2.3): admission is limited only by memory and the policy."""


@frozen
class PoissonArrivals:
    """Poisson arrivals at ``rate`` requests per iteration, classes drawn from the mix (§6.1)."""

    rate: float = field(converter=float, validator=ge(0.0))
    """Mean arrivals per iteration."""

    def __attrs_post_init__(self) -> None:
        if not math.isfinite(self.rate):
            raise ValueError(f"'rate' must be finite: {self.rate!r}")


def _int_tuple(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@frozen
class TraceArrivals:
    """Replay of a trace: request ``i`` arrives at iteration ``steps[i]`` in class ``classes[i]``.

    Build it with :meth:`from_requests`, which also returns the matching :class:`StabilityWorkload`.
    """

    steps: tuple[int, ...] = field(converter=_int_tuple)
    """Arrival iteration of each request (non-decreasing)."""
    classes: tuple[int, ...] = field(converter=_int_tuple)
    """Class index of each request in the workload."""

    def __attrs_post_init__(self) -> None:
        if len(self.steps) != len(self.classes):
            raise ValueError(
                f"'classes' must have one entry per arrival ({len(self.steps)}): "
                f"{len(self.classes)} given"
            )
        if any(b < a for a, b in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError("'steps' must be non-decreasing")
        if self.steps and self.steps[0] < 0:
            raise ValueError(f"'steps' must be non-negative: {self.steps[0]!r}")

    @classmethod
    def from_requests(
        cls, requests: Sequence[Request], iteration_s: float, memory: int
    ) -> tuple[TraceArrivals, StabilityWorkload]:
        """Arrivals and workload of ``requests``, one iteration lasting ``iteration_s`` seconds."""
        if not (iteration_s > 0 and math.isfinite(iteration_s)):
            raise ValueError(f"'iteration_s' must be positive: {iteration_s!r}")
        workload = StabilityWorkload.from_requests(requests, memory)
        pairs = zip(workload.input_lens, workload.decode_lens, strict=True)
        index = {pair: k for k, pair in enumerate(pairs)}
        ordered = sorted(requests, key=lambda r: r.arrival_time)
        t0 = ordered[0].arrival_time
        steps = tuple(int((r.arrival_time - t0) // iteration_s) for r in ordered)
        classes = tuple(index[(r.prompt_len, r.decode_len)] for r in ordered)
        return cls(steps=steps, classes=classes), workload


Arrivals = SaturatedArrivals | PoissonArrivals | TraceArrivals


@frozen(eq=False)
class ModelResult:
    """Per-iteration series of one run; each array is (steps,) float64."""

    workload: StabilityWorkload
    """The simulated workload."""
    mode: str
    """``"fluid"`` or ``"integer"``."""
    policy: str
    """Name of the admission rule."""
    memory: NDArray[np.float64]
    """Tokens in use after admission (``M^{n+1}``)."""
    admitted: NDArray[np.float64]
    """Requests (mass) admitted."""
    evicted: NDArray[np.float64]
    """Requests (mass) evicted."""
    completed: NDArray[np.float64]
    """Requests (mass) completed (``D^n``)."""
    queue: NDArray[np.float64]
    """Waiting requests after admission (0 under saturated input)."""
    stages: NDArray[np.float64] | None
    """(steps, L) float64 stage totals after admission, when recorded."""

    @property
    def steps(self) -> int:
        """Number of iterations."""
        return int(self.memory.size)

    @property
    def throughput(self) -> float:
        """Completions per iteration over the whole run."""
        return float(self.completed.sum() / max(self.steps, 1))

    @property
    def steady_throughput(self) -> float:
        """Completions per iteration over the second half of the run."""
        half = self.completed[self.steps // 2 :]
        return float(half.mean()) if half.size else 0.0

    @property
    def evictions(self) -> float:
        """Total evicted requests (mass)."""
        return float(self.evicted.sum())

    @property
    def eviction_rate(self) -> float:
        """Evictions per iteration."""
        return self.evictions / max(self.steps, 1)

    @property
    def queue_growth(self) -> float:
        """Least-squares slope of the queue over the second half, requests per iteration."""
        half = self.queue[self.steps // 2 :]
        if half.size < 2:
            return 0.0
        x = np.arange(half.size, dtype=np.float64)
        return float(np.polyfit(x, half, 1)[0])

    def summary(self) -> dict[str, float | int | str]:
        """The headline figures as a JSON-ready dictionary."""
        return {
            "mode": self.mode,
            "policy": self.policy,
            "steps": self.steps,
            "throughput": self.throughput,
            "steady_throughput": self.steady_throughput,
            "evictions": self.evictions,
            "eviction_rate": self.eviction_rate,
            "mean_queue": float(self.queue.mean()) if self.steps else 0.0,
            "final_queue": float(self.queue[-1]) if self.steps else 0.0,
            "queue_growth": self.queue_growth,
            "peak_memory": float(self.memory.max()) if self.steps else 0.0,
        }


class _Engine:
    """State of one run; the public entry point is :func:`simulate_model`."""

    def __init__(self, workload: StabilityWorkload, integer: bool) -> None:
        self.w = workload
        self.k = workload.num_classes
        self.length = workload.max_decode_len
        self.l0 = np.asarray(workload.input_lens, dtype=np.float64)
        self.l1 = np.asarray(workload.decode_lens, dtype=np.int64)
        self.mix = np.asarray(workload.mix)
        self.weights = stage_weights(workload)  # (K, L)
        self.ring: NDArray[Any] = np.zeros(
            (self.k, self.length), dtype=np.int64 if integer else np.float64
        )
        self.head = 0
        self.used = 0.0
        self.alive: NDArray[Any] = np.zeros(self.k, dtype=self.ring.dtype)
        self.rows = np.arange(self.k)
        self.stage_index = np.arange(self.length)
        self.l0_plus_1 = self.l0 + 1.0

    def stage_view(self) -> NDArray[np.float64]:
        """(K, L) mass by class and stage."""
        cols = (self.head - np.arange(self.length)) % self.length
        view: NDArray[np.float64] = self.ring[:, cols].astype(np.float64)
        return view

    def recount(self) -> None:
        self.used = float(np.sum(self.weights * self.stage_view()))

    def execute(self) -> NDArray[Any]:
        cols = (self.head - (self.l1 - 1)) % self.length
        done = self.ring[self.rows, cols]
        self.ring[self.rows, cols] = 0
        self.alive = self.alive - done
        self.used += float(self.alive.sum()) - float(np.dot(done, self.l0 + self.l1))
        self.head = (self.head + 1) % self.length
        return done

    def overflow(self) -> float:
        return self.used - self.w.memory

    def evict_fluid(self) -> NDArray[Any]:
        """Least-progressed-first, proportional within the partially evicted stage.

        Column ``c`` holds stage ``(head - c) mod L``, so its memory is
        ``sum_k ring[k, c] (l0,k + 1) + stage(c) sum_k ring[k, c]`` (entries past a class's
        decode length are always zero): one (K,) x (K, L) product, no state reordering.
        """
        excess = self.overflow()
        order = (self.head - self.stage_index) % self.length  # columns, youngest first
        cols = self.ring[:, order]
        per_stage = self.l0_plus_1 @ cols + self.stage_index * cols.sum(axis=0)
        cum = np.cumsum(per_stage)
        j = min(int(np.searchsorted(cum, excess * (1 - 1e-12))), self.length - 1)
        before = float(cum[j - 1]) if j > 0 else 0.0
        fraction = min(1.0, (excess - before) / per_stage[j]) if per_stage[j] > 0 else 1.0
        removed = cols[:, :j].sum(axis=1) + fraction * cols[:, j]
        self.ring[:, order[:j]] = 0.0
        self.ring[:, order[j]] = cols[:, j] * (1.0 - fraction)
        self.alive = self.alive - removed
        self.used -= before + fraction * float(per_stage[j])
        return np.asarray(removed, dtype=np.float64)

    def evict_integer(self) -> NDArray[np.int64]:
        """Least-progressed-first; within a stage, classes evicted in proportion to occupancy."""
        excess = self.overflow()
        order = (self.head - self.stage_index) % self.length  # columns, youngest first
        cols = self.ring[:, order]
        per_stage = self.l0_plus_1 @ cols + self.stage_index * cols.sum(axis=0)
        cum = np.cumsum(per_stage)
        # Stages before j go entirely; stage j frees the rest of the excess.
        j = min(int(np.searchsorted(cum, excess)), self.length - 1)
        removed = cols[:, :j].sum(axis=1)
        self.ring[:, order[:j]] = 0
        left = excess - (float(cum[j - 1]) if j > 0 else 0.0)
        freed = float(cum[j - 1]) if j > 0 else 0.0
        counts = cols[:, j]
        total = int(counts.sum())
        if left > 0 and total > 0:
            weights = self.weights[:, j]
            held = float(per_stage[j])
            # Proportional split: the floor of each class's share of the tokens to free,
            # then one request at a time, the class furthest below its share first.
            taken = np.minimum(np.floor(counts * (left / held)).astype(np.int64), counts)
            left -= float(np.dot(taken, weights))
            while left > 0 and taken.sum() < total:
                target = (taken.sum() + 1) * counts / total
                k = int(np.argmax(np.where(taken < counts, target - taken, -np.inf)))
                taken[k] += 1
                left -= weights[k]
            self.ring[:, order[j]] = counts - taken
            removed = removed + taken
            freed += float(np.dot(taken, weights))
        self.alive = self.alive - removed
        self.used -= freed
        return np.asarray(removed, dtype=np.int64)

    def add(self, masses: NDArray[Any]) -> None:
        self.ring[:, self.head] += masses
        self.alive = self.alive + masses
        self.used += float(np.dot(masses, self.l0 + 1.0))


def simulate_model(
    workload: StabilityWorkload,
    *,
    steps: int,
    arrivals: Arrivals | None = None,
    policy: Literal["greedy", "rate-limited"] | AdmissionPolicy = "greedy",
    mode: Literal["fluid", "integer"] = "fluid",
    initial: NDArray[np.float64] | None = None,
    seed: int = 0,
    record_stages: bool = False,
) -> ModelResult:
    """Run the model of §2.2 for ``steps`` iterations.

    Args:
        workload: classes, mix and memory ``M``.
        steps: iterations to run.
        arrivals: saturated input (default), Poisson or a trace replay.
        policy: ``"greedy"`` (the baseline), ``"rate-limited"`` (cap ``x*``, §5.1; in integer
            mode :class:`RateLimitedAdmission` with the known mix), or, in integer mode, any
            :class:`~kvpolicy.kvmodel.AdmissionPolicy` (a
            :class:`~kvpolicy.kvmodel.CompletionObserver` also sees the completions).
        mode: ``"fluid"`` masses or ``"integer"`` requests.
        initial: optional (K, L) float64 active state ``X^0`` by class and stage (integers in
            integer mode); its memory must not exceed ``M``.
        seed: seed of the arrival and class draws.
        record_stages: keep the (steps, L) stage totals (for limit-cycle detection).

    Returns:
        The per-iteration series.
    """
    if not isinstance(workload, StabilityWorkload):
        raise TypeError(f"'workload' must be a StabilityWorkload: {workload!r}")
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"'steps' must be an int: {steps!r}")
    if steps <= 0:
        raise ValueError(f"'steps' must be positive: {steps!r}")
    if mode not in ("fluid", "integer"):
        raise ValueError(f"'mode' must be 'fluid' or 'integer': {mode!r}")
    arrivals = SaturatedArrivals() if arrivals is None else arrivals
    if not isinstance(arrivals, SaturatedArrivals | PoissonArrivals | TraceArrivals):
        raise TypeError(f"'arrivals' must be Saturated/Poisson/TraceArrivals: {arrivals!r}")
    if (
        isinstance(arrivals, TraceArrivals)
        and arrivals.classes
        and (max(arrivals.classes) >= workload.num_classes or min(arrivals.classes) < 0)
    ):
        raise ValueError("'arrivals' classes must index the workload's classes")
    if isinstance(policy, str):
        if policy not in ("greedy", "rate-limited"):
            raise ValueError(f"'policy' must be 'greedy' or 'rate-limited': {policy!r}")
    elif mode == "fluid":
        raise ValueError("'policy' objects need mode='integer'; fluid mode takes a name")
    elif not isinstance(policy, AdmissionPolicy):
        raise TypeError(f"'policy' must be a name or an AdmissionPolicy: {policy!r}")
    integer = mode == "integer"
    engine = _Engine(workload, integer)
    if initial is not None:
        state = np.asarray(initial, dtype=np.float64)
        if state.shape != (engine.k, engine.length):
            raise ValueError(
                f"'initial' must have shape {(engine.k, engine.length)}: {state.shape}"
            )
        if np.any(state < 0) or np.any((engine.weights == 0) & (state != 0)):
            raise ValueError("'initial' must be non-negative and empty past each decode length")
        if integer and not np.all(state == np.round(state)):
            raise ValueError("'initial' must hold whole requests in integer mode")
        if float(np.sum(engine.weights * state)) > workload.memory * (1 + 1e-12):
            raise ValueError("'initial' must fit in 'memory'")
        for j in range(engine.length):
            engine.ring[:, (-j) % engine.length] = state[:, j]
        engine.alive = engine.ring.sum(axis=1)
        engine.recount()
    rng = np.random.default_rng(seed)
    saturated = isinstance(arrivals, SaturatedArrivals)
    if not integer and saturated and initial is None and not record_stages:
        cap = eviction_free_rate(workload) if policy == "rate-limited" else math.inf
        return _saturated_fluid(workload, steps, cap, str(policy))
    if integer:
        return _IntegerRun(engine, workload, arrivals, policy, rng).run(steps, record_stages)
    return _FluidRun(engine, workload, arrivals, policy, rng).run(steps, record_stages)


class _FluidRun:
    def __init__(
        self,
        engine: _Engine,
        workload: StabilityWorkload,
        arrivals: Arrivals,
        policy: object,
        rng: np.random.Generator,
    ) -> None:
        self.e = engine
        self.w = workload
        self.arrivals = arrivals
        self.name = str(policy)
        self.cap = eviction_free_rate(workload) if policy == "rate-limited" else math.inf
        self.rng = rng
        self.queue = np.zeros(engine.k)

    def run(self, steps: int, record: bool) -> ModelResult:
        e, w = self.e, self.w
        out = np.zeros((5, steps))
        stages = np.zeros((steps, e.length)) if record else None
        saturated = isinstance(self.arrivals, SaturatedArrivals)
        unit_cost = float(np.dot(e.mix, e.l0 + 1.0))
        cost = e.l0 + 1.0
        trace_pos = 0
        for n in range(steps):
            if n % 1024 == 1023:
                e.recount()
            done = e.execute()
            if isinstance(self.arrivals, PoissonArrivals):
                self.queue += self.rng.poisson(self.arrivals.rate * e.mix)
            elif isinstance(self.arrivals, TraceArrivals):
                trace_pos = _trace_into(self.arrivals, n, trace_pos, self.queue)
            evicted = 0.0
            if e.overflow() > 1e-9 * w.memory:
                removed = e.evict_fluid()
                evicted = float(removed.sum())
                if not saturated:
                    self.queue += removed
            free = max(w.memory - e.used, 0.0)
            if saturated:
                total = min(free / unit_cost, self.cap)
                masses = total * e.mix
            else:
                demand = float(self.queue.sum())
                need = float(np.dot(self.queue, cost))
                theta = 0.0 if need <= 0 else min(1.0, free / need, self.cap / demand)
                masses = theta * self.queue
                self.queue = self.queue - masses
                total = float(masses.sum())
            e.add(masses)
            out[:, n] = (e.used, total, evicted, float(done.sum()), float(self.queue.sum()))
            if stages is not None:
                stages[n] = e.stage_view().sum(axis=0)
        return _result(w, "fluid", self.name, out, stages)


def _result(
    w: StabilityWorkload,
    mode: Literal["fluid", "integer"],
    policy: str,
    out: NDArray[np.float64],
    stages: NDArray[np.float64] | None,
) -> ModelResult:
    """A :class:`ModelResult` from the (5, steps) per-step rows
    (memory, admitted, evicted, completed, queue)."""
    return ModelResult(
        workload=w,
        mode=mode,
        policy=policy,
        memory=out[0],
        admitted=out[1],
        evicted=out[2],
        completed=out[3],
        queue=out[4],
        stages=stages,
    )


def _saturated_fluid(workload: StabilityWorkload, steps: int, cap: float, name: str) -> ModelResult:
    """Saturated fluid model with scalar cohorts, in plain Python floats.

    Under saturated input every cohort enters with the class mix ``p`` and LPF splits a
    stage in proportion to its classes, so a cohort keeps composition ``p`` for life: the
    state is one mass ``a_t`` per admission step ``t``. At stage ``j`` a unit cohort holds
    ``c_j = sum_{k: l1,k > j} p_k (l0,k + 1 + j)`` tokens (the coefficients of eq. 10) and
    ``s_j = sum_{k: l1,k > j} p_k`` live requests. Executing a step releases
    ``p_k (l0,k + l1,k) a_{n - l1,k}`` for each class and grows every survivor by one token;
    eviction walks the cohorts youngest first. An iteration is ``O(K)`` float operations
    plus the walk over the stages it evicts from, with no numpy call at all.
    """
    length = workload.max_decode_len
    mix = list(workload.mix)
    l0 = list(workload.input_lens)
    l1 = list(workload.decode_lens)
    k_range = range(workload.num_classes)
    c = [sum(mix[k] * (l0[k] + 1 + j) for k in k_range if l1[k] > j) for j in range(length + 1)]
    s = [sum(mix[k] for k in k_range if l1[k] > j) for j in range(length + 1)]
    release = [mix[k] * (l0[k] + l1[k]) for k in k_range]
    memory = float(workload.memory)
    tolerance = 1e-12 * memory
    ring = [0.0] * length
    used = 0.0
    alive = 0.0
    out_mem = [0.0] * steps
    out_adm = [0.0] * steps
    out_ev = [0.0] * steps
    out_done = [0.0] * steps
    c0 = c[0]
    for n in range(steps):
        done = 0.0
        freed = 0.0
        for k in k_range:
            mass = ring[(n - l1[k]) % length]
            if mass:
                done += mix[k] * mass
                freed += release[k] * mass
        alive -= done
        used += alive - freed
        evicted = 0.0
        if used > memory + tolerance:
            excess = used - memory
            for j in range(1, length):
                idx = (n - j) % length
                mass = ring[idx]
                if not mass:
                    continue
                held = mass * c[j]
                if held <= excess:
                    ring[idx] = 0.0
                    excess -= held
                    evicted += mass * s[j]
                else:
                    part = mass * excess / held
                    ring[idx] = mass - part
                    evicted += part * s[j]
                    excess = 0.0
                if excess <= tolerance:
                    break
            alive -= evicted
            used = memory + excess
        admitted = min(max(memory - used, 0.0) / c0, cap)
        ring[n % length] = admitted
        alive += admitted
        used += admitted * c0
        out_mem[n] = used
        out_adm[n] = admitted
        out_ev[n] = evicted
        out_done[n] = done
    return ModelResult(
        workload=workload,
        mode="fluid",
        policy=name,
        memory=np.asarray(out_mem),
        admitted=np.asarray(out_adm),
        evicted=np.asarray(out_ev),
        completed=np.asarray(out_done),
        queue=np.zeros(steps),
        stages=None,
    )


def _trace_into(arrivals: TraceArrivals, n: int, pos: int, queue: NDArray[np.float64]) -> int:
    while pos < len(arrivals.steps) and arrivals.steps[pos] <= n:
        queue[arrivals.classes[pos]] += 1
        pos += 1
    return pos


class _IntegerRun:
    def __init__(
        self,
        engine: _Engine,
        workload: StabilityWorkload,
        arrivals: Arrivals,
        policy: object,
        rng: np.random.Generator,
    ) -> None:
        self.e = engine
        self.w = workload
        self.arrivals = arrivals
        self.rng = rng
        if policy == "greedy":
            self.policy: AdmissionPolicy = GreedyAdmission()
        elif policy == "rate-limited":
            self.policy = RateLimitedAdmission(
                classes=tuple(
                    RequestClass(a, b, p)
                    for a, b, p in zip(
                        workload.input_lens, workload.decode_lens, workload.mix, strict=True
                    )
                )
            )
        else:
            self.policy = policy  # type: ignore[assignment]
        self.name = policy if isinstance(policy, str) else type(policy).__name__
        self.observer = self.policy if isinstance(self.policy, CompletionObserver) else None
        self.templates = [
            Request(request_id=f"class-{k}", prompt_len=int(a), decode_len=int(b))
            for k, (a, b) in enumerate(zip(workload.input_lens, workload.decode_lens, strict=True))
        ]
        self.queue: deque[int] = deque()

    def _top_up(self, free: float) -> None:
        need = int(free // (min(self.w.input_lens) + 1)) + 2
        if len(self.queue) < need:
            extra = need - len(self.queue) + 64
            self.queue.extend(self.rng.choice(self.e.k, size=extra, p=self.e.mix).tolist())

    def run(self, steps: int, record: bool) -> ModelResult:
        e, w = self.e, self.w
        out = np.zeros((5, steps))
        stages = np.zeros((steps, e.length)) if record else None
        saturated = isinstance(self.arrivals, SaturatedArrivals)
        trace_pos = 0
        for n in range(steps):
            done = e.execute()
            if self.observer is not None:
                for cls in np.flatnonzero(done).tolist():
                    for _ in range(int(done[cls])):
                        self.observer.observe_completion(self.templates[cls], float(n))
            if isinstance(self.arrivals, PoissonArrivals):
                count = int(self.rng.poisson(self.arrivals.rate))
                if count:
                    self.queue.extend(self.rng.choice(e.k, size=count, p=e.mix).tolist())
            elif isinstance(self.arrivals, TraceArrivals):
                while trace_pos < len(self.arrivals.steps) and self.arrivals.steps[trace_pos] <= n:
                    self.queue.append(self.arrivals.classes[trace_pos])
                    trace_pos += 1
            evicted = 0
            if e.overflow() > 0:
                removed = e.evict_integer()
                evicted = int(removed.sum())
                for cls in np.flatnonzero(removed)[::-1].tolist():
                    self.queue.extendleft([cls] * int(removed[cls]))
            free = w.memory - e.used
            if saturated:
                self._top_up(free)
            head = _QueueView(self.queue, self.templates)
            state = SchedulerState(
                step=n, time=float(n), used_tokens=round(e.used), capacity_tokens=w.memory
            )
            asked = int(self.policy.admit(state, head)) if len(head) else 0
            if not 0 <= asked <= len(head):
                raise ValueError(f"policy admitted {asked} of {len(head)} waiting requests")
            masses = np.zeros(e.k, dtype=np.int64)
            budget = free
            for _ in range(asked):
                k = self.queue[0]
                # The model reserves the next decoding token: admission costs l0 + 1.
                if w.input_lens[k] + 1 > budget:
                    break
                budget -= w.input_lens[k] + 1
                masses[k] += 1
                self.queue.popleft()
            e.add(masses)
            waiting = 0.0 if saturated else float(len(self.queue))
            out[:, n] = (e.used, float(masses.sum()), evicted, float(done.sum()), waiting)
            if stages is not None:
                stages[n] = e.stage_view().sum(axis=0)
        return _result(w, "integer", self.name, out, stages)


class _QueueView(Sequence[Request]):
    """The waiting queue of class indices seen as requests, without copying it."""

    def __init__(self, queue: deque[int], templates: list[Request]) -> None:
        self._queue = queue
        self._templates = templates

    def __len__(self) -> int:
        return len(self._queue)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | Sequence[Request]:
        if isinstance(index, slice):
            return [self._templates[k] for k in list(self._queue)[index]]
        return self._templates[self._queue[index]]

    def __iter__(self) -> Iterator[Request]:
        templates = self._templates
        for k in self._queue:
            yield templates[k]
