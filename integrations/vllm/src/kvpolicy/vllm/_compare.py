"""Stock vLLM against kvpolicy's scheduler on the same workload, on vLLM's real scheduler."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from kvpolicy.vllm._harness import WorkloadRequest, make_scheduler, run_workload

__all__ = ["PREEMPTION_HEAVY", "compare", "preemption_heavy"]

PREEMPTION_HEAVY: dict[str, dict[str, Any] | None] = {
    "stock": None,
    "cost-aware preemption": {
        "preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}}
    },
    "rate-limited admission": {
        "admission": {
            "name": "rate-limited",
            "params": {"prior_decode_len": 200, "margin_sigmas": 0.0},
        }
    },
    "both": {
        "preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}},
        "admission": {
            "name": "rate-limited",
            "params": {"prior_decode_len": 200, "margin_sigmas": 0.0},
        },
    },
}
"""The configurations compared (None: vLLM's own AsyncScheduler)."""


def preemption_heavy(n: int = 100, seed: int = 0) -> list[WorkloadRequest]:
    """``n`` requests, prompts 16-600 and outputs 16-400 tokens, arriving over 400 steps."""
    rng = random.Random(seed)
    return [
        WorkloadRequest(
            str(i),
            [i % 50 + 3] * rng.randint(16, 600),
            rng.randint(16, 400),
            arrival_step=rng.randint(0, 400),
        )
        for i in range(n)
    ]


def compare(
    workload: Sequence[WorkloadRequest],
    num_blocks: int,
    configs: Mapping[str, Mapping[str, Any] | None] = PREEMPTION_HEAVY,
    **scheduler: Any,
) -> dict[str, dict[str, Any]]:
    """Run ``workload`` under each config; steps, preemptions, recomputed tokens, finish order.

    Returns:
        Per config: ``steps``, ``preemptions``, ``recomputed_tokens``, ``finish_order`` and,
        for every config but the first, ``recomputed_change`` relative to the first.
    """
    from kvpolicy.vllm._scheduler import KVPolicyScheduler

    out: dict[str, dict[str, Any]] = {}
    base: int | None = None
    for name, cfg in configs.items():
        cls = None if cfg is None else KVPolicyScheduler
        sched = make_scheduler(cls, num_blocks=num_blocks, kvpolicy=cfg, **scheduler)
        stats = run_workload(sched, workload)
        row: dict[str, Any] = {
            "steps": stats.steps,
            "preemptions": stats.preemptions,
            "recomputed_tokens": stats.recomputed_tokens,
            "finish_order": stats.finish_order,
        }
        if base is None:
            base = stats.recomputed_tokens
        elif base:
            row["recomputed_change"] = stats.recomputed_tokens / base - 1.0
        out[name] = row
    return out
