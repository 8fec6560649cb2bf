"""``kvpolicy sim``: run, compare, sweep and their errors."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main

_ARGS = ["--workload", "multi-tenant", "--num-requests", "60", "--model", "Llama-3-8B"]


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


class TestRun:
    def test_json(self) -> None:
        """--json prints one document with the run's figures."""
        code, out = _invoke("sim", "run", *_ARGS, "--gpu", "H100-SXM", "--json")
        assert code == 0, out
        doc = json.loads(out)
        (run,) = doc["runs"]
        assert run["stack"] == "vllm"
        assert run["summary"]["requests"] == 60
        assert run["summary"]["completed"] + run["summary"]["rejected"] == 60

    @pytest.mark.heavy
    def test_table_and_report(self, tmp_path: pathlib.Path) -> None:
        """The table is printed and the report directory holds HTML, JSON and PNGs."""
        code, out = _invoke("sim", "run", *_ARGS, "--gpu", "H100-SXM", "--report", str(tmp_path))
        assert code == 0, out
        assert "throughput (req/s)" in out
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == [
            "latency_cdf.png",
            "memory.png",
            "report.html",
            "results.json",
            "tenants.png",
        ]
        assert "data:image/png;base64," in (tmp_path / "report.html").read_text()

    def test_unknown_gpu_lists_known(self) -> None:
        """An unknown GPU is a usage error listing the known ones."""
        code, out = _invoke("sim", "run", *_ARGS, "--gpu", "B300")
        assert code == 2
        assert "Invalid value for '--gpu': 'B300' is not one of 'A100-40GB'" in out

    def test_unknown_stack_key(self, tmp_path: pathlib.Path) -> None:
        """A stack file with an unknown key names the key before anything runs."""
        p = tmp_path / "s.yaml"
        p.write_text("engine:\n  max_batchsize: 3\n")
        code, out = _invoke("sim", "run", *_ARGS, "--gpu", "H100-SXM", "--stack", str(p))
        assert code == 2
        assert "unknown key engine.max_batchsize" in out

    def test_nothing_fits(self, tmp_path: pathlib.Path) -> None:
        """A pool smaller than any request is refused with the sizes."""
        p = tmp_path / "tiny.yaml"
        p.write_text("engine:\n  kv_capacity_tokens: 16\n")
        code, out = _invoke("sim", "run", *_ARGS, "--gpu", "H100-SXM", "--stack", str(p))
        assert code == 2
        assert "no request fits" in out

    def test_workload_and_trace_exclusive(self) -> None:
        """Neither --workload nor --trace is a usage error."""
        code, out = _invoke("sim", "run", "--model", "Llama-3-8B", "--gpu", "H100-SXM")
        assert code == 2
        assert "exactly one of --workload NAME or --trace PATH" in out

    def test_malformed_trace(self, tmp_path: pathlib.Path) -> None:
        """A malformed Azure row is an error naming the file; --skip-bad counts it."""
        p = tmp_path / "t.csv"
        p.write_text(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46.6805900,374,44\n"
            "2023-11-16 18:15:47.0000000,abc,44\n"
            "2023-11-16 18:15:48.0000000,100,10\n"
        )
        base = ["sim", "run", "--trace", str(p), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]
        code, out = _invoke(*base, "--json")
        assert code == 2
        assert "t.csv" in out
        code, out = _invoke(*base, "--json", "--skip-bad")
        assert code == 0, out
        assert "skipped 1 malformed rows" in out


class TestCompare:
    def test_two_stacks_side_by_side(self, tmp_path: pathlib.Path) -> None:
        """Two stacks give two runs on the same workload."""
        p = tmp_path / "small.yaml"
        p.write_text("engine:\n  max_batch: 4\n")
        code, out = _invoke(
            "sim",
            "compare",
            *_ARGS,
            "--gpu",
            "H100-SXM",
            "--stack",
            "vllm",
            "--stack",
            str(p),
            "--json",
        )
        assert code == 0, out
        runs = json.loads(out)["runs"]
        assert [r["stack"] for r in runs] == ["vllm", "small"]

    def test_a_stack_that_cannot_fit_stops_everything(self, tmp_path: pathlib.Path) -> None:
        """The second stack's tiny pool is refused before the first one runs."""
        p = tmp_path / "tiny.yaml"
        p.write_text("engine:\n  kv_capacity_tokens: 16\n")
        code, out = _invoke(
            "sim", "compare", *_ARGS, "--gpu", "H100-SXM", "--stack", "vllm", "--stack", str(p)
        )
        assert code == 2
        assert "no request fits" in out
        assert "throughput" not in out


class TestSweep:
    def test_grid_on_one_process(self) -> None:
        """A two-point grid gives two points in grid order."""
        code, out = _invoke(
            "sim",
            "sweep",
            *_ARGS,
            "--gpu",
            "H100-SXM",
            "--param",
            "engine.max_batch=2,64",
            "--workers",
            "1",
            "--json",
        )
        assert code == 0, out
        points = json.loads(out)["points"]
        assert [p["params"] for p in points] == [
            {"engine.max_batch": 2},
            {"engine.max_batch": 64},
        ]
        assert points[0]["summary"]["e2e"]["p95"] > points[1]["summary"]["e2e"]["p95"]

    def test_unknown_parameter(self) -> None:
        """An unknown grid field is named."""
        code, out = _invoke(
            "sim",
            "sweep",
            *_ARGS,
            "--gpu",
            "H100-SXM",
            "--param",
            "engine.nope=1",
            "--workers",
            "1",
        )
        assert code == 2
        assert "unknown sweep parameter 'engine.nope'" in out


@pytest.mark.ray
@pytest.mark.slow
class TestRay:
    def test_sweep_on_local_ray(self) -> None:
        """The same grid on a one-CPU local Ray cluster gives the local results."""
        ray = pytest.importorskip("ray", reason="ray is not installed (extra 'ray')")
        from kvpolicy.kvmodel import Request
        from kvpolicy.sim import StackConfig, sweep

        reqs = [Request(f"r{i}", 64, 16, 0.05 * i) for i in range(20)]
        grid = {"engine.max_batch": [1, 8]}
        local = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, workers=1)
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            remote = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, executor="ray")
        finally:
            ray.shutdown()
        assert [p.summary for p in remote] == [p.summary for p in local]


class TestFitTiming:
    def _rows(self, tmp_path: pathlib.Path) -> pathlib.Path:
        from kvpolicy.kvmodel import get_gpu, get_model
        from kvpolicy.sim import TimingModel

        truth = TimingModel(
            get_model("Llama-3-8B"),
            get_gpu("H100-SXM"),
            bandwidth_efficiency=0.6,
            flops_efficiency=0.4,
            overhead_s=1e-3,
        )
        lines = ["batch,tokens,seconds,kv_tokens"]
        for b, t, kv in [
            (1, 1, 0),
            (16, 16, 16000),
            (64, 64, 90000),
            (1, 2048, 2048),
            (1, 8192, 8192),
        ]:
            lines.append(f"{b},{t},{truth.iteration_time(t, kv, kv)!r},{kv}")
        f = tmp_path / "m.csv"
        f.write_text("\n".join(lines) + "\n")
        return f

    def test_writes_a_stack_that_runs(self, tmp_path: pathlib.Path) -> None:
        """The fitted constants come back and the written file is a usable stack."""
        from kvpolicy.sim import load_stack

        out = tmp_path / "fitted.yaml"
        code, text = _invoke(
            "sim", "fit-timing", "--csv", str(self._rows(tmp_path)), "--out", str(out), "--json"
        )
        assert code == 0, text
        doc = json.loads(text.splitlines()[0])
        assert doc["timing"]["bandwidth_efficiency"] == pytest.approx(0.6, rel=0.05)
        assert doc["fit"]["median_rel_error"] < 0.01
        stack = load_stack(out)
        assert stack.timing.bandwidth_efficiency == pytest.approx(0.6, rel=0.05)

    def test_bad_csv_is_a_usage_error(self, tmp_path: pathlib.Path) -> None:
        """A malformed row fails with the file and line, and nothing is written."""
        f = tmp_path / "m.csv"
        f.write_text("batch,tokens,seconds\n1,1,0.1\n1,2,oops\n")
        out = tmp_path / "fitted.yaml"
        code, text = _invoke("sim", "fit-timing", "--csv", str(f), "--out", str(out))
        assert code == 2
        assert "m.csv:3" in text
        assert not out.exists()


class TestWorkloadSpec:
    """One validated WorkloadSpec for run, compare and sweep: options that don't apply to
    the chosen source are refused, naming the flag."""

    _AZURE = "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0000000,100,10\n"

    def _azure(self, tmp_path: pathlib.Path) -> str:
        p = tmp_path / "t.csv"
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + self._AZURE)
        return str(p)

    @pytest.mark.parametrize("command", ["run", "compare"])
    def test_trace_option_with_a_synthetic_workload(self, command: str) -> None:
        """--limit (a trace option) with --workload is an error, not ignored."""
        code, out = _invoke("sim", command, *_ARGS, "--gpu", "H100-SXM", "--limit", "5")
        assert code == 2
        assert "--limit only apply to --trace" in out

    def test_num_requests_with_a_trace(self, tmp_path: pathlib.Path) -> None:
        """--num-requests sizes synthetic workloads only."""
        args = ["--trace", self._azure(tmp_path), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]
        code, out = _invoke("sim", "run", *args, "--num-requests", "5")
        assert code == 2
        assert "--num-requests only applies to --workload" in out

    def test_option_the_format_does_not_take(self, tmp_path: pathlib.Path) -> None:
        """--start is a servegen option: an Azure trace refuses it and says what it takes."""
        args = ["--trace", self._azure(tmp_path), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]
        code, out = _invoke("sim", "run", *args, "--start", "10")
        assert code == 2
        assert "--start does not apply to a azure trace; it takes --limit, --rate" in out

    def test_speedup_and_scale_are_servegen_options(self, tmp_path: pathlib.Path) -> None:
        """--speedup and --scale replay a ServeGen folder (the same requests K times faster;
        S times the requests); an Azure trace refuses them, and --scale with --rate is
        named as flags."""
        folder = tmp_path / "svc"
        folder.mkdir()
        rows = "".join(f"{i * 600},0.05,1.0,Gamma,1.0,1.0\n" for i in range(2))
        (folder / "chunk-0-trace.csv").write_text(rows)
        args = ["--trace", str(folder), "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--json"]
        code, out = _invoke("sim", "run", *args, "--speedup", "10")
        assert code == 0, out
        fast = json.loads(out[out.index("{") :])["runs"][0]["summary"]
        code, out = _invoke("sim", "run", *args)
        assert code == 0, out
        slow = json.loads(out[out.index("{") :])["runs"][0]["summary"]
        assert fast["requests"] == slow["requests"]
        assert fast["duration_s"] < slow["duration_s"] / 5
        code, out = _invoke("sim", "run", *args, "--scale", "2", "--rate", "1")
        assert code == 2
        assert "give --rate or --scale, not both" in out
        azure = ["--trace", self._azure(tmp_path), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]
        code, out = _invoke("sim", "run", *azure, "--speedup", "2")
        assert code == 2
        assert "--speedup does not apply to a azure trace" in out

    def test_lengths_trace_needs_rate_named_as_a_flag(self, tmp_path: pathlib.Path) -> None:
        """A lengths trace without --rate says --rate, not the Python parameter."""
        p = tmp_path / "l.csv"
        p.write_text("prompt_len,decode_len\n100,20\n50,10\n")
        args = ["--trace", str(p), "--model", "Llama-3-8B", "--gpu", "H100-SXM"]
        code, out = _invoke("sim", "run", *args)
        assert code == 2
        assert "--rate" in out
        assert "'rate'" not in out

    def test_rate_retimes_a_synthetic_workload(self) -> None:
        """--rate applies to a synthetic workload too (its arrivals are re-timed); the
        workload's note goes to stderr and into the JSON on stdout."""
        result = CliRunner().invoke(
            main, ["sim", "run", *_ARGS, "--gpu", "H100-SXM", "--rate", "5", "--json"]
        )
        assert result.exit_code == 0, result.output
        (run,) = json.loads(result.stdout)["runs"]
        assert run["summary"]["requests"] == 60
        assert run["notes"][0].startswith("arrival times scaled by")
        assert f"note: {run['notes'][0]}" in result.stderr

    def test_help_lists_choices_and_defaults(self) -> None:
        """--help lists the workloads, formats, models and the stack presets."""
        code, out = _invoke("sim", "run", "--help")
        assert code == 0
        for text in ("multi-tenant", "mooncake", "Llama-3-8B", "kvpolicy", "[default: vllm]"):
            assert text in out


class TestTensorParallel:
    def test_70b_needs_tp_and_runs_with_it(self) -> None:
        """Llama-3-70B fits no single H100: the error names the tp that fits, and --tp 4
        simulates it with a per-GPU KV pool."""
        args = ["--workload", "multi-tenant", "--num-requests", "40", "--model", "Llama-3-70B"]
        code, out = _invoke("sim", "run", *args, "--gpu", "H100-SXM")
        assert code == 2
        assert "tp >= 2 (--tp 2, timing.tp)" in out
        result = CliRunner().invoke(
            main, ["sim", "run", *args, "--gpu", "H100-SXM", "--tp", "4", "--json"]
        )
        assert result.exit_code == 0, result.output
        (run,) = json.loads(result.stdout)["runs"]
        assert run["summary"]["completed"] == 40
