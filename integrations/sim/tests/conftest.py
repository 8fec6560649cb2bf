"""Fixtures and factories of the kvpolicy-sim tests."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import numpy as np
import pytest
from numpy.typing import NDArray

from kvpolicy.kvmodel import Request, SchedulerState, SequenceView, get_gpu, get_model
from kvpolicy.sim import EngineConfig, TimingModel


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)


def make_request(
    i: int, prompt: int = 32, decode: int = 8, t: float = 0.0, tenant: str = "default", **kw: object
) -> Request:
    """A request named ``r{i}``."""
    return Request(f"r{i}", prompt, decode, t, tenant, **kw)  # type: ignore[arg-type]


def timing() -> TimingModel:
    """Llama-3-8B on H100-SXM with the default calibration."""
    return TimingModel(get_model("Llama-3-8B"), get_gpu("H100-SXM"))


def small_engine(tokens: int, **kw: object) -> EngineConfig:
    """An engine with a KV pool of ``tokens`` tokens."""
    return EngineConfig(kv_capacity_tokens=tokens, **kw)  # type: ignore[arg-type]


class FitAdmission:
    """Seed 002's baseline rule: admit from the head while ``prompt + 1`` fits."""

    def admit(self, state: SchedulerState, waiting: Sequence[Request]) -> int:
        free = state.capacity_tokens - state.used_tokens
        n = 0
        for r in waiting:
            if r.prompt_len + 1 > free:
                break
            free -= r.prompt_len + 1
            n += 1
        return n


class CappedAdmission:
    """Seed 002 §5.1: at most ``cap`` per iteration on average (fractional credit)."""

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.credit = 0.0

    def admit(self, state: SchedulerState, waiting: Sequence[Request]) -> int:
        self.credit = min(self.credit + self.cap, self.cap + 1.0)
        free = state.capacity_tokens - state.used_tokens
        n = 0
        for r in waiting:
            if n + 1 > self.credit or r.prompt_len + 1 > free:
                break
            free -= r.prompt_len + 1
            n += 1
        self.credit -= n
        return n


class LeastProgressed:
    """Preempt the request with the fewest generated tokens first (seed 002's LPF)."""

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        return [
            v.request_id for v in sorted(running, key=lambda v: (v.generated, -v.admitted_time))
        ]


class OldestFirst:
    """Preempt the earliest admitted first (the reverse of vLLM's rule)."""

    def order(self, running: Sequence[SequenceView]) -> list[str]:
        return [v.request_id for v in sorted(running, key=lambda v: v.admitted_time)]


class FifoEviction:
    """Token FIFO over numpy arrays: evict the oldest positions of the longest stream."""

    def __init__(self) -> None:
        self.streams: dict[str, NDArray[np.int64]] = {}
        self.observed = 0.0

    def insert(
        self,
        stream: str,
        positions: NDArray[np.int64],
        signals: NDArray[np.float64] | None = None,
    ) -> None:
        old = self.streams.get(stream, np.empty(0, dtype=np.int64))
        self.streams[stream] = np.concatenate((old, positions))

    def observe(
        self, stream: str, positions: NDArray[np.int64], attention: NDArray[np.float64]
    ) -> None:
        self.observed += float(attention.sum())

    def evict(self, budget_tokens: int) -> Mapping[str, NDArray[np.int64]]:
        out: dict[str, NDArray[np.int64]] = {}
        excess = self.resident_tokens() - budget_tokens
        while excess > 0:
            sid = max(self.streams, key=lambda s: len(self.streams[s]))
            arr = self.streams[sid]
            k = min(excess, len(arr) - 1) if len(arr) > 1 else len(arr)
            out[sid] = np.concatenate((out.get(sid, np.empty(0, dtype=np.int64)), arr[:k]))
            self.streams[sid] = arr[k:]
            excess -= k
        return out

    def remove(self, stream: str) -> None:
        self.streams.pop(stream, None)

    def resident_tokens(self) -> int:
        return sum(len(a) for a in self.streams.values())


@pytest.fixture
def tm() -> TimingModel:
    """Llama-3-8B on H100-SXM."""
    return timing()


@pytest.fixture
def kit() -> SimpleNamespace:
    """Factories and small policy objects built for the tests."""
    return SimpleNamespace(
        request=make_request,
        timing=timing,
        engine=small_engine,
        FitAdmission=FitAdmission,
        CappedAdmission=CappedAdmission,
        LeastProgressed=LeastProgressed,
        OldestFirst=OldestFirst,
        FifoEviction=FifoEviction,
    )
