"""``kvpolicy demo``: the two stacks, the table and the report."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main


class TestDemo:
    @pytest.mark.heavy
    def test_small_demo(self, tmp_path: pathlib.Path) -> None:
        """A small demo prints both stacks and writes the HTML report."""
        result = CliRunner().invoke(
            main, ["demo", "--num-requests", "40", "--report", str(tmp_path / "demo")]
        )
        assert result.exit_code == 0, result.output
        assert "vllm" in result.output
        assert "kvpolicy" in result.output
        assert (tmp_path / "demo" / "report.html").is_file()

    def test_output_tells_the_whole_story(self, tmp_path: pathlib.Path) -> None:
        """Every arrived request is accounted for; the paragraph under the table and the
        warnings on stderr are those of results.json; each stack's parts are described."""
        result = CliRunner().invoke(
            main, ["demo", "--num-requests", "60", "--report", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
        doc = json.loads((tmp_path / "results.json").read_text())
        assert [r["stack"] for r in doc["runs"]] == ["vllm", "kvpolicy"]
        for run in doc["runs"]:
            s = run["summary"]
            assert s["completed"] + s["rejected"] + s["gave_up"] + s["unfinished"] == 60
            assert s["rejected"] == s["rejected_context"] + s["rejected_memory"]
            assert set(run["stack_parts"]) == {
                "gateway",
                "admission",
                "eviction",
                "preemption",
                "tiers",
                "engine",
                "SLO",
            }
            for warning in run["warnings"]:
                assert f"warning: {run['stack']}: {warning}" in result.stderr
        assert doc["runs"][0]["stack_parts"]["gateway"] == "none: every request enters"
        flat = " ".join(result.stdout.split())
        assert "goodput (req/s in SLO)" in flat
        assert f"What happened: {' '.join(doc['what_happened'].split())}" in flat
        assert "…" not in result.stdout

    def test_unknown_gpu(self, tmp_path: pathlib.Path) -> None:
        """An unknown GPU names the flag and lists the known ones."""
        result = CliRunner().invoke(main, ["demo", "--gpu", "TPU", "--report", str(tmp_path)])
        assert result.exit_code == 2
        assert "Invalid value for '--gpu': 'TPU' is not one of 'A100-40GB'" in result.output
