"""``kvpolicy demo``: the README's first command."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from kvpolicy.kvmodel import GPU_PRESETS, MODEL_PRESETS, plan_capacity

__all__ = ["demo"]


@click.command()
@click.option("--context", type=int, default=4096, show_default=True)
def demo(context: int) -> None:
    """Capacity plan of several models on several GPUs (sequences of CONTEXT tokens)."""
    table = Table(title=f"Sequences of {context:,} tokens that fit (90% HBM, bf16 KV)")
    table.add_column("model")
    for gpu in GPU_PRESETS:
        table.add_column(gpu, justify="right")
    for model in MODEL_PRESETS.values():
        cells = []
        for gpu in GPU_PRESETS.values():
            s = min(context, model.max_context)
            cells.append(f"{plan_capacity(model, gpu, s).max_sequences:,}")
        table.add_row(model.name, *cells)
    Console().print(table)
