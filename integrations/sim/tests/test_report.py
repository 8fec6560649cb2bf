"""Reports: the comparison table, JSON, plots and the HTML file."""

from __future__ import annotations

import json
import pathlib
from html import escape
from types import SimpleNamespace

import attrs
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
from kvpolicy.sim._report import glossary

CONFIGS = (StackConfig(name="one"), stack_from_dict({"engine": {"max_batch": 2}}, name="two"))


@pytest.fixture
def results(kit: SimpleNamespace) -> list[object]:
    """Two small runs on one workload; a tenth of it longer than the model's context."""
    reqs = [
        kit.request(i, 9000 if i % 10 == 3 else 120, 40, 0.02 * i, tenant=("a", "b")[i % 2])
        for i in range(30)
    ]
    m, g = get_model("Llama-3-8B"), get_gpu("H100-SXM")
    return [
        simulate(reqs, m, g, c, workload_name="w", notes=("pooled 3 clients",)) for c in CONFIGS
    ]


def _text(table: object, width: int) -> str:
    console = Console(record=True, width=width)
    console.print(table)
    return console.export_text()


class TestReport:
    def test_table_has_a_column_per_run(self, results: list[object]) -> None:
        """The table's columns are the figure and each stack."""
        table = comparison_table(results)  # type: ignore[arg-type]
        assert [str(c.header) for c in table.columns] == ["figure", "one", "two"]
        assert "SLO attainment" in _text(table, 120)

    def test_leads_with_goodput_and_counts_every_request(self, results: list[object]) -> None:
        """Goodput comes first; arrived, completed, rejected by reason, gave up and 429s
        follow, and the latency section says what it covers."""
        lines = _text(comparison_table(results), 80).splitlines()  # type: ignore[arg-type]
        rows = [ln.strip("│ ").split("│")[0].strip() for ln in lines if ln.startswith("│")]
        assert rows[:4] == [
            "goodput",
            "goodput (req/s in SLO)",
            "goodput (output tok/s in SLO)",
            "SLO attainment (of arrived)",
        ]
        assert rows[4:13] == [
            "requests",
            "arrived",
            "completed",
            "completed within SLO",
            "rejected: over context",
            "rejected: over KV pool",
            "gave up after 429s",
            "gateway 429s",
            "throughput",
        ]
        covers = next(ln for ln in lines if "measured (completed/arrived)" in ln)
        assert [c.strip() for c in covers.split("│")[2:4]] == ["27/30", "27/30"]
        context = next(ln for ln in lines if "rejected: over context" in ln)
        assert [c.strip() for c in context.split("│")[2:4]] == ["3", "3"]

    @pytest.mark.parametrize("names", [("vllm", "kvpolicy"), ("vllm", "kvpolicy", "mine")])
    def test_fits_80_columns(self, results: list[object], names: tuple[str, ...]) -> None:
        """At 80 columns nothing is cut: every label and header is whole, no ellipsis."""
        runs = [attrs.evolve(results[i % 2], stack=n) for i, n in enumerate(names)]  # type: ignore[misc]
        text = _text(comparison_table(runs, title="multi-tenant: Llama-3-8B on L40S"), 80)
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= 80
        for label, _ in glossary():
            if label != "unfinished at stop":
                assert label in text
        for n in names:
            assert n in text

    def test_json_lists_runs(self, results: list[object]) -> None:
        """results_json holds one entry per run with its summary."""
        doc = json.loads(json.dumps(results_json(results, CONFIGS)))  # type: ignore[arg-type]
        assert [r["stack"] for r in doc["runs"]] == ["one", "two"]
        run = doc["runs"][0]
        assert run["summary"]["requests"] == 30
        assert run["notes"] == ["pooled 3 clients"]
        assert run["warnings"][0].startswith("3 of 30 requests (10.0%) exceed Llama-3-8B's")
        assert run["stack_parts"]["gateway"] == "none: every request enters"
        assert doc["what_happened"].startswith("one led on goodput")

    def test_json_without_configs(self, results: list[object]) -> None:
        """Without the stacks, the runs have no parts; a wrong count is a ValueError."""
        doc = results_json(results)  # type: ignore[arg-type]
        assert "stack_parts" not in doc["runs"][0]
        with pytest.raises(ValueError, match=r"one StackConfig per result \(2\): 1"):
            results_json(results, CONFIGS[:1])  # type: ignore[arg-type]

    def test_files(self, results: list[object], tmp_path: pathlib.Path) -> None:
        """The report directory holds PNGs and an HTML embedding all three."""
        path = write_report(results, tmp_path / "r", configs=CONFIGS)  # type: ignore[arg-type]
        html = path.read_text()
        assert html.count("data:image/png;base64,") == 3
        for name in ("memory.png", "latency_cdf.png", "tenants.png"):
            assert (tmp_path / "r" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        doc = json.loads((tmp_path / "r" / "results.json").read_text())
        assert doc == json.loads(json.dumps(results_json(results, CONFIGS)))  # type: ignore[arg-type]

    @pytest.mark.heavy
    def test_html_explains_itself(self, results: list[object], tmp_path: pathlib.Path) -> None:
        """The HTML holds what happened, the warnings, the notes, each stack's parts and
        a glossary of every figure."""
        html = write_report(results, tmp_path, configs=CONFIGS).read_text()  # type: ignore[arg-type]
        doc = results_json(results, CONFIGS)  # type: ignore[arg-type]
        for heading in ("What happened", "Warnings", "Workload notes", "Stacks", "Figures"):
            assert f"<h2>{heading}</h2>" in html
        assert escape(doc["what_happened"]) in html
        assert escape(doc["runs"][1]["warnings"][0]) in html
        assert "<li>pooled 3 clients</li>" in html
        assert "at most 2 running" in html
        for _label, meaning in glossary():
            assert escape(meaning) in html
        assert "latency: completed requests only" in html

    def test_empty_is_an_error(self) -> None:
        """No results is a ValueError."""
        with pytest.raises(ValueError, match="at least one result"):
            comparison_table([])
