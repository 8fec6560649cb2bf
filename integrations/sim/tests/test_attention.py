"""The synthetic attention-return model and its fit."""

from __future__ import annotations

import numpy as np
import pytest

from kvpolicy.sim import AttentionModel, fit_attention


class TestAttentionModel:
    def test_rows_sum_to_one(self) -> None:
        """Every row of the full matrix is a distribution over keys 0..t."""
        m = AttentionModel()
        a = m.matrix(m.token_scores(np.random.default_rng(0), 64))
        np.testing.assert_allclose(a.sum(axis=1), 1.0, rtol=1e-12)
        assert np.all(np.triu(a, 1) == 0)

    def test_normaliser_equals_the_sum(self) -> None:
        """Z_t in closed form equals the sum of every weight."""
        m = AttentionModel()
        z = m.token_scores(np.random.default_rng(1), 300)
        pos = np.arange(300, dtype=np.int64)
        assert m.normaliser(300, float(z.sum())) == pytest.approx(
            float(m.weights(pos, 300, z).sum()), rel=1e-12
        )

    def test_defaults_reproduce_the_recorded_shares(self) -> None:
        """At 288 tokens of context, the sink draws 30% and the 16 newest keys 31% (the
        SmolLM2-135M statistics in kvpolicy-evict's quality/ATTENTION.md)."""
        m = AttentionModel()
        pos = np.arange(288, dtype=np.int64)
        a = m.weights(pos, 288, np.ones(288))
        a = a / a.sum()
        assert a[0] == pytest.approx(0.301, abs=0.01)
        assert a[-16:].sum() == pytest.approx(0.311, abs=0.01)
        assert a[-129] == pytest.approx(0.00118, rel=0.1)

    def test_scores_have_unit_mean(self) -> None:
        """Heavy-hitter scores average 1."""
        z = AttentionModel().token_scores(np.random.default_rng(2), 200_000)
        assert z.mean() == pytest.approx(1.0, rel=0.03)


class TestFit:
    @pytest.mark.parametrize(
        "truth",
        [
            AttentionModel(sink_weight=100, recency_weight=18.8, recency_tau=32, heavy_weight=1),
            AttentionModel(
                sink_weight=20, recency_weight=5, recency_tau=16, heavy_weight=1, heavy_sigma=1.0
            ),
        ],
    )
    def test_recovers_parameters(self, truth: AttentionModel) -> None:
        """A matrix drawn from the model gives back its parameters within 25%."""
        a = truth.matrix(truth.token_scores(np.random.default_rng(0), 1200))
        fit = fit_attention(a)
        assert fit.recency_tau == pytest.approx(truth.recency_tau, rel=0.25)
        assert fit.sink_weight == pytest.approx(truth.sink_weight, rel=0.25)
        assert fit.recency_weight == pytest.approx(truth.recency_weight, rel=0.25)
        assert fit.heavy_sigma == pytest.approx(truth.heavy_sigma, rel=0.25)

    def test_not_stochastic(self) -> None:
        """Rows that do not sum to one are refused."""
        with pytest.raises(ValueError, match="sum to 1"):
            fit_attention(np.ones((600, 600)))
