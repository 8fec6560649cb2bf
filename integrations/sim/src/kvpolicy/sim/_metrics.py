"""Figures of one run: goodput, where every request ended, latency percentiles, memory,
evictions, tenants, cost.

Every arrived request ends one way: completed, rejected (longer than the model's context, or
more KV than the pool holds), given up after the gateway's 429s, or unfinished when the run
stopped early; ``completed + rejected + gave_up + unfinished == requests``. Latency
percentiles cover completed requests only; goodput and SLO attainment count every arrival.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
from attrs import field, frozen
from numpy.typing import NDArray

from kvpolicy.kvmodel import GPUSpec
from kvpolicy.sim._config import SLOConfig
from kvpolicy.sim._engine import RunRecord

__all__ = ["Summary", "TenantSummary", "summarize"]


@frozen
class TenantSummary:
    """Per-tenant figures."""

    tenant: str
    """Tenant name."""
    requests: int
    """Requests that arrived."""
    admissions: int
    """Requests admitted to the running batch at least once."""
    rejected: int
    """Requests refused by the server because they can never fit."""
    rejected_context: int
    """Those of them longer than the model's context."""
    denials: int
    """429 answers from the gateway (a request denied twice counts twice)."""
    gave_up: int
    """Requests whose client stopped retrying after its last allowed denial."""
    completed: int
    """Requests finished."""
    slo_met: int
    """Requests finished within both the TTFT and the TPOT target."""
    slo_attainment: float
    """``slo_met`` over arrived requests."""
    ttft_p95_s: float
    """95th percentile time to first token of its completed requests, seconds."""
    share_of_tokens: float
    """Share of all output tokens served that went to this tenant."""


@frozen
class ReplicaSummary:
    """One replica of a fleet run."""

    replica_id: str
    """Identifier (``r0``, ``r1``, ... in start order)."""
    model: str
    """Model served."""
    gpu: str
    """GPU name."""
    start_s: float
    """When it was asked for (its GPU counted from here)."""
    up_s: float
    """When it started serving (after its provisioning delay)."""
    down_s: float
    """When it stopped (drained, cancelled, or the end of the run)."""
    requests: int
    """Requests routed to it."""
    slo_met: int
    """Of them, finished within the latency targets."""
    peak_kv_tokens: int
    """Most KV slots it held in used blocks."""
    gpu_hours: float
    """Hours its GPU was held."""


@frozen
class FleetSummary:
    """A fleet's own figures."""

    gpu_hours: float
    """GPU-hours of every replica, from start to stop."""
    peak_replicas: int
    """Most replicas holding a GPU at once."""
    replicas: tuple[ReplicaSummary, ...]
    """Every replica, in start order."""
    reclaimed: int = 0
    """Times a draining replica was taken back instead of starting one."""


@frozen
class Summary:
    """What one run achieved. Latencies are seconds; memory is tokens and bytes.

    Goodput and SLO attainment count every arrived request (a rejected or given-up request
    is a miss); latency percentiles cover completed requests only (``completed`` of
    ``requests``); cost is the GPU time of the whole run, whatever became of each request.
    """

    requests: int
    """Requests that arrived (the workload)."""
    completed: int
    """Requests finished."""
    slo_met: int
    """Requests finished within both latency targets."""
    rejected: int
    """Requests refused because they can never fit (``rejected_context +
    rejected_memory``)."""
    rejected_context: int
    """Rejected requests longer than the model's context (0 when the record does not say)."""
    rejected_memory: int
    """Rejected requests that fit the context but need more KV than the pool holds."""
    gave_up: int
    """Requests abandoned by their clients after repeated 429s."""
    unfinished: int
    """Requests neither finished, rejected nor given up when the run stopped (0 for a run
    to completion)."""
    gate_denials: int
    """429 answers from the gateway (a request denied twice counts twice)."""
    duration_s: float
    """Simulated time from the first arrival to the end of the run (the last completion,
    or a later give-up or stop)."""
    goodput_rps: float
    """Requests finished within both latency targets per second of the run."""
    goodput_tps: float
    """Output tokens of those requests per second of the run."""
    throughput_rps: float
    """Completed requests per second, within the targets or not."""
    throughput_tps: float
    """Output tokens of completed requests per second."""
    ttft: dict[str, float]
    """Time to first token of completed requests: ``mean``, ``p50``, ``p95``, ``p99``."""
    tpot: dict[str, float]
    """Time per output token after the first, completed requests."""
    e2e: dict[str, float]
    """End-to-end latency from first arrival to last token, completed requests."""
    peak_kv_tokens: int
    """Most KV slots held in used blocks at once."""
    mean_kv_tokens: float
    """Time-weighted mean of KV slots held."""
    peak_kv_bytes: int
    """``peak_kv_tokens`` in bytes."""
    peak_resident_tokens: int
    """Most tokens resident at once (after token eviction)."""
    capacity_tokens: int
    """KV pool size in tokens."""
    evicted_tokens: int
    """Tokens dropped by the eviction policy."""
    preemptions: int
    """Requests preempted (a request preempted twice counts twice)."""
    recomputed_tokens: int
    """Tokens computed again after preemption."""
    swapped_tokens: int
    """Tokens moved over PCIe to and from the CPU tier."""
    prefix_hit_tokens: int
    """Prompt tokens served from the prefix cache."""
    tier_hit_tokens: int
    """Prompt tokens loaded from the tiers below HBM (DRAM, disk) instead of recomputed."""
    tier_load_s: float
    """Seconds spent loading them."""
    attention_recall: float
    """Mean share of attention mass on resident tokens (synthetic model; 1.0 without
    eviction)."""
    iterations: int
    """Engine iterations simulated."""
    iterations_per_s: float
    """Iterations per simulated second."""
    slo_attainment: float
    """``slo_met`` over arrived requests."""
    cost_usd: float
    """GPU rental for ``duration_s`` at the GPU's price per hour: the GPU time of every
    request, finished or not."""
    cost_per_1k_completed_usd: float
    """``cost_usd`` per thousand completed requests (NaN when none completed). A stack that
    turns requests away pays the same GPU time for fewer of them, so this rises."""
    cost_per_1k_slo_met_usd: float
    """``cost_usd`` per thousand requests finished within the targets (NaN when none)."""
    tenants: tuple[TenantSummary, ...] = field()
    """Per-tenant figures, sorted by tenant name."""
    fleet: FleetSummary | None = None
    """A fleet's GPU-hours, peak replicas and replicas (None: one engine)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (NaN becomes ``None``); a fleet's figures are top-level
        keys ``gpu_hours``, ``peak_replicas``, ``replicas`` and ``replicas_reclaimed``."""
        out = attrs.asdict(self, recurse=True)
        out["tenants"] = list(out["tenants"])
        fleet = out.pop("fleet")
        if fleet is not None:
            out["gpu_hours"] = fleet["gpu_hours"]
            out["peak_replicas"] = fleet["peak_replicas"]
            out["replicas"] = list(fleet["replicas"])
            out["replicas_reclaimed"] = fleet["reclaimed"]
        cleaned: dict[str, Any] = _clean(out)
        return cleaned


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _pct(x: NDArray[np.float64]) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {"mean": math.nan, "p50": math.nan, "p95": math.nan, "p99": math.nan}
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def _time_weighted_mean(t: NDArray[np.float64], v: NDArray[np.int64]) -> float:
    if len(t) < 2:
        return float(v.mean()) if len(v) else 0.0
    dt = np.diff(t)
    total = float(dt.sum())
    if total <= 0:
        return float(v.mean())
    # A sample holds from its time until the next one.
    return float((v[:-1] * dt).sum() / total)


def summarize(record: RunRecord, slo: SLOConfig, gpu: GPUSpec) -> Summary:
    """Figures of ``record`` against the latency targets ``slo``, priced at ``gpu``'s rate."""
    reqs = record.requests
    n = len(reqs)
    arrival = np.fromiter((r.arrival_time for r in reqs), dtype=np.float64, count=n)
    decode = np.fromiter((r.decode_len for r in reqs), dtype=np.float64, count=n)
    tenants = np.array([r.tenant for r in reqs], dtype=object)
    done = np.isfinite(record.finish)
    too_long = (
        record.rejected & record.rejected_context
        if record.rejected_context is not None
        else np.zeros(n, dtype=np.bool_)
    )
    ttft = record.first_token - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            decode > 1, (record.finish - record.first_token) / np.maximum(decode - 1, 1), 0.0
        )
    tpot = np.where(done, tpot, np.nan)
    e2e = record.finish - arrival
    within = done & (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
    start = float(arrival.min()) if n else 0.0
    # The GPU is held until the run ends: a give-up after the last completion counts too.
    end = max(float(np.nanmax(record.finish)) if done.any() else start, record.end_time)
    duration = max(end - start, 0.0)
    completed = int(done.sum())
    met = int(within.sum())
    out_tokens = float(decode[done].sum())
    cost = gpu.price_per_hour * duration / 3600.0
    tenant_rows = []
    admitted = np.isfinite(record.first_admitted)
    for name in sorted(set(tenants.tolist())):
        m = tenants == name
        tenant_rows.append(
            TenantSummary(
                tenant=str(name),
                requests=int(m.sum()),
                admissions=int((admitted & m).sum()),
                rejected=int((record.rejected & m).sum()),
                rejected_context=int((too_long & m).sum()),
                denials=int(record.gate_denials[m].sum()),
                gave_up=int((record.gave_up & m).sum()),
                completed=int((done & m).sum()),
                slo_met=int((within & m).sum()),
                slo_attainment=float((within & m).sum() / m.sum()),
                ttft_p95_s=_pct(ttft[m & done])["p95"],
                share_of_tokens=float(decode[done & m].sum() / out_tokens) if out_tokens else 0.0,
            )
        )
    peak = int(record.series_kv_tokens.max()) if len(record.series_kv_tokens) else 0
    rejected = int(record.rejected.sum())
    gave_up = int(record.gave_up.sum())

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else math.nan

    def per_1k(count: int) -> float:
        return 1000.0 * cost / count if count else math.nan

    return Summary(
        requests=n,
        completed=completed,
        slo_met=met,
        rejected=rejected,
        rejected_context=int(too_long.sum()),
        rejected_memory=rejected - int(too_long.sum()),
        gave_up=gave_up,
        unfinished=n - completed - rejected - gave_up,
        gate_denials=int(record.gate_denials.sum()),
        duration_s=duration,
        goodput_rps=per_s(met),
        goodput_tps=per_s(float(decode[within].sum())),
        throughput_rps=per_s(completed),
        throughput_tps=per_s(out_tokens),
        ttft=_pct(ttft[done]),
        tpot=_pct(tpot[done]),
        e2e=_pct(e2e[done]),
        peak_kv_tokens=peak,
        mean_kv_tokens=_time_weighted_mean(record.series_time, record.series_kv_tokens),
        peak_kv_bytes=peak * record.bytes_per_token,
        peak_resident_tokens=int(record.series_resident.max())
        if len(record.series_resident)
        else 0,
        capacity_tokens=record.capacity_tokens,
        evicted_tokens=record.evicted_tokens,
        preemptions=int(record.preemptions.sum()),
        recomputed_tokens=record.recomputed_tokens,
        swapped_tokens=record.swapped_tokens,
        prefix_hit_tokens=record.prefix_hit_tokens,
        tier_hit_tokens=record.tier_hit_tokens,
        tier_load_s=record.tier_load_s,
        attention_recall=record.attention_recall,
        iterations=record.iterations,
        iterations_per_s=per_s(record.iterations),
        slo_attainment=met / n if n else math.nan,
        cost_usd=cost,
        cost_per_1k_completed_usd=per_1k(completed),
        cost_per_1k_slo_met_usd=per_1k(met),
        tenants=tuple(tenant_rows),
    )
