"""The workload options of ``sim run``, ``compare`` and ``sweep``: one validated object.

:func:`workload_options` adds the options to a command and hands it one
:class:`WorkloadSpec`. An option that does not apply to the chosen source is an error, not
ignored: ``--limit`` with a synthetic workload, ``--num-requests`` with a trace, ``--start``
with a format whose loader has no start. Which options a trace format takes comes from its
entry in the ``kvpolicy.workload_formats`` registry (its loader's parameters).
"""

from __future__ import annotations

import functools
import pathlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kvpolicy.kvmodel._entrypoints import WORKLOAD_FORMATS_GROUP
from kvpolicy.kvmodel.cli import installed_names

__all__ = ["FLAGS", "WorkloadSpec", "flag_message", "workload_options"]

FLAGS: dict[str, str] = {
    "skip_bad": "--skip-bad",
    "limit": "--limit",
    "rate": "--rate",
    "start": "--start",
    "duration": "--duration",
    "scale": "--scale",
    "speedup": "--speedup",
    "seed": "--seed",
    "num_requests": "--num-requests",
    "format": "--format",
    "workload": "--workload",
    "trace": "--trace",
}
"""Loader parameters and the flags that set them."""

_TRACE_ONLY = ("format", "skip_bad", "limit", "start", "duration", "scale", "speedup")


def flag_message(message: str) -> str:
    """``message`` with the loaders' parameter names (``'rate'``, ``format=``) written as
    the flags that set them."""
    for param, flag in FLAGS.items():
        message = re.sub(rf"'{param}'|\b{param}=", flag, message)
    return message


@dataclass(frozen=True)
class WorkloadSpec:
    """Where the requests come from: a named synthetic workload or a trace file."""

    workload: str | None
    """A synthetic workload name, or None for a trace."""
    trace: pathlib.Path | None
    """A trace file (a folder for servegen), or None."""
    options: dict[str, Any]
    """The options given (only those), by loader parameter name."""
    seed: int = 0
    """Seed of generated lengths and arrivals (where the source generates any)."""

    @classmethod
    def from_cli(
        cls, workload: str | None, trace: pathlib.Path | None, **given: Any
    ) -> WorkloadSpec:
        """Validate the options given for a source.

        Raises:
            click.UsageError: no source or both, or an option that does not apply to the
                source (naming the flag and what the source takes).
        """
        options = {k: v for k, v in given.items() if v is not None and v is not False}
        seed = options.pop("seed", None)
        if (workload is None) == (trace is None):
            raise click.UsageError("give exactly one of --workload NAME or --trace PATH")
        if workload is not None:
            bad = [FLAGS[k] for k in options if k in _TRACE_ONLY]
            if bad:
                raise click.UsageError(
                    f"{', '.join(bad)} only apply to --trace; a synthetic workload takes "
                    "--num-requests, --rate and --seed"
                )
            return cls(workload, None, options, 0 if seed is None else seed)
        if "num_requests" in options:
            raise click.UsageError(
                "--num-requests only applies to --workload; limit a trace with --limit"
            )
        assert trace is not None
        from kvpolicy.sim.workloads import detect_format

        try:
            fmt = options.get("format") or detect_format(trace)
        except ValueError as exc:
            raise click.UsageError(flag_message(str(exc))) from exc
        from kvpolicy.kvmodel import WORKLOAD_FORMATS, describe

        accepted = {p.name for p in describe(WORKLOAD_FORMATS, fmt)}
        bad = [FLAGS[k] for k in options if k != "format" and k not in accepted]
        if bad:
            takes = ", ".join(FLAGS[p] for p in sorted(accepted) if p in FLAGS)
            raise click.UsageError(
                f"{', '.join(bad)} does not apply to a {fmt} trace; it takes {takes}"
            )
        return cls(None, trace, {**options, "format": fmt}, 0 if seed is None else seed)

    def load(self, block_size: int = 16) -> Any:
        """The :class:`~kvpolicy.sim.workloads.Workload`; prefix hashes (of formats that
        carry them) are made at ``block_size``.

        Raises:
            click.UsageError: a bad file, row or value, with the flags named.
        """
        from kvpolicy.kvmodel import WORKLOAD_FORMATS, describe
        from kvpolicy.sim import workloads as wl

        opts = dict(self.options)
        try:
            if self.workload is not None:
                w = wl.get_workload(
                    self.workload, seed=self.seed, num_requests=opts.get("num_requests")
                )
                return w.with_rate(opts["rate"]) if "rate" in opts else w
            assert self.trace is not None
            fmt = opts.pop("format")
            takes = {p.name for p in describe(WORKLOAD_FORMATS, fmt)}
            if "block_size" in takes:
                opts["block_size"] = block_size
            if "seed" in takes:
                opts["seed"] = self.seed
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", wl.TraceWarning)
                w = wl.load_trace(self.trace, fmt, **opts)
            for warning in caught:  # a suspicious row: said once, plainly, on stderr
                click.echo(f"warning: {warning.message}", err=True)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise click.UsageError(flag_message(str(exc))) from exc
        if w.skipped_rows:
            click.echo(f"skipped {w.skipped_rows} malformed rows of {self.trace}", err=True)
        return w


def workload_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the workload options to a command, which then receives ``spec: WorkloadSpec``."""
    from kvpolicy.sim._names import WORKLOAD_NAMES

    formats = installed_names(WORKLOAD_FORMATS_GROUP)
    options = [
        click.option(
            "--workload",
            type=click.Choice(WORKLOAD_NAMES),
            default=None,
            metavar="NAME",
            help="A synthetic workload (the project's generator, calibrated on public traces): "
            f"{', '.join(WORKLOAD_NAMES)}.",
        ),
        click.option(
            "--trace",
            type=click.Path(path_type=pathlib.Path, exists=True),
            default=None,
            help="A trace file (a folder for servegen) to replay.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(formats),
            default=None,
            help="Trace format.  [default: detected from the file]",
        ),
        click.option("--skip-bad", is_flag=True, help="Trace: skip malformed rows (counted)."),
        click.option(
            "--limit", type=click.IntRange(min=1), default=None, help="Trace: first N rows."
        ),
        click.option(
            "--rate",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Re-time arrivals to this mean req/s (required for a lengths trace).",
        ),
        click.option(
            "--start",
            type=click.FloatRange(min=0),
            default=None,
            help="Servegen trace: seconds into the series to begin.",
        ),
        click.option(
            "--duration",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Servegen trace: seconds of series to use.  [default: to the end]",
        ),
        click.option(
            "--scale",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Servegen trace: times the requests (every client's rate multiplied).",
        ),
        click.option(
            "--speedup",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Servegen trace: play the series this many times faster (a day in 86,400/K s).",
        ),
        click.option(
            "--num-requests",
            type=click.IntRange(min=1),
            default=None,
            help="Synthetic workload: requests to generate.  [default: the preset's]",
        ),
        click.option(
            "--seed",
            type=int,
            default=None,
            help="Seed of generated lengths, arrivals and attention scores.  [default: 0]",
        ),
    ]

    @functools.wraps(f)
    def wrapper(
        workload: str | None,
        trace: pathlib.Path | None,
        fmt: str | None,
        skip_bad: bool,
        limit: int | None,
        rate: float | None,
        start: float | None,
        duration: float | None,
        scale: float | None,
        speedup: float | None,
        num_requests: int | None,
        seed: int | None,
        **kwargs: Any,
    ) -> Any:
        spec = WorkloadSpec.from_cli(
            workload,
            trace,
            format=fmt,
            skip_bad=skip_bad,
            limit=limit,
            rate=rate,
            start=start,
            duration=duration,
            scale=scale,
            speedup=speedup,
            num_requests=num_requests,
            seed=seed,
        )
        return f(spec=spec, **kwargs)

    out: Callable[..., Any] = wrapper
    for opt in reversed(options):
        out = opt(out)
    return out
