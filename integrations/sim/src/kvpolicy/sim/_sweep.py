"""Grids of stack parameters, run on local processes or on a Ray cluster.

A parameter is named ``section.field`` of :class:`StackConfig` (``engine.max_batch``,
``eviction.budget_fraction``, ``admission.params.cap``). Each grid point is one independent
simulation, so points fan out with no shared state: ``concurrent.futures`` processes on one
machine, Ray tasks beyond it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from attrs import frozen

from kvpolicy.kvmodel import Request, get_gpu, get_model
from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._names import EXECUTORS
from kvpolicy.sim._simulate import check_config, simulate
from kvpolicy.sim._story import run_warnings

__all__ = [
    "EXECUTORS",
    "SweepPoint",
    "apply_params",
    "expand_grid",
    "sweep",
    "unchanged_parameters",
]


@frozen
class SweepPoint:
    """One grid point and its figures."""

    params: dict[str, Any]
    """``section.field`` -> value."""
    summary: dict[str, Any]
    """:meth:`Summary.as_dict` of the run."""
    warnings: tuple[str, ...] = ()
    """What went wrong for more than 1% of the point's requests (rejections, give-ups),
    with hints: :func:`kvpolicy.sim._story.run_warnings`."""


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of ``grid``'s values, the first key varying slowest.

    Raises:
        ValueError: a key has no values.
    """
    keys = list(grid)
    for k in keys:
        if len(grid[k]) == 0:
            raise ValueError(f"grid parameter {k!r} has no values")
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def apply_params(base: StackConfig, params: Mapping[str, Any]) -> StackConfig:
    """``base`` with each ``section.field`` (or ``section.params.key``) set.

    Raises:
        ConfigError: an unknown section or field (named), or a value the field rejects.
    """
    cfg = base
    sections = [a.name for a in attrs.fields(StackConfig) if a.name != "name"]
    for key, value in params.items():
        parts = key.split(".")
        if len(parts) < 2 or parts[0] not in sections:
            raise ConfigError(
                f"unknown sweep parameter {key!r}; use section.field with section in "
                f"{', '.join(sections)}"
            )
        section = getattr(cfg, parts[0])
        fields = [a.name for a in attrs.fields(type(section))]
        try:
            if parts[1] == "params" and len(parts) == 3 and "params" in fields:
                new = attrs.evolve(section, params={**section.params, parts[2]: value})
            elif len(parts) == 2 and parts[1] in fields:
                new = attrs.evolve(section, **{parts[1]: value})
            else:
                raise ConfigError(
                    f"unknown sweep parameter {key!r}; {parts[0]} has {', '.join(fields)}"
                )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"sweep parameter {key!r}={value!r}: {exc}") from exc
        cfg = attrs.evolve(cfg, **{parts[0]: new})
    label = ",".join(f"{k}={v}" for k, v in params.items())
    return attrs.evolve(cfg, name=f"{base.name}[{label}]" if label else base.name)


def _run_point(
    requests: Sequence[Request],
    model_name: str,
    gpu_name: str,
    config: StackConfig,
    params: dict[str, Any],
    workload_name: str,
) -> SweepPoint:
    result = simulate(
        requests, get_model(model_name), get_gpu(gpu_name), config, workload_name=workload_name
    )
    return SweepPoint(
        params=params,
        summary=result.summary.as_dict(),
        warnings=tuple(run_warnings(result, config)),
    )


def sweep(
    requests: Sequence[Request],
    model_name: str,
    gpu_name: str,
    base: StackConfig,
    grid: Mapping[str, Sequence[Any]],
    *,
    executor: str = "local",
    workers: int | None = None,
    workload_name: str = "workload",
    progress: Callable[[int, int], None] | None = None,
) -> list[SweepPoint]:
    """Simulate every point of ``grid`` over ``base``; results in grid order.

    Args:
        requests: the workload.
        model_name: a model preset name.
        gpu_name: a GPU preset name.
        base: the stack each point modifies.
        grid: ``section.field`` -> values.
        executor: ``local`` (processes; inline when ``workers == 1``) or ``ray`` (tasks on
            the cluster ``ray.init`` connects to; a local one when none is running).
        workers: local processes (default: CPU count).
        progress: called as ``progress(done, total)`` as points finish.

    Raises:
        ConfigError: a bad grid key or value, an unknown model, GPU or policy, checked for
            every point before any runs.
        ValueError: an unknown executor.
        ImportError: ``executor="ray"`` without Ray installed (``pip install
            'kvpolicy-sim[ray]'``).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"'executor' must be one of {', '.join(EXECUTORS)}: {executor!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"'workers' must be a positive int: {workers!r}")
    get_model(model_name)
    get_gpu(gpu_name)
    points = expand_grid(grid)
    configs = [apply_params(base, p) for p in points]
    reqs = tuple(requests)
    for c in configs:  # every point is checked before any runs
        check_config(reqs, get_model(model_name), get_gpu(gpu_name), c)
    total = len(points)

    def tick(done: int) -> None:
        if progress is not None:
            progress(done, total)

    tick(0)
    if executor == "ray":
        import ray

        if not ray.is_initialized():
            ray.init()
        remote = ray.remote(_run_point)
        ref = ray.put(reqs)
        futures = [
            remote.remote(ref, model_name, gpu_name, c, p, workload_name)  # type: ignore[arg-type, unused-ignore]
            for c, p in zip(configs, points, strict=True)
        ]
        done_ray: list[SweepPoint] = []
        for k, fut in enumerate(futures):
            done_ray.append(ray.get(fut))
            tick(k + 1)
        return done_ray
    if workers == 1 or len(points) == 1:
        out = []
        for k, (c, p) in enumerate(zip(configs, points, strict=True)):
            out.append(_run_point(reqs, model_name, gpu_name, c, p, workload_name))
            tick(k + 1)
        return out
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        futs = [
            pool.submit(_run_point, reqs, model_name, gpu_name, c, p, workload_name)
            for c, p in zip(configs, points, strict=True)
        ]
        for k, _ in enumerate(concurrent.futures.as_completed(futs)):
            tick(k + 1)
        return [f.result() for f in futs]


def _values(values: Sequence[Any]) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values)


def unchanged_parameters(points: Sequence[SweepPoint], base: StackConfig) -> list[str]:
    """Warnings for the grid parameters that changed nothing the stack uses.

    A parameter changed nothing when, among the points that agree on every other
    parameter, every value of it gave the same figures (the whole summary). When the
    parameter's section names no implementation (``none``) at every point, the warning
    says that section is unused.

    Args:
        points: :func:`sweep`'s result, in grid order.
        base: the stack the grid modified.

    Returns:
        One message per such parameter, naming it; empty when every parameter mattered.
    """
    if not points:
        return []
    out = []
    keys = list(points[0].params)
    for key in keys:
        values = list(dict.fromkeys(repr(p.params[key]) for p in points))
        if len(values) < 2:
            continue
        groups: dict[str, list[dict[str, Any]]] = {}
        for p in points:
            rest = repr([(k, p.params[k]) for k in keys if k != key])
            groups.setdefault(rest, []).append(p.summary)
        if any(any(s != g[0] for s in g[1:]) for g in groups.values()):
            continue
        shown = _values(list(dict.fromkeys(p.params[key] for p in points)))
        text = f"sweep parameter {key!r} changed nothing: every figure is the same at {shown}"
        section, _, field_name = key.partition(".")
        unused = field_name != "name" and all(
            getattr(getattr(apply_params(base, p.params), section), "name", None) == "none"
            for p in points
        )
        if unused:
            text += (
                f"; the stack's {section} section is 'none', so {section}.* is unused: name "
                f"one ({section}.name) in the stack or in the grid"
            )
        out.append(text)
    return out
