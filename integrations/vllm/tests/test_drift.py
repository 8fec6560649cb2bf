"""Drift guard: every vLLM internal kvpolicy-vllm relies on is still there, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvpolicy.vllm import REQUIRED_VLLM_SYMBOLS, vllm_drift

pytestmark = pytest.mark.usefixtures("needs_vllm")


@pytest.mark.parametrize("symbol", sorted(REQUIRED_VLLM_SYMBOLS))
def test_symbol_unchanged(symbol: str) -> None:
    """The named vLLM symbol still has the shape kvpolicy-vllm relies on."""
    problem = REQUIRED_VLLM_SYMBOLS[symbol]()
    assert problem is None, f"vLLM drift: {symbol}: {problem}"


def test_installed_version_is_tested() -> None:
    """The installed vLLM is one this package was tested against."""
    import vllm

    from kvpolicy.vllm import TESTED_VLLM_VERSIONS

    assert vllm.__version__ in TESTED_VLLM_VERSIONS


def test_a_change_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed internal is reported under its vLLM name."""
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    monkeypatch.setattr(
        CachePolicy, "__abstractmethods__", CachePolicy.__abstractmethods__ | {"pin"}
    )
    drift = vllm_drift()
    assert list(drift) == ["vllm.v1.kv_offload.cpu.policies.base.CachePolicy (abstract methods)"]
    assert "pin" in drift["vllm.v1.kv_offload.cpu.policies.base.CachePolicy (abstract methods)"]


def test_scheduler_refuses_drifted_vllm(
    monkeypatch: pytest.MonkeyPatch, vllm_sched: Callable[..., Any]
) -> None:
    """KVPolicyScheduler fails at startup, naming the symbol, when vLLM drifted."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from kvpolicy.vllm import KVPolicyScheduler, UnsupportedVLLMError

    def add_request(self: Any, new_request: Any) -> None:
        """A renamed parameter, as a vLLM upgrade might do."""

    monkeypatch.setattr(Scheduler, "add_request", add_request)
    with pytest.raises(UnsupportedVLLMError, match=r"Scheduler\.add_request.*lost parameters"):
        vllm_sched(KVPolicyScheduler, num_blocks=16)
