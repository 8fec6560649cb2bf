"""``kvpolicy sim``: run, compare and sweep policy stacks on a workload."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from kvpolicy.kvmodel.cli import GPU, MODEL
from kvpolicy.sim._names import EXECUTORS as EXECUTOR_NAMES
from kvpolicy.sim.cli._workload import WorkloadSpec, workload_options

if TYPE_CHECKING:
    from rich.console import Console

    from kvpolicy.kvmodel import GPUSpec, ModelSpec

__all__ = ["group", "progress_bar"]

_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, FileNotFoundError)


@click.group()
def group() -> None:
    """The reference serving simulator: run, compare and sweep policy stacks."""


@contextmanager
def progress_bar(
    console: Console, label: str, enabled: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar yielding a ``progress(done, total)`` callback."""
    if not enabled:
        yield lambda _done, _total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _specs(model: str, gpu: str) -> tuple[ModelSpec, GPUSpec]:
    from kvpolicy.kvmodel import get_gpu, get_model

    try:
        return get_model(model), get_gpu(gpu)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--tp",
        type=click.IntRange(min=1),
        default=None,
        help="Tensor-parallel GPUs per server (overrides the stacks' timing.tp).  [default: 1]",
    )(f)
    f = click.option("--gpu", type=GPU, required=True, help="The accelerator.")(f)
    return click.option("--model", type=MODEL, required=True, help="The model served.")(f)


def _fleet_options(many: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--replicas``, ``--router`` (repeatable when ``many``), ``--autoscaler``, its bounds
    and ``--signal-delay``: a fleet in front of the stacks (their ``fleet:`` section
    otherwise)."""

    count = click.IntRange(min=1)
    options: list[tuple[str, dict[str, Any]]] = [
        ("--replicas", {"type": count, "help": "Replicas of the engine behind the router "
                        "(a fleet).  [default: 1]"}),
        ("--router", {"multiple": many, "help": "Router by name (kvpolicy.routing)"
                      + ("; repeat to compare routers." if many else ".")
                      + "  [default: round-robin]"}),
        ("--autoscaler", {"multiple": many, "help": "Autoscaler by name "
                          "(kvpolicy.autoscaling); --replicas is its start"
                          + ("; repeat to compare autoscalers." if many else ".")}),
        ("--min-replicas", {"type": count, "help": "Fewest replicas the autoscaler may ask "
                            "for.  [default: 1]"}),
        ("--max-replicas", {"type": count, "help": "Most replicas the autoscaler may ask for."}),
        ("--signal-delay", {"type": click.FloatRange(min=0.0), "help": "Seconds old the "
                            "replica views the router sees are (a scrape's lag)."}),
    ]  # fmt: skip

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        for flag, kw in reversed(options):
            dest = {"--router": ("routers",), "--autoscaler": ("autoscalers",)}.get(flag, ())
            dest = dest if many else ()
            f = click.option(flag, *dest, default=None, **kw)(f)
        return f

    return add


def _check_name(flag: str, name: str | None, group: Any) -> None:
    from kvpolicy.kvmodel import names

    if name is None:
        return
    known = names(group)
    if name not in known:
        raise click.BadParameter(
            f"unknown {group.kind} {name!r}; known: {', '.join(known)}", param_hint=flag
        )


def _with_fleet(cfg: Any, flags: _Fleet, router: str | None, autoscaler: str | None) -> Any:
    """``cfg`` with the fleet the flags give behind ``router`` and ``autoscaler`` (flags not
    given keep its ``fleet:``)."""
    import attrs

    from kvpolicy.sim import PolicyChoice

    fleet = cfg.fleet
    replicas, signal_delay = flags.replicas, flags.signal_delay
    min_replicas, max_replicas = flags.bounds
    changes: dict[str, Any] = {}
    if replicas is not None:
        changes["replicas"] = replicas
    if router is not None and router != fleet.router.name:
        changes["router"] = PolicyChoice(router)
    if autoscaler is not None and autoscaler != fleet.autoscaler.name:
        changes["autoscaler"] = PolicyChoice(autoscaler)
    if min_replicas is not None:
        changes["min_replicas"] = min_replicas
    if max_replicas is not None:
        changes["max_replicas"] = max_replicas
    if signal_delay is not None:
        changes["signal_delay_s"] = signal_delay
    if not changes:
        return cfg
    low = changes.get("min_replicas", fleet.min_replicas)
    high = changes.get("max_replicas", fleet.max_replicas)
    if high is not None and low > high:
        raise click.BadParameter(
            f"--min-replicas {low} is more than --max-replicas {high}",
            param_hint="--min-replicas/--max-replicas",
        )
    name = changes.get("autoscaler", fleet.autoscaler).name
    start = changes.get("replicas", fleet.replicas)
    if name != "none" and not (low <= start and (high is None or start <= high)):
        raise click.BadParameter(
            f"--replicas {start} is outside [--min-replicas {low}, --max-replicas {high}]",
            param_hint="--replicas",
        )
    try:
        return attrs.evolve(cfg, fleet=attrs.evolve(fleet, **changes))
    except (TypeError, ValueError) as exc:
        raise click.UsageError(f"fleet: {exc}") from exc


_STACK_HELP = (
    "A preset (vllm: vLLM's defaults; kvpolicy: every kvpolicy package) or a YAML stack file."
)
_REPORT_HELP = "Write an HTML report (tables, plots, JSON) into this directory."


def _with_tp(cfg: Any, tp: int | None) -> Any:
    """``cfg`` served by ``tp`` tensor-parallel GPUs (unchanged when ``tp`` is None)."""
    import attrs

    if tp is None:
        return cfg
    return attrs.evolve(cfg, timing=attrs.evolve(cfg.timing, tp=tp))


def _run_stacks(
    stacks: Sequence[Any],
    w: Any,
    model: ModelSpec,
    gpu: GPUSpec,
    console: Console,
    show_progress: bool,
    seed: int,
) -> list[Any]:
    from kvpolicy.sim import check_config, simulate

    for cfg in stacks:  # every stack is checked before any runs
        check_config(w.requests, model, gpu, cfg)
    results = []
    for cfg in stacks:
        with progress_bar(console, f"{cfg.name}", show_progress) as update:
            results.append(
                simulate(
                    w.requests,
                    model,
                    gpu,
                    cfg,
                    workload_name=w.name,
                    progress=update,
                    notes=w.notes,
                    seed=seed,
                )
            )
    return results


def _emit(
    results: list[Any],
    report: pathlib.Path | None,
    as_json: bool,
    title: str,
    configs: Sequence[Any] | None = None,
) -> None:
    """Print the runs (a table and what happened, or one JSON document) and write the
    report; the workload's notes and the runs' warnings also go to stderr."""
    from rich.console import Console
    from rich.text import Text

    from kvpolicy.sim import comparison_table, results_json, write_report

    doc = results_json(results, configs)
    for note in dict.fromkeys(n for r in results for n in r.notes):
        click.echo(f"note: {note}", err=True)
    if as_json:
        click.echo(json.dumps(doc))
    else:
        console = Console()
        console.print(comparison_table(results, title=title))
        console.print(Text(f"What happened: {doc['what_happened']}"))
    for run in doc["runs"]:
        for warning in run["warnings"]:
            click.echo(f"warning: {run['stack']}: {warning}", err=True)
    if report is not None:
        path = write_report(results, report, configs=configs)
        click.echo(f"report: {path.resolve()}", err=as_json)


@group.command("run")
@workload_options
@_model_options
@click.option("--stack", default="vllm", show_default=True, help=_STACK_HELP)
@click.option(
    "--report", type=click.Path(path_type=pathlib.Path, file_okay=False), help=_REPORT_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@_fleet_options(many=False)
def run(
    spec: WorkloadSpec,
    model: str,
    gpu: str,
    tp: int | None,
    stack: str,
    report: pathlib.Path | None,
    as_json: bool,
    replicas: int | None,
    router: str | None,
    autoscaler: str | None,
    min_replicas: int | None,
    max_replicas: int | None,
    signal_delay: float | None,
) -> None:
    """Simulate one policy stack on a workload or a trace (on a fleet of replicas with
    --replicas, --router or --autoscaler)."""
    fleet = _Fleet(
        replicas,
        (router,) if router else (),
        (autoscaler,) if autoscaler else (),
        min_replicas,
        max_replicas,
        signal_delay,
    )
    _compare_stacks((stack,), spec, model, gpu, report, as_json, tp, fleet)


@group.command("compare")
@workload_options
@_model_options
@click.option(
    "--stack",
    "stacks",
    multiple=True,
    default=("vllm", "kvpolicy"),
    show_default=True,
    help=_STACK_HELP + " Repeat for each stack.",
)
@click.option(
    "--report", type=click.Path(path_type=pathlib.Path, file_okay=False), help=_REPORT_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@_fleet_options(many=True)
def compare(
    spec: WorkloadSpec,
    model: str,
    gpu: str,
    tp: int | None,
    stacks: tuple[str, ...],
    report: pathlib.Path | None,
    as_json: bool,
    replicas: int | None,
    routers: tuple[str, ...],
    autoscalers: tuple[str, ...],
    min_replicas: int | None,
    max_replicas: int | None,
    signal_delay: float | None,
) -> None:
    """Simulate several policy stacks on one workload, side by side (each behind every
    --router and every --autoscaler given, on a fleet of --replicas)."""
    fleet = _Fleet(replicas, routers, autoscalers, min_replicas, max_replicas, signal_delay)
    _compare_stacks(stacks, spec, model, gpu, report, as_json, tp, fleet)


class _Fleet:
    """The fleet flags of ``run`` and ``compare``."""

    def __init__(
        self,
        replicas: int | None,
        routers: tuple[str, ...],
        autoscalers: tuple[str, ...],
        min_replicas: int | None,
        max_replicas: int | None,
        signal_delay: float | None,
    ) -> None:
        from kvpolicy.kvmodel import AUTOSCALING, ROUTING

        for name in routers:
            _check_name("--router", name, ROUTING)
        for name in autoscalers:
            _check_name("--autoscaler", name, AUTOSCALING)
        self.replicas = replicas
        self.routers = routers
        self.autoscalers = autoscalers
        self.bounds = (min_replicas, max_replicas)
        self.signal_delay = signal_delay

    def apply(self, cfg: Any) -> list[Any]:
        """``cfg`` behind each router and each autoscaler (its own fleet when no flag is
        given); a stack run behind several routers or autoscalers is named
        ``stack/router``, ``stack/autoscaler`` or ``stack/router/autoscaler``."""
        import attrs

        routers: tuple[str | None, ...] = self.routers or (None,)
        autoscalers: tuple[str | None, ...] = self.autoscalers or (None,)
        out = []
        for router in routers:
            for autoscaler in autoscalers:
                one = _with_fleet(cfg, self, router, autoscaler)
                parts = [cfg.name]
                if len(routers) > 1:
                    parts.append(str(router))
                if len(autoscalers) > 1:
                    parts.append(str(autoscaler))
                if len(parts) > 1:
                    one = attrs.evolve(one, name="/".join(parts))
                out.append(one)
        return out


def _compare_stacks(
    stacks: tuple[str, ...],
    spec: WorkloadSpec,
    model: str,
    gpu: str,
    report: pathlib.Path | None,
    as_json: bool,
    tp: int | None = None,
    fleet: _Fleet | None = None,
) -> None:
    """Load the workload once, simulate each stack on it, then print and report."""
    from rich.console import Console

    from kvpolicy.sim import get_stack

    console = Console(stderr=True)
    m, g = _specs(model, gpu)
    try:
        cfgs = [_with_tp(get_stack(s), tp) for s in stacks]
    except _ERRORS as exc:
        raise click.BadParameter(str(exc), param_hint="'--stack'") from exc
    if fleet is not None:
        cfgs = [one for cfg in cfgs for one in fleet.apply(cfg)]
    # Prefix hashes at the finest block size of the stacks; each engine re-chunks them.
    w = spec.load(math.gcd(*(c.engine.block_size for c in cfgs)))
    try:
        results = _run_stacks(cfgs, w, m, g, console, not as_json, spec.seed)
    except _ERRORS as exc:
        raise click.UsageError(str(exc)) from exc
    _emit(results, report, as_json, f"{w.name}: {m.name} on {g.name}", cfgs)


def _parse_param(text: str) -> tuple[str, list[Any]]:
    import yaml

    if "=" not in text:
        raise click.UsageError(f"--param must be section.field=v1,v2,...: {text!r}")
    key, values = text.split("=", 1)
    return key.strip(), [yaml.safe_load(v) for v in values.split(",")]


@group.command("sweep")
@workload_options
@_model_options
@click.option("--stack", default="vllm", show_default=True, help="Base stack. " + _STACK_HELP)
@click.option(
    "--param",
    "params",
    multiple=True,
    required=True,
    help="section.field=v1,v2,... (repeat for a grid), e.g. engine.max_batch=64,128.",
)
@click.option(
    "--executor",
    type=click.Choice(list(EXECUTOR_NAMES)),
    default="local",
    show_default=True,
    help="local: processes on this machine; ray: a Ray cluster (extra 'ray').",
)
@click.option("--workers", type=int, default=None, help="Local processes.  [default: CPUs]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def sweep_cmd(
    spec: WorkloadSpec,
    model: str,
    gpu: str,
    tp: int | None,
    stack: str,
    params: tuple[str, ...],
    executor: str,
    workers: int | None,
    as_json: bool,
) -> None:
    """Simulate a grid of stack parameters on local processes or on Ray."""
    from rich.console import Console

    from kvpolicy.sim import get_stack, sweep

    m, g = _specs(model, gpu)
    grid = dict(_parse_param(p) for p in params)
    try:
        cfg = _with_tp(get_stack(stack), tp)
    except _ERRORS as exc:
        raise click.BadParameter(str(exc), param_hint="'--stack'") from exc
    w = spec.load(cfg.engine.block_size)
    try:
        err = Console(stderr=True)
        with progress_bar(err, "sweep points", not as_json and err.is_terminal) as update:
            points = sweep(
                w.requests,
                m.name,
                g.name,
                cfg,
                grid,
                executor=executor,
                workers=workers,
                workload_name=w.name,
                progress=update,
            )
    except ImportError as exc:
        raise click.UsageError(
            f"{exc}; install the extra: pip install --find-links dist 'kvpolicy-sim[ray]'"
        ) from exc
    except _ERRORS as exc:
        raise click.UsageError(str(exc)) from exc
    from kvpolicy.sim._report import sweep_tables
    from kvpolicy.sim._sweep import unchanged_parameters

    unchanged = unchanged_parameters(points, cfg)
    for note in w.notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        doc = {
            "points": [
                {"params": p.params, "summary": p.summary, "warnings": list(p.warnings)}
                for p in points
            ],
            "notes": list(w.notes),
            "warnings": unchanged,
        }
        click.echo(json.dumps(doc))
    else:
        console = Console()
        for table in sweep_tables(points, list(grid), f"sweep on {w.name}: {m.name} on {g.name}"):
            console.print(table)
    # The same warning at several points is printed once, with the points it holds at.
    at: dict[str, list[str]] = {}
    for p in points:
        label = ",".join(f"{k}={v}" for k, v in p.params.items())
        for warning in p.warnings:
            at.setdefault(warning, []).append(label)
    for warning, labels in at.items():
        where = "every point" if len(labels) == len(points) else "; ".join(labels)
        click.echo(f"warning: [{where}] {warning}", err=True)
    for warning in unchanged:
        click.echo(f"warning: {warning}", err=True)


@group.command("fit-timing")
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(path_type=pathlib.Path, dir_okay=False),
    required=True,
    help="Measured iterations: a header naming batch,tokens,seconds[,kv_tokens].",
)
@click.option(
    "--model", type=MODEL, default="Llama-3-8B", show_default=True, help="Model measured."
)
@click.option("--gpu", type=GPU, default="H100-SXM", show_default=True, help="Device measured.")
@click.option(
    "--dtype-bytes",
    type=float,
    default=None,
    help="Bytes per weight and KV element as measured (e.g. 4 for fp32); default the model's.",
)
@click.option("--bandwidth", type=float, default=None, help="Override the device's B/s.")
@click.option("--flops", type=float, default=None, help="Override the device's peak FLOP/s.")
@click.option(
    "--out",
    type=click.Path(path_type=pathlib.Path, dir_okay=False),
    default=None,
    help="Write a stack file holding the fitted `timing` section.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def fit_timing_cmd(
    csv_path: pathlib.Path,
    model: str,
    gpu: str,
    dtype_bytes: float | None,
    bandwidth: float | None,
    flops: float | None,
    out: pathlib.Path | None,
    as_json: bool,
) -> None:
    """Fit the time model's calibration constants to measured iterations."""
    import attrs
    import yaml
    from rich.console import Console

    from kvpolicy.sim import TimingModel, fit_error, fit_timing, read_timing_csv

    m, g = _specs(model, gpu)
    try:
        if dtype_bytes is not None:
            m = attrs.evolve(m, kv_dtype_bytes=dtype_bytes, weight_dtype_bytes=dtype_bytes)
        if bandwidth is not None:
            g = attrs.evolve(g, name=f"{g.name} (given B/s)", hbm_bandwidth=bandwidth)
        if flops is not None:
            g = attrs.evolve(g, name=f"{g.name} (given FLOP/s)", peak_flops=flops)
        rows = read_timing_csv(csv_path)
        fit = fit_timing(m, g, rows)
    except _ERRORS as exc:
        raise click.UsageError(str(exc)) from exc
    constants = {
        "bandwidth_efficiency": round(fit.bandwidth_efficiency, 6),
        "flops_efficiency": round(fit.flops_efficiency, 6),
        "overhead_s": round(fit.overhead_s, 9),
    }
    fitted_err = fit_error(fit, rows)
    default_err = fit_error(TimingModel(m, g), rows)
    doc = {
        "model": m.name,
        "gpu": g.name,
        "rows": len(rows),
        "timing": constants,
        "fit": fitted_err,
        "defaults": default_err,
    }
    if out is not None:
        out.write_text(yaml.safe_dump({"timing": constants}, sort_keys=False), encoding="utf-8")
    if as_json:
        click.echo(json.dumps(doc))
        return
    from rich.table import Table

    table = Table(
        title=f"time model fitted to {len(rows)} iterations of {m.name} on {g.name}",
        title_justify="left",
    )
    for col in ("constant", "fitted", "default"):
        table.add_column(col, justify="right" if col != "constant" else "left")
    base = TimingModel(m, g)
    for key, value in constants.items():
        table.add_row(key, f"{value:.4g}", f"{getattr(base, key):.4g}")
    for key in ("median_rel_error", "max_rel_error", "r2"):
        table.add_row(key, f"{fitted_err[key]:.3f}", f"{default_err[key]:.3f}")
    Console().print(table)
    if out is not None:
        click.echo(f"wrote {out} (use it as a stack file, or copy its timing section)")
