"""Reports of one or several runs: a rich table, JSON, PNG plots and a self-contained HTML.

Plots use matplotlib's Agg backend (no display needed). The HTML embeds the PNGs as base64,
so the single file opens in any browser and can be attached or archived as is.
"""

from __future__ import annotations

import base64
import html
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.table import Table

from kvpolicy.sim._simulate import SimResult

__all__ = [
    "comparison_table",
    "plot_latency_cdf",
    "plot_memory",
    "plot_tenant_shares",
    "results_json",
    "write_report",
]

_ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "completed requests"),
    ("throughput_rps", "throughput (req/s)"),
    ("throughput_tps", "throughput (output tok/s)"),
    ("ttft.p50", "TTFT p50 (s)"),
    ("ttft.p99", "TTFT p99 (s)"),
    ("tpot.p50", "TPOT p50 (ms)"),
    ("tpot.p99", "TPOT p99 (ms)"),
    ("e2e.p50", "E2E p50 (s)"),
    ("e2e.p95", "E2E p95 (s)"),
    ("e2e.p99", "E2E p99 (s)"),
    ("peak_kv_gib", "peak KV (GiB)"),
    ("mean_kv_gib", "mean KV (GiB)"),
    ("evicted_tokens", "evicted tokens"),
    ("attention_recall", "attention recall"),
    ("preemptions", "preemptions"),
    ("recomputed_tokens", "recomputed tokens"),
    ("prefix_hit_tokens", "prefix-cache hit tokens"),
    ("tier_hit_tokens", "tier hit tokens (DRAM/disk)"),
    ("gate_denials", "gateway 429s"),
    ("gave_up", "requests given up"),
    ("slo_attainment", "SLO attainment"),
    ("cost_per_1k_requests_usd", "cost per 1k requests ($)"),
)


def _value(result: SimResult, key: str) -> float:
    s = result.summary
    if key == "peak_kv_gib":
        return s.peak_kv_bytes / 2**30
    if key == "mean_kv_gib":
        return s.mean_kv_tokens * result.record.bytes_per_token / 2**30
    if "." in key:
        group, stat = key.split(".")
        v = float(getattr(s, group)[stat])
        return v * 1000.0 if group == "tpot" else v
    return float(getattr(s, key))


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "-"
    if float(v).is_integer():
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def comparison_table(results: Sequence[SimResult], title: str | None = None) -> Table:
    """A rich table: one row per figure, one column per run."""
    if not results:
        raise ValueError("'results' must hold at least one result")
    first = results[0]
    table = Table(
        title=title or f"{first.workload}: {first.model} on {first.gpu}",
        title_justify="left",
    )
    table.add_column("figure")
    for r in results:
        table.add_column(r.stack, justify="right")
    for key, label in _ROWS:
        table.add_row(label, *(_fmt(_value(r, key)) for r in results))
    return table


def results_json(results: Sequence[SimResult]) -> dict[str, Any]:
    """JSON-ready document of every run's summary."""
    return {
        "runs": [
            {
                "stack": r.stack,
                "workload": r.workload,
                "model": r.model,
                "gpu": r.gpu,
                "summary": r.summary.as_dict(),
            }
            for r in results
        ]
    }


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_memory(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """KV memory held over time, one line per run, with the pool capacity dashed."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    for r in results:
        rec = r.record
        t = rec.series_time
        gib = rec.series_kv_tokens * rec.bytes_per_token / 2**30
        if len(t) > 4000:  # keep the PNG light: the max over each bin preserves peaks
            bins = np.linspace(t[0], t[-1], 2001)
            idx = np.clip(np.searchsorted(bins, t) - 1, 0, 1999)
            peak = np.full(2000, np.nan)
            np.fmax.at(peak, idx, gib)
            t, gib = bins[:-1], peak
        ax.plot(t, gib, lw=0.8, label=r.stack)
    if results:
        rec = results[0].record
        ax.axhline(
            rec.capacity_tokens * rec.bytes_per_token / 2**30,
            ls="--",
            c="grey",
            lw=0.8,
            label="KV pool",
        )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV held (GiB)")
    ax.set_title("KV memory over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_latency_cdf(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """CDFs of TTFT and end-to-end latency, one line per run."""
    plt = _figure()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=110)
    for r in results:
        rec = r.record
        arrival = np.array([q.arrival_time for q in rec.requests])
        for ax, values in ((axes[0], rec.first_token - arrival), (axes[1], rec.finish - arrival)):
            v = np.sort(values[np.isfinite(values)])
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.0, label=r.stack)
    for ax, name in zip(axes, ("TTFT (s)", "end-to-end latency (s)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_tenant_shares(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """Per-tenant share of output tokens served, SLO attainment and gateway 429s per
    request, grouped by run."""
    plt = _figure()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=110)
    tenants = sorted({t.tenant for r in results for t in r.summary.tenants})
    width = 0.8 / max(len(results), 1)
    x = np.arange(len(tenants))
    for i, r in enumerate(results):
        rows = {t.tenant: t for t in r.summary.tenants}
        share = [rows[t].share_of_tokens if t in rows else 0.0 for t in tenants]
        slo = [rows[t].slo_attainment if t in rows else 0.0 for t in tenants]
        denied = [rows[t].denials / rows[t].requests if t in rows else 0.0 for t in tenants]
        axes[0].bar(x + i * width, share, width, label=r.stack)
        axes[1].bar(x + i * width, slo, width, label=r.stack)
        axes[2].bar(x + i * width, denied, width, label=r.stack)
    names = ("share of output tokens", "SLO attainment", "gateway 429s per request")
    for ax, name in zip(axes, names, strict=True):
        ax.set_xticks(x + 0.4 - width / 2, tenants, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(name)
    axes[0].set_ylim(0, 1.05)
    axes[1].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _html_table(results: Sequence[SimResult]) -> str:
    head = "".join(f"<th>{html.escape(r.stack)}</th>" for r in results)
    rows = []
    for key, label in _ROWS:
        cells = "".join(f"<td>{_fmt(_value(r, key))}</td>" for r in results)
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    return f"<table><tr><th>figure</th>{head}</tr>{''.join(rows)}</table>"


_TENANT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("admissions", "admitted"),
    ("denials", "429s"),
    ("gave_up", "given up"),
    ("rejected", "rejected"),
    ("completed", "completed"),
    ("slo_attainment", "SLO attainment"),
    ("ttft_p95_s", "TTFT p95 (s)"),
    ("share_of_tokens", "token share"),
)


def _html_tenants(results: Sequence[SimResult]) -> str:
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in _TENANT_COLUMNS)
    rows = []
    for r in results:
        for t in r.summary.tenants:
            cells = "".join(
                f"<td>{_fmt(float(getattr(t, key)))}</td>" for key, _ in _TENANT_COLUMNS
            )
            rows.append(
                f"<tr><th>{html.escape(r.stack)}</th><th>{html.escape(t.tenant)}</th>{cells}</tr>"
            )
    return f"<table><tr><th>stack</th><th>tenant</th>{head}</tr>{''.join(rows)}</table>"


def write_report(
    results: Sequence[SimResult], directory: str | pathlib.Path, *, title: str | None = None
) -> pathlib.Path:
    """Write ``results.json``, three PNGs and ``report.html`` into ``directory``.

    Returns:
        The path of ``report.html``.
    """
    if not results:
        raise ValueError("'results' must hold at least one result")
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results_json(results), indent=2) + "\n")
    pngs = [
        plot_memory(results, out / "memory.png"),
        plot_latency_cdf(results, out / "latency_cdf.png"),
        plot_tenant_shares(results, out / "tenants.png"),
    ]
    first = results[0]
    heading = title or f"kvpolicy simulation: {first.workload}, {first.model} on {first.gpu}"
    images = "".join(
        f'<figure><img alt="{p.stem}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode("ascii")}"></figure>'
        for p in pngs
    )
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th:first-child{{text-align:left}}img{{max-width:100%}}</style></head>
<body><h1>{html.escape(heading)}</h1>
<p>{len(first.record.requests):,} requests. Figures from kvpolicy-sim's roofline time model;
see results.json for every figure.</p>
{_html_table(results)}
<h2>Tenants</h2>
{_html_tenants(results)}
{images}
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path
