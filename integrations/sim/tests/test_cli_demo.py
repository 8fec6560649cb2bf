"""``kvpolicy demo``: the two stacks, the table and the report."""

from __future__ import annotations

import pathlib

from click.testing import CliRunner

from kvpolicy.sim.cli import main


class TestDemo:
    def test_small_demo(self, tmp_path: pathlib.Path) -> None:
        """A small demo prints both stacks and writes the HTML report."""
        result = CliRunner().invoke(
            main, ["demo", "--num-requests", "40", "--report", str(tmp_path / "demo")]
        )
        assert result.exit_code == 0, result.output
        assert "vllm" in result.output
        assert "kvpolicy" in result.output
        assert (tmp_path / "demo" / "report.html").is_file()

    def test_unknown_gpu(self, tmp_path: pathlib.Path) -> None:
        """An unknown GPU lists the known ones."""
        result = CliRunner().invoke(main, ["demo", "--gpu", "TPU", "--report", str(tmp_path)])
        assert result.exit_code == 2
        assert "unknown gpu 'TPU'; known:" in result.output
