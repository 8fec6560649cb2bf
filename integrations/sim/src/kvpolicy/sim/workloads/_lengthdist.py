"""Length distributions: how many prompt and output tokens each synthetic request has.

Every distribution draws ``(prompt_len, decode_len)`` pairs of positive integers, so that a
sample can be turned into :class:`kvpolicy.kvmodel.Request` objects directly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from attrs import field, frozen
from attrs.validators import ge, instance_of, le

if TYPE_CHECKING:
    from kvpolicy.sim.workloads._workload import Workload

__all__ = [
    "QUANTILE_GRID",
    "EmpiricalLengths",
    "FixedLengths",
    "LengthDistribution",
    "LogNormalLengths",
    "PMFLengths",
    "QuantileLengths",
    "normal_cdf",
]


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"'n' must be int: {n!r}")
    if n < 0:
        raise ValueError(f"'n' must be >= 0: {n}")
    return n


def _finite(name: str) -> Any:
    def check(_inst: object, _attr: object, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"'{name}' must be a number: {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"'{name}' must be finite: {value!r}")

    return check


def _positive(name: str) -> Any:
    def check(_inst: object, _attr: object, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"'{name}' must be a number: {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"'{name}' must be finite and > 0: {value!r}")

    return check


def _pos_int() -> Any:
    return [instance_of(int), ge(1)]


@runtime_checkable
class LengthDistribution(Protocol):
    """Draws prompt and output lengths."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` requests' lengths.

        Returns:
            (n, 2) int64: column 0 the prompt length, column 1 the output length, both >= 1.
        """
        ...


@frozen
class FixedLengths:
    """Every request has the same lengths: one class of requests, as in seed 002's model."""

    prompt_len: int = field(validator=_pos_int())
    """Prompt tokens (``l0`` of seed 002)."""
    decode_len: int = field(validator=_pos_int())
    """Output tokens (``l1`` of seed 002)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 2) int64 rows equal to ``(prompt_len, decode_len)``."""
        out = np.empty((_count(n), 2), dtype=np.int64)
        out[:, 0] = self.prompt_len
        out[:, 1] = self.decode_len
        return out


@frozen
class LogNormalLengths:
    """Correlated lognormal prompt and output lengths, rounded and clipped to ``[1, max]``.

    ``(ln prompt, ln decode)`` is bivariate normal with means ``prompt_mu``/``decode_mu``,
    standard deviations ``prompt_sigma``/``decode_sigma`` and correlation ``correlation``.
    Clipping puts the tail mass beyond a maximum at the maximum, as a server's context limit
    and ``max_tokens`` do.
    """

    prompt_mu: float = field(validator=_finite("prompt_mu"))
    """Mean of ln(prompt tokens)."""
    prompt_sigma: float = field(validator=_positive("prompt_sigma"))
    """Standard deviation of ln(prompt tokens)."""
    decode_mu: float = field(validator=_finite("decode_mu"))
    """Mean of ln(output tokens)."""
    decode_sigma: float = field(validator=_positive("decode_sigma"))
    """Standard deviation of ln(output tokens)."""
    correlation: float = field(default=0.0, validator=[_finite("correlation"), ge(-1), le(1)])
    """Correlation of the two logarithms, in [-1, 1]."""
    max_prompt_len: int = field(default=1 << 20, validator=_pos_int())
    """Largest prompt drawn."""
    max_decode_len: int = field(default=1 << 20, validator=_pos_int())
    """Largest output drawn."""

    @classmethod
    def fit(cls, prompt_lens: Sequence[int], decode_lens: Sequence[int]) -> LogNormalLengths:
        """Fit to observed lengths: moments of the logarithms; maxima as observed.

        Args:
            prompt_lens: (n,) positive integers.
            decode_lens: (n,) positive integers, paired with ``prompt_lens``.
        """
        p = np.asarray(prompt_lens, dtype=np.float64)
        d = np.asarray(decode_lens, dtype=np.float64)
        if p.ndim != 1 or p.shape != d.shape or p.size < 2:
            raise ValueError(
                f"'prompt_lens' and 'decode_lens' must be 1-D, of one length >= 2: "
                f"{p.shape} and {d.shape}"
            )
        if (p < 1).any() or (d < 1).any():
            raise ValueError("'prompt_lens' and 'decode_lens' must be >= 1")
        lp, ld = np.log(p), np.log(d)
        corr = float(np.corrcoef(lp, ld)[0, 1]) if lp.std() > 0 and ld.std() > 0 else 0.0
        return cls(
            prompt_mu=float(lp.mean()),
            prompt_sigma=max(float(lp.std()), 1e-9),
            decode_mu=float(ld.mean()),
            decode_sigma=max(float(ld.std()), 1e-9),
            correlation=corr,
            max_prompt_len=int(p.max()),
            max_decode_len=int(d.max()),
        )

    @classmethod
    def from_workload(cls, workload: Workload) -> LogNormalLengths:
        """:meth:`fit` to the lengths of a workload (a loaded trace, say)."""
        return cls.fit(
            [r.prompt_len for r in workload.requests], [r.decode_len for r in workload.requests]
        )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 2) int64 lengths."""
        z = rng.standard_normal((_count(n), 2))
        # Cholesky factor of [[1, rho], [rho, 1]]: the second normal gets the correlation.
        rho = self.correlation
        z2 = rho * z[:, 0] + math.sqrt(max(0.0, 1.0 - rho * rho)) * z[:, 1]
        out = np.empty((n, 2), dtype=np.int64)
        for col, mu, sigma, z_col, cap in (
            (0, self.prompt_mu, self.prompt_sigma, z[:, 0], self.max_prompt_len),
            (1, self.decode_mu, self.decode_sigma, z2, self.max_decode_len),
        ):
            # Cap the exponent first: past ln(cap) the value is clipped anyway, and exp of a
            # huge exponent would overflow to inf.
            log_len = np.minimum(mu + sigma * z_col, math.log(cap) + 1.0)
            out[:, col] = np.clip(np.rint(np.exp(log_len)), 1, cap)
        return out


def _lengths_tuple(name: str) -> Any:
    def convert(value: Sequence[int]) -> tuple[int, ...]:
        try:
            items = tuple(int(v) for v in value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"'{name}' must be a sequence of integers: {value!r}") from exc
        return items

    return convert


def _to_prompt_lens(value: Sequence[int]) -> tuple[int, ...]:
    return _lengths_tuple("prompt_lens")(value)  # type: ignore[no-any-return]


def _to_decode_lens(value: Sequence[int]) -> tuple[int, ...]:
    return _lengths_tuple("decode_lens")(value)  # type: ignore[no-any-return]


def _check_pairs(inst: Any, _attr: Any, value: tuple[int, ...]) -> None:
    if not value:
        raise ValueError("'decode_lens' must not be empty")
    if len(value) != len(inst.prompt_lens):
        raise ValueError(
            f"'prompt_lens' and 'decode_lens' must have one length: "
            f"{len(inst.prompt_lens)} and {len(value)}"
        )
    for name, seq in (("prompt_lens", inst.prompt_lens), ("decode_lens", value)):
        low = min(seq)
        if low < 1:
            raise ValueError(f"'{name}' must be >= 1: {low}")


@frozen
class EmpiricalLengths:
    """Resample observed ``(prompt, output)`` pairs uniformly, keeping their joint law."""

    prompt_lens: tuple[int, ...] = field(converter=_to_prompt_lens)
    """(n,) observed prompt lengths, >= 1."""
    decode_lens: tuple[int, ...] = field(
        converter=_to_decode_lens,
        validator=_check_pairs,
    )
    """(n,) observed output lengths, >= 1, paired with ``prompt_lens``."""

    @classmethod
    def from_workload(cls, workload: Workload) -> EmpiricalLengths:
        """The observed pairs of a workload (a loaded trace, say).

        Raises:
            ValueError: the workload is empty.
        """
        if not workload.requests:
            raise ValueError(f"'workload' has no requests to resample: {workload.name!r}")
        return cls(
            [r.prompt_len for r in workload.requests], [r.decode_len for r in workload.requests]
        )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 2) int64 pairs drawn with replacement."""
        idx = rng.integers(0, len(self.prompt_lens), size=_count(n))
        pairs = np.column_stack(
            (np.asarray(self.prompt_lens, dtype=np.int64), np.asarray(self.decode_lens, np.int64))
        )
        return pairs[idx]


def _pmf(name: str) -> Any:
    def convert(value: object) -> tuple[tuple[int, ...], tuple[float, ...]]:
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TypeError(f"'{name}' must be a (values, probabilities) pair: {value!r}")
        values = tuple(int(v) for v in value[0])
        probs = tuple(float(p) for p in value[1])
        return values, probs

    return convert


_PMF = tuple[tuple[int, ...], tuple[float, ...]]


def _to_prompt_pmf(value: object) -> _PMF:
    return _pmf("prompt")(value)  # type: ignore[no-any-return]


def _to_decode_pmf(value: object) -> _PMF:
    return _pmf("decode")(value)  # type: ignore[no-any-return]


def _check_pmf(
    _inst: object, attr: object, value: tuple[tuple[int, ...], tuple[float, ...]]
) -> None:
    name = getattr(attr, "name", "pmf")
    values, probs = value
    if not values or len(values) != len(probs):
        raise ValueError(
            f"'{name}' must have as many probabilities as values, at least one: "
            f"{len(values)} and {len(probs)}"
        )
    if min(values) < 1:
        raise ValueError(f"'{name}' values must be >= 1: {min(values)}")
    if not all(math.isfinite(p) and p >= 0 for p in probs) or sum(probs) <= 0:
        raise ValueError(f"'{name}' probabilities must be finite, >= 0 and not all 0")


@frozen
class PMFLengths:
    """Independent prompt and output lengths drawn from two probability mass functions.

    This is what ServeGen publishes per client and window: the two marginals, not their joint
    law, so the two lengths are drawn independently. Probabilities are normalised to sum to 1.
    """

    prompt: tuple[tuple[int, ...], tuple[float, ...]] = field(
        converter=_to_prompt_pmf,
        validator=_check_pmf,
    )
    """``(values, probabilities)`` of the prompt length."""
    decode: tuple[tuple[int, ...], tuple[float, ...]] = field(
        converter=_to_decode_pmf,
        validator=_check_pmf,
    )
    """``(values, probabilities)`` of the output length."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 2) int64 independent draws."""
        out = np.empty((_count(n), 2), dtype=np.int64)
        for col, (values, probs) in enumerate((self.prompt, self.decode)):
            p = np.asarray(probs, dtype=np.float64)
            out[:, col] = rng.choice(np.asarray(values, dtype=np.int64), size=n, p=p / p.sum())
        return out


QUANTILE_GRID: tuple[float, ...] = (
    0.0, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6,
    0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999, 1.0,
)  # fmt: skip
"""Probabilities at which :meth:`QuantileLengths.fit` tabulates a marginal (dense in the tail,
where KV memory is decided)."""

# Abramowitz & Stegun 7.1.26: erf(x) to 1.5e-7 for x >= 0.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF, elementwise, to about 1e-7 (numpy only).

    Args:
        z: float64 array of any shape.

    Returns:
        float64 array of the same shape, in [0, 1].
    """
    x = np.abs(np.asarray(z, dtype=np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + _AS_P * x)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    erf = 1.0 - poly * np.exp(-x * x)
    out: np.ndarray = 0.5 * (1.0 + np.sign(z) * erf)
    return out


def _float_tuple(value: Sequence[float]) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"quantile tables must be sequences of numbers: {value!r}") from exc


def _check_quantiles(inst: Any, attr: Any, value: tuple[float, ...]) -> None:
    grid = inst.probabilities
    if len(value) != len(grid):
        raise ValueError(
            f"'{attr.name}' must have one value per probability ({len(grid)}): {len(value)}"
        )
    if not all(math.isfinite(v) and v >= 1 for v in value):
        raise ValueError(f"'{attr.name}' must be finite and >= 1: {value!r}")
    if any(b < a for a, b in itertools.pairwise(value)):
        raise ValueError(f"'{attr.name}' must be non-decreasing: {value!r}")


def _check_grid(_inst: Any, _attr: Any, value: tuple[float, ...]) -> None:
    if len(value) < 2 or value[0] != 0.0 or value[-1] != 1.0:
        raise ValueError(f"'probabilities' must run from 0.0 to 1.0: {value!r}")
    if any(b <= a for a, b in itertools.pairwise(value)):
        raise ValueError(f"'probabilities' must increase: {value!r}")


@frozen
class QuantileLengths:
    """Lengths with tabulated marginals joined by a Gaussian copula.

    Each marginal is its quantile function, interpolated linearly between the tabulated
    ``(probabilities[i], quantiles[i])`` points, so a trace's median, tail and maximum are
    reproduced (a lognormal fit matches only the log-moments: on the Azure conversation
    trace it puts the prompt p99 at 7,775 tokens against the trace's 4,142). The two lengths
    are joined by a Gaussian copula whose correlation ``rho`` reproduces the trace's Spearman
    rank correlation ``rho_s`` (``rho = 2 sin(pi rho_s / 6)``).
    """

    prompt_quantiles: tuple[float, ...] = field(converter=_float_tuple, validator=_check_quantiles)
    """Prompt tokens at each probability (non-decreasing, >= 1)."""
    decode_quantiles: tuple[float, ...] = field(converter=_float_tuple, validator=_check_quantiles)
    """Output tokens at each probability (non-decreasing, >= 1)."""
    correlation: float = field(default=0.0, validator=[_finite("correlation"), ge(-1), le(1)])
    """Correlation of the Gaussian copula, in [-1, 1]."""
    probabilities: tuple[float, ...] = field(
        default=QUANTILE_GRID, converter=_float_tuple, validator=_check_grid
    )
    """Increasing probabilities from 0.0 to 1.0 at which the quantiles are given."""

    @classmethod
    def fit(
        cls,
        prompt_lens: Sequence[int],
        decode_lens: Sequence[int],
        probabilities: Sequence[float] = QUANTILE_GRID,
    ) -> QuantileLengths:
        """Tabulate observed lengths: quantiles at ``probabilities``, Spearman correlation.

        Args:
            prompt_lens: (n,) positive integers.
            decode_lens: (n,) positive integers, paired with ``prompt_lens``.
            probabilities: the grid (from 0.0 to 1.0, increasing).
        """
        p = np.asarray(prompt_lens, dtype=np.float64)
        d = np.asarray(decode_lens, dtype=np.float64)
        if p.ndim != 1 or p.shape != d.shape or p.size < 2:
            raise ValueError(
                f"'prompt_lens' and 'decode_lens' must be 1-D, of one length >= 2: "
                f"{p.shape} and {d.shape}"
            )
        if (p < 1).any() or (d < 1).any():
            raise ValueError("'prompt_lens' and 'decode_lens' must be >= 1")
        grid = np.asarray(probabilities, dtype=np.float64)
        rho_s = _spearman(p, d)
        return cls(
            probabilities=tuple(grid.tolist()),
            prompt_quantiles=tuple(np.quantile(p, grid).tolist()),
            decode_quantiles=tuple(np.quantile(d, grid).tolist()),
            correlation=float(np.clip(2.0 * math.sin(math.pi * rho_s / 6.0), -1.0, 1.0)),
        )

    @classmethod
    def from_workload(cls, workload: Workload) -> QuantileLengths:
        """:meth:`fit` to the lengths of a workload (a loaded trace, say)."""
        return cls.fit(
            [r.prompt_len for r in workload.requests], [r.decode_len for r in workload.requests]
        )

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, 2) int64 lengths."""
        z = rng.standard_normal((_count(n), 2))
        rho = self.correlation
        z2 = rho * z[:, 0] + math.sqrt(max(0.0, 1.0 - rho * rho)) * z[:, 1]
        grid = np.asarray(self.probabilities)
        out = np.empty((n, 2), dtype=np.int64)
        for col, zz, table in ((0, z[:, 0], self.prompt_quantiles), (1, z2, self.decode_quantiles)):
            values = np.interp(normal_cdf(zz), grid, np.asarray(table))
            out[:, col] = np.maximum(np.rint(values), 1)
        return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), (n,) float64."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    mean_rank = (starts + ends - 1) / 2.0
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = _ranks(x), _ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])
