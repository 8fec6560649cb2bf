"""What one run measured: the recorder the engine's phases write to, and its RunRecord."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from attrs import frozen
from numpy.typing import NDArray

from kvpolicy.kvmodel import Request

__all__ = ["Recorder", "RunRecord"]


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
    denial_reasons: dict[str, int] | None = None
    """429s by the gateway check that answered them (``tokens``, ``concurrency``,
    ``priority``, ...)."""
    finish_step: NDArray[np.int64] | None = None
    """(n,) int64 iterations done when each request finished (-1 if it never did); for
    comparing the order of completions with another scheduler step by step."""
    rejected_context: NDArray[np.bool_] | None = None
    """(n,) bool rejected requests longer than the model's context (the others among
    ``rejected`` did not fit in the KV pool); None when not recorded."""
    tier_hit_tokens: int = 0
    """Prompt tokens loaded from the tiers below HBM instead of recomputed."""
    tier_load_s: float = 0.0
    """Seconds spent loading them."""
    gateway_refreshes: tuple[tuple[float, float], ...] = ()
    """(time, tokens/s) of every change of the gateway's throughput estimate made from the
    service observed (``gateway.refresh_s``); empty when it never changed."""


class Recorder:
    """Per-request times, counters and the memory series of one run, as they happen.

    Args:
        requests: the workload, in arrival order.
        rejected: (n,) bool requests that can never run.
        rejected_context: (n,) bool those of them longer than the model's context.
    """

    def __init__(
        self,
        requests: tuple[Request, ...],
        rejected: NDArray[np.bool_],
        rejected_context: NDArray[np.bool_] | None = None,
    ) -> None:
        n = len(requests)
        self.requests = requests
        self.rejected = rejected
        self.rejected_context = rejected_context
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.first_admitted = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.finish_step = np.full(n, -1, dtype=np.int64)
        self.denial_reasons: dict[str, int] = {}
        self.denials = np.zeros(n, dtype=np.int64)
        self.gave_up = np.zeros(n, dtype=np.bool_)
        self.recomputed = 0
        self.swapped = 0
        self.prefix_hit = 0
        self.tier_hit = 0
        self.tier_load = 0.0
        self.done = 0
        """Requests that reached an end: finished, rejected or given up."""
        self.gateway_refreshes: list[tuple[float, float]] = []
        self._series: list[tuple[float, int, int, int, int]] = []

    def admitted(self, idx: int, now: float) -> None:
        """Request ``idx`` joined the running batch (its first time counts)."""
        if math.isnan(self.first_admitted[idx]):
            self.first_admitted[idx] = now

    def first_output(self, idx: int, now: float) -> None:
        """Request ``idx`` produced an output token (its first counts)."""
        if math.isnan(self.first_token[idx]):
            self.first_token[idx] = now

    def finished(self, idx: int, now: float, iteration: int | None = None) -> None:
        """Request ``idx`` finished at ``now``, after ``iteration`` iterations."""
        self.finish[idx] = now
        if iteration is not None:
            self.finish_step[idx] = iteration
        self.done += 1

    def sample(self, now: float, kv: int, resident: int, running: int, waiting: int) -> None:
        """One point of the memory series."""
        self._series.append((now, kv, resident, running, waiting))

    def record(
        self,
        *,
        capacity_tokens: int,
        eviction_budget: int | None,
        bytes_per_token: int,
        iterations: int,
        end_time: float,
        evicted_tokens: int,
        eviction_rounds: int,
        attention_recall: float,
        series: Sequence[tuple[float, int, int, int, int]] | None = None,
    ) -> RunRecord:
        """The finished :class:`RunRecord`; ``series`` (time, KV slots, resident tokens,
        running, waiting) replaces the points :meth:`sample` took."""
        points = self._series if series is None else series
        series_arr = np.array(points, dtype=np.float64).reshape(-1, 5)
        return RunRecord(
            requests=self.requests,
            first_token=self.first_token,
            finish=self.finish,
            first_admitted=self.first_admitted,
            preemptions=self.preemptions,
            rejected=self.rejected,
            rejected_context=self.rejected_context,
            finish_step=self.finish_step,
            denial_reasons=dict(self.denial_reasons),
            series_time=series_arr[:, 0].copy(),
            series_kv_tokens=series_arr[:, 1].astype(np.int64),
            series_resident=series_arr[:, 2].astype(np.int64),
            series_running=series_arr[:, 3].astype(np.int64),
            series_waiting=series_arr[:, 4].astype(np.int64),
            capacity_tokens=capacity_tokens,
            eviction_budget=eviction_budget,
            bytes_per_token=bytes_per_token,
            iterations=iterations,
            end_time=end_time,
            evicted_tokens=evicted_tokens,
            eviction_rounds=eviction_rounds,
            recomputed_tokens=self.recomputed,
            swapped_tokens=self.swapped,
            prefix_hit_tokens=self.prefix_hit,
            attention_recall=attention_recall,
            gate_denials=self.denials,
            gave_up=self.gave_up,
            tier_hit_tokens=self.tier_hit,
            tier_load_s=self.tier_load,
            gateway_refreshes=tuple(self.gateway_refreshes),
        )
