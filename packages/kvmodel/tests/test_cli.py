"""``kvpolicy kv plan``: capacity on one GPU or a tensor/pipeline-parallel group."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvpolicy.commands._main import main
from kvpolicy.kvmodel import get_gpu, get_model, plan_capacity


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["kv", "plan", *args])
    return result.exit_code, result.output


class TestPlan:
    """kvpolicy kv plan."""

    def test_single_gpu_json_unchanged(self) -> None:
        """Without --tp the JSON is the single-GPU plan (tp = pp = 1)."""
        code, out = _invoke(
            "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--context", "4096", "--json"
        )
        assert code == 0, out
        data = json.loads(out)
        plan = plan_capacity(get_model("Llama-3-8B"), get_gpu("H100-SXM"), 4096)
        assert data == plan.as_dict()
        assert (data["tp"], data["pp"]) == (1, 1)

    def test_70b_on_four_h100(self) -> None:
        """--tp 4 plans Llama-3-70B on 4 x H100 with per-GPU figures."""
        code, out = _invoke("--model", "Llama-3-70B", "--gpu", "H100-SXM", "--tp", "4", "--json")
        assert code == 0, out
        data = json.loads(out)
        assert data["tp"] == 4
        assert data["max_sequences"] > 0
        assert data["bytes_per_token"] == get_model("Llama-3-70B").kv_bytes_per_token() // 4

    def test_table_names_the_group(self) -> None:
        """The table's title shows the GPU count and the figures say per GPU."""
        code, out = _invoke("--model", "Llama-3-70B", "--gpu", "L40S", "--tp", "8", "--pp", "1")
        assert code == 0, out
        assert "8x L40S" in out
        assert "per GPU" in out

    def test_no_fit_exits_non_zero_with_advice(self) -> None:
        """70B on one H200: exit 1, no 0-sequence table, and the tp that would fit."""
        code, out = _invoke("--model", "Llama-3-70B", "--gpu", "H200")
        assert code == 1
        assert "needs tp >= 2 on H200" in out

    def test_bad_tp_is_a_usage_error(self) -> None:
        """--tp 3 does not split 64 query heads: exit 2 naming tp."""
        code, out = _invoke("--model", "Llama-3-70B", "--gpu", "H200", "--tp", "3")
        assert code == 2
        assert "'tp'" in out


def test_version_lists_the_installed_distributions() -> None:
    """``kvpolicy --version`` gives kvpolicy's version, then each installed kvpolicy
    distribution's, marked ``(compiled)`` where its wheel carries compiled modules (the
    ``compiled`` session installs kvmodel so: ``KVPOLICY_EXPECT_COMPILED=1``)."""
    import importlib.metadata
    import os

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    version = importlib.metadata.version("kvpolicy-kvmodel")
    lines = result.output.splitlines()
    assert lines[0] == f"kvpolicy, version {version}"
    compiled = os.environ.get("KVPOLICY_EXPECT_COMPILED") == "1"
    assert f"  kvpolicy-kvmodel {version}{' (compiled)' if compiled else ''}" in lines[1:]
    names = [line.split()[0] for line in lines[1:]]
    assert names == sorted(names)
    assert all(name.startswith("kvpolicy-") for name in names)
