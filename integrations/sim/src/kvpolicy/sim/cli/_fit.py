"""``kvpolicy sim fit-attention``: record a model's attention and fit the synthetic model to it.

Runs SmolLM2-135M-Instruct (through kvpolicy-evict-quality, the harness) over the first ``--tokens``
tokens of a text with the full cache, averages the attention over layers and heads, fits
:class:`kvpolicy.sim.AttentionModel` to it with :func:`kvpolicy.sim.fit_attention` and prints
the parameters next to the statistics they reproduce. ``--out`` writes the parameters as
JSON (:meth:`AttentionModel.to_json`), which :meth:`AttentionModel.from_json` reads back.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import click

__all__ = ["fit_attention_cmd"]

# Rows before this are left out of the fit and the statistics (fit_attention's default).
_WARMUP = 64
# The recorded (layers, heads, T, T) float32 attention takes 30 · 9 · 4 · T^2 bytes.
_MAX_TOKENS = 2048


def _record(text: pathlib.Path | None, tokens: int) -> tuple[Any, str]:
    """(T, T) float64 attention of SmolLM2-135M on ``text``, averaged over layers and heads."""
    from rich.console import Console

    try:
        from kvpolicy.evict.quality import (
            default_text,
            load_smollm2,
            mean_attention,
            require_quality_deps,
        )
    except ModuleNotFoundError as exc:
        if exc.name != "kvpolicy.evict.quality":
            raise
        raise click.ClickException(
            "recording a model's attention needs the quality harness: pip install "
            "kvpolicy-evict-quality (see its README for the CPU build of torch and the model)"
        ) from exc
    try:
        require_quality_deps()
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    if text is None:
        content, source = default_text(), "pydoc_data.topics"
    else:
        content, source = text.read_text(errors="replace"), str(text)
    with Console(stderr=True).status("loading SmolLM2-135M-Instruct"):
        lm = load_smollm2()
    try:
        ids = lm.encode(content, tokens)
    except ValueError as exc:
        raise click.ClickException(f"{source}: {exc}") from exc
    with Console(stderr=True).status(f"recording attention over {tokens} tokens"):
        mass = mean_attention(lm, ids)  # rows renormalised to sum to exactly 1
    return mass, source


@click.command("fit-attention")
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=pathlib.Path),
    default=None,
    help="Text file (default: Python's pydoc_data.topics).",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=80, max=_MAX_TOKENS),
    default=1024,
    show_default=True,
    help="Tokens recorded (T of the (T, T) matrix).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=pathlib.Path),
    default=None,
    help="Write the fitted parameters here as JSON.",
)
@click.option(
    "--sink-tokens",
    type=click.IntRange(min=0, max=_WARMUP - 1),
    default=1,
    show_default=True,
    help="Leading tokens the model treats as attention sinks.",
)
@click.option(
    "--max-distance",
    type=click.IntRange(min=8),
    default=256,
    show_default=True,
    help="Largest query-key distance of the recency fit (< tokens - 64).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the draws the fit compares against.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fit_attention_cmd(
    text: pathlib.Path | None,
    tokens: int,
    out: pathlib.Path | None,
    sink_tokens: int,
    max_distance: int,
    seed: int,
    as_json: bool,
) -> None:
    """Record SmolLM2-135M's attention on a text and fit the synthetic attention model."""
    from rich.console import Console

    if tokens <= max_distance + _WARMUP:
        raise click.BadParameter(
            f"must be > max-distance + {_WARMUP} = {max_distance + _WARMUP}: {tokens}",
            param_hint="'--tokens'",
        )
    import numpy as np
    from rich.table import Table

    from kvpolicy.sim._attention_fit import attention_summary, fit_attention
    from kvpolicy.sim.cli._sim import progress_bar

    recorded, source = _record(text, tokens)
    err = Console(stderr=True)
    with progress_bar(err, "fitting", err.is_terminal) as update:
        model = fit_attention(
            recorded,
            sink_tokens=sink_tokens,
            max_distance=max_distance,
            seed=seed,
            progress=update,
        )
    rng = np.random.default_rng(seed)
    drawn = model.matrix(model.token_scores(rng, tokens), rng)
    stats_recorded = attention_summary(recorded, warmup=_WARMUP)
    stats_model = attention_summary(drawn, warmup=_WARMUP)
    if out is not None:
        out.write_text(model.to_json() + "\n")
    if as_json:
        payload = {
            "source": source,
            "tokens": tokens,
            "model": model.to_dict(),
            "recorded": stats_recorded,
            "synthetic": stats_model,
        }
        click.echo(json.dumps(payload, indent=2))
        return
    console = Console()
    params = Table(title=f"AttentionModel fitted to SmolLM2-135M on {tokens} tokens of {source}")
    params.add_column("parameter")
    params.add_column("value", justify="right")
    for key, value in model.to_dict().items():
        params.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(params)
    fit = Table(title="Goodness of fit (model: one draw at the same T)")
    fit.add_column("statistic")
    fit.add_column("recorded", justify="right")
    fit.add_column("model", justify="right")
    for key, value in stats_recorded.items():
        fit.add_row(key, f"{value:.4g}", f"{stats_model[key]:.4g}")
    console.print(fit)
    if out is not None:
        console.print(f"parameters: {out}")
