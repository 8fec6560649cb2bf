"""Reports of one or several runs: a rich table, JSON, PNG plots and a self-contained HTML.

Plots use matplotlib's Agg backend (no display needed). The HTML embeds the PNGs as base64,
so the single file opens in any browser and can be attached or archived as is.
"""

from __future__ import annotations

import base64
import html
import json
import math
import pathlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from rich import box
from rich.table import Table
from rich.text import Text

from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._metrics import ReplicaSummary
from kvpolicy.sim._simulate import SimResult
from kvpolicy.sim._story import describe_stack, run_warnings, what_happened
from kvpolicy.sim._sweep import SweepPoint

__all__ = [
    "comparison_table",
    "glossary",
    "plot_latency_cdf",
    "plot_memory",
    "plot_tenant_shares",
    "results_json",
    "sweep_tables",
    "write_report",
]

_Row = tuple[str, str, str]
"""(key, label, meaning)."""

_SECTIONS: tuple[tuple[str, tuple[_Row, ...]], ...] = (
    (
        "goodput",
        (
            (
                "goodput_rps",
                "goodput (req/s in SLO)",
                "Requests finished within both latency targets (TTFT and TPOT), per second "
                "of the run.",
            ),
            (
                "goodput_tps",
                "goodput (output tok/s in SLO)",
                "Output tokens of those requests per second of the run.",
            ),
            (
                "slo_attainment",
                "SLO attainment (of arrived)",
                "Requests within both targets over every request that arrived: rejected and "
                "given-up requests count as misses.",
            ),
        ),
    ),
    (
        "requests",
        (
            ("requests", "arrived", "Requests in the workload."),
            ("completed", "completed", "Requests that finished, within the targets or not."),
            ("slo_met", "completed within SLO", "Completed within both latency targets."),
            (
                "rejected_context",
                "rejected: over context",
                "Refused at once: prompt plus output longer than the model's context.",
            ),
            (
                "rejected_memory",
                "rejected: over KV pool",
                "Refused at once: fits the context but needs more KV than the whole pool.",
            ),
            (
                "gave_up",
                "gave up after 429s",
                "Requests whose client stopped retrying after the gateway's last allowed 429.",
            ),
            (
                "unfinished",
                "unfinished at stop",
                "Requests still waiting or running when the run stopped early.",
            ),
            (
                "gate_denials",
                "gateway 429s",
                "429 answers from the gateway (a request denied twice counts twice); each "
                "delays its request by the Retry-After.",
            ),
        ),
    ),
    (
        "throughput",
        (
            (
                "throughput_rps",
                "throughput (req/s)",
                "Completed requests per second of the run, within the targets or not.",
            ),
            (
                "throughput_tps",
                "throughput (output tok/s)",
                "Output tokens of completed requests per second of the run.",
            ),
        ),
    ),
    (
        "latency: completed requests only",
        (
            (
                "latency_covers",
                "measured (completed/arrived)",
                "The latency percentiles below cover completed requests only; rejected, "
                "given-up and unfinished requests have no latency.",
            ),
            ("ttft.p50", "TTFT p50 (s)", "Time to first token from the first arrival, median."),
            ("ttft.p99", "TTFT p99 (s)", "Time to first token, 99th percentile."),
            (
                "tpot.p50",
                "TPOT p50 (ms)",
                "Mean time per output token after the first, median over requests.",
            ),
            ("tpot.p99", "TPOT p99 (ms)", "Time per output token, 99th percentile."),
            ("e2e.p50", "E2E p50 (s)", "First arrival to last token, median."),
            ("e2e.p95", "E2E p95 (s)", "First arrival to last token, 95th percentile."),
            ("e2e.p99", "E2E p99 (s)", "First arrival to last token, 99th percentile."),
        ),
    ),
    (
        "memory",
        (
            ("peak_kv_gib", "peak KV (GiB)", "Most KV memory held in used blocks at once."),
            ("pool_gib", "KV pool (GiB)", "HBM left for KV after the weights."),
            ("mean_kv_gib", "mean KV (GiB)", "Time-weighted mean of the KV memory held."),
            (
                "evicted_tokens",
                "evicted tokens",
                "Tokens the eviction policy dropped from running requests.",
            ),
            (
                "attention_recall",
                "attention recall",
                "Mean share of the synthetic attention mass on tokens still resident (1 "
                "without eviction): how much eviction costs the model.",
            ),
            (
                "preemptions",
                "preemptions",
                "Running requests pushed out when blocks ran out (twice counts twice).",
            ),
            (
                "recomputed_tokens",
                "recomputed tokens",
                "Tokens computed again for preempted requests.",
            ),
            (
                "prefix_hit_tokens",
                "prefix-cache hit tokens",
                "Prompt tokens served from KV already in HBM (shared prefixes).",
            ),
            (
                "tier_hit_tokens",
                "tier hit tokens (DRAM/disk)",
                "Prompt tokens loaded from the tiers below HBM instead of recomputed.",
            ),
        ),
    ),
    (
        "cost",
        (
            (
                "cost_usd",
                "GPU cost of the run ($)",
                "GPU price per hour times the run's length (first arrival to its end): the "
                "GPU time of every request, finished or not.",
            ),
            (
                "cost_per_1k_completed_usd",
                "cost per 1k completed ($)",
                "The run's GPU cost per thousand completed requests: a stack that turns "
                "requests away pays the same hours for fewer of them.",
            ),
            (
                "cost_per_1k_slo_met_usd",
                "cost per 1k in SLO ($)",
                "The run's GPU cost per thousand requests finished within the targets.",
            ),
        ),
    ),
)

_OPTIONAL = frozenset({"unfinished"})
"""Rows shown only when some run has a non-zero value."""


def _rows(results: Sequence[SimResult]) -> list[tuple[str, tuple[_Row, ...]]]:
    return [
        (
            section,
            tuple(
                row
                for row in rows
                if row[0] not in _OPTIONAL or any(_value(r, row[0]) for r in results)
            ),
        )
        for section, rows in _SECTIONS
    ]


def _value(result: SimResult, key: str) -> float:
    s = result.summary
    if key == "peak_kv_gib":
        return s.peak_kv_bytes / 2**30
    if key == "pool_gib":
        return s.capacity_tokens * result.record.bytes_per_token / 2**30
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


def _cell(result: SimResult, key: str) -> str:
    if key == "latency_covers":
        return f"{result.summary.completed:,}/{result.summary.requests:,}"
    return _fmt(_value(result, key))


def comparison_table(results: Sequence[SimResult], title: str | None = None) -> Table:
    """A rich table: one row per figure in sections (goodput first, then where every
    request ended, throughput, latency of completed requests, memory, cost), one column
    per run. Cells fold rather than cut when the console is narrow."""
    if not results:
        raise ValueError("'results' must hold at least one result")
    first = results[0]
    table = Table(
        title=title or f"{first.workload}: {first.model} on {first.gpu}",
        title_justify="left",
    )
    table.add_column("figure", overflow="fold")
    for r in results:
        table.add_column(Text(_short_header(r.stack, 12)), justify="right", overflow="fold")
    for section, rows in _rows(results):
        table.add_row(f"[bold]{section}[/]", *("" for _ in results))
        for i, (key, label, _) in enumerate(rows):
            table.add_row(
                f" {label}", *(_cell(r, key) for r in results), end_section=i == len(rows) - 1
            )
    fleet = fleet_rows(results)
    if fleet:
        table.add_row("[bold]fleet[/]", *("" for _ in results))
        for label, cells in fleet:
            table.add_row(f" {label}", *cells)
    return table


_REPLICA_ROWS: tuple[tuple[str, Callable[[ReplicaSummary], str]], ...] = (
    ("requests (in SLO)", lambda x: f"{x.requests:,} ({x.slo_met:,})"),
    ("model on GPU", lambda x: f"{x.model} on {x.gpu}"),
    ("serving (s)", lambda x: f"{_fmt(x.up_s)}-{_fmt(x.down_s)}"),
    ("peak KV (tokens)", lambda x: _fmt(x.peak_kv_tokens)),
)
"""Per replica of a fleet: the label of a row and its cell."""


def fleet_rows(results: Sequence[SimResult]) -> list[tuple[str, tuple[str, ...]]]:
    """Rows of the fleet figures, one cell per run ("-" for a run of one engine): GPU-hours,
    peak replicas, then per replica its requests (those in SLO), model on GPU, serving time
    and peak KV; empty when no run is a fleet."""
    fleets = [r.summary.fleet for r in results]
    if all(f is None for f in fleets):
        return []
    rows = [
        ("GPU-hours", tuple("-" if f is None else _fmt(f.gpu_hours) for f in fleets)),
        ("peak replicas", tuple("-" if f is None else _fmt(f.peak_replicas) for f in fleets)),
    ]
    by_id: list[dict[str, ReplicaSummary]] = [
        {} if f is None else {x.replica_id: x for x in f.replicas} for f in fleets
    ]
    for rid in dict.fromkeys(rid for reps in by_id for rid in reps):
        for label, cell in _REPLICA_ROWS:
            values = tuple(cell(reps[rid]) if rid in reps else "-" for reps in by_id)
            rows.append((f"{rid} {label}", values))
    return rows


_SWEEP_TABLES: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    (
        "where every request ended",
        (
            ("goodput\nreq/s", ("goodput_rps",)),
            ("SLO\nattain.", ("slo_attainment",)),
            ("arrived", ("requests",)),
            ("completed", ("completed",)),
            ("rejected\nctx/KV", ("rejected_context", "rejected_memory")),
            ("gave up\n(429s)", ("gave_up", "gate_denials")),
        ),
    ),
    (
        "latency of completed requests, memory, cost",
        (
            ("goodput\ntok/s", ("goodput_tps",)),
            ("TTFT\np99 s", ("ttft.p99",)),
            ("E2E\np95 s", ("e2e.p95",)),
            ("peak KV\nGiB", ("peak_kv_gib",)),
            ("preemp-\ntions", ("preemptions",)),
            ("$ per 1k\ncompleted", ("cost_per_1k_completed_usd",)),
        ),
    ),
)
"""Per table: its title and columns, each a header and the figures it shows (a second
figure joins as ``a/b`` or, for 429s, ``a (b)``)."""


def _sweep_cell(summary: dict[str, Any], keys: tuple[str, ...]) -> str:
    values = [_fmt(_summary_value(summary, k)) for k in keys]
    if len(values) == 1:
        return values[0]
    return f"{values[0]} ({values[1]})" if keys[1] == "gate_denials" else "/".join(values)


def _short_header(key: str, width: int = 10) -> str:
    """``key`` broken into lines of at most ``width`` characters after a dot, an
    underscore, a bracket, a comma or an equals sign, so a long ``section.field`` or
    ``stack[section.field=value]`` needs a narrow column."""
    lines = [""]
    for part in re.split(r"(?<=[._\[,=])", key):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def _summary_value(summary: dict[str, Any], key: str) -> float:
    """A figure of :meth:`Summary.as_dict` (None, a NaN, is NaN)."""
    if key == "peak_kv_gib":
        return float(summary["peak_kv_bytes"]) / 2**30
    group, _, stat = key.partition(".")
    v = summary[group][stat] if stat else summary[key]
    return math.nan if v is None else float(v)


def sweep_tables(
    points: Sequence[SweepPoint], keys: Sequence[str], title: str
) -> tuple[Table, Table]:
    """Two rich tables of a sweep, one row per point, each led by the grid's parameters
    and goodput, narrow enough for 80 columns: where every request ended (arrived,
    completed, rejected by reason, gave up, 429s), then latency of completed requests,
    memory and cost."""
    tables = []
    for part, columns in _SWEEP_TABLES:
        # Two spaces between columns and none at the edges: six figures and two
        # parameters fit 80 columns.
        table = Table(
            title=f"{title}: {part}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            padding=(0, 1, 0, 0),
        )
        for key in keys:
            table.add_column(Text(_short_header(key)), overflow="fold")
        for label, _ in columns:
            table.add_column(label, justify="right", overflow="fold")
        for p in points:
            table.add_row(
                *(Text(str(p.params[k])) for k in keys),
                *(_sweep_cell(p.summary, figures) for _, figures in columns),
            )
        tables.append(table)
    return tables[0], tables[1]


def glossary() -> tuple[tuple[str, str], ...]:
    """``(label, meaning)`` of every figure of :func:`comparison_table`, in its order."""
    return tuple((label, meaning) for _, rows in _SECTIONS for _, label, meaning in rows)


def _configs(
    results: Sequence[SimResult], configs: Sequence[StackConfig] | None
) -> list[StackConfig | None]:
    if configs is None:
        return [None] * len(results)
    if len(configs) != len(results):
        raise ValueError(
            f"'configs' must hold one StackConfig per result ({len(results)}): {len(configs)}"
        )
    return list(configs)


def _notes(results: Sequence[SimResult]) -> list[str]:
    """The workloads' notes, each once, in order."""
    return list(dict.fromkeys(n for r in results for n in r.notes))


def results_json(
    results: Sequence[SimResult], configs: Sequence[StackConfig] | None = None
) -> dict[str, Any]:
    """JSON-ready document: every run's summary, its stack's parts (when ``configs``, the
    stacks the runs used, are given), its warnings, its workload's notes and the changes of
    its gateway's throughput estimate, and the "what happened" paragraph.

    Raises:
        ValueError: ``configs`` does not hold one stack per result.
    """
    cfgs = _configs(results, configs)
    runs = []
    for r, c in zip(results, cfgs, strict=True):
        run: dict[str, Any] = {
            "stack": r.stack,
            "workload": r.workload,
            "model": r.model,
            "gpu": r.gpu,
        }
        if c is not None:
            run["stack_parts"] = dict(describe_stack(c))
        run["notes"] = list(r.notes)
        run["warnings"] = run_warnings(r, c)
        run["summary"] = r.summary.as_dict()
        run["gateway_refreshes"] = [
            {"time_s": t, "tokens_per_s": tps} for t, tps in r.record.gateway_refreshes
        ]
        runs.append(run)
    return {"runs": runs, "what_happened": what_happened(results) if results else ""}


_RC: Any = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 13,
}
"""Matplotlib settings of every plot: nothing smaller than 10 points."""


@contextmanager
def _figure() -> Iterator[Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context(_RC):
        yield plt


def _save(plt: Any, fig: Any, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_memory(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """KV memory held over time, one line per run (labelled with its peak), with the pool
    capacity dashed."""
    with _figure() as plt:
        fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
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
            label = f"{r.stack} (peak {r.summary.peak_kv_bytes / 2**30:.1f} GiB)"
            ax.plot(t, gib, lw=0.8, label=label)
        if results:
            rec = results[0].record
            ax.axhline(
                rec.capacity_tokens * rec.bytes_per_token / 2**30,
                ls="--",
                c="grey",
                lw=0.8,
                label="KV pool",
            )
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("KV held (GiB)")
        ax.set_title("KV memory held in used blocks over time")
        ax.legend()
        return _save(plt, fig, path)


def plot_latency_cdf(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """CDFs of TTFT and end-to-end latency of completed requests, one line per run
    (labelled with how many of the arrived requests it covers)."""
    with _figure() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110)
        for r in results:
            rec = r.record
            arrival = np.array([q.arrival_time for q in rec.requests])
            done = np.isfinite(rec.finish)
            label = f"{r.stack} ({int(done.sum()):,} of {len(rec.requests):,})"
            for ax, values in (
                (axes[0], rec.first_token - arrival),
                (axes[1], rec.finish - arrival),
            ):
                v = np.sort(values[done])
                if len(v):
                    ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.0, label=label)
        titles = ("time to first token", "end-to-end latency")
        for ax, name in zip(axes, titles, strict=True):
            ax.set_xscale("log")
            ax.set_title(name.capitalize())
            ax.set_xlabel(f"{name} (s, log scale)")
            ax.set_ylabel("fraction of completed requests")
            ax.grid(alpha=0.3)
        axes[0].legend(title="completed of arrived")
        fig.suptitle("Latency CDFs: completed requests only")
        return _save(plt, fig, path)


_TENANT_PANELS: tuple[tuple[str, str], ...] = (
    ("share_of_tokens", "Share of output tokens served"),
    ("slo_attainment", "SLO attainment (of arrived)"),
    ("denials", "Gateway 429s per arrived request"),
    ("gave_up", "Gave up (share of arrived)"),
)


def plot_tenant_shares(results: Sequence[SimResult], path: pathlib.Path) -> pathlib.Path:
    """Per tenant, grouped by run: share of output tokens served, SLO attainment, gateway
    429s per arrived request and the share of arrived requests given up."""
    with _figure() as plt:
        fig, grid = plt.subplots(2, 2, figsize=(10, 7), dpi=110)
        axes = list(grid.flat)
        tenants = sorted({t.tenant for r in results for t in r.summary.tenants})
        width = 0.8 / max(len(results), 1)
        x = np.arange(len(tenants))
        for i, r in enumerate(results):
            rows = {t.tenant: t for t in r.summary.tenants}
            for ax, (key, _) in zip(axes, _TENANT_PANELS, strict=True):
                values = [
                    float(getattr(rows[t], key))
                    / (rows[t].requests if key in ("denials", "gave_up") else 1)
                    if t in rows
                    else 0.0
                    for t in tenants
                ]
                ax.bar(x + i * width, values, width, label=r.stack)
        for ax, (key, name) in zip(axes, _TENANT_PANELS, strict=True):
            ax.set_xticks(x + 0.4 - width / 2, tenants, rotation=30, ha="right")
            ax.set_title(name)
            ax.set_xlabel("tenant")
            if key != "denials":
                ax.set_ylim(0, 1.05)
        axes[0].legend()
        fig.suptitle("Per tenant")
        return _save(plt, fig, path)


def _html_table(results: Sequence[SimResult]) -> str:
    head = "".join(f"<th>{html.escape(r.stack)}</th>" for r in results)
    rows = []
    for section, figures in _rows(results):
        rows.append(
            f'<tr class="section"><th colspan="{len(results) + 1}">{html.escape(section)}</th></tr>'
        )
        for key, label, meaning in figures:
            cells = "".join(f"<td>{_cell(r, key)}</td>" for r in results)
            rows.append(
                f'<tr><th title="{html.escape(meaning)}">{html.escape(label)}</th>{cells}</tr>'
            )
    fleet = fleet_rows(results)
    if fleet:
        rows.append(f'<tr class="section"><th colspan="{len(results) + 1}">fleet</th></tr>')
        for label, values in fleet:
            cells = "".join(f"<td>{html.escape(v)}</td>" for v in values)
            rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    return f"<table><tr><th>figure</th>{head}</tr>{''.join(rows)}</table>"


def _html_glossary() -> str:
    rows = "".join(
        f'<tr><th>{html.escape(label)}</th><td class="text">{html.escape(meaning)}</td></tr>'
        for label, meaning in glossary()
    )
    return f"<table><tr><th>figure</th><th>meaning</th></tr>{rows}</table>"


def _html_stacks(results: Sequence[SimResult], cfgs: Sequence[StackConfig | None]) -> str:
    blocks = []
    for r, c in zip(results, cfgs, strict=True):
        if c is None:
            blocks.append(f"<h3>{html.escape(r.stack)}</h3><p>(its parts were not given)</p>")
            continue
        rows = "".join(
            f'<tr><th>{html.escape(part)}</th><td class="text">{html.escape(text)}</td></tr>'
            for part, text in describe_stack(c)
        )
        blocks.append(f"<h3>{html.escape(r.stack)}</h3><table>{rows}</table>")
    return "".join(blocks)


_TENANT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("requests", "arrived"),
    ("admissions", "admitted"),
    ("denials", "429s"),
    ("gave_up", "gave up"),
    ("rejected", "rejected"),
    ("rejected_context", "of which over context"),
    ("completed", "completed"),
    ("slo_met", "within SLO"),
    ("slo_attainment", "SLO attainment"),
    ("ttft_p95_s", "TTFT p95 of completed (s)"),
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


def _html_list(items: Sequence[str], css: str) -> str:
    if not items:
        return ""
    lis = "".join(f"<li>{html.escape(i)}</li>" for i in items)
    return f'<ul class="{css}">{lis}</ul>'


_CAPTIONS = {
    "memory": "KV memory each stack held over time; the dashed line is the KV pool.",
    "latency_cdf": "Share of completed requests served within a given time; requests "
    "rejected, given up or unfinished are not in these curves (the legend says how many "
    "of the arrived requests each covers).",
    "tenants": "Per tenant: share of the output tokens served, SLO attainment over its "
    "arrived requests, gateway 429s per arrived request, and the share that gave up.",
}


def write_report(
    results: Sequence[SimResult],
    directory: str | pathlib.Path,
    *,
    title: str | None = None,
    configs: Sequence[StackConfig] | None = None,
) -> pathlib.Path:
    """Write ``results.json``, three PNGs and ``report.html`` into ``directory``.

    The HTML says what happened (a paragraph computed from the figures), lists warnings and
    the workload's notes, describes each stack part by part (when ``configs``, the stacks
    the runs used, are given), and explains every figure in a glossary.

    Returns:
        The path of ``report.html``.

    Raises:
        ValueError: no results, or ``configs`` does not hold one stack per result.
    """
    if not results:
        raise ValueError("'results' must hold at least one result")
    cfgs = _configs(results, configs)
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    doc_json = results_json(results, configs)
    (out / "results.json").write_text(json.dumps(doc_json, indent=2) + "\n")
    pngs = [
        plot_memory(results, out / "memory.png"),
        plot_latency_cdf(results, out / "latency_cdf.png"),
        plot_tenant_shares(results, out / "tenants.png"),
    ]
    first = results[0]
    heading = title or f"kvpolicy simulation: {first.workload}, {first.model} on {first.gpu}"
    images = "".join(
        f'<figure><img alt="{p.stem}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode("ascii")}">'
        f"<figcaption>{html.escape(_CAPTIONS[p.stem])}</figcaption></figure>"
        for p in pngs
    )
    warnings = [f"{r['stack']}: {w}" for r in doc_json["runs"] for w in r["warnings"]]
    notes = _notes(results)
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1000px;line-height:1.4}}
table{{border-collapse:collapse;margin:0.5em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}}
th:first-child,td.text{{text-align:left}}tr.section th{{background:#eee;text-align:left}}
ul.warnings{{background:#fff4e5;border-left:4px solid #e69500;padding:0.5em 2em}}
img{{max-width:100%}}figcaption{{font-size:0.9em;color:#444}}</style></head>
<body><h1>{html.escape(heading)}</h1>
<p>{len(first.record.requests):,} requests of the {html.escape(first.workload)} workload on
{html.escape(first.model)} / {html.escape(first.gpu)}, simulated with kvpolicy-sim's roofline
time model; results.json holds every figure.</p>
<h2>What happened</h2>
<p>{html.escape(doc_json["what_happened"])}</p>
{"<h2>Warnings</h2>" + _html_list(warnings, "warnings") if warnings else ""}
{"<h2>Workload notes</h2>" + _html_list(notes, "notes") if notes else ""}
<h2>Figures</h2>
{_html_table(results)}
<h2>Stacks</h2>
{_html_stacks(results, cfgs)}
<h2>Tenants</h2>
{_html_tenants(results)}
<h2>Plots</h2>
{images}
<h2>What each figure means</h2>
{_html_glossary()}
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path
