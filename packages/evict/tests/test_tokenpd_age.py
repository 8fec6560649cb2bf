"""Token-PD's ``age_prior``: a per-stream profile of attention by age, learned online, that
counts as extra observations in every token's estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy
from kvpolicy.evict._tokenpd import age_bins, bin_medians, pooled_max


def test_age_bins_are_powers_of_two() -> None:
    ages = np.array([0, 1, 2, 3, 4, 7, 8, 1023, 1024], dtype=np.int64)
    assert age_bins(ages).tolist() == [0, 1, 2, 2, 3, 3, 4, 10, 11]
    assert age_bins(np.array([2**40])).tolist() == [31]


def test_bin_medians_per_bin() -> None:
    bins = np.array([3, 1, 1, 1, 3, 5], dtype=np.int64)
    vals = np.array([2.0, 5.0, 1.0, 3.0, 4.0, 7.0])
    present, med = bin_medians(bins, vals)
    assert present.tolist() == [1, 3, 5]
    assert med.tolist() == [3.0, 3.0, 7.0]


def _decay_run(policy: TokenPDPolicy, steps: int, budget: int, scale: float) -> None:
    """Attention that fades with age (e^{-age/scale}), plus a heavy first token."""
    for t in range(steps):
        policy.insert("s", np.array([t], dtype=np.int64))
        pos = policy.resident_positions("s")
        att = np.exp(-(t - pos) / scale)
        att[pos == 0] += 5.0
        policy.observe("s", pos, att / att.sum())
        policy.evict(budget)


def test_profile_learns_how_attention_fades() -> None:
    policy = TokenPDPolicy(TokenPDConfig(age_prior=8.0, keep_rule=False, memory=16))
    _decay_run(policy, 80, 24, 4.0)
    prof = policy.age_profile("s")
    assert prof is not None
    assert prof.shape == (32,)
    seen = prof[~np.isnan(prof)]
    # The median by age falls with age (the heavy first token is one of many in its bin).
    assert np.all(np.diff(seen[:5]) < 0)
    assert policy.age_profile("other") is None
    assert TokenPDPolicy(TokenPDConfig(memory=16)).age_profile("s") is None


def test_profile_moves_value_towards_the_typical_token_of_its_age() -> None:
    """A token that was attended once long ago keeps its value without the profile; with it,
    its value falls towards what tokens of its age typically receive."""
    plain = TokenPDPolicy(TokenPDConfig(keep_rule=False, memory=64))
    aged = TokenPDPolicy(TokenPDConfig(age_prior=32.0, keep_rule=False, memory=64))
    for policy in (plain, aged):
        _decay_run(policy, 60, 1000, 3.0)
    pos = np.array([10, 58], dtype=np.int64)
    r_plain, _ = plain.estimates("s", pos)
    r_aged, _ = aged.estimates("s", pos)
    assert r_aged[0] < r_plain[0]
    # The old token loses against the young one by more with the profile.
    assert r_aged[0] / r_aged[1] < r_plain[0] / r_plain[1]


def test_keeps_the_heavy_first_token_and_the_recent_ones() -> None:
    policy = TokenPDPolicy(TokenPDConfig(age_prior=8.0, keep_rule=False, memory=16))
    _decay_run(policy, 100, 12, 4.0)
    kept = policy.resident_positions("s")
    assert 0 in kept
    assert set(range(89, 100)) <= set(kept.tolist())


def test_remove_forgets_the_profile() -> None:
    policy = TokenPDPolicy(TokenPDConfig(age_prior=1.0))
    _decay_run(policy, 10, 100, 2.0)
    assert policy.age_profile("s") is not None
    policy.remove("s")
    assert policy.age_profile("s") is None


def test_bad_observation_changes_nothing() -> None:
    policy = TokenPDPolicy(TokenPDConfig(age_prior=4.0))
    _decay_run(policy, 10, 100, 2.0)
    before = policy.age_profile("s")
    pos = policy.resident_positions("s")
    with pytest.raises(ValueError, match="attention"):
        policy.observe("s", pos, np.full(pos.size, math.nan))
    after = policy.age_profile("s")
    assert before is not None
    assert after is not None
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_age_prior_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="age_prior"):
        TokenPDConfig(age_prior=bad)


def test_pooled_max_by_position() -> None:
    values = np.array([0.0, 5.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    positions = np.array([6, 1, 2, 3, 4, 5, 0], dtype=np.int64)
    got = pooled_max(values, positions, 1)
    # by position: 0 5 0 0 0 1 0 -> 5 5 5 0 1 1 1, given back in input order
    assert got.tolist() == [1.0, 5.0, 5.0, 0.0, 1.0, 1.0, 5.0]
    np.testing.assert_array_equal(pooled_max(values, positions, 0), values)


def test_pool_keeps_the_neighbours_of_an_attended_token() -> None:
    """Token 10 is the only one attended; with pool=2 its neighbours 8-12 outlast the
    others, without pooling they go first (their value is 0 like the rest)."""
    for pool, expect in ((0, {10}), (2, {8, 9, 10, 11, 12})):
        policy = TokenPDPolicy(TokenPDConfig(keep_rule=False, memory=8, pool=pool))
        policy.insert("s", np.arange(30, dtype=np.int64))
        pos = policy.resident_positions("s")
        att = np.where(pos == 10, 1.0, 0.0)
        policy.observe("s", pos, att)
        policy.evict(len(expect))
        assert set(policy.resident_positions("s").tolist()) == expect
