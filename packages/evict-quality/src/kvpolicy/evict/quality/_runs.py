"""Rows of ``kvpolicy evict eval``: one decoding run per (text, task, policy, budget), appended
to a JSON-lines file as each finishes, so that an interrupted evaluation resumes where it
stopped and several invocations (one policy each) fill the same file.

A row is a flat JSON object; :data:`ROW_KEY` names the fields that identify a run. The
peer harness for NVIDIA's kvpress (``benchmarks/kvpress_peers.py``) writes the same rows.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from kvpolicy.evict import ReturnPredictor
from kvpolicy.evict.quality._bootstrap import bootstrap_perplexity, bootstrap_ratio
from kvpolicy.evict.quality._decode import DecodeResult, decode_batch, decode_perplexity
from kvpolicy.evict.quality._eval import FULL, budget_tokens, demoting_factory, policy_factory
from kvpolicy.evict.quality._lookup import LookupTask, lookup_accuracy
from kvpolicy.evict.quality._model import CausalLM
from kvpolicy.evict.quality._needle import NeedleTask
from kvpolicy.kvmodel import EvictionPolicy

__all__ = [
    "BUDGET_UNITS",
    "KEY_DEFAULTS",
    "ROW_KEY",
    "TASKS",
    "append_row",
    "bytes_rows",
    "compare_to_full",
    "decode_row",
    "decode_rows",
    "missing",
    "read_rows",
    "result_row",
    "row_key",
]

TASKS = ("ppl", "lookup", "needle")
"""``ppl``: perplexity of a text; ``lookup``: accuracy on the records planted before it;
``needle``: accuracy on records planted at 25%, 50% and 75% of it (``depth_accuracy``)."""

ROW_KEY = (
    "task",
    "text",
    "tokens",
    "policy",
    "budget",
    "predictor",
    "streams",
    "signal",
    "budget_unit",
)
"""Fields that identify a run; a results file holds at most one row per key. A row without
``streams`` (kvpress's, and rows written before per-head streams) counts as ``"layer"``,
one without ``signal`` (kvpress's, and rows written before it) as ``"attention"``, one
without ``budget_unit`` (every row before budgets in bytes) as ``"tokens"``."""

BUDGET_UNITS = ("tokens", "bytes")
"""What a budget is a fraction of: the tokens fed (per layer), or the bytes the full cache
of those tokens holds at 16 bits (per layer; tokens may be held at lower precision)."""

KEY_DEFAULTS = {"streams": "layer", "signal": "attention", "budget_unit": "tokens"}
"""What a row without ``streams`` or ``signal`` counts as (see :data:`ROW_KEY`)."""


def row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The identifying fields of ``row`` (budget rounded so 0.125 and 0.1250 match;
    ``streams`` and ``signal`` default as :data:`ROW_KEY` says)."""
    return tuple(
        round(row[k], 6)
        if k == "budget"
        else row.get(k, KEY_DEFAULTS[k])
        if k in KEY_DEFAULTS
        else row[k]
        for k in ROW_KEY
    )


def read_rows(path: pathlib.Path) -> list[dict[str, Any]]:
    """The rows of a results file (empty when it does not exist); a torn last line (a run
    killed while writing) is ignored.

    Raises:
        ValueError: a line other than the last is not a JSON object.
    """
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise ValueError(f"{path}:{i + 1}: not a JSON row") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i + 1}: not a JSON object")
        rows.append(row)
    return rows


def append_row(path: pathlib.Path, row: Mapping[str, Any]) -> None:
    """Append one row as a line and flush it to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(dict(row)) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def result_row(
    *,
    task: str,
    text: str,
    tokens: int,
    policy: str,
    budget: float,
    kept: int,
    predictor: str,
    result: DecodeResult,
    lookup: LookupTask | NeedleTask | None = None,
    extra: Mapping[str, Any] | None = None,
    streams: str | None = "layer",
    signal: str | None = "attention",
) -> dict[str, Any]:
    """The JSON row of one decoding run (what :func:`decode_row` and the kvpress harness
    write): identity, perplexity with its bootstrap interval, residency, timing, the
    per-position losses and, for ``lookup``, the accuracy. ``streams`` is how kvpolicy's
    harness split the cache into policy streams (``"layer"`` or ``"kv-head"``; the full
    cache is ``"layer"``); None leaves the field out (kvpress's rows: the press decides).
    ``signal`` is what the policies observed (``"attention"`` or ``"output"``, the full
    cache ``"attention"``); None leaves it out likewise."""
    if task not in TASKS:
        raise ValueError(f"'task' must be one of {', '.join(TASKS)}: {task!r}")
    ci = bootstrap_perplexity(result.nll)
    row: dict[str, Any] = {
        "task": task,
        "text": text,
        "tokens": tokens,
        "policy": policy,
        "budget": budget,
        "predictor": predictor,
        "budget_tokens": kept,
        "perplexity": result.perplexity,
        "ppl_low": ci.low,
        "ppl_high": ci.high,
        "mean_resident": result.mean_resident,
        "max_resident": result.max_resident,
        "ms_per_step": result.ms_per_step,
        "policy_ms_per_step": result.policy_ms_per_step,
        "accuracy": None
        if lookup is None
        else lookup.accuracy(result.correct)
        if isinstance(lookup, NeedleTask)
        else lookup_accuracy(result.correct, lookup),
        "nll": [round(float(x), 5) for x in result.nll],
    }
    if isinstance(lookup, NeedleTask):
        row["depth_accuracy"] = lookup.depth_accuracy(result.correct)
    if streams is not None:
        row["streams"] = streams
    if signal is not None:
        row["signal"] = signal
    row.update(extra or {})
    return row


def _plan(
    policy: str, budget: float, n: int, streams: str, signal: str
) -> tuple[Callable[[], EvictionPolicy] | None, int, float, str, str]:
    """(a factory of fresh policies or None for the full cache, tokens kept, the budget
    reported, streams, signal) for ``policy`` at ``budget`` of ``n`` tokens; the full cache
    runs at budget 1.0 with the defaults of :data:`ROW_KEY` (one stream per layer,
    attention)."""
    factory = policy_factory(policy)
    if factory is None:
        return None, n, 1.0, KEY_DEFAULTS["streams"], KEY_DEFAULTS["signal"]
    k = budget_tokens(budget, n)
    return (lambda: factory(k)), k, budget, streams, signal


def decode_row(
    lm: CausalLM,
    input_ids: Any,
    *,
    task: str,
    text: str,
    policy: str,
    budget: float,
    predictor: ReturnPredictor | None,
    predictor_name: str,
    lookup: LookupTask | NeedleTask | None = None,
    progress: Any = None,
    streams: str = "layer",
    signal: str = "attention",
) -> dict[str, Any]:
    """Decode ``input_ids`` under one kvpolicy policy label at one budget; its row.

    ``policy == "full"`` runs the full cache (budget 1.0, streams ``"layer"``, signal
    ``"attention"``); ``streams`` and ``signal`` are
    :func:`~kvpolicy.evict.quality.decode_perplexity`'s.
    """
    n = len(input_ids)
    make, k, budget, streams, signal = _plan(policy, budget, n, streams, signal)
    r = decode_perplexity(
        lm,
        input_ids,
        make,
        k,
        predictor if make else None,
        progress=progress,
        streams=streams,
        signal=signal,
    )
    return result_row(
        task=task,
        text=text,
        tokens=n,
        policy=policy,
        budget=budget,
        kept=k,
        predictor=predictor_name if make is not None else "-",
        result=r,
        lookup=lookup,
        streams=streams,
        signal=signal,
    )


def decode_rows(
    lm: CausalLM,
    input_ids: Sequence[Any],
    *,
    task: str,
    texts: Sequence[str],
    policy: str,
    budget: float,
    predictor: ReturnPredictor | None,
    predictor_name: str,
    lookups: Sequence[LookupTask | NeedleTask | None] | None = None,
    progress: Any = None,
    streams: str = "layer",
    signal: str = "attention",
    budget_unit: str = "tokens",
) -> list[dict[str, Any]]:
    """:func:`decode_row` of several texts of one length as one batch
    (:func:`~kvpolicy.evict.quality.decode_batch`): one row per text, each timed by the
    whole batch (``batch`` in the row says how many texts shared it). With
    ``budget_unit="bytes"`` the budget is a fraction of the full cache's bytes and the
    texts decode under :func:`~kvpolicy.evict.quality._bytes.decode_bytes` (one stream
    per layer, attention signal); the rows carry ``bytes_held``."""
    import torch

    batch = torch.stack([torch.as_tensor(i, dtype=torch.long) for i in input_ids])
    n = int(batch.shape[1])
    if budget_unit not in BUDGET_UNITS:
        raise ValueError(f"'budget_unit' must be one of {', '.join(BUDGET_UNITS)}: {budget_unit!r}")
    if budget_unit == "bytes":
        if streams != "layer" or signal != "attention":
            raise ValueError(
                "a budget in bytes runs one stream per layer on the attention signal: "
                f"streams={streams!r}, signal={signal!r}"
            )
        return bytes_rows(
            lm,
            list(input_ids),
            task=task,
            texts=texts,
            runs=[(policy, budget)],
            predictor=predictor,
            predictor_name=predictor_name,
            lookups=lookups,
            progress=progress,
        )
    make, k, budget, streams, signal = _plan(policy, budget, n, streams, signal)
    results = decode_batch(
        lm,
        batch,
        make,
        k,
        predictor if make else None,
        progress=progress,
        streams=streams,
        signal=signal,
    )
    tasks = list(lookups) if lookups is not None else [None] * len(texts)
    return [
        result_row(
            task=task,
            text=text,
            tokens=n,
            policy=policy,
            budget=budget,
            kept=k,
            predictor=predictor_name if make is not None else "-",
            result=r,
            lookup=lookup,
            extra={"batch": len(texts)},
            streams=streams,
            signal=signal,
        )
        for text, lookup, r in zip(texts, tasks, results, strict=True)
    ]


def compare_to_full(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each ``ppl`` row with its perplexity over the full cache's on the same text and
    length (``ratio``) and the paired block-bootstrap interval of that ratio
    (``ratio_low``, ``ratio_high``), and per-step overhead over the full cache
    (``overhead_ms``); rows without a full-cache partner get None."""
    rows = list(rows)
    full = {(r["task"], r["text"], r["tokens"]): r for r in rows if r["policy"] == FULL}
    out = []
    for r in rows:
        ref = full.get((r["task"], r["text"], r["tokens"]))
        row = {k: v for k, v in r.items() if k != "nll"}
        row.update(ratio=None, ratio_low=None, ratio_high=None, overhead_ms=None)
        if ref is not None and r.get("nll") and ref.get("nll") and len(r["nll"]) == len(ref["nll"]):
            iv = bootstrap_ratio(np.array(r["nll"]), np.array(ref["nll"]))
            row.update(ratio=iv.value, ratio_low=iv.low, ratio_high=iv.high)
            row["overhead_ms"] = r["ms_per_step"] - ref["ms_per_step"]
        out.append(row)
    return out


def missing(
    done: Sequence[Mapping[str, Any]], wanted: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The ``wanted`` run keys (dicts of :data:`ROW_KEY`) not yet in ``done``."""
    have = {row_key(r) for r in done}
    return [dict(w) for w in wanted if row_key(w) not in have]


def bytes_rows(
    lm: CausalLM,
    input_ids: Sequence[Any],
    *,
    task: str,
    texts: Sequence[str],
    runs: Sequence[tuple[str, float]],
    predictor: ReturnPredictor | None,
    predictor_name: str,
    lookups: Sequence[LookupTask | NeedleTask | None] | None = None,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Rows of every ``(policy label, budget)`` of ``runs`` on every text, decoded under a
    budget in bytes as one batch (:func:`~kvpolicy.evict.quality._bytes.decode_bytes`;
    one row per run and text, the forward pass shared): a budget is a fraction of the bytes
    the full cache of the text holds at 16 bits, per layer; ``full`` labels run at 1.0.
    Each row carries ``bytes_held`` (mean over steps of the bytes held after the step's
    allocation, every layer), ``max_bytes_held``, ``budget_bytes`` and ``full_bytes``
    (every layer), and its own ``policy_ms_per_step``."""
    import torch

    from kvpolicy.evict import PRECISIONS, PrecisionCosts
    from kvpolicy.evict.quality._bytes import decode_bytes, layer_spec

    batch = torch.stack([torch.as_tensor(i, dtype=torch.long) for i in input_ids])
    n = int(batch.shape[1])
    layer = layer_spec(lm)
    plans = []
    for policy, budget in runs:
        make, costs, group = demoting_factory(policy, layer)
        full = policy.split(":")[0] == FULL
        b = 1.0 if full else float(budget)
        plans.append((policy, b, make, costs, group, full))
    groups = {p[4] for p in plans}
    if len(groups) != 1:
        raise ValueError(f"one batch takes one group_size: {sorted(groups)}")
    group = groups.pop()
    counting = PrecisionCosts.of(layer, PRECISIONS, group)
    c16 = counting.token_bytes[16]
    full_bytes = n * c16  # one layer's full cache of n tokens at 16 bits
    factories: list[Any] = []
    budgets: list[float] = []
    meta = []
    for policy, b, make, _costs, _group, full in plans:
        for t, text in enumerate(texts):
            layer_budget = b * full_bytes
            factories.append(None if make is None else (lambda m=make, lb=layer_budget: m(lb)))
            budgets.append(layer_budget)
            meta.append((policy, b, text, t, full))
    use = predictor if any(not m[4] for m in meta) else None
    ids = batch[[m[3] for m in meta]]
    results = decode_bytes(
        lm, ids, factories, budgets, counting, use, progress=progress, group_size=group
    )
    layers = lm.num_layers
    tasks = list(lookups) if lookups is not None else [None] * len(texts)
    return [
        result_row(
            task=task,
            text=text,
            tokens=n,
            policy=policy,
            budget=b,
            kept=int(b * full_bytes // c16),
            predictor=predictor_name if not full else "-",
            result=r.result,
            lookup=tasks[t],
            extra={
                "batch": len(meta),
                "budget_unit": "bytes",
                "group_size": group,
                "budget_bytes": b * full_bytes * layers,
                "full_bytes": full_bytes * layers,
                "bytes_held": r.bytes_mean,
                "max_bytes_held": r.bytes_max,
                "bytes_fraction": r.bytes_max / (full_bytes * layers),
            },
        )
        for (policy, b, text, t, full), r in zip(meta, results, strict=True)
    ]
