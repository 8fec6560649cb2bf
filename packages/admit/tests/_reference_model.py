"""The integer model as it was first written: a direct numpy transcription, kept as the
reference that the optimised ``simulate_model(..., mode="integer")`` must match bit for bit.

Every iteration recomputes the per-stage memory of the whole (K, L) state for eviction and
goes through ``SchedulerState`` and the policy object, so it is slow but easy to check
against seed 002 §2.2.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

from kvpolicy.admit import (
    GreedyAdmission,
    ModelResult,
    RateLimitedAdmission,
    RequestClass,
    SaturatedArrivals,
    StabilityWorkload,
    TraceArrivals,
    stage_weights,
)
from kvpolicy.admit._model import _QueueView, _result
from kvpolicy.kvmodel import AdmissionPolicy, Request, SchedulerState


def reference_integer(
    workload: StabilityWorkload,
    steps: int,
    policy: str = "greedy",
    arrivals: SaturatedArrivals | TraceArrivals | None = None,
    seed: int = 0,
) -> ModelResult:
    """Integer model of §2.2, saturated or trace arrivals, greedy or rate-limited."""
    arrivals = SaturatedArrivals() if arrivals is None else arrivals
    k_count, length = workload.num_classes, workload.max_decode_len
    l0 = np.asarray(workload.input_lens, dtype=np.float64)
    l1 = np.asarray(workload.decode_lens, dtype=np.int64)
    mix = np.asarray(workload.mix)
    weights = stage_weights(workload)
    ring = np.zeros((k_count, length), dtype=np.int64)
    rows = np.arange(k_count)
    stage_index = np.arange(length)
    head = 0
    used = 0.0
    rng = np.random.default_rng(seed)
    chosen: AdmissionPolicy
    if policy == "greedy":
        chosen = GreedyAdmission()
    else:
        chosen = RateLimitedAdmission(
            classes=tuple(
                RequestClass(a, b, p)
                for a, b, p in zip(
                    workload.input_lens, workload.decode_lens, workload.mix, strict=True
                )
            )
        )
    templates = [
        Request(request_id=f"class-{k}", prompt_len=int(a), decode_len=int(b))
        for k, (a, b) in enumerate(zip(workload.input_lens, workload.decode_lens, strict=True))
    ]
    queue: deque[int] = deque()
    out = np.zeros((5, steps))
    saturated = isinstance(arrivals, SaturatedArrivals)
    trace_pos = 0
    for n in range(steps):
        # Execute: every request grows one token; those at their last stage finish.
        cols = (head - (l1 - 1)) % length
        done = ring[rows, cols]
        ring[rows, cols] = 0
        head = (head + 1) % length
        order = (head - stage_index) % length  # columns, youngest first
        used = float(np.sum(weights * ring[:, order]))
        if isinstance(arrivals, TraceArrivals):
            while trace_pos < len(arrivals.steps) and arrivals.steps[trace_pos] <= n:
                queue.append(arrivals.classes[trace_pos])
                trace_pos += 1
        evicted = 0
        if used > workload.memory:
            removed = _evict(ring, order, weights, l0, used - workload.memory)
            used = float(np.sum(weights * ring[:, order]))
            evicted = int(removed.sum())
            for cls in np.flatnonzero(removed)[::-1].tolist():
                queue.extendleft([cls] * int(removed[cls]))
        free = workload.memory - used
        if saturated:
            need = int(free // (min(workload.input_lens) + 1)) + 2
            if len(queue) < need:
                extra = need - len(queue) + 64
                queue.extend(rng.choice(k_count, size=extra, p=mix).tolist())
        view = _QueueView(queue, templates)
        state = SchedulerState(
            step=n, time=float(n), used_tokens=round(used), capacity_tokens=workload.memory
        )
        asked = int(chosen.admit(state, view)) if len(view) else 0
        masses = np.zeros(k_count, dtype=np.int64)
        budget = free
        for _ in range(asked):
            k = queue[0]
            if workload.input_lens[k] + 1 > budget:
                break
            budget -= workload.input_lens[k] + 1
            masses[k] += 1
            queue.popleft()
        ring[:, head] += masses
        used += float(np.dot(masses, l0 + 1.0))
        waiting = 0.0 if saturated else float(len(queue))
        out[:, n] = (used, float(masses.sum()), evicted, float(done.sum()), waiting)
    return _result(workload, "integer", policy, out, None)


def _evict(
    ring: NDArray[np.int64],
    order: NDArray[np.int64],
    weights: NDArray[np.float64],
    l0: NDArray[np.float64],
    excess: float,
) -> NDArray[np.int64]:
    """Least-progressed-first; within a stage, classes in proportion to occupancy."""
    cols = ring[:, order]
    per_stage = np.sum(weights * cols, axis=0)
    cum = np.cumsum(per_stage)
    j = min(int(np.searchsorted(cum, excess)), len(order) - 1)
    removed = cols[:, :j].sum(axis=1)
    ring[:, order[:j]] = 0
    left = excess - (float(cum[j - 1]) if j > 0 else 0.0)
    counts = cols[:, j]
    total = int(counts.sum())
    if left > 0 and total > 0:
        held = float(per_stage[j])
        taken = np.minimum(np.floor(counts * (left / held)).astype(np.int64), counts)
        left -= float(np.dot(taken, weights[:, j]))
        while left > 0 and taken.sum() < total:
            target = (taken.sum() + 1) * counts / total
            k = int(np.argmax(np.where(taken < counts, target - taken, -np.inf)))
            taken[k] += 1
            left -= weights[k, j]
        ring[:, order[j]] = counts - taken
        removed = removed + taken
    return np.asarray(removed, dtype=np.int64)
