"""``kvpolicy sim sweep`` and ``run``: tables on stdout, warnings and notes on stderr."""

from __future__ import annotations

import json
import pathlib

from click.testing import CliRunner, Result

from kvpolicy.sim.cli import main

_ARGS = ["--workload", "multi-tenant", "--num-requests", "30", "--model", "Llama-3-8B"]
_SWEEP = ["sim", "sweep", *_ARGS, "--gpu", "H100-SXM", "--workers", "1"]


def _invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result


class TestSweepCommand:
    def test_an_unused_section_is_warned(self) -> None:
        """Sweeping a parameter of the stack's `none` eviction warns on stderr, naming it;
        the tables go to stdout."""
        result = _invoke(*_SWEEP, "--param", "eviction.budget_fraction=0.3,0.6")
        assert result.stderr.splitlines()[-1] == (
            "warning: sweep parameter 'eviction.budget_fraction' changed nothing: every "
            "figure is the same at 0.3, 0.6; the stack's eviction section is 'none', so "
            "eviction.* is unused: name one (eviction.name) in the stack or in the grid"
        )
        assert "where every request ended" in " ".join(result.stdout.split())
        assert "warning" not in result.stdout

    def test_json_carries_the_warnings(self) -> None:
        """--json holds every point's warnings and the grid's unchanged parameters."""
        result = _invoke(*_SWEEP, "--param", "eviction.budget_fraction=0.3,0.6", "--json")
        doc = json.loads(result.stdout)
        assert [p["warnings"] for p in doc["points"]] == [[], []]
        assert doc["warnings"][0].startswith("sweep parameter 'eviction.budget_fraction'")
        assert doc["notes"] == []

    def test_a_parameter_that_matters_is_quiet(self) -> None:
        """A batch limit that changes the run gives no warning."""
        result = _invoke(*_SWEEP, "--param", "engine.max_batch=1,64")
        assert result.stderr == ""


class TestRunWarnings:
    def test_requests_over_the_context(self, tmp_path: pathlib.Path) -> None:
        """A trace whose rows exceed the model's context warns on stderr with a model to
        use, under the table and the paragraph of what happened."""
        p = tmp_path / "t.csv"
        rows = [
            f"2023-11-16 18:15:{10 + i:02d}.0000000,{9000 if i % 2 else 300},20" for i in range(10)
        ]
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
        result = _invoke("sim", "run", "--trace", str(p), "--model", "Llama-3-8B", "--gpu", "L40S")
        assert result.stderr.splitlines()[-1] == (
            "warning: vllm: 5 of 10 requests (50.0%) exceed Llama-3-8B's 8,192-token "
            "context and were rejected; the longest needs 9,020 tokens: use a "
            "longer-context model (--model Qwen3-8B or Mistral-7B, 32,768 tokens, holds 5 "
            "of them)"
        )
        row = next(ln for ln in result.stdout.splitlines() if "rejected: over context" in ln)
        assert row.split("│")[2].strip() == "5"
        flat = " ".join(result.stdout.split())
        assert "What happened: vllm: goodput" in flat
        assert "5 were rejected (5 longer than the context)" in flat
