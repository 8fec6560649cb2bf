"""Parameter grids: expansion, applying parameters, running points."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import Request
from kvpolicy.sim import ConfigError, StackConfig, apply_params, expand_grid, sweep


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
