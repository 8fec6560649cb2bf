"""Block-level eviction prototype on vLLM's real KV cache manager and block pool."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from kvpolicy.vllm import ConfigError


def _cfg(name: str, budget: int, **params: Any) -> dict[str, Any]:
    return {"block_eviction": {"policy": {"name": name, "params": params}, "budget_blocks": budget}}


def _workload() -> list[Any]:
    from kvpolicy.vllm import WorkloadRequest

    rng = random.Random(0)
    return [
        WorkloadRequest(
            str(i),
            [i % 50 + 3] * rng.randint(16, 600),
            rng.randint(16, 400),
            arrival_step=rng.randint(0, 400),
        )
        for i in range(100)
    ]


@pytest.mark.usefixtures("needs_vllm")
class TestBlockEvictionScheduler:
    def test_budget_held_and_blocks_conserved(self, vllm_sched: Callable[..., Any]) -> None:
        """After each round the running batch holds at most the budget in full blocks;
        evicted blocks are the null block; every block is free again at the end."""
        from kvpolicy.vllm import BlockEvictionScheduler, run_workload

        s = vllm_sched(BlockEvictionScheduler, num_blocks=256, kvpolicy=_cfg("token-pd", 160))
        evict = s._evict_blocks
        worst = [0]

        def watched(step: int) -> None:
            evict(step)
            full = sum(
                sum(1 for b in s._manager.req_to_blocks.get(r.request_id, [])[:n] if not b.is_null)
                for r in s.running
                for n in [r.num_computed_tokens // s.block_size]
            )
            worst[0] = max(worst[0], full)

        s._evict_blocks = watched
        stats = run_workload(s, _workload())
        assert s.dropped_blocks > 0
        assert worst[0] <= 160
        assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 255
        assert len(stats.finish_step) == 100

    def test_fewer_preemptions_than_stock(self, vllm_sched: Callable[..., Any]) -> None:
        """Freed blocks let the same pool run the workload without preemptions."""
        from kvpolicy.vllm import BlockEvictionScheduler, run_workload

        stock = run_workload(vllm_sched(num_blocks=256), _workload())
        ours = run_workload(
            vllm_sched(BlockEvictionScheduler, num_blocks=256, kvpolicy=_cfg("token-pd", 160)),
            _workload(),
        )
        assert stock.preemptions == 66
        assert ours.preemptions == 0

    def test_fifo_drops_the_oldest_blocks(self, vllm_sched: Callable[..., Any]) -> None:
        """With evict's FIFO policy the earliest reported blocks go first: 10 full blocks,
        budget 8 less 2 blocks of growth leaves 6, so r0's first 4 blocks are dropped."""
        from kvpolicy.vllm import BlockEvictionScheduler, WorkloadRequest
        from kvpolicy.vllm._harness import _vllm_request

        s = vllm_sched(BlockEvictionScheduler, num_blocks=64, kvpolicy=_cfg("fifo", 8))
        for i, n in enumerate((96, 64)):  # 6 and 4 full blocks
            s.add_request(_vllm_request(WorkloadRequest(f"r{i}", [i + 3] * n, 50), 16, 1.0 + i))
        from vllm.v1.outputs import ModelRunnerOutput

        for _ in range(2):
            out = s.schedule()
            ids = list(out.num_scheduled_tokens)
            s.update_from_output(
                out,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: k for k, r in enumerate(ids)},
                    sampled_token_ids=[[7] for _ in ids],
                ),
            )
        table = s._manager.req_to_blocks
        assert [b.is_null for b in table["r0"]][:6] == [True, True, True, True, False, False]
        assert not any(b.is_null for b in table["r1"])
        assert (s.resident_blocks("r0"), s.resident_blocks("r1")) == (
            2 + 1,
            4 + 1,
        )  # + each one's partial tail block

    def test_prefix_caching_refused(self, vllm_sched: Callable[..., Any]) -> None:
        """The prototype refuses prefix caching at startup, saying why."""
        from kvpolicy.vllm import BlockEvictionScheduler

        with pytest.raises(ConfigError, match="prefix caching off"):
            vllm_sched(
                BlockEvictionScheduler,
                num_blocks=64,
                enable_prefix_caching=True,
                kvpolicy=_cfg("token-pd", 16),
            )

    def test_missing_section_refused(self, vllm_sched: Callable[..., Any]) -> None:
        """Without a block_eviction section the scheduler does not start."""
        from kvpolicy.vllm import BlockEvictionScheduler

        with pytest.raises(ConfigError, match="'block_eviction'"):
            vllm_sched(BlockEvictionScheduler, num_blocks=64)


def test_unknown_eviction_policy_named() -> None:
    """An unknown block eviction policy fails at config load, with the field."""
    from kvpolicy.vllm import load_config

    with pytest.raises(ConfigError, match=r"'block_eviction.policy'.*'nope'.*token-pd"):
        load_config(_cfg("nope", 10))
