"""``kvpolicy admit``: analyze and simulate, their JSON, plots and errors."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
from click.testing import CliRunner

from kvpolicy.commands._main import main


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["admit", *args])
    return result.exit_code, result.output


_TABLE_8 = ("--input-len", "20", "--decode-len", "20", "--memory", "1000", "--steps", "2000")
_EXAMPLE_4 = ["--input-len", "50,50", "--decode-len", "2,3", "--mix", "0.5,0.5", "--memory", "518"]


class TestAnalyze:
    """kvpolicy admit analyze."""

    def test_example_4_json(self) -> None:
        """Example 4: x* = 4, gcd 1, stable, radius sqrt(26.5/51), l0,min = 2."""
        code, out = _invoke("analyze", *_EXAMPLE_4, "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["x_star"] == pytest.approx(4.0)
        assert doc["gcd"] == 1
        assert doc["stable"] is True
        assert doc["spectral_radius"] == pytest.approx(math.sqrt(26.5 / 51))
        assert doc["worst_cycle_throughput"] == pytest.approx(518 / (0.5 * 2 * 52 + 0.5 * 3 * 53))
        assert doc["min_input_len"] == 2

    def test_example_5_unstable(self) -> None:
        """Example 5: gcd 2, unstable, no l0,min."""
        code, out = _invoke(
            "analyze", "--input-len", "50,50", "--decode-len", "2,4", "--memory", "626", "--json"
        )
        assert code == 0, out
        doc = json.loads(out)
        assert (doc["gcd"], doc["stable"], doc["min_input_len"]) == (2, False, None)

    def test_table(self) -> None:
        """Without --json a table names every figure."""
        code, out = _invoke("analyze", *_EXAMPLE_4)
        assert code == 0, out
        assert "spectral radius of F" in out
        assert "shortest stable prompt (exact)" in out

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--input-len", "50", "--decode-len", "2,3", "--memory", "518"], "decode_lens"),
            (["--input-len", "5", "--decode-len", "3", "--memory", "8"], "memory"),
            (
                ["--input-len", "5,5", "--decode-len", "2,3", "--mix", "0.5,0.6", "--memory", "99"],
                "mix",
            ),
            (["--input-len", "5,x", "--decode-len", "2,3", "--memory", "99"], "--input-len"),
            (["--input-len", "0", "--decode-len", "3", "--memory", "99"], "input_lens"),
        ],
    )
    def test_bad_input(self, args: list[str], message: str) -> None:
        """Bad workloads exit with a usage error naming the argument."""
        code, out = _invoke("analyze", *args)
        assert code == 2
        assert message in out


class TestSimulate:
    """kvpolicy admit simulate."""

    def test_rate_limited_json(self) -> None:
        """Rate-limited integer admission: zero evictions near x*."""
        code, out = _invoke("simulate", *_TABLE_8, "--policy", "rate-limited", "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["evictions"] == 0
        assert doc["throughput"] > 1.5
        assert doc["x_star"] == pytest.approx(1000 / 610)

    def test_greedy_fluid_json(self) -> None:
        """Greedy fluid admission settles on the worst cycle with evictions."""
        code, out = _invoke("simulate", *_TABLE_8, "--mode", "fluid", "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["steady_throughput"] == pytest.approx(1.25)
        assert doc["evictions"] > 0

    def test_poisson_queue_growth_and_plot(self, tmp_path: pathlib.Path) -> None:
        """Figure 4 load 1.4 backlogs; --plot writes a PNG."""
        pytest.importorskip("matplotlib", reason="--plot needs kvpolicy-admit[plot]")
        png = tmp_path / "memory.png"
        code, out = _invoke(
            "simulate",
            "--input-len",
            "10",
            "--decode-len",
            "40",
            "--memory",
            "2000",
            "--steps",
            "3000",
            "--arrivals",
            "poisson:1.4",
            "--plot",
            str(png),
            "--json",
        )
        assert code == 0, out
        doc = json.loads(out)
        assert doc["queue_growth"] > 0.25
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_table(self) -> None:
        """Without --json a table is printed."""
        code, out = _invoke("simulate", *_TABLE_8, "--steps", "200")
        assert code == 0, out
        assert "throughput (completions/iteration)" in out

    def test_bad_arrivals(self) -> None:
        """An unknown arrival spec is a usage error."""
        code, out = _invoke("simulate", *_TABLE_8, "--arrivals", "bursty")
        assert code == 2
        assert "--arrivals" in out
