"""Pareto filter, hypervolume and the adaptive Pareto search (Algorithm 1 of seed 003).

Objectives follow eq. (1): minimise ``(E[latency], -E[throughput], cost)``. A point
dominates another when it is no worse in every objective and strictly better in one
(§4.1, "Pareto-based configuration selector").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of

from kvpolicy.tiers._check import is_sequence

__all__ = [
    "Evaluation",
    "Objectives",
    "ParetoSearchResult",
    "SearchAxis",
    "adaptive_pareto_search",
    "grid_search",
    "hypervolume",
    "pareto_mask",
]

FloatArray = npt.NDArray[np.float64]


def _finite(_inst: object, attribute: object, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"'{getattr(attribute, 'name', 'value')}' must be finite: {value!r}")


def _points(points: npt.ArrayLike, name: str = "points") -> FloatArray:
    arr = np.asarray(points, dtype=np.float64)
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 1)
    if arr.ndim != 2:
        raise ValueError(f"'{name}' must be a 2-D array (n, objectives): shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"'{name}' must be finite: {arr!r}")
    return arr


def pareto_mask(points: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Which points no other point dominates (every objective minimised).

    Args:
        points: (n, m) float, one row per configuration.

    Returns:
        (n,) bool. Equal rows do not dominate each other, so duplicates are all kept.
    """
    p = _points(points)
    n = p.shape[0]
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        no_worse = np.all(p <= p[i], axis=1)
        better = np.any(p < p[i], axis=1)
        if np.any(no_worse & better):
            keep[i] = False
    return keep


def hypervolume(points: npt.ArrayLike, reference: npt.ArrayLike) -> float:
    """Volume dominated by ``points`` and bounded by ``reference`` (all minimised).

    Exact, by slicing along the last objective (HSO); points not strictly better than the
    reference in every objective add nothing. §5.3.1 compares search strategies by this
    number with one reference point "strictly worse than all emulated configurations".

    Args:
        points: (n, m) float.
        reference: (m,) float.
    """
    p = _points(points)
    ref = np.asarray(reference, dtype=np.float64).ravel()
    if not np.all(np.isfinite(ref)):
        raise ValueError(f"'reference' must be finite: {ref!r}")
    if p.shape[0] and p.shape[1] != ref.size:
        raise ValueError(
            f"'reference' has {ref.size} objectives but 'points' has {p.shape[1]}: {ref!r}"
        )
    p = p[np.all(p < ref, axis=1)] if p.shape[0] else p
    if p.shape[0] == 0:
        return 0.0
    p = p[pareto_mask(p)]
    return _hso(p, ref)


def _hso(p: FloatArray, ref: FloatArray) -> float:
    m = ref.size
    if p.shape[0] == 0:
        return 0.0
    if m == 1:
        return float(ref[0] - p[:, 0].min())
    if m == 2:
        order = np.argsort(p[:, 0], kind="stable")
        x = p[order, 0]
        y = np.minimum.accumulate(p[order, 1])
        widths = np.diff(np.append(x, ref[0]))
        return float(np.sum(widths * (ref[1] - y)))
    order = np.argsort(p[:, -1], kind="stable")
    q = p[order]
    z = np.append(q[:, -1], ref[-1])
    total = 0.0
    for k in range(q.shape[0]):
        depth = z[k + 1] - z[k]
        if depth > 0:
            total += depth * _hso(q[: k + 1, :-1], ref[:-1])
    return total


@frozen
class Objectives:
    """What one configuration achieves (eq. (1) of seed 003)."""

    latency: float = field(converter=float, validator=_finite)
    """Mean latency, e.g. TTFT in seconds (minimised)."""
    throughput: float = field(converter=float, validator=_finite)
    """Throughput, e.g. tokens or requests per second (maximised)."""
    cost: float = field(converter=float, validator=_finite)
    """Cost, e.g. dollars per hour (minimised)."""

    def as_minimization(self) -> tuple[float, float, float]:
        """``(latency, -throughput, cost)``: every component minimised."""
        return (self.latency, -self.throughput, self.cost)


@frozen
class SearchAxis:
    """One dimension of the configuration space (DRAM GiB, disk GiB, TTL seconds)."""

    name: str = field(validator=instance_of(str))
    """Key of this value in the configuration passed to the evaluation function."""
    low: float = field(converter=float, validator=[_finite, ge(0.0)])
    """Start of the initial grid."""
    high: float = field(converter=float, validator=_finite)
    """End of the initial grid (included)."""
    step: float = field(converter=float, validator=[_finite, gt(0.0)])
    """Initial grid step (Δ_d, Δ_t of Algorithm 1)."""
    min_step: float = field(converter=float, validator=[_finite, gt(0.0)])
    """Finest spacing refinement may reach (midpoints closer than this are not added)."""
    limit: float = field(converter=float, validator=_finite)
    """How far the expansion of Algorithm 1 (lines 10-13) may go; only the first axis
    expands, so ``limit == high`` on the others."""

    def __attrs_post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"'high' must be >= 'low' ({self.low!r}): {self.high!r}")
        if self.min_step > self.step:
            raise ValueError(f"'min_step' must be <= 'step' ({self.step!r}): {self.min_step!r}")
        if self.limit < self.high:
            raise ValueError(f"'limit' must be >= 'high' ({self.high!r}): {self.limit!r}")

    @classmethod
    def of(
        cls,
        name: str,
        low: float,
        high: float,
        step: float,
        *,
        min_step: float | None = None,
        limit: float | None = None,
    ) -> SearchAxis:
        """Build with ``min_step`` defaulting to ``step / 8`` and ``limit`` to ``high``."""
        return cls(
            name=name,
            low=low,
            high=high,
            step=step,
            min_step=step / 8 if min_step is None else min_step,
            limit=high if limit is None else limit,
        )

    def grid(self) -> list[float]:
        """The initial grid ``low, low + step, ..., <= high``."""
        count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
        return [_snap(self.low + k * self.step) for k in range(count)]


def _snap(x: float) -> float:
    # Midpoints of binary subdivisions are exact in floating point; rounding only removes
    # the last-ulp noise of low + k * step so that equal configurations compare equal.
    return round(x, 9)


@frozen
class Evaluation:
    """One simulated configuration."""

    config: tuple[tuple[str, float], ...]
    """``(axis name, value)`` pairs, in axis order."""
    objectives: Objectives
    """What the evaluation function returned."""

    def value(self, name: str) -> float:
        """The configuration value of axis ``name``."""
        return dict(self.config)[name]


@frozen
class ParetoSearchResult:
    """All evaluations of a search and the non-dominated ones."""

    evaluations: tuple[Evaluation, ...]
    """In evaluation order."""
    front: tuple[Evaluation, ...]
    """The non-dominated evaluations (ParetoFilter(P), line 20)."""

    def hypervolume(self, reference: Sequence[float]) -> float:
        """Hypervolume of the front in ``(latency, -throughput, cost)`` space."""
        return hypervolume([e.objectives.as_minimization() for e in self.front], reference)


Evaluate = Callable[[Mapping[str, float]], Objectives]


def _relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def _check_axes(axes: Sequence[SearchAxis]) -> tuple[SearchAxis, ...]:
    if not is_sequence(axes) or not axes:
        raise TypeError(f"'axes' must be a non-empty sequence of SearchAxis: {axes!r}")
    for a in axes:
        if not isinstance(a, SearchAxis):
            raise TypeError(f"'axes' must hold SearchAxis values: {a!r}")
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ValueError(f"'axes' must have distinct names: {names!r}")
    return tuple(axes)


def _check_threshold(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number: {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"'{name}' must be finite and >= 0: {value!r}")


class _Runner:
    """Evaluates configurations once each, in order, up to a budget."""

    def __init__(self, evaluate: Evaluate, axes: tuple[SearchAxis, ...], budget: int) -> None:
        self.evaluate = evaluate
        self.names = tuple(a.name for a in axes)
        self.budget = budget
        self.seen: dict[tuple[float, ...], Objectives] = {}
        self.order: list[tuple[float, ...]] = []

    def run(self, configs: Sequence[tuple[float, ...]]) -> bool:
        """Evaluate the unvisited ``configs``; False once the budget is spent."""
        for c in configs:
            if c in self.seen:
                continue
            if len(self.order) >= self.budget:
                return False
            result = self.evaluate(dict(zip(self.names, c, strict=True)))
            if not isinstance(result, Objectives):
                raise TypeError(f"'evaluate' must return Objectives: {result!r}")
            self.seen[c] = result
            self.order.append(c)
        return True

    def result(self) -> ParetoSearchResult:
        evals = tuple(
            Evaluation(config=tuple(zip(self.names, c, strict=True)), objectives=self.seen[c])
            for c in self.order
        )
        mask = (
            pareto_mask([e.objectives.as_minimization() for e in evals])
            if evals
            else np.zeros(0, dtype=bool)
        )
        return ParetoSearchResult(
            evaluations=evals, front=tuple(e for e, k in zip(evals, mask, strict=True) if k)
        )


def grid_search(
    evaluate: Evaluate, axes: Sequence[SearchAxis], *, max_evaluations: int = 10_000
) -> ParetoSearchResult:
    """Evaluate the full uniform grid of ``axes`` (the baseline of §5.3.1, Figure 13)."""
    ax = _check_axes(axes)
    runner = _Runner(evaluate, ax, max_evaluations)
    runner.run(list(itertools.product(*(a.grid() for a in ax))))
    return runner.result()


def adaptive_pareto_search(
    evaluate: Evaluate,
    axes: Sequence[SearchAxis],
    *,
    expand_threshold: float,
    perf_threshold: float,
    cost_threshold: float,
    max_evaluations: int = 1_000,
) -> ParetoSearchResult:
    """Adaptive Pareto exploration (Algorithm 1 of seed 003), over any number of axes.

    1. Evaluate the uniform initial grid (lines 2-8).
    2. Expansion (lines 10-13): along the first axis (DRAM), at the base of the other
       axes (their ``low``: TTL = 0, no disk), if the last step of the first axis still
       changed latency by more than ``expand_threshold``, add the next slice
       ``d_max + step`` over the initial grid of the other axes, up to ``limit``.
    3. Refinement (lines 14-18): for every pair of visited configurations adjacent along
       one axis (equal elsewhere, nothing visited between them) where latency or
       throughput changes by more than ``perf_threshold`` and cost by more than
       ``cost_threshold``, add the midpoint, unless it would be closer than ``min_step``.
    4. Repeat until nothing is added or ``max_evaluations`` is spent; return all
       evaluations and ParetoFilter of them (line 20).

    Changes are relative, ``|a - b| / max(|a|, |b|)``; the paper leaves the units of its
    thresholds open and relative changes do not depend on the objectives' units.

    Args:
        evaluate: maps ``{axis name: value}`` to :class:`Objectives` (the simulator).
        axes: the first axis is the one that expands (DRAM capacity in the paper).
        expand_threshold: τ_e.
        perf_threshold: τ_perf.
        cost_threshold: τ_cost.
        max_evaluations: hard cap on calls of ``evaluate``.
    """
    ax = _check_axes(axes)
    if not callable(evaluate):
        raise TypeError(f"'evaluate' must be callable: {evaluate!r}")
    for name, value in (
        ("expand_threshold", expand_threshold),
        ("perf_threshold", perf_threshold),
        ("cost_threshold", cost_threshold),
    ):
        _check_threshold(name, value)
    if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int):
        raise TypeError(f"'max_evaluations' must be an int: {max_evaluations!r}")
    if max_evaluations < 1:
        raise ValueError(f"'max_evaluations' must be >= 1: {max_evaluations!r}")
    runner = _Runner(evaluate, ax, max_evaluations)
    others = [a.grid() for a in ax[1:]]
    base_rest = tuple(_snap(a.low) for a in ax[1:])
    pending: list[tuple[float, ...]] = list(itertools.product(*(a.grid() for a in ax)))
    while pending:
        if not runner.run(pending):
            break
        seen = runner.seen
        added: dict[tuple[float, ...], None] = {}
        # Expansion along the first axis, judged on the base row (lines 10-13).
        first = ax[0]
        d_max = max(c[0] for c in seen if c[1:] == base_rest)
        prev = (_snap(d_max - first.step), *base_rest)
        nxt = _snap(d_max + first.step)
        if (
            prev in seen
            and nxt <= first.limit + 1e-9
            and _relative(seen[prev].latency, seen[(d_max, *base_rest)].latency) > expand_threshold
        ):
            for rest in itertools.product(*others):
                c = (nxt, *rest)
                if c not in seen:
                    added[c] = None
        # Refinement between neighbours along each axis (lines 14-18).
        for k, axis in enumerate(ax):
            lines: dict[tuple[float, ...], list[float]] = {}
            for c in seen:
                lines.setdefault(c[:k] + c[k + 1 :], []).append(c[k])
            for rest, values in lines.items():
                values.sort()
                for lo, hi in itertools.pairwise(values):
                    if hi - lo < 2 * axis.min_step - 1e-12:
                        continue
                    a = seen[(*rest[:k], lo, *rest[k:])]
                    b = seen[(*rest[:k], hi, *rest[k:])]
                    perf = max(
                        _relative(a.latency, b.latency), _relative(a.throughput, b.throughput)
                    )
                    if perf > perf_threshold and _relative(a.cost, b.cost) > cost_threshold:
                        mid = (*rest[:k], _snap((lo + hi) / 2), *rest[k:])
                        if mid not in seen:
                            added[mid] = None
        pending = list(added)
    return runner.result()
