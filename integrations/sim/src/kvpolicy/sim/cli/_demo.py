"""``kvpolicy demo``: the README's first command.

A vLLM-like baseline stack against the kvpolicy stack on the embedded multi-tenant workload:
a comparison table on the terminal and an HTML report on disk.
"""

from __future__ import annotations

import pathlib

import click

from kvpolicy.kvmodel.cli import GPU, MODEL

__all__ = ["demo"]


@click.command()
@click.option("--model", type=MODEL, default="Llama-3-8B", show_default=True, help="Model preset.")
@click.option("--gpu", type=GPU, default="L40S", show_default=True, help="GPU preset.")
@click.option(
    "--num-requests",
    type=click.IntRange(min=1),
    default=2000,
    show_default=True,
    help="Requests of the multi-tenant workload.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the workload (same seed, same requests).",
)
@click.option(
    "--report",
    type=click.Path(path_type=pathlib.Path, file_okay=False),
    default=pathlib.Path("kvpolicy-demo"),
    show_default=True,
    help="Directory of the HTML report.",
)
def demo(model: str, gpu: str, num_requests: int, seed: int, report: pathlib.Path) -> None:
    """A vLLM-like stack against the kvpolicy stack on the multi-tenant workload."""
    from rich.console import Console

    from kvpolicy.kvmodel import get_gpu, get_model
    from kvpolicy.sim import STACK_PRESETS, simulate
    from kvpolicy.sim.cli._sim import _emit, progress_bar
    from kvpolicy.sim.workloads import get_workload

    console = Console()
    try:
        m, g = get_model(model), get_gpu(gpu)
        w = get_workload("multi-tenant", seed=seed, num_requests=num_requests)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    stacks = [STACK_PRESETS["vllm"], STACK_PRESETS["kvpolicy"]]
    results = []
    for cfg in stacks:
        with progress_bar(console, f"{cfg.name:9s}") as update:
            results.append(
                simulate(
                    w.requests,
                    m,
                    g,
                    cfg,
                    workload_name=w.name,
                    progress=update,
                    seed=seed,
                    notes=w.notes,
                )
            )
    _emit(
        results,
        report,
        False,
        f"{w.name} ({len(w.requests):,} requests): {m.name} on {g.name}",
        stacks,
    )
