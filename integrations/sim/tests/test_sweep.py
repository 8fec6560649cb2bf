"""Parameter grids: expansion, applying parameters, running points."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from kvpolicy.kvmodel import Request
from kvpolicy.sim import (
    ConfigError,
    StackConfig,
    SweepPoint,
    apply_params,
    expand_grid,
    stack_from_dict,
    sweep,
)
from kvpolicy.sim._report import sweep_tables
from kvpolicy.sim._sweep import unchanged_parameters


def _point(params: dict[str, Any], goodput: float) -> SweepPoint:
    """A point whose figures are one goodput."""
    return SweepPoint(params=params, summary={"goodput_rps": goodput})


class TestGrid:
    def test_expand_order(self) -> None:
        """The first key varies slowest."""
        assert expand_grid({"a": [1, 2], "b": ["x", "y"]}) == [
            {"a": 1, "b": "x"},
            {"a": 1, "b": "y"},
            {"a": 2, "b": "x"},
            {"a": 2, "b": "y"},
        ]

    def test_empty_values(self) -> None:
        """A key with no values is named."""
        with pytest.raises(ValueError, match="'a' has no values"):
            expand_grid({"a": []})


class TestApplyParams:
    def test_fields_and_params(self) -> None:
        """Fields and policy params are set, and the name records them."""
        cfg = apply_params(
            StackConfig(name="s"), {"engine.max_batch": 8, "eviction.params.recent_window": 4}
        )
        assert cfg.engine.max_batch == 8
        assert cfg.eviction.params == {"recent_window": 4}
        assert cfg.name == "s[engine.max_batch=8,eviction.params.recent_window=4]"

    def test_unknown_section(self) -> None:
        """An unknown section lists the sections."""
        with pytest.raises(ConfigError, match="section in engine, admission"):
            apply_params(StackConfig(), {"cache.ttl": 3})

    def test_bad_value(self) -> None:
        """A value the field rejects is a ConfigError naming the parameter."""
        with pytest.raises(ConfigError, match=r"'engine\.max_batch'=0"):
            apply_params(StackConfig(), {"engine.max_batch": 0})


class TestSweep:
    def test_points_in_order(self) -> None:
        """Each point's summary reflects its parameters."""
        reqs = [Request(f"r{i}", 64, 32, 0.0) for i in range(12)]
        points = sweep(
            reqs,
            "Llama-3-8B",
            "H100-SXM",
            StackConfig(),
            {"engine.max_batch": [1, 12]},
            workers=1,
        )
        assert [p.params for p in points] == [{"engine.max_batch": 1}, {"engine.max_batch": 12}]
        assert points[0].summary["e2e"]["p99"] > points[1].summary["e2e"]["p99"]

    def test_two_processes(self) -> None:
        """Local processes give the inline results."""
        reqs = [Request(f"r{i}", 64, 32, 0.01 * i) for i in range(8)]
        grid = {"engine.token_budget": [64, 512]}
        inline = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, workers=1)
        pooled = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, workers=2)
        assert [p.summary for p in pooled] == [p.summary for p in inline]

    def test_unknown_executor(self) -> None:
        """An unknown executor lists the known ones."""
        with pytest.raises(ValueError, match="one of local, ray: 'dask'"):
            sweep([], "Llama-3-8B", "H100-SXM", StackConfig(), {}, executor="dask")


class TestCheckConfig:
    def test_counts_rejections(self) -> None:
        """check_config returns how many requests will be rejected, running nothing."""
        from kvpolicy.kvmodel import get_gpu, get_model
        from kvpolicy.sim import check_config

        reqs = [Request("a", 9000, 10), Request("b", 10, 10)]
        assert check_config(reqs, get_model("Llama-3-8B"), get_gpu("H100-SXM"), StackConfig()) == 1


class TestPointWarnings:
    def test_rejections_are_warned_per_point(self) -> None:
        """A point that rejects more than 1% of its requests carries the warning."""
        reqs = [Request(f"r{i}", 9000 if i % 4 == 0 else 64, 8, 0.01 * i) for i in range(8)]
        (point,) = sweep(
            reqs, "Llama-3-8B", "H100-SXM", StackConfig(), {"engine.max_batch": [8]}, workers=1
        )
        assert point.summary["rejected_context"] == 2
        assert len(point.warnings) == 1
        assert point.warnings[0].startswith("2 of 8 requests (25.0%) exceed Llama-3-8B's")


class TestUnchangedParameters:
    def test_names_the_parameter_that_changed_nothing(self) -> None:
        """Figures that vary with one parameter only: the other one is named."""
        points = [
            _point({"engine.max_batch": b, "engine.token_budget": t}, goodput=float(t))
            for b in (8, 64)
            for t in (512, 2048)
        ]
        assert unchanged_parameters(points, StackConfig()) == [
            "sweep parameter 'engine.max_batch' changed nothing: every figure is the same at 8, 64"
        ]

    def test_a_section_that_is_none_is_named(self) -> None:
        """A parameter of a section the stack does not use says which section is none."""
        points = [_point({"eviction.budget_fraction": f}, 1.0) for f in (0.3, 0.6)]
        assert unchanged_parameters(points, StackConfig()) == [
            "sweep parameter 'eviction.budget_fraction' changed nothing: every figure is "
            "the same at 0.3, 0.6; the stack's eviction section is 'none', so eviction.* is "
            "unused: name one (eviction.name) in the stack or in the grid"
        ]

    def test_a_named_section_is_not_called_unused(self) -> None:
        """With the section named, only the unchanged figures are reported; sweeping the
        name itself is never called unused."""
        base = stack_from_dict({"eviction": {"name": "h2o"}})
        points = [_point({"eviction.budget_fraction": f}, 1.0) for f in (0.3, 0.6)]
        assert unchanged_parameters(points, base) == [
            "sweep parameter 'eviction.budget_fraction' changed nothing: every figure is "
            "the same at 0.3, 0.6"
        ]
        points = [_point({"eviction.name": n}, 1.0) for n in ("none", "h2o")]
        assert unchanged_parameters(points, StackConfig()) == [
            "sweep parameter 'eviction.name' changed nothing: every figure is the same at "
            "'none', 'h2o'"
        ]

    def test_quiet_when_every_parameter_matters(self) -> None:
        """Figures that change with each parameter, or a single value, give no warning."""
        points = [
            _point({"engine.max_batch": b, "engine.token_budget": t}, goodput=float(b * t))
            for b in (8, 64)
            for t in (512, 2048)
        ]
        assert unchanged_parameters(points, StackConfig()) == []
        assert unchanged_parameters([_point({"engine.max_batch": 8}, 1.0)], StackConfig()) == []
        assert unchanged_parameters([], StackConfig()) == []

    def test_a_real_sweep_of_an_unused_section(self) -> None:
        """Sweeping Token-PD's budget on a stack without eviction is caught from the runs."""
        reqs = [Request(f"r{i}", 64, 16, 0.01 * i) for i in range(6)]
        grid = {"eviction.budget_fraction": [0.3, 0.6]}
        points = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, workers=1)
        (warning,) = unchanged_parameters(points, StackConfig())
        assert warning.endswith(
            "the stack's eviction section is 'none', so eviction.* is "
            "unused: name one (eviction.name) in the stack or in the grid"
        )


class TestSweepTables:
    def test_two_parameters_fit_80_columns(self) -> None:
        """Both tables lead with the parameters and goodput, show where every request
        ended, and fit 80 columns uncut."""
        reqs = [Request(f"r{i}", 9000 if i == 0 else 64, 16, 0.01 * i) for i in range(6)]
        grid = {"engine.max_batch": [2, 64], "eviction.budget_fraction": [0.3]}
        points = sweep(reqs, "Llama-3-8B", "H100-SXM", StackConfig(), grid, workers=1)
        console = Console(record=True, width=80)
        for table in sweep_tables(points, list(grid), "sweep on w: Llama-3-8B on H100-SXM"):
            console.print(table)
        text = console.export_text()
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= 80
        lines = text.splitlines()
        rule = next(i for i, ln in enumerate(lines) if "───" in ln)
        assert [ln.split() for ln in lines[rule - 3 : rule]] == [
            ["eviction."],
            ["engine.", "budget_", "goodput", "SLO", "rejected", "gave", "up"],
            [
                "max_batch",
                "fraction",
                "req/s",
                "attain.",
                "arrived",
                "completed",
                "ctx/KV",
                "(429s)",
            ],
        ]
        rows = [ln.split() for ln in lines[rule + 1 : rule + 3]]
        assert [r[:2] + r[4:] for r in rows] == [
            ["2", "0.3", "6", "5", "1/0", "0", "(0)"],
            ["64", "0.3", "6", "5", "1/0", "0", "(0)"],
        ]


def test_sweep_reports_progress() -> None:
    """sweep calls progress(done, total) from 0 to every point."""
    from kvpolicy.kvmodel import Request
    from kvpolicy.sim import StackConfig, sweep

    seen: list[tuple[int, int]] = []
    reqs = [Request(f"r{i}", 64, 8, 0.01 * i) for i in range(10)]
    grid = {"engine.max_batch": [4, 8, 16]}
    sweep(
        reqs,
        "Llama-3-8B",
        "H100-SXM",
        StackConfig(),
        grid,
        workers=1,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]
