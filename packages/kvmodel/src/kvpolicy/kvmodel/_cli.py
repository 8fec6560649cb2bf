"""``kvpolicy kv``: KV cost model and capacity planning (the library is imported when a
command runs, not for its ``--help``)."""

from __future__ import annotations

import json

import click

from kvpolicy.kvmodel import KVModelError
from kvpolicy.kvmodel.cli import GPU, KV_DTYPE, MODEL, FiniteFloat, table_console

__all__ = ["group"]


@click.group()
def group() -> None:
    """KV cost model and capacity planning."""


@group.command("plan")
@click.option("--model", "model_name", required=True, type=MODEL, help="A model preset (any case).")
@click.option("--gpu", "gpu_name", required=True, type=GPU, help="A GPU preset (any case).")
@click.option(
    "--context",
    type=click.IntRange(min=1),
    default=None,
    help="Sequence length S (default: max).",
)
@click.option("--kv-dtype", type=KV_DTYPE, default=None, help="KV dtype.")
@click.option(
    "--gpu-memory-utilization",
    type=FiniteFloat(min=0.0, max=1.0, min_open=True),
    default=0.9,
    show_default=True,
    help="Share of the GPU's memory the server may use (weights, activations and KV).",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1, max=2**20),
    default=16,
    show_default=True,
    help="Tokens per KV block.",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1, max=4096),
    default=1,
    show_default=True,
    help="Tensor-parallel GPUs: weights and KV heads split over them (KV heads replicated "
    "past the model's KV head count).",
)
@click.option(
    "--pp",
    type=click.IntRange(min=1, max=4096),
    default=1,
    show_default=True,
    help="Pipeline-parallel stages.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(
    model_name: str,
    gpu_name: str,
    context: int | None,
    kv_dtype: str | None,
    gpu_memory_utilization: float,
    block_size: int,
    tp: int,
    pp: int,
    as_json: bool,
) -> None:
    """Bytes per token, KV budget and how many sequences of CONTEXT tokens fit.

    With --tp/--pp the byte figures are per GPU and the counts those of the whole group.
    A model that does not fit one sequence exits with status 1 and says what would fit.
    """
    from rich.table import Table

    from kvpolicy.kvmodel import CapacityError, get_gpu, get_model, plan_capacity

    try:
        model = get_model(model_name)
        if kv_dtype is not None:
            model = model.with_kv_dtype(kv_dtype)
        gpu = get_gpu(gpu_name)
        result = plan_capacity(
            model,
            gpu,
            context,
            gpu_memory_utilization=gpu_memory_utilization,
            block_size=block_size,
            tp=tp,
            pp=pp,
        )
    except CapacityError as exc:
        raise click.ClickException(str(exc)) from exc
    except (KVModelError, ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    gpus = result.tp * result.pp
    where = result.gpu if gpus == 1 else f"{gpus}x {result.gpu} (tp={tp}, pp={pp})"
    per_gpu = "" if gpus == 1 else " per GPU"
    table = Table(title=f"{result.model} on {where}", show_header=False)
    table.add_row(f"KV bytes per token{per_gpu}", f"{result.bytes_per_token:,}")
    table.add_row(f"weights{per_gpu}", f"{result.weight_bytes / 2**30:,.2f} GiB")
    table.add_row(f"KV budget{per_gpu}", f"{result.kv_budget_bytes / 2**30:,.2f} GiB")
    table.add_row("KV capacity", f"{result.kv_capacity_tokens:,} tokens")
    table.add_row(f"sequences of {result.context_len:,} tokens", f"{result.max_sequences:,}")
    table.add_row(f"blocks of {result.block_size} tokens", f"{result.num_blocks:,}")
    table_console().print(table)
