"""Reports: the comparison table, JSON, plots and the HTML file."""

from __future__ import annotations

import json
import pathlib
from types import SimpleNamespace

import pytest
from rich.console import Console

from kvpolicy.kvmodel import get_gpu, get_model
from kvpolicy.sim import (
    StackConfig,
    comparison_table,
    results_json,
    simulate,
    stack_from_dict,
    write_report,
)


@pytest.fixture
def results(kit: SimpleNamespace) -> list[object]:
    """Two small runs on one workload."""
    reqs = [kit.request(i, 120, 40, 0.02 * i, tenant=("a", "b")[i % 2]) for i in range(30)]
    m, g = get_model("Llama-3-8B"), get_gpu("H100-SXM")
    return [
        simulate(reqs, m, g, StackConfig(name="one"), workload_name="w"),
        simulate(reqs, m, g, stack_from_dict({"engine": {"max_batch": 2}}, name="two")),
    ]


class TestReport:
    def test_table_has_a_column_per_run(self, results: list[object]) -> None:
        """The table's columns are the figure and each stack."""
        table = comparison_table(results)  # type: ignore[arg-type]
        assert [c.header for c in table.columns] == ["figure", "one", "two"]
        console = Console(record=True, width=120)
        console.print(table)
        assert "SLO attainment" in console.export_text()

    def test_json_lists_runs(self, results: list[object]) -> None:
        """results_json holds one entry per run with its summary."""
        doc = json.loads(json.dumps(results_json(results)))  # type: ignore[arg-type]
        assert [r["stack"] for r in doc["runs"]] == ["one", "two"]
        assert doc["runs"][0]["summary"]["requests"] == 30

    def test_files(self, results: list[object], tmp_path: pathlib.Path) -> None:
        """The report directory holds PNGs and an HTML embedding all three."""
        path = write_report(results, tmp_path / "r")  # type: ignore[arg-type]
        html = path.read_text()
        assert html.count("data:image/png;base64,") == 3
        for name in ("memory.png", "latency_cdf.png", "tenants.png"):
            assert (tmp_path / "r" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_empty_is_an_error(self) -> None:
        """No results is a ValueError."""
        with pytest.raises(ValueError, match="at least one result"):
            comparison_table([])
