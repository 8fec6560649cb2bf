"""``kvpolicy tiers``: the adaptive Pareto search and the reuse analysis of Kareto.

Outside ``kvpolicy.tiers`` and with its imports inside the commands, so that ``--help``
imports neither the library nor numpy.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

import click

from kvpolicy.kvmodel.cli import MODEL, FiniteFloat, OutputFile, table_console

__all__ = ["group"]


_TRACE_FORMAT = (
    "a JSONL hash trace: one JSON object a line with 'hash_ids' and 'timestamp' (ms, "
    "Mooncake's) or 'time' (s), in time order"
)


def _read_trace(path: str, limit: int | None) -> list[tuple[float, list[int]]]:
    """A JSONL hash trace: Mooncake rows (``timestamp`` in ms, ``hash_ids``) or rows with
    ``time`` in seconds and ``hash_ids``; times finite, >= 0 and in order."""
    rows: list[tuple[float, list[int]]] = []

    def bad(number: int, why: str) -> click.BadParameter:
        return click.BadParameter(
            f"{path}: line {number}: {why}; expected {_TRACE_FORMAT}", param_hint="--trace"
        )

    with pathlib.Path(path).open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    raise bad(number, "not JSON") from None
                if not isinstance(r, dict) or "hash_ids" not in r:
                    raise bad(number, "no 'hash_ids'")
                try:
                    t = float(r["time"]) if "time" in r else float(r["timestamp"]) / 1000.0
                    hashes = [int(h) for h in r["hash_ids"]]
                except KeyError:
                    raise bad(number, "no 'timestamp' or 'time'") from None
                except (ValueError, TypeError) as err:
                    raise bad(number, f"a value is not a number ({err})") from None
                if not math.isfinite(t) or t < 0:
                    raise bad(number, f"time {t!r} s is not a finite time >= 0")
                if rows and t < rows[-1][0]:
                    raise bad(number, f"time {t!r} s is earlier than the line before it")
                rows.append((t, hashes))
                if limit is not None and len(rows) >= limit:
                    break
        except UnicodeDecodeError:
            raise click.BadParameter(
                f"{path}: not text (binary?); expected {_TRACE_FORMAT}", param_hint="--trace"
            ) from None
    if not rows:
        raise click.BadParameter(f"no requests in {path!r}", param_hint="--trace")
    return rows


@click.group()
def group() -> None:
    """KV tiers below HBM (after Kareto, the tiered KV-cache optimizer): Pareto sizing and
    reuse analysis."""


_TRACE = click.option("--trace", required=True, type=click.Path(exists=True, dir_okay=False))


@group.command("plan")
@_TRACE
@click.option("--grid", is_flag=True, help="Also run the full grid; report hypervolume_ratio.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--max-requests",
    default=600,
    show_default=True,
    type=click.IntRange(min=1),
    help="Requests of the trace replayed per evaluation (from its start).",
)
@click.option(
    "--model",
    type=MODEL,
    default="Llama-3-8B",
    show_default=True,
    help="Model whose KV bytes a block holds (a preset, any case).",
)
@click.option(
    "--block-tokens",
    default=512,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens per hashed block of the trace (Mooncake's traces: 512).",
)
def plan(
    trace: str, grid: bool, as_json: bool, max_requests: int, model: str, block_tokens: int
) -> None:
    """Adaptive Pareto search over DRAM GiB x disk GiB (Algorithm 1) by trace replay."""
    from rich.table import Table

    from kvpolicy.kvmodel import get_model
    from kvpolicy.tiers import ReplayEvaluator, get_tier, plan_tiers

    rows = _read_trace(trace, max_requests)
    evaluate = ReplayEvaluator(
        rows,
        get_model(model).kv_bytes_per_block(block_tokens),
        prefill_seconds_per_block=0.05,
        decode_seconds_per_request=0.5,
        gpu_price_per_hour=3.0,
        dram=get_tier("dram"),
        disk=get_tier("disk"),
    )
    result = plan_tiers(evaluate, grid=grid)
    adaptive = result.adaptive
    doc: dict[str, Any] = {
        "requests": len(rows),
        "evaluations": len(adaptive.evaluations),
        "front": [
            {
                **dict(e.config),
                "latency_s": e.objectives.latency,
                "throughput_rps": e.objectives.throughput,
                "cost": e.objectives.cost,
            }
            for e in adaptive.front
        ],
    }
    if result.grid is not None:
        doc["grid_evaluations"] = len(result.grid.evaluations)
        doc["hypervolume_ratio"] = result.hypervolume_ratio
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    table = Table(title=f"Pareto front ({doc['evaluations']} evaluations)")
    for col in ("dram_gib", "disk_gib", "latency_s", "throughput_rps", "cost"):
        table.add_column(col)
    for p in doc["front"]:
        table.add_row(
            *(f"{p[c]:.4g}" for c in ("dram_gib", "disk_gib", "latency_s")),
            *(f"{p[c]:.4g}" for c in ("throughput_rps", "cost")),
        )
    table_console().print(table)
    if grid:
        click.echo(
            f"grid: {doc['grid_evaluations']} evaluations; "
            f"hypervolume_ratio {doc['hypervolume_ratio']:.4f}"
        )


@group.command("reuse")
@_TRACE
@click.option(
    "--top-k",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most reused prefix subtrees to list.",
)
@click.option(
    "--depth", default=2, show_default=True, type=click.IntRange(min=1), help="Subtree depth."
)
@click.option(
    "--budget",
    default=5e7,
    show_default=True,
    type=FiniteFloat(min=0.0, min_open=True),
    help="Block-seconds of TTL to share among the groups.",
)
@click.option(
    "--export",
    "export",
    type=OutputFile(),
    default=None,
    help="Write the prefix tree as GraphML (networkx) to this file.",
)
@click.option(
    "--max-requests",
    default=None,
    type=click.IntRange(min=1),
    help="Read at most this many requests of the trace (default: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def reuse(
    trace: str,
    top_k: int,
    depth: int,
    budget: float,
    export: pathlib.Path | None,
    max_requests: int | None,
    as_json: bool,
) -> None:
    """Reuse analysis, the prefix tree's top subtrees and their fitted group TTLs."""
    from rich.table import Table

    from kvpolicy.tiers import (
        allocate_group_ttls,
        analyze_reuse,
        export_graphml,
        prefix_tree,
        subtree_reuse,
        tree_groups,
    )

    rows = _read_trace(trace, max_requests)
    analysis = analyze_reuse(rows)
    start = time.perf_counter()
    tree = prefix_tree(rows)
    tree_s = time.perf_counter() - start
    groups = tree_groups(tree, top_k, depth)
    alloc = allocate_group_ttls(groups, budget)
    doc: dict[str, Any] = {
        "requests": len(rows),
        "references": analysis.references,
        "unique_blocks": analysis.unique_blocks,
        "reuse_ratio": analysis.reuse_ratio,
        "hot_fraction_90": analysis.hot_fraction(0.9),
        "tree_nodes": tree.number_of_nodes(),
        "tree_build_s": tree_s,
        "budget_block_s": budget,
        "hits": alloc.hits,
        "cost_block_s": alloc.cost,
        "groups": [
            {
                "key": g.key,
                "unique_blocks": g.unique_blocks,
                "references": g.references,
                "reuses": g.reuses,
                "ttl_s": ttl,
                "roi_ttl_s": roi,
            }
            for g, ttl, roi in zip(groups, alloc.ttls, alloc.roi_ttls, strict=True)
        ],
    }
    if export is not None:
        export_graphml(tree, export)
        doc["export"] = str(export)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(
        f"{doc['requests']} requests, {doc['references']} block references, "
        f"{doc['unique_blocks']} blocks; reuse ratio {doc['reuse_ratio']:.3f}; "
        f"90% of reuses in {doc['hot_fraction_90']:.2%} of blocks"
    )
    table = Table(title=f"top {top_k} subtrees (depth {depth}) and fitted TTLs")
    for col in ("key", "blocks", "refs", "reuses", "ttl_s", "roi_ttl_s"):
        table.add_column(col)
    for g in doc["groups"]:
        key = "residual" if g["key"] is None else str(g["key"])
        subtree = "" if g["key"] is None else f" ({subtree_reuse(tree, g['key'])[2]} in subtree)"
        table.add_row(
            key + subtree,
            str(g["unique_blocks"]),
            str(g["references"]),
            str(g["reuses"]),
            f"{g['ttl_s']:.1f}",
            f"{g['roi_ttl_s']:.1f}",
        )
    table_console().print(table)
    click.echo(f"hits {alloc.hits}, cost {alloc.cost:.4g} of {budget:.4g} block-seconds")
