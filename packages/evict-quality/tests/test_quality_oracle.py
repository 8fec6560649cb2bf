"""The future-knowing references (``quality.oracle``) on the tiny random Llama: the attention
oracle keeps exactly what the full-cache pass says the next queries use, and the realised
returns are seed 000's returns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpolicy.evict import TokenPDConfig, TokenPDPolicy
from kvpolicy.evict.quality import CausalLM, decode_batch, decode_perplexity
from kvpolicy.evict.quality._record import mean_attention
from kvpolicy.evict.quality.oracle import (
    CopySourceOracle,
    FutureAttentionOracle,
    RealisedReturns,
    _oracle_factories,
    future_attention,
    next_occurrence,
)

from .test_quality import make_peaked_lm

N = 40
BUDGET = 10


@pytest.fixture(scope="module")
def peaked_lm() -> CausalLM:
    return make_peaked_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(3))


def test_cumulative_attention(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    cum = future_attention(peaked_lm, ids)
    mass = mean_attention(peaked_lm, ids, per_layer=True)
    assert cum.shape == (peaked_lm.num_layers, N + 1, N)
    assert np.allclose(cum[:, 0], 0.0)
    assert np.allclose(cum[:, 5] - cum[:, 2], mass[:, 2:5].sum(axis=1), atol=1e-5)


def test_keeps_what_the_next_queries_use(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    cum = future_attention(peaked_lm, ids)
    oracle = FutureAttentionOracle(cum, window=4)
    oracle.insert("layer1", np.arange(20, dtype=np.int64))
    gone = oracle.evict(BUDGET)["layer1"]
    kept = np.setdiff1d(np.arange(20), gone)
    future = cum[1, 24] - cum[1, 20]  # queries 20..23, after the newest token 19
    assert len(kept) == BUDGET
    assert future[kept].min() >= future[gone].max()
    assert oracle.resident_tokens() == BUDGET
    with pytest.raises(ValueError, match="'stream' must be named 'layer<i>'"):
        oracle.insert("head0", np.arange(2, dtype=np.int64))
    with pytest.raises(ValueError, match="'window' must be an int >= 1: 0"):
        FutureAttentionOracle(cum, window=0)


@pytest.mark.heavy
def test_decodes_in_the_harness(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    """The oracle holds the budget and does no worse than keeping the oldest tokens."""
    cum = future_attention(peaked_lm, ids)
    makers, predictor = _oracle_factories("oracle:window=8", [cum], BUDGET)
    assert predictor is None
    [oracle] = decode_batch(peaked_lm, ids[None], makers, BUDGET)
    assert oracle.max_resident == BUDGET
    full = decode_perplexity(peaked_lm, ids, None, N)
    assert oracle.perplexity >= full.perplexity * 0.8  # eviction is not free (loose check)


@pytest.mark.heavy
def test_realised_returns_drive_token_pd(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    cum = future_attention(peaked_lm, ids)
    returns = RealisedReturns([cum, cum], horizon=5)
    mass = mean_attention(peaked_lm, ids, per_layer=True).mean(axis=0)
    want = mass[4:9, 3].sum() / 5  # token 3: queries 4..8
    feats = np.array([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 7.0, 0.0]])
    got, risk = returns.predict(feats)
    assert got[0] == pytest.approx(want, rel=1e-5)
    assert np.all(risk == 0)
    makers, predictor = _oracle_factories("token-pd:keep_rule=false:oracle-returns", [cum], 8)
    assert isinstance(predictor, RealisedReturns)
    [row] = decode_batch(peaked_lm, ids[None], makers, 8, predictor)
    assert row.max_resident == 8
    with pytest.raises(ValueError, match="'policy' must be 'oracle:window=W'"):
        _oracle_factories("h2o", [cum], 8)


@pytest.mark.heavy
@pytest.mark.parametrize("policy", ["h2o", "token-pd:keep_rule=false", "sink-window"])
def test_pooled_budget_spreads_over_layers(
    peaked_lm: CausalLM, ids: torch.Tensor, policy: str
) -> None:
    """One policy for every layer keeps BUDGET per layer on average, not in each layer."""
    from kvpolicy.evict.quality import policy_factory

    factory = policy_factory(policy)
    assert factory is not None
    layers = peaked_lm.num_layers
    pooled = decode_perplexity(
        peaked_lm, ids, lambda: factory(BUDGET * layers), BUDGET, pooled=True
    )
    per_layer = decode_perplexity(peaked_lm, ids, lambda: factory(BUDGET), BUDGET)
    # The same memory at every step, spread over the layers as the policy chooses.
    assert pooled.mean_resident == pytest.approx(per_layer.mean_resident)
    assert np.isfinite(pooled.perplexity)
    with pytest.raises(ValueError, match="'pooled' decodes one text"):
        decode_batch(peaked_lm, torch.stack([ids, ids]), lambda: factory(8), 8, pooled=True)


def test_pooled_label(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    makers, predictor = _oracle_factories("pooled:token-pd:keep_rule=false", [None], 6, 2)  # type: ignore[list-item]
    assert predictor is not None  # Token-PD gets the shipped compact predictor
    assert makers[0]().__class__.__name__ == "TokenPDPolicy"
    with pytest.raises(ValueError, match="not the full cache"):
        _oracle_factories("pooled:full", [None], 6, 2)  # type: ignore[list-item]


def test_next_occurrence() -> None:
    """The position of each id's next occurrence, n when there is none."""
    assert next_occurrence([3, 1, 3, 2, 1, 3]).tolist() == [2, 4, 5, 6, 6, 6]


def test_copy_oracle_favours_the_sources_of_copies_to_come() -> None:
    """The bonus goes to the latest occurrence of an id the text repeats within the
    horizon, not to one repeated later or never, nor to an older occurrence."""
    text = [5, 6, 7, 5, 8, 9, 9, 6, 7]  # at t=4: 5 and 8 are never repeated, 6 at 7, 7 at 8
    cfg = TokenPDConfig(keep_rule=False, prior_weight=0.0)
    oracle = CopySourceOracle(cfg, text, horizon=3, bonus=5.0)
    for t in range(5):
        oracle.insert("layer0", np.array([t]))
        oracle.tokens("layer0", np.array([t]), [text[t]])
        held = oracle.resident_positions("layer0")
        oracle.observe("layer0", held, np.full(len(held), 1.0 / len(held)))
    keys = oracle.excess_values("layer0", np.arange(5))
    # Position 1 (id 6, repeated at 7 = 4 + 3) has the bonus; 2 (id 7, at 8 > 4 + 3) not.
    assert keys[1] > max(keys[0], keys[2], keys[3], keys[4])
    # Near the end of the text an id never repeated gets no bonus, however long the horizon.
    late = CopySourceOracle(cfg, text, horizon=100, bonus=5.0)
    plain = TokenPDPolicy(cfg)
    for policy in (late, plain):
        for t in range(9):
            policy.insert("layer0", np.array([t]))
            held = policy.resident_positions("layer0")
            policy.observe("layer0", held, np.full(len(held), 1.0 / len(held)))
    assert late.excess_values("layer0", np.arange(9)).tolist() == pytest.approx(
        plain.excess_values("layer0", np.arange(9)).tolist()
    )
    with pytest.raises(ValueError, match="'horizon'"):
        CopySourceOracle(cfg, text, horizon=0)
    with pytest.raises(ValueError, match="'bonus'"):
        CopySourceOracle(cfg, text, horizon=3, bonus=0.0)


def test_copy_oracle_label_decodes(peaked_lm: CausalLM, ids: torch.Tensor) -> None:
    """``token-pd:...:copy-oracle=H`` builds one oracle per text from its ids and holds
    the budget in the harness."""
    label = "token-pd:keep_rule=false:copy_bonus=2:copy-oracle=16"
    makers, predictor = _oracle_factories(label, [], 8, encoded=[ids])
    assert predictor is not None
    policy = makers[0]()
    assert isinstance(policy, CopySourceOracle)
    [row] = decode_batch(peaked_lm, ids[None], makers, 8, predictor)
    assert row.max_resident == 8
    with pytest.raises(ValueError, match="needs the texts' token ids"):
        _oracle_factories(label, [], 8)
    with pytest.raises(ValueError, match="copy-oracle=H needs an int"):
        _oracle_factories("token-pd:copy-oracle=x", [], 8, encoded=[ids])
