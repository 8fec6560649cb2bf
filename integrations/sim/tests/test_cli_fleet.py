"""``kvpolicy sim run|compare`` on a fleet: --replicas, --router, --autoscaler and errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpolicy.sim.cli import main

_ARGS = ["--workload", "multi-tenant", "--num-requests", "40", "--model", "Llama-3-8B"]
_GPU = ["--gpu", "H100-SXM"]


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


class TestRun:
    def test_json_carries_the_replicas(self) -> None:
        """A fleet run's summary has gpu_hours, peak_replicas and one row per replica."""
        code, out = _invoke(
            "sim", "run", *_ARGS, *_GPU, "--replicas", "2", "--router", "least-requests", "--json"
        )
        assert code == 0, out
        summary = json.loads(out)["runs"][0]["summary"]
        assert summary["peak_replicas"] == 2
        rows = summary["replicas"]
        assert [r["replica_id"] for r in rows] == ["r0", "r1"]
        assert sum(r["requests"] for r in rows) == summary["completed"]
        assert summary["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in rows))
        assert {r["model"] for r in rows} == {"Llama-3-8B"}
        assert {r["gpu"] for r in rows} == {"H100-SXM"}

    def test_compare_across_routers(self) -> None:
        """compare runs the stack behind each --router, named stack/router."""
        code, out = _invoke(
            "sim", "compare", *_ARGS, *_GPU, "--stack", "vllm", "--replicas", "2",
            "--router", "round-robin", "--router", "prefix-aware", "--json",
        )  # fmt: skip
        assert code == 0, out
        runs = json.loads(out)["runs"]
        assert [r["stack"] for r in runs] == ["vllm/round-robin", "vllm/prefix-aware"]

    def test_compare_across_autoscalers(self) -> None:
        """compare runs the stack behind each --autoscaler on the same workload, named
        stack/autoscaler (stack/router/autoscaler with several routers too); an unknown
        one in the list is a usage error naming it."""
        code, out = _invoke(
            "sim", "compare", *_ARGS, *_GPU, "--stack", "vllm", "--replicas", "2",
            "--autoscaler", "static", "--autoscaler", "threshold", "--max-replicas", "3",
            "--json",
        )  # fmt: skip
        assert code == 0, out
        runs = json.loads(out)["runs"]
        assert [r["stack"] for r in runs] == ["vllm/static", "vllm/threshold"]
        assert {r["summary"]["completed"] for r in runs} == {40}
        code, out = _invoke(
            "sim", "compare", *_ARGS, *_GPU, "--stack", "vllm", "--replicas", "2",
            "--router", "round-robin", "--router", "least-kv",
            "--autoscaler", "static", "--autoscaler", "threshold", "--json",
        )  # fmt: skip
        assert code == 0, out
        assert [r["stack"] for r in json.loads(out)["runs"]] == [
            "vllm/round-robin/static",
            "vllm/round-robin/threshold",
            "vllm/least-kv/static",
            "vllm/least-kv/threshold",
        ]
        code, out = _invoke(
            "sim", "compare", *_ARGS, *_GPU, "--autoscaler", "static", "--autoscaler", "magic"
        )
        assert code == 2
        assert "--autoscaler: unknown autoscaler 'magic'" in " ".join(out.split())

    def test_table_shows_each_replica(self) -> None:
        """The table carries the fleet's rows, one set per replica."""
        code, out = _invoke("sim", "run", *_ARGS, *_GPU, "--replicas", "2")
        assert code == 0, out
        lines = [line for line in out.splitlines() if "requests (in SLO)" in line]
        assert [line.split()[1] for line in lines] == ["r0", "r1"]
        assert "peak replicas" in out

    def test_html_table_shows_each_replica(self) -> None:
        """The HTML report's table carries the same rows."""
        from kvpolicy.kvmodel import get_gpu, get_model
        from kvpolicy.sim import FleetConfig, StackConfig, simulate
        from kvpolicy.sim._report import _html_table
        from kvpolicy.sim.workloads import get_workload

        w = get_workload("multi-tenant", seed=0, num_requests=20)
        cfg = StackConfig(fleet=FleetConfig(2))
        result = simulate(w.requests, get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg)
        page = _html_table([result])
        assert "<th>r1 model on GPU</th><td>Llama-3-8B on H100-SXM</td>" in page
        assert "<th>peak replicas</th><td>2</td>" in page


class TestErrors:
    @pytest.mark.parametrize(
        ("flags", "message"),
        [
            (["--router", "fastest"], "--router: unknown router 'fastest'; known: least-kv,"),
            (["--autoscaler", "magic"], "--autoscaler: unknown autoscaler 'magic'; known: "),
            (["--replicas", "0"], "'--replicas': 0 is not in the range x>=1"),
            (
                ["--autoscaler", "static", "--min-replicas", "3", "--max-replicas", "2"],
                "--min-replicas 3 is more than --max-replicas 2",
            ),
            (["--replicas", "2", "--signal-delay", "-1"], "'--signal-delay': -1.0 is not in"),
        ],
    )
    def test_bad_flags_are_usage_errors(self, flags: list[str], message: str) -> None:
        """Bad fleet flags exit with status 2 naming the flag, before anything runs."""
        code, out = _invoke("sim", "run", *_ARGS, *_GPU, *flags)
        assert code == 2
        assert message in " ".join(out.split())
