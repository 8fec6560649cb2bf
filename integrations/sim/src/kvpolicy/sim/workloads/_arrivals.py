"""Arrival processes: when the requests of a synthetic workload arrive.

Each process is a renewal process started at time 0: the first request arrives after one
inter-arrival gap. Gamma gaps with mean ``1 / rate`` and coefficient of variation ``cv`` have
shape ``k = 1 / cv**2`` and scale ``theta = cv**2 / rate`` (mean ``k * theta``, variance
``k * theta**2``); ``cv = 1`` is the Poisson process. ServeGen (Xiang et al. 2025) fits
per-client inter-arrival times with exactly this family, which is why a tenant is described
by a rate and a CV.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import numpy as np
from attrs import field, frozen

__all__ = ["ArrivalProcess", "GammaArrivals", "Poisson", "Saturated"]


def _positive_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"'{name}' must be a number: {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{name}' must be finite and > 0: {value!r}")
    return float(value)


def _rate(value: float) -> float:
    return _positive_finite("rate", value)


def _cv(value: float) -> float:
    return _positive_finite("cv", value)


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"'n' must be int: {n!r}")
    if n < 0:
        raise ValueError(f"'n' must be >= 0: {n}")
    return n


@runtime_checkable
class ArrivalProcess(Protocol):
    """When requests arrive: a renewal process started at time 0."""

    @property
    def rate(self) -> float:
        """Mean arrivals per second (``inf`` when every request arrives at once)."""
        ...

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Arrival times of the first ``n`` requests.

        Returns:
            (n,) float64, non-decreasing, >= 0, in seconds.
        """
        ...

    def scaled(self, factor: float) -> ArrivalProcess:
        """The same process with the rate multiplied by ``factor`` (burstiness kept)."""
        ...


@frozen
class GammaArrivals:
    """Gamma-distributed inter-arrival gaps with a given rate and CV."""

    rate: float = field(converter=_rate)
    """Mean arrivals per second (> 0)."""
    cv: float = field(default=1.0, converter=_cv)
    """Coefficient of variation of the gaps (> 0); 1 is Poisson, > 1 bursty, < 1 regular."""

    @classmethod
    def fit(cls, arrival_times: np.ndarray) -> GammaArrivals:
        """Method-of-moments fit to observed arrival times.

        Args:
            arrival_times: (n,) float64 non-decreasing seconds, n >= 3, spanning time.
        """
        times = np.asarray(arrival_times, dtype=np.float64)
        if times.ndim != 1 or times.size < 3:
            raise ValueError(f"'arrival_times' must be 1-D with >= 3 entries: shape {times.shape}")
        gaps = np.diff(times)
        if (gaps < 0).any():
            raise ValueError("'arrival_times' must be non-decreasing")
        mean = float(gaps.mean())
        if mean <= 0:
            raise ValueError(f"'arrival_times' must span time: all equal to {times[0]!r}")
        return cls(rate=1.0 / mean, cv=float(gaps.std()) / mean)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Arrival times of the first ``n`` requests: (n,) float64 cumulative gaps."""
        shape = 1.0 / (self.cv * self.cv)
        gaps = rng.gamma(shape, 1.0 / (self.rate * shape), size=_count(n))
        return np.cumsum(gaps)

    def scaled(self, factor: float) -> GammaArrivals:
        """Rate times ``factor``, CV unchanged."""
        return GammaArrivals(rate=self.rate * _positive_finite("factor", factor), cv=self.cv)


@frozen
class Poisson:
    """Poisson arrivals: exponential gaps (Gamma with ``cv = 1``)."""

    rate: float = field(converter=_rate)
    """Mean arrivals per second (> 0)."""

    @property
    def cv(self) -> float:
        """Always 1."""
        return 1.0

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Arrival times of the first ``n`` requests: (n,) float64 cumulative gaps."""
        return np.cumsum(rng.exponential(1.0 / self.rate, size=_count(n)))

    def scaled(self, factor: float) -> Poisson:
        """Rate times ``factor``."""
        return Poisson(rate=self.rate * _positive_finite("factor", factor))


@frozen
class Saturated:
    """Every request arrives at time 0: the saturated (finite-input) setting of seed 002."""

    @property
    def rate(self) -> float:
        """Infinite."""
        return math.inf

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n,) float64 zeros."""
        return np.zeros(_count(n), dtype=np.float64)

    def scaled(self, factor: float) -> Saturated:
        """Itself (an infinite rate stays infinite)."""
        _positive_finite("factor", factor)
        return self
