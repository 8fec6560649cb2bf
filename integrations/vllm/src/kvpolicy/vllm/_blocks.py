"""Block-level Token-PD inside vLLM's real KV cache manager: a prototype.

vLLM's sliding-window manager already frees blocks a request will not attend to again: it
replaces them with the pool's null block in the request's block table and returns them to
the pool (``SingleTypeKVCacheManager._remove_blocks_in_range``). This prototype does the
same for blocks *chosen by an eviction policy*: before each ``schedule()`` it reports every
running request's full, computed blocks to a batch-global :class:`EvictionPolicy` (through
kvmodel's :class:`~kvpolicy.kvmodel.ResidencyLedger`, one ledger position per block), runs
a round down to ``budget_blocks`` when one is due, and frees the blocks the policy evicted.
vLLM then allocates from the freed blocks as from any others, so the same pool runs more
requests with fewer preemptions.

A block's value is the sum of its tokens' values: the ``(R̂, σ̂²)`` that
:class:`~kvpolicy.vllm.ReturnSignalProcessor` recorded for them when it runs in the same
process, else ``default_return`` per token. The scheduler sees no attention, so every
resident block is reported as receiving the same share.

What this prototype does **not** do, and a full integration would need (see DESIGN.md):
the model still reads the null block where an evicted block was, so the attention kernel
must mask evicted blocks (as it masks the sliding window's); blocks computed after an
eviction must not enter the prefix cache under the full-context hash, so the prototype
refuses prefix caching; the worker-side signals must reach the engine-core process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvpolicy.evict import Periodic
from kvpolicy.kvmodel import ResidencyLedger
from kvpolicy.vllm._config import BlockEvictionConfig
from kvpolicy.vllm._errors import ConfigError
from kvpolicy.vllm._logits import ReturnSignalProcessor
from kvpolicy.vllm._scheduler import KVPolicyScheduler

__all__ = ["BlockEvictionScheduler", "BlockValues"]


class BlockValues:
    """kvmodel ``AttentionSource`` over blocks: a block's signals sum its tokens' values.

    Args:
        block_size: tokens per block.
        default_return: ``R̂`` of a token with no recorded signal.
    """

    def __init__(self, block_size: int, default_return: float = 0.5) -> None:
        self.block_size = block_size
        self.default_return = float(default_return)

    def signals(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> NDArray[np.float64] | None:
        """(n, 2) float64: summed ``R̂`` and ``σ̂²`` of each block's tokens."""
        bs = self.block_size
        out = np.empty((len(positions), 2), dtype=np.float64)
        out[:, 0] = self.default_return * bs
        out[:, 1] = 0.0
        recorded = ReturnSignalProcessor.signals.get(stream)
        if recorded:
            first = {int(b): i for i, b in enumerate(positions)}
            sums = np.zeros((len(positions), 2))
            counts = np.zeros(len(positions))
            for pos, r, v in recorded:
                i = first.get(pos // bs)
                if i is not None:
                    sums[i] += (r, v)
                    counts[i] += 1
            has = counts > 0
            # Tokens without a signal (the prompt) keep the default return.
            out[has, 0] = sums[has, 0] + (bs - counts[has]) * self.default_return
            out[has, 1] = sums[has, 1]
        return out

    def attention(
        self, stream: str, positions: NDArray[np.int64], length: int
    ) -> tuple[NDArray[np.float64], float]:
        """Uniform attention over ``length`` blocks (the scheduler sees no attention)."""
        return np.ones(len(positions), dtype=np.float64), float(max(length, 1))


class BlockEvictionScheduler(KVPolicyScheduler):
    """:class:`KVPolicyScheduler` that also drops whole KV blocks chosen by evict's policy.

    Configured by the ``block_eviction`` section of the kvpolicy config
    (``{"policy": {"name": "token-pd"}, "budget_blocks": 512}``). A prototype: see the
    module docstring for what the model side must add before outputs are correct.

    Raises:
        ConfigError: no ``block_eviction`` section, prefix caching on, or more than one KV
            cache group (hybrid models).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.kvpolicy_config.block_eviction
        if not isinstance(cfg, BlockEvictionConfig):
            raise ConfigError("'block_eviction': BlockEvictionScheduler needs this section")
        if self.cache_config.enable_prefix_caching:
            raise ConfigError(
                "'block_eviction': the prototype needs prefix caching off "
                "(--no-enable-prefix-caching): blocks computed after an eviction would be "
                "cached under their full-context hash"
            )
        managers = self.kv_cache_manager.coordinator.single_type_managers
        if len(managers) != 1:
            raise ConfigError(
                f"'block_eviction': the prototype handles one KV cache group, not {len(managers)}"
            )
        self._manager = managers[0]
        self.ledger = ResidencyLedger(
            Periodic(cfg.build(), cfg.interval),
            cfg.budget_blocks,
            BlockValues(self.block_size),
            evict_ahead=1,
        )
        """The residency ledger of full blocks (one ledger position per block)."""
        self.dropped_blocks = 0
        """Blocks freed by eviction rounds."""
        self._open: dict[str, int] = {}  # full blocks reported per open stream

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """One eviction round when due, then vLLM's schedule on the freed pool."""
        self._evict_blocks(self.current_step)
        return super().schedule(*args, **kwargs)

    def _evict_blocks(self, step: int) -> None:
        ledger, bs = self.ledger, self.block_size
        running = {r.request_id: r for r in self.running}
        for rid in list(self._open):
            if rid in running:
                continue
            r = self.requests.get(rid)
            written = self._open.pop(rid)
            if r is not None and not r.is_finished():
                ledger.drop(rid, written)  # preempted: its KV is gone, it recomputes
            else:
                ledger.close(rid, written)
        batch: list[tuple[str, int]] = []
        new = 0
        for rid, r in running.items():
            full = r.num_computed_tokens // bs
            if rid not in self._open:
                ledger.open(rid, step)
                self._open[rid] = 0
            new += full - self._open[rid]
            self._open[rid] = full
            batch.append((rid, full))
        ledger.wrote(new)
        growth = len(batch)
        if not batch or not ledger.due(step, growth):
            return
        ledger.round(step, batch, min(growth, ledger.budget // 4))
        null = self._manager._null_block
        pool = self._manager.block_pool
        for rid, full in batch:
            blocks = self._manager.req_to_blocks.get(rid)
            if blocks is None:
                continue
            keep = set(ledger.positions(rid).tolist())
            freed = []
            for i in range(min(full, len(blocks))):
                if i not in keep and blocks[i] is not null:
                    freed.append(blocks[i])
                    blocks[i] = null
            if freed:
                pool.free_blocks(freed)
                self.dropped_blocks += len(freed)

    def resident_blocks(self, request_id: str) -> int:
        """Blocks of ``request_id`` that are not the null block."""
        blocks = self._manager.req_to_blocks.get(request_id, [])
        return sum(1 for b in blocks if b is not self._manager._null_block)
