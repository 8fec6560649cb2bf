"""The quality harness end to end on a tiny random Llama built in the test (no download)."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import kvpolicy.evict.quality as quality
from kvpolicy.evict import FIFOPolicy, H2OPolicy, SinkWindowPolicy, TokenPDPolicy
from kvpolicy.evict.predictors import ConstantReturnPredictor, default_compact, train_mlp
from kvpolicy.evict.quality import (
    POLICY_CHOICES,
    CausalLM,
    QualityResult,
    budget_tokens,
    decode_perplexity,
    evaluate,
    load_or_train_mlp,
    model_attention_statistics,
    policy_factory,
    record_returns,
    record_windows,
    train_compact,
    validate_budgets,
    window_attention,
)

N = 48


def make_tiny_lm(layers: int) -> CausalLM:
    """A Llama with random weights, GQA (4 query heads, 2 KV heads), eager attention."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    return CausalLM(model=model, name="tiny-llama")


def make_peaked_lm(layers: int) -> CausalLM:
    """:func:`make_tiny_lm` with its queries scaled up: the random model's attention is
    nearly uniform (attention-based policies would all keep the same tokens), this one's is
    peaked and differs between heads."""
    lm = make_tiny_lm(layers)
    with torch.no_grad():
        for layer in lm.model.model.layers:
            layer.self_attn.q_proj.weight *= 300
    return lm


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    """The 2-layer tiny Llama."""
    return make_tiny_lm(2)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    """N token ids."""
    return torch.randint(0, 97, (N,), generator=torch.Generator().manual_seed(1))


def one_pass_perplexity(lm: CausalLM, ids: torch.Tensor) -> float:
    """Perplexity from a single full-sequence forward pass (the reference)."""
    with torch.no_grad():
        logits = lm.model(input_ids=ids.view(1, -1)).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits.float(), ids[1:], reduction="mean")
    return math.exp(float(nll))


def isort_key(name: str) -> tuple[int, str]:
    """ruff's __all__ order (RUF022): CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


class TestExports:
    def test_all_is_sorted_and_complete(self) -> None:
        """quality.__all__ is sorted, unique and lists exactly the public names."""
        names = quality.__all__
        assert list(names) == sorted(names, key=isort_key)
        assert len(set(names)) == len(names)
        public = {n for n in dir(quality) if not n.startswith("_")} - {"annotations"}
        modules = {n for n in public if type(getattr(quality, n)).__name__ == "module"}
        assert public - modules == set(names) - {"__version__"}

    def test_version_is_a_string(self) -> None:
        """The distribution reports a PEP 440 version."""
        assert quality.__version__.count(".") == 2


class TestDecode:
    def test_full_cache_matches_one_forward_pass(
        self, tiny_lm: CausalLM, ids: torch.Tensor
    ) -> None:
        """Token-by-token decoding with the full cache reproduces the one-pass perplexity."""
        r = decode_perplexity(tiny_lm, ids, None, N)
        assert r.perplexity == pytest.approx(one_pass_perplexity(tiny_lm, ids), rel=1e-5)
        assert (r.tokens, r.max_resident) == (N, N - 1)

    @pytest.mark.heavy
    def test_a_budget_that_never_binds_changes_nothing(
        self, tiny_lm: CausalLM, ids: torch.Tensor
    ) -> None:
        """FIFO with a budget of every token gives the full-cache perplexity exactly."""
        full = decode_perplexity(tiny_lm, ids, None, N).perplexity
        fifo = decode_perplexity(tiny_lm, ids, FIFOPolicy, N).perplexity
        assert fifo == pytest.approx(full, rel=1e-6)

    def test_budget_is_never_exceeded(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """After every step each layer holds at most the budget."""
        r = decode_perplexity(tiny_lm, ids, lambda: SinkWindowPolicy(num_sink=2), 8)
        assert r.max_resident == 8
        assert r.mean_resident <= 8

    @pytest.mark.heavy
    def test_budget_of_one_is_a_bigram_window(self, ids: torch.Tensor) -> None:
        """Budget 1 with FIFO keeps only the newest token, so step t attends to tokens t-1 and
        t at their true positions: in a 1-layer model (keys depend on the token alone), a
        two-token forward with position_ids (t-1, t)."""
        tiny_lm = make_tiny_lm(1)
        r = decode_perplexity(tiny_lm, ids, FIFOPolicy, 1)
        nll = 0.0
        with torch.no_grad():
            for t in range(N - 1):
                lo = max(0, t - 1)
                out = tiny_lm.model(
                    input_ids=ids[lo : t + 1].view(1, -1),
                    position_ids=torch.arange(lo, t + 1).view(1, -1),
                )
                nll -= float(torch.log_softmax(out.logits[0, -1], -1)[ids[t + 1]])
        assert r.perplexity == pytest.approx(math.exp(nll / (N - 1)), rel=1e-5)
        assert r.max_resident == 1

    def test_eviction_costs_quality(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """A binding budget changes the perplexity."""
        full = decode_perplexity(tiny_lm, ids, None, N).perplexity
        small = decode_perplexity(tiny_lm, ids, FIFOPolicy, 4).perplexity
        assert small != pytest.approx(full, rel=1e-4)

    def test_token_pd_with_compact_predictor(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """Token-PD decodes with the shipped compact predictor's signals under the budget."""
        r = decode_perplexity(tiny_lm, ids, TokenPDPolicy, 12, default_compact())
        assert r.max_resident <= 12
        assert math.isfinite(r.perplexity)

    def test_token_pd_with_logits_mlp(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """Token-PD decodes with a logits MLP (the predictor reads the raw logits)."""
        mlp = train_mlp(torch.randn(16, 97), np.full(16, 0.05), epochs=1, hidden=8)
        assert quality.feature_kind(mlp) == "logits"
        r = decode_perplexity(tiny_lm, ids, TokenPDPolicy, 12, mlp)
        assert r.max_resident <= 12
        assert math.isfinite(r.perplexity)

    def test_rejects_a_zero_budget(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """A policy run needs a budget of at least one token."""
        with pytest.raises(ValueError, match="'budget_tokens' must be an int >= 1: 0"):
            decode_perplexity(tiny_lm, ids, FIFOPolicy, 0)

    def test_rejects_a_single_token(self, tiny_lm: CausalLM) -> None:
        """Perplexity needs at least one predicted token."""
        with pytest.raises(ValueError, match="at least 2 tokens: 1"):
            decode_perplexity(tiny_lm, torch.tensor([3]), None, 1)


class TestEvaluate:
    @pytest.mark.heavy
    def test_results_in_order(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """Full cache once at budget 1.0, then each policy at each budget, in order."""
        got = evaluate(
            tiny_lm,
            ids,
            {"full": None, "fifo": lambda b: FIFOPolicy(), "h2o": lambda b: H2OPolicy(b // 2)},
            [0.25, 0.5],
        )
        assert [(r.policy, r.budget, r.budget_tokens) for r in got] == [
            ("full", 1.0, 48),
            ("fifo", 0.25, 12),
            ("fifo", 0.5, 24),
            ("h2o", 0.25, 12),
            ("h2o", 0.5, 24),
        ]
        assert got[0].perplexity == pytest.approx(one_pass_perplexity(tiny_lm, ids), rel=1e-5)
        assert set(got[1].to_dict()) == {
            "policy",
            "budget",
            "budget_tokens",
            "perplexity",
            "mean_resident",
        }

    @pytest.mark.heavy
    def test_every_named_policy_runs(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """Each of POLICY_CHOICES builds and decodes with the constant predictor."""
        factories = {name: policy_factory(name) for name in POLICY_CHOICES}
        got = evaluate(tiny_lm, ids[:20], factories, [0.5], ConstantReturnPredictor(0.1))
        assert [r.policy for r in got] == list(POLICY_CHOICES)
        assert all(r.mean_resident <= r.budget_tokens for r in got)

    def test_unknown_policy_lists_the_known_ones(self) -> None:
        """An unknown name raises ValueError listing every known name."""
        with pytest.raises(
            ValueError, match="must be one of full, fifo, h2o, lru, sink-window, token-pd: 'lfu'"
        ):
            policy_factory("lfu")

    @pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, math.nan, math.inf])
    def test_budgets_outside_the_unit_interval(self, bad: float) -> None:
        """Budgets outside (0, 1] raise ValueError naming the value."""
        with pytest.raises(ValueError, match=f"'budget' must be in \\(0, 1\\]: {bad!r}"):
            validate_budgets([0.5, bad])

    def test_budget_tokens_of_the_issue(self) -> None:
        """0.25 of 512 tokens is 128 per layer; 0.5 is 256."""
        assert [budget_tokens(b, 512) for b in (0.25, 0.5, 1.0, 1e-9)] == [128, 256, 512, 1]

    def test_result_rejects_a_budget_above_one(self) -> None:
        """QualityResult validates its budget."""
        with pytest.raises(ValueError, match=r"'budget' must be <= 1\.0"):
            QualityResult("fifo", 1.5, 3, 2.0, 3.0)


class TestRecord:
    def test_returns_are_future_attention_mass(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """R_k is the mean over the next `horizon` queries, layers and heads of A[q, k]."""
        rec = record_returns(tiny_lm, ids, horizon=10)
        _, att = window_attention(tiny_lm, ids)
        mass = att.mean(dim=(0, 1)).double().numpy()
        expected = [mass[k + 1 : k + 11, k].mean() for k in range(N - 10)]
        assert rec.returns == pytest.approx(expected, rel=1e-9)
        assert rec.features[:, 2].tolist() == list(range(N - 10))
        assert rec.features[:, 3] == pytest.approx(np.diagonal(mass)[: N - 10])
        assert tuple(rec.logits.shape) == (N - 10, 97)

    def test_compact_fit_on_records(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """A compact predictor fitted on recorded windows predicts returns in [0, 1]."""
        rec = record_windows(tiny_lm, [ids[:24], ids[24:]], horizon=8)
        assert len(rec.returns) == 32
        pred, risk = train_compact(rec).predict(rec.features)
        assert ((pred >= 0) & (pred <= 1)).all()
        assert (risk >= 0).all()

    def test_max_tokens_truncates(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """record_windows stops at max_tokens."""
        rec = record_windows(tiny_lm, [ids[:24], ids[24:]], horizon=8, max_tokens=20)
        assert len(rec.returns) == 20
        assert tuple(rec.logits.shape) == (20, 97)

    def test_rejects_a_horizon_longer_than_the_window(
        self, tiny_lm: CausalLM, ids: torch.Tensor
    ) -> None:
        """A window must be longer than the horizon."""
        with pytest.raises(ValueError, match="longer than 'horizon' = 64: 48"):
            record_returns(tiny_lm, ids, horizon=64)

    def test_mlp_is_trained_once_then_loaded(
        self, tiny_lm: CausalLM, ids: torch.Tensor, tmp_path: pathlib.Path
    ) -> None:
        """load_or_train_mlp trains and caches on first call and loads the cache after."""
        calls: list[int] = []

        def record() -> quality.ReturnRecord:
            calls.append(1)
            return record_returns(tiny_lm, ids, horizon=8)

        path = tmp_path / "mlp.pt"
        first = load_or_train_mlp(tiny_lm, record, path=path, epochs=1)
        second = load_or_train_mlp(tiny_lm, record, path=path, epochs=1)
        assert calls == [1]
        assert path.exists()
        x = np.random.default_rng(0).normal(size=(2, 97))
        assert second.predict(x)[0].tolist() == first.predict(x)[0].tolist()


class TestAttentionStatistics:
    def test_shares_are_consistent(self, tiny_lm: CausalLM, ids: torch.Tensor) -> None:
        """Shares lie in [0, 1] and the top-p% masses grow with p."""
        s = model_attention_statistics(tiny_lm, ids, warmup=16)
        assert (s["layers"], s["heads"], s["tokens"]) == (2.0, 4.0, 48.0)
        for key in ("sink_mass_first_token", "sink_mass_first_4", "recent_mass_last_16"):
            assert 0 <= s[key] <= 1
        assert s["sink_mass_first_token"] <= s["sink_mass_first_4"]
        for kind in ("per_query", "accumulated"):
            tops = [s[f"{kind}_top_{p}pct_mass"] for p in (1, 5, 10)]
            assert tops == sorted(tops)
            assert tops[-1] <= 1.0
        assert math.isfinite(s["decay_exponent"])


class TestModel:
    def test_encode_needs_a_tokenizer(self, tiny_lm: CausalLM) -> None:
        """A model without tokenizer refuses text."""
        with pytest.raises(ValueError, match="has no tokenizer"):
            tiny_lm.encode("hello", 3)

    def test_cache_dir_follows_the_environment(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
    ) -> None:
        """KVPOLICY_CACHE_DIR overrides ~/.cache/kvpolicy."""
        monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path))
        assert quality.cache_dir() == tmp_path
        monkeypatch.delenv("KVPOLICY_CACHE_DIR")
        assert quality.cache_dir() == pathlib.Path.home() / ".cache" / "kvpolicy"

    def test_default_text_is_long_english(self) -> None:
        """The default evaluation text (pydoc topics) has far more than 512 tokens' worth."""
        assert len(quality.default_text()) > 100_000
