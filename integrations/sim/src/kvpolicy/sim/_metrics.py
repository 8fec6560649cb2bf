"""Figures of one run: throughput, latency percentiles, memory, evictions, tenants, cost."""

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
    denials: int
    """429 answers from the gateway (a request denied twice counts twice)."""
    gave_up: int
    """Requests whose client stopped retrying after its last allowed denial."""
    completed: int
    """Requests finished."""
    slo_attainment: float
    """Share of arrived requests finished within both the TTFT and the TPOT target."""
    ttft_p95_s: float
    """95th percentile time to first token, seconds."""
    share_of_tokens: float
    """Share of all output tokens served that went to this tenant."""


@frozen
class Summary:
    """What one run achieved. Latencies are seconds; memory is tokens and bytes."""

    requests: int
    """Requests in the workload."""
    completed: int
    """Requests finished."""
    rejected: int
    """Requests refused because they can never fit."""
    duration_s: float
    """Simulated time from the first arrival to the last completion."""
    throughput_rps: float
    """Completed requests per second."""
    throughput_tps: float
    """Output tokens per second."""
    ttft: dict[str, float]
    """Time to first token: ``mean``, ``p50``, ``p95``, ``p99``."""
    tpot: dict[str, float]
    """Time per output token after the first."""
    e2e: dict[str, float]
    """End-to-end latency from arrival to last token."""
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
    gate_denials: int
    """429 answers from the gateway."""
    gave_up: int
    """Requests abandoned by their clients after repeated 429s."""
    attention_recall: float
    """Mean share of attention mass on resident tokens (synthetic model; 1.0 without
    eviction)."""
    iterations: int
    """Engine iterations simulated."""
    iterations_per_s: float
    """Iterations per simulated second."""
    slo_attainment: float
    """Share of requests finished within both latency targets."""
    cost_usd: float
    """GPU rental for ``duration_s`` at the GPU's price per hour."""
    cost_per_1k_requests_usd: float
    """``cost_usd`` per thousand completed requests (NaN when none completed)."""
    tenants: tuple[TenantSummary, ...] = field()
    """Per-tenant figures, sorted by tenant name."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (NaN becomes ``None``)."""
        out = attrs.asdict(self, recurse=True)
        out["tenants"] = list(out["tenants"])
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
    ttft = record.first_token - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(
            decode > 1, (record.finish - record.first_token) / np.maximum(decode - 1, 1), 0.0
        )
    tpot = np.where(done, tpot, np.nan)
    e2e = record.finish - arrival
    within = done & (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
    start = float(arrival.min()) if n else 0.0
    end = float(np.nanmax(record.finish)) if done.any() else record.end_time
    duration = max(end - start, 0.0)
    completed = int(done.sum())
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
                denials=int(record.gate_denials[m].sum()),
                gave_up=int((record.gave_up & m).sum()),
                completed=int((done & m).sum()),
                slo_attainment=float((within & m).sum() / m.sum()),
                ttft_p95_s=_pct(ttft[m & done])["p95"],
                share_of_tokens=float(decode[done & m].sum() / out_tokens) if out_tokens else 0.0,
            )
        )
    peak = int(record.series_kv_tokens.max()) if len(record.series_kv_tokens) else 0
    return Summary(
        requests=n,
        completed=completed,
        rejected=int(record.rejected.sum()),
        duration_s=duration,
        throughput_rps=completed / duration if duration > 0 else math.nan,
        throughput_tps=out_tokens / duration if duration > 0 else math.nan,
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
        gate_denials=int(record.gate_denials.sum()),
        gave_up=int(record.gave_up.sum()),
        attention_recall=record.attention_recall,
        iterations=record.iterations,
        iterations_per_s=record.iterations / duration if duration > 0 else math.nan,
        slo_attainment=float(within.sum() / n) if n else math.nan,
        cost_usd=cost,
        cost_per_1k_requests_usd=1000.0 * cost / completed if completed else math.nan,
        tenants=tuple(tenant_rows),
    )
