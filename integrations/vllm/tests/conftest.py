"""Fixtures of kvpolicy-vllm's tests: vLLM on CPU, offline, with a tiny local model config."""

from __future__ import annotations

import os
import pathlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

# vLLM reads these at import time: CPU platform, never the Hugging Face hub.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_MODEL = pathlib.Path(__file__).parent / "data" / "tiny-llama"
"""A tiny Llama ``config.json`` (no weights, no tokenizer) for vLLM's ModelConfig."""

VLLM_REASON = "vLLM is not installed: run `nox -s vllm` (pins vllm==0.32.0, CPU torch)"


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)


@pytest.fixture
def manifest() -> dict[str, Any]:
    """A token pool with a guaranteed tenant 'gold' (2 running at most) and a spot 'free'."""
    return {
        "pool": {
            "name": "tiny",
            "capacity": {"tokens_per_s": 1000, "kv_bytes": 1 << 30, "concurrency": 16},
        },
        "entitlements": [
            {
                "tenant": "gold",
                "service_class": "guaranteed",
                "slo_target_s": 0.5,
                "baseline": {"tokens_per_s": 100, "kv_bytes": 1 << 20, "concurrency": 2},
            },
            {
                "tenant": "free",
                "service_class": "spot",
                "slo_target_s": 5.0,
                "baseline": {"tokens_per_s": 100, "kv_bytes": 1 << 20, "concurrency": 8},
            },
        ],
    }


@pytest.fixture
def needs_vllm() -> None:
    """Skip the test, with the reason, where vLLM is not installed."""
    pytest.importorskip("vllm", reason=VLLM_REASON)


@pytest.fixture
def vllm_sched(needs_vllm: None) -> Callable[..., Any]:
    """A factory of vLLM's real scheduler on the tiny model (skips without vLLM)."""
    from kvpolicy.vllm import make_scheduler

    def make(cls: type[Any] | None = None, **kwargs: Any) -> Any:
        return make_scheduler(cls, model_dir=TINY_MODEL, **kwargs)

    return make


def pytest_configure(config: pytest.Config) -> None:
    # vLLM 0.32 and torch 2.13 warn at import about their own deprecations; the rest of
    # this suite keeps warnings as errors.
    for line in (
        "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",
        "ignore::DeprecationWarning:vllm.*",
        "ignore::FutureWarning:vllm.*",
    ):
        config.addinivalue_line("filterwarnings", line)
