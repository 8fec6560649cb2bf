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

    def add(self, masses: NDArray[Any]) -> None:
        self.ring[:, self.head] += masses
        self.alive = self.alive + masses
        self.used += float(np.dot(masses, self.l0 + 1.0))


MAX_MODEL_STEPS = 10**6
"""The most iterations :func:`simulate_model` runs in one call (its series hold a value per
iteration and stage: 10^7 steps would take minutes and gigabytes)."""


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
    if not 0 < steps <= MAX_MODEL_STEPS:
        raise ValueError(f"'steps' must be in [1, {MAX_MODEL_STEPS}]: {steps!r}")
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
    """The integer model in plain Python integers.

    With whole requests every quantity (memory, stage totals, class counts) is an exact
    integer, so the state is a list of ``K`` Python lists ``ring[k][t mod L]`` and the
    memory an ``int``: an iteration costs ``O(K)`` integer operations plus the stages its
    eviction walks (youngest first, stopping at the first stage that covers the excess),
    never a pass over all ``L`` stages nor a numpy call on a (K,) array. The built-in
    ``"greedy"`` rule is evaluated inline on the queue of class indices (the same count
    :class:`GreedyAdmission` returns); other policies see :class:`SchedulerState` and the
    queue as requests, as a server would call them.
    """

    def __init__(
        self,
        engine: _Engine,
        workload: StabilityWorkload,
        arrivals: Arrivals,
        policy: object,
        rng: np.random.Generator,
    ) -> None:
        self.w = workload
        self.k = workload.num_classes
        self.length = workload.max_decode_len
        self.head = engine.head
        self.ring: list[list[int]] = [[int(v) for v in row] for row in engine.ring.tolist()]
        self.used = round(engine.used)
        self.l0p1 = [a + 1 for a in workload.input_lens]
        # Per column: live requests and their memory at stage 0 (sum_k count_k (l0,k + 1)),
        # so the memory of column c at stage j is base[c] + j * total[c].
        self.col_total = [sum(row[c] for row in self.ring) for c in range(self.length)]
        self.col_base = [
            sum(row[c] * a for row, a in zip(self.ring, self.l0p1, strict=True))
            for c in range(self.length)
        ]
        self.mix = engine.mix
        self.arrivals = arrivals
        self.rng = rng
        self.inline_greedy = policy == "greedy"
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

    def _top_up(self, free: int) -> None:
        need = int(free // (min(self.w.input_lens) + 1)) + 2
        if len(self.queue) < need:
            extra = need - len(self.queue) + 64
            self.queue.extend(self.rng.choice(self.k, size=extra, p=self.mix).tolist())

    def _evict(self, excess: int) -> list[int]:
        """Least-progressed-first; within a stage, classes evicted in proportion to occupancy.

        Stages are walked youngest first (stage ``j`` is column ``head - j``); those whose
        memory does not yet cover the excess go entirely. In the stage that does, each class
        first loses the floor of its share ``counts * left / held`` of requests, then one
        request at a time goes from the class furthest below its share ``(taken + 1) counts /
        total`` (first class on ties) until the excess is freed. Returns the (K,) counts.
        """
        ring, length, k_range = self.ring, self.length, range(self.k)
        col_total, col_base, l0p1 = self.col_total, self.col_base, self.l0p1
        l1 = self.w.decode_lens
        removed = [0] * self.k
        freed = 0
        col = self.head
        for j in range(length):
            total = col_total[col]
            if not total:
                col = col - 1 if col else length - 1
                continue
            held = col_base[col] + j * total
            if freed + held < excess and j < length - 1:
                for k in k_range:
                    count = ring[k][col]
                    if count:
                        removed[k] += count
                        ring[k][col] = 0
                col_total[col] = 0
                col_base[col] = 0
                freed += held
                col = col - 1 if col else length - 1
                continue
            left = excess - freed
            if left > 0:
                counts = [ring[k][col] for k in k_range]
                weights = [a + j if j < b else 0 for a, b in zip(l0p1, l1, strict=True)]
                share = left / held
                taken = [min(math.floor(c * share), c) for c in counts]
                left -= sum(t * wk for t, wk in zip(taken, weights, strict=True))
                count = sum(taken)
                while left > 0 and count < total:
                    best, best_gap = -1, -math.inf
                    for k in k_range:
                        if taken[k] < counts[k]:
                            gap = (count + 1) * counts[k] / total - taken[k]
                            if gap > best_gap:
                                best, best_gap = k, gap
                    taken[best] += 1
                    count += 1
                    left -= weights[best]
                for k in k_range:
                    if taken[k]:
                        ring[k][col] = counts[k] - taken[k]
                        removed[k] += taken[k]
                        col_base[col] -= taken[k] * l0p1[k]
                col_total[col] -= count
                freed += sum(t * wk for t, wk in zip(taken, weights, strict=True))
            break
        self.used -= freed
        return removed

    def _greedy(self, free: int) -> int:
        """:class:`GreedyAdmission`'s count on the queue of class indices."""
        count = 0
        lens = self.w.input_lens
        for k in self.queue:
            free -= lens[k]
            if free < 0:
                break
            count += 1
        return count

    def _stages(self) -> list[int]:
        cols = [(self.head - j) % self.length for j in range(self.length)]
        return [sum(row[c] for row in self.ring) for c in cols]

    def run(self, steps: int, record: bool) -> ModelResult:
        w, k_range, length, ring = self.w, range(self.k), self.length, self.ring
        l0, l1 = w.input_lens, w.decode_lens
        release = [a + b for a, b in zip(l0, l1, strict=True)]
        col_total, col_base, l0p1 = self.col_total, self.col_base, self.l0p1
        memory = w.memory
        out_mem = [0.0] * steps
        out_adm = [0.0] * steps
        out_ev = [0.0] * steps
        out_done = [0.0] * steps
        out_queue = [0.0] * steps
        stages = np.zeros((steps, length)) if record else None
        saturated = isinstance(self.arrivals, SaturatedArrivals)
        poisson = self.arrivals if isinstance(self.arrivals, PoissonArrivals) else None
        trace = self.arrivals if isinstance(self.arrivals, TraceArrivals) else None
        queue = self.queue
        alive = sum(sum(row) for row in ring)
        trace_pos = 0
        for n in range(steps):
            # Execute: survivors grow one token; class k's stage l1,k - 1 finishes.
            head = self.head
            done = [0] * self.k
            freed = 0
            for k in k_range:
                col = (head - l1[k] + 1) % length
                count = ring[k][col]
                if count:
                    done[k] = count
                    ring[k][col] = 0
                    col_total[col] -= count
                    col_base[col] -= count * l0p1[k]
                    freed += count * release[k]
            done_total = sum(done)
            alive -= done_total
            self.used += alive - freed
            self.head = head = head + 1 if head + 1 < length else 0
            if self.observer is not None and done_total:
                for cls in k_range:
                    for _ in range(done[cls]):
                        self.observer.observe_completion(self.templates[cls], float(n))
            if poisson is not None:
                count = int(self.rng.poisson(poisson.rate))
                if count:
                    queue.extend(self.rng.choice(self.k, size=count, p=self.mix).tolist())
            elif trace is not None:
                while trace_pos < len(trace.steps) and trace.steps[trace_pos] <= n:
                    queue.append(trace.classes[trace_pos])
                    trace_pos += 1
            evicted = 0
            if self.used > memory:
                removed = self._evict(self.used - memory)
                evicted = sum(removed)
                alive -= evicted
                for cls in reversed(k_range):
                    if removed[cls]:
                        queue.extendleft([cls] * removed[cls])
            free = memory - self.used
            if saturated:
                self._top_up(free)
            if not queue:
                asked = 0
            elif self.inline_greedy:
                asked = self._greedy(max(0, free))
            else:
                view = _QueueView(queue, self.templates)
                state = SchedulerState(
                    step=n, time=float(n), used_tokens=self.used, capacity_tokens=memory
                )
                asked = int(self.policy.admit(state, view))
                if not 0 <= asked <= len(queue):
                    raise ValueError(f"policy admitted {asked} of {len(queue)} waiting requests")
            admitted = 0
            budget = free
            for _ in range(asked):
                k = queue[0]
                # The model reserves the next decoding token: admission costs l0 + 1.
                if l0[k] + 1 > budget:
                    break
                budget -= l0[k] + 1
                ring[k][head] += 1
                col_total[head] += 1
                col_base[head] += l0p1[k]
                admitted += 1
                queue.popleft()
            alive += admitted
            self.used += free - budget
            out_mem[n] = self.used
            out_adm[n] = admitted
            out_ev[n] = evicted
            out_done[n] = done_total
            out_queue[n] = 0.0 if saturated else float(len(queue))
            if stages is not None:
                stages[n] = self._stages()
        out = np.array([out_mem, out_adm, out_ev, out_done, out_queue], dtype=np.float64)
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
