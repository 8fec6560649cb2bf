"""``kvpolicy admit``: stability analysis and model simulation of continuous batching
(after "Service-Induced Congestion in Memory-Constrained LLM Serving").

Outside ``kvpolicy.admit`` and with its imports inside the commands, so that ``--help``
imports neither the library nor numpy and scipy.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

import click

from kvpolicy.kvmodel.cli import OutputFile, table_console

if TYPE_CHECKING:
    from kvpolicy.admit import ModelResult, PoissonArrivals, SaturatedArrivals, StabilityWorkload

__all__ = ["group"]


def _ints(name: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as exc:
        raise click.BadParameter(
            f"must be comma-separated integers: {text!r}", param_hint=name
        ) from exc


def _floats(name: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError as exc:
        raise click.BadParameter(
            f"must be comma-separated numbers: {text!r}", param_hint=name
        ) from exc


def _workload(input_len: str, decode_len: str, mix: str | None, memory: int) -> StabilityWorkload:
    from kvpolicy.admit import StabilityWorkload

    l0 = _ints("--input-len", input_len)
    l1 = _ints("--decode-len", decode_len)
    proportions = _floats("--mix", mix) if mix else tuple([1.0 / len(l0)] * len(l0))
    try:
        return StabilityWorkload(input_lens=l0, decode_lens=l1, memory=memory, mix=proportions)
    except (ValueError, TypeError) as exc:
        raise click.UsageError(str(exc)) from exc


_WORKLOAD_OPTIONS = [
    click.option("--input-len", required=True, help="Input lengths l0,k, comma-separated."),
    click.option("--decode-len", required=True, help="Decode lengths l1,k, comma-separated."),
    click.option("--mix", default=None, help="Proportions p_k, comma-separated (default equal)."),
    click.option("--memory", type=int, required=True, help="KV capacity M in tokens."),
]


def _with_workload(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_WORKLOAD_OPTIONS):
        func = option(func)
    return func


@click.group()
def group() -> None:
    """Stability of continuous batching under growing KV caches (after "Service-Induced
    Congestion in Memory-Constrained LLM Serving")."""


@group.command("analyze")
@_with_workload
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def analyze(input_len: str, decode_len: str, mix: str | None, memory: int, as_json: bool) -> None:
    """Eviction-free rate x*, worst-cycle throughput, spectral radius, GCD stability verdict
    and the shortest prompt that keeps the system stable."""
    from rich.table import Table

    from kvpolicy.admit import (
        analyze_stability,
        eviction_free_rate,
        worst_cycle_ratio,
        worst_cycle_throughput,
    )

    workload = _workload(input_len, decode_len, mix, memory)
    report = analyze_stability(workload)
    doc = {
        "x_star": eviction_free_rate(workload),
        "worst_cycle_throughput": worst_cycle_throughput(workload),
        "worst_cycle_ratio": worst_cycle_ratio(workload),
        **report.as_dict(),
    }
    if as_json:
        click.echo(json.dumps(doc))
        return
    table = Table(title="eviction-free stability", show_header=False)
    table.add_row("x* (admissions/iteration)", f"{doc['x_star']:.6g}")
    table.add_row("worst-cycle throughput", f"{doc['worst_cycle_throughput']:.6g}")
    table.add_row("worst-cycle / x*", f"{doc['worst_cycle_ratio']:.4f}")
    table.add_row("spectral radius of F", f"{report.spectral_radius:.6f}")
    table.add_row("spectral radius of A (l0 -> inf)", f"{report.limiting_spectral_radius:.6f}")
    table.add_row("unstable roots", str(report.unstable_roots))
    table.add_row("gcd of decode lengths", str(report.gcd))
    table.add_row("stable", "yes" if report.stable else "no")
    table.add_row(
        "shortest stable prompt (exact)",
        "none (gcd > 1)" if report.min_input_len is None else str(report.min_input_len),
    )
    if report.min_input_len_asymptotic is not None:
        table.add_row(
            "shortest stable prompt (asymptotic)", f"{report.min_input_len_asymptotic:.1f}"
        )
    table_console().print(table)


def _arrivals(text: str) -> SaturatedArrivals | PoissonArrivals:
    from kvpolicy.admit import PoissonArrivals, SaturatedArrivals

    if text == "saturated":
        return SaturatedArrivals()
    if text.startswith("poisson:"):
        try:
            return PoissonArrivals(float(text.split(":", 1)[1]))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--arrivals") from exc
    raise click.BadParameter(
        f"must be 'saturated' or 'poisson:RATE': {text!r}", param_hint="--arrivals"
    )


def _plot(result: ModelResult, path: pathlib.Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise click.UsageError(
            "--plot needs matplotlib: pip install --find-links dist 'kvpolicy-admit[plot]'"
        ) from exc
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(result.memory, lw=0.8, label="memory in use")
    top.axhline(result.workload.memory, color="k", ls="--", lw=0.8, label="capacity M")
    top.set_ylabel("tokens")
    top.legend(loc="lower right")
    bottom.plot(result.admitted, lw=0.8, label="admitted")
    bottom.plot(result.evicted, lw=0.8, label="evicted")
    bottom.set_xlabel("iteration")
    bottom.set_ylabel("requests")
    bottom.legend(loc="upper right")
    fig.suptitle(f"{result.policy} admission, {result.mode} model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@group.command("simulate")
@_with_workload
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=4000,
    show_default=True,
    help="Iterations of the model to simulate.",
)
@click.option("--arrivals", default="saturated", show_default=True, help="saturated | poisson:RATE")
@click.option(
    "--policy",
    type=click.Choice(["greedy", "rate-limited"]),
    default="greedy",
    show_default=True,
    help="Admission: greedy (admit while memory lasts) or rate-limited (at most x* a step).",
)
@click.option(
    "--mode",
    type=click.Choice(["integer", "fluid"]),
    default="integer",
    show_default=True,
    help="integer: whole requests, drawn at random; fluid: expected fractional counts.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Random seed of the integer model."
)
@click.option(
    "--plot",
    type=OutputFile(),
    default=None,
    help="Save memory and admissions over time as a PNG.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate_cmd(
    input_len: str,
    decode_len: str,
    mix: str | None,
    memory: int,
    steps: int,
    arrivals: str,
    policy: str,
    mode: str,
    seed: int,
    plot: pathlib.Path | None,
    as_json: bool,
) -> None:
    """Run the discrete-time model: throughput, evictions and queue growth."""
    from rich.table import Table

    from kvpolicy.admit import eviction_free_rate, simulate_model, worst_cycle_throughput

    workload = _workload(input_len, decode_len, mix, memory)
    result = simulate_model(
        workload,
        steps=steps,
        arrivals=_arrivals(arrivals),
        policy=policy,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        seed=seed,
    )
    doc = {
        **result.summary(),
        "x_star": eviction_free_rate(workload),
        "worst_cycle_throughput": worst_cycle_throughput(workload),
    }
    if plot is not None:
        _plot(result, plot)
        doc["plot"] = str(plot)
    if as_json:
        click.echo(json.dumps(doc))
        return
    table = Table(title=f"{policy} admission, {mode} model, {steps} iterations", show_header=False)
    table.add_row("throughput (completions/iteration)", f"{result.throughput:.4f}")
    table.add_row("steady throughput (second half)", f"{result.steady_throughput:.4f}")
    table.add_row("x* / worst cycle", f"{doc['x_star']:.4f} / {doc['worst_cycle_throughput']:.4f}")
    table.add_row("evictions", f"{result.evictions:.6g}")
    table.add_row("evictions per iteration", f"{result.eviction_rate:.4f}")
    table.add_row("queue growth (requests/iteration)", f"{result.queue_growth:.4f}")
    table.add_row("final queue", f"{doc['final_queue']:.6g}")
    if plot is not None:
        table.add_row("plot", str(plot))
    table_console().print(table)
