"""Every policy of the installed packages runs in the engine and keeps its contract."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvpolicy.sim import (
    Engine,
    EvictionConfig,
    Stack,
    StackConfig,
    TimingModel,
    build_stack,
    part_names,
    stack_from_dict,
)

evict = pytest.importorskip("kvpolicy.evict", reason="kvpolicy-evict is not installed")

_PARAMS: dict[str, dict[str, Any]] = {
    "h2o": {"recent_window": 32},
    "composed": {"policies": ["sink-window", {"name": "h2o", "params": {"recent_window": 8}}]},
}
_EVICTION = [n for n in part_names("eviction") if n != "none"]
_PREEMPTION = [n for n in part_names("preemption") if n != "none"]


def _workload(kit: SimpleNamespace) -> list[Any]:
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.01, 24))
    return [
        kit.request(
            i,
            int(rng.integers(50, 400)),
            int(rng.integers(20, 300)),
            float(t[i]),
            tenant=f"t{i % 3}",
            priority=i % 2,
        )
        for i in range(24)
    ]


@pytest.mark.parametrize("name", _EVICTION)
class TestEvictionPolicies:
    def test_budget_holds(self, name: str, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Resident tokens never pass the budget and every request finishes."""
        cfg = stack_from_dict(
            {
                "eviction": {
                    "name": name,
                    "params": _PARAMS.get(name, {}),
                    "budget_fraction": 0.25,
                    "every": 16,
                }
            }
        )
        stack = build_stack(cfg)
        rec = Engine(
            tm,
            kit.engine(16384, token_budget=512),
            Stack(eviction=stack.eviction),
            eviction_config=cfg.eviction,
        ).run(_workload(kit))
        assert rec.eviction_budget == 4096
        assert int(rec.series_resident.max()) <= 4096
        assert rec.evicted_tokens > 0
        assert np.isfinite(rec.finish).all()
        assert stack.eviction is not None
        assert stack.eviction.resident_tokens() == 0


@pytest.mark.parametrize("name", _PREEMPTION)
class TestPreemptionPolicies:
    def test_all_finish(self, name: str, kit: SimpleNamespace, tm: TimingModel) -> None:
        """Under a small pool the order preempts and every request still finishes."""
        stack = build_stack(stack_from_dict({"preemption": {"name": name}}))
        rec = Engine(tm, kit.engine(1024), Stack(preemption=stack.preemption)).run(_workload(kit))
        assert rec.preemptions.sum() > 0
        assert np.isfinite(rec.finish[~rec.rejected]).all()


def test_default_stack_has_no_policies() -> None:
    """The vLLM-like default builds no policy objects."""
    assert build_stack(StackConfig()).admission is None
    assert EvictionConfig().name == "none"
