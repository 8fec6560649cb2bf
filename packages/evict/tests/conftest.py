"""Fixtures of kvpolicy-evict's tests."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from kvpolicy.evict import (
    FIFOPolicy,
    H2OPolicy,
    LRUPolicy,
    ScoredPolicy,
    SinkWindowPolicy,
    TokenPDConfig,
    TokenPDPolicy,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)


POLICY_FACTORIES: dict[str, Callable[[], ScoredPolicy]] = {
    "fifo": FIFOPolicy,
    "lru": LRUPolicy,
    "h2o": lambda: H2OPolicy(recent_window=3, num_sink=1),
    "sink-window": lambda: SinkWindowPolicy(num_sink=2),
    "token-pd": lambda: TokenPDPolicy(TokenPDConfig(initial_price=0.01, recent_window=2)),
    "token-pd-noprice": TokenPDPolicy,
}
"""Every token policy, in a small configuration, by a test id."""


@pytest.fixture(scope="session")
def policy_factories() -> dict[str, Callable[[], ScoredPolicy]]:
    """Factories of every token policy, by test id."""
    return POLICY_FACTORIES


@pytest.fixture(params=sorted(POLICY_FACTORIES))
def policy_name(request: pytest.FixtureRequest) -> str:
    """Each token policy's test id in turn."""
    return str(request.param)


@pytest.fixture
def any_policy(policy_name: str) -> ScoredPolicy:
    """A fresh instance of each token policy in turn."""
    return POLICY_FACTORIES[policy_name]()
