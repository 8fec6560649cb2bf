"""The evaluation harness around the decode loop: bootstrap intervals, policy labels, the
key-value lookup, result rows and resuming, on the tiny random Llama (no download)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
import torch

from kvpolicy.evict import TokenPDPolicy
from kvpolicy.evict.quality import CausalLM, decode_perplexity, parse_policy, policy_factory
from kvpolicy.evict.quality._bootstrap import bootstrap_perplexity, bootstrap_ratio
from kvpolicy.evict.quality._lookup import build_lookup, lookup_accuracy
from kvpolicy.evict.quality._runs import (
    append_row,
    compare_to_full,
    decode_row,
    missing,
    read_rows,
    row_key,
)

from .test_quality import make_tiny_lm


@pytest.fixture(scope="module")
def tiny_lm() -> CausalLM:
    return make_tiny_lm(2)


class CharTokenizer:
    """One token per character (ids are code points mod 97, as the tiny Llama's vocab)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> object:
        return type("Encoding", (), {"input_ids": [ord(c) % 97 for c in text]})()


class TestBootstrap:
    def test_point_estimate_is_the_perplexity(self) -> None:
        nll = np.random.default_rng(0).gamma(2.0, 1.0, 512)
        iv = bootstrap_perplexity(nll)
        assert iv.value == pytest.approx(math.exp(nll.mean()))
        assert iv.low < iv.value < iv.high

    def test_paired_ratio_is_tighter_than_either_interval(self) -> None:
        """Two decodings that differ by a constant 1% per position: the paired interval of
        their ratio is exact while each perplexity's own interval is wide."""
        nll = np.random.default_rng(1).gamma(2.0, 1.0, 1024)
        worse = nll + math.log(1.01)
        iv = bootstrap_ratio(worse, nll)
        assert iv.value == pytest.approx(1.01)
        assert iv.low == pytest.approx(1.01)
        assert iv.high == pytest.approx(1.01)
        own = bootstrap_perplexity(nll)
        assert own.high / own.low > 1.05

    def test_ratio_interval_excludes_one_for_a_real_difference(self) -> None:
        rng = np.random.default_rng(2)
        nll = rng.gamma(2.0, 1.0, 2048)
        worse = nll + rng.normal(0.02, 0.1, 2048)  # 2% worse on average, noisy
        iv = bootstrap_ratio(worse, nll)
        assert 1.0 < iv.low < iv.value < iv.high

    def test_mismatched_lengths(self) -> None:
        with pytest.raises(ValueError, match="'nll' has 3 positions, 'reference' has 4"):
            bootstrap_ratio(np.ones(3), np.ones(4))

    def test_non_finite(self) -> None:
        with pytest.raises(ValueError, match="'nll' must be finite"):
            bootstrap_perplexity(np.array([1.0, math.inf]))


class TestPolicyLabels:
    def test_parameters_and_budget_fractions(self) -> None:
        name, params = parse_policy("token-pd:num_sink=4:recent_window=0.25b:keep_rule=false")
        assert name == "token-pd"
        assert params["num_sink"] == 4
        assert params["keep_rule"] is False
        policy = policy_factory("token-pd:num_sink=4:recent_window=0.25b")(128)  # type: ignore[misc]
        assert isinstance(policy, TokenPDPolicy)
        assert (policy.config.num_sink, policy.config.recent_window) == (4, 32)

    def test_h2o_keeps_half_the_budget_recent_unless_told(self) -> None:
        h2o = policy_factory("h2o")
        assert h2o is not None
        assert h2o(64).table.recent_window == 32  # type: ignore[attr-defined]

    @pytest.mark.parametrize(
        ("label", "match"),
        [
            ("token-pd:num_sink", "must be KEY=VALUE: 'num_sink'"),
            ("token-pd:num_sink=x", "must be a number, a bool, token or channel: 'num_sink=x'"),
            ("full:num_sink=1", "full takes only precision, group_size, key_axis and window"),
            ("lfu", "must be one of"),
        ],
    )
    def test_bad_labels(self, label: str, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            parse_policy(label)

    def test_unknown_parameter_names_the_accepted_ones(self) -> None:
        with pytest.raises(ValueError, match="unknown param 'sinks'"):
            policy_factory("token-pd:sinks=4")(16)  # type: ignore[misc]


class TestLookup:
    def test_scored_positions_predict_the_planted_digits(self) -> None:
        tok = CharTokenizer()
        task = build_lookup(tok, "lorem ipsum " * 100, 600, records=3, digits=4, seed=3)
        ids = task.input_ids.tolist()
        assert len(ids) == 600
        assert task.records == 3
        assert len(task.scored) == 12
        digits = {ord(d) % 97 for d in "0123456789"}
        assert all(ids[t + 1] in digits for t in task.scored)
        # The answers sit at the end, after the filler.
        assert task.scored.min() > 600 - 3 * 40

    def test_accuracy_reads_the_scored_positions(self) -> None:
        task = build_lookup(CharTokenizer(), "x" * 1000, 400, records=2, digits=3)
        correct = np.zeros(399, dtype=bool)
        correct[task.scored[:3]] = True
        assert lookup_accuracy(correct, task) == pytest.approx(0.5)
        with pytest.raises(ValueError, match=r"shape \(399,\)"):
            lookup_accuracy(np.zeros(10, dtype=bool), task)

    def test_too_short(self) -> None:
        with pytest.raises(ValueError, match="'tokens' = 60 leaves"):
            build_lookup(CharTokenizer(), "x" * 1000, 60, records=2)
        with pytest.raises(ValueError, match="'records' must be an int"):
            build_lookup(CharTokenizer(), "x" * 1000, 600, records=0)


class TestRows:
    @pytest.mark.heavy
    def test_decode_rows_resume_and_compare(
        self, tiny_lm: CausalLM, tmp_path: pathlib.Path
    ) -> None:
        ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(4))
        out = tmp_path / "rows.jsonl"
        common = {"task": "ppl", "text": "t", "predictor": None, "predictor_name": "none"}
        for policy, budget in [("full", 1.0), ("sink-window:num_sink=2", 0.25)]:
            append_row(out, decode_row(tiny_lm, ids, policy=policy, budget=budget, **common))
        with out.open("a") as fh:
            fh.write('{"task": "ppl", "te')  # a run killed while writing its row
        rows = read_rows(out)
        assert [r["policy"] for r in rows] == ["full", "sink-window:num_sink=2"]
        assert len(rows[0]["nll"]) == 39
        assert rows[0]["perplexity"] == pytest.approx(
            decode_perplexity(tiny_lm, ids, None, 40).perplexity, rel=1e-4
        )
        wanted = [
            {**{k: r[k] for k in ("task", "text", "tokens", "policy", "budget", "predictor")}}
            for r in rows
        ]
        wanted.append({**wanted[1], "budget": 0.5})
        assert [row_key(w) for w in missing(rows, wanted)] == [row_key(wanted[2])]
        table = compare_to_full(rows)
        assert table[0]["ratio"] == pytest.approx(1.0)
        assert table[1]["ratio"] == pytest.approx(rows[1]["perplexity"] / rows[0]["perplexity"])
        assert table[1]["ratio_low"] <= table[1]["ratio"] <= table[1]["ratio_high"]
        assert "nll" not in table[1]
        json.dumps(table)

    def test_decode_result_keeps_losses_and_argmax_hits(self, tiny_lm: CausalLM) -> None:
        ids = torch.randint(0, 97, (30,), generator=torch.Generator().manual_seed(5))
        r = decode_perplexity(tiny_lm, ids, None, 30)
        assert r.nll.shape == (29,)
        assert r.correct.shape == (29,)
        assert r.perplexity == pytest.approx(math.exp(r.nll.mean()))
        with torch.no_grad():
            logits = tiny_lm.model(input_ids=ids.view(1, -1)).logits[0, :-1]
        assert np.array_equal(r.correct, (logits.argmax(-1) == ids[1:]).numpy())
        assert r.seconds > 0
        assert r.ms_per_step > 0


class TestRankCorrelation:
    def test_monotone_and_reversed(self) -> None:
        from kvpolicy.evict.quality import rank_correlation

        x = np.array([0.1, 0.5, 0.2, 0.9, 0.3])
        assert rank_correlation(x, x**3) == pytest.approx(1.0)
        assert rank_correlation(x, -x) == pytest.approx(-1.0)

    def test_ties_get_mean_ranks(self) -> None:
        from kvpolicy.evict.quality import rank_correlation

        # Spearman's rho with tied ranks is Pearson's r of the mean ranks.
        x = np.array([1.0, 1.0, 2.0, 3.0])
        y = np.array([1.0, 2.0, 3.0, 4.0])
        rx = np.array([0.5, 0.5, 2.0, 3.0])
        assert rank_correlation(x, y) == pytest.approx(np.corrcoef(rx, np.arange(4.0))[0, 1])

    def test_constant_is_undefined(self) -> None:
        from kvpolicy.evict.quality import rank_correlation

        with pytest.raises(ValueError, match="constant"):
            rank_correlation(np.ones(5), np.arange(5.0))
        with pytest.raises(ValueError, match="n >= 3"):
            rank_correlation(np.ones(2), np.ones(2))
