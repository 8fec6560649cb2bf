"""Fixtures of the kvpolicy-admit tests: seeded randomness and small real objects."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from kvpolicy.kvmodel import Request, SchedulerState


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)


@pytest.fixture
def make_request() -> Callable[..., Request]:
    """Factory of requests with sequential ids."""
    counter = iter(range(1_000_000))

    def make(prompt_len: int = 10, decode_len: int = 5, arrival_time: float = 0.0) -> Request:
        return Request(
            request_id=f"r{next(counter)}",
            prompt_len=prompt_len,
            decode_len=decode_len,
            arrival_time=arrival_time,
        )

    return make


@pytest.fixture
def make_state() -> Callable[..., SchedulerState]:
    """Factory of scheduler states."""

    def make(used: int = 0, capacity: int = 100, step: int = 0) -> SchedulerState:
        return SchedulerState(
            step=step, time=float(step), used_tokens=used, capacity_tokens=capacity
        )

    return make
