"""Token-PD's ``memory``: a running estimate that forgets old observations."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy


def _observe(policy: TokenPDPolicy, values: list[float]) -> tuple[float, float]:
    pos = np.array([0], dtype=np.int64)
    policy.insert("s", pos, np.array([[0.0, 0.0]]))
    for v in values:
        policy.observe("s", pos, np.array([v]))
    r, var = policy.estimates("s", pos)
    return float(r[0]), float(var[0])


def test_memory_zero_is_the_mean_since_insertion() -> None:
    values = [0.5, 0.1, 0.0, 0.0]
    r, _ = _observe(TokenPDPolicy(TokenPDConfig(prior_weight=0.0)), values)
    assert r == pytest.approx(np.mean(values))


def test_short_memory_follows_recent_attention() -> None:
    values = [0.9] * 5 + [0.0] * 10
    full, _ = _observe(TokenPDPolicy(TokenPDConfig(prior_weight=0.0)), values)
    short, _ = _observe(TokenPDPolicy(TokenPDConfig(prior_weight=0.0, memory=4)), values)
    assert full == pytest.approx(0.3)
    assert short == pytest.approx(0.9 * 0.75**10 * (5 / 5), rel=1e-6)
    assert short < full


def test_memory_matches_welford_until_it_fills() -> None:
    """Up to ``memory`` observations both estimates (mean and variance) agree."""
    rng = np.random.default_rng(0)
    values = list(rng.random(6))
    a = _observe(TokenPDPolicy(TokenPDConfig(prior_weight=0.0)), values)
    b = _observe(TokenPDPolicy(TokenPDConfig(prior_weight=0.0, memory=6)), values)
    assert a == pytest.approx(b)
    assert a[1] == pytest.approx(np.var(values))


def test_memory_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="memory"):
        TokenPDConfig(memory=-1)
