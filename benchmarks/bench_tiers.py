"""kvpolicy-tiers: store operations per second and the cost of the Pareto search.

Figures are ratios against baselines measured in the same run:

* ``store_over_dict_lru_seconds``: seconds of :class:`TieredPrefixStore` (DRAM + disk,
  TTL on disk) over a plain ``OrderedDict`` LRU of the same total size, replaying the
  same synthetic Mooncake-like stream of 1,000,000 block references (100,000 with
  ``--quick``): per request, fetch the leading run, then offload all its blocks. Also the
  absolute block operations per second of both and their hit ratios.
* ``adaptive_over_grid_evaluations`` and ``adaptive_over_grid_hypervolume``: Algorithm 1
  against a full grid over (DRAM GiB, disk GiB), both evaluated by
  :class:`ReplayEvaluator` on the Mooncake conversation trace (its first requests; the
  synthetic stream when the trace is absent), plus the seconds of each search.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _harness import parse_args, write_result

from kvpolicy.kvmodel import get_model
from kvpolicy.tiers import (
    FixedTTL,
    ReplayEvaluator,
    SearchAxis,
    TieredPrefixStore,
    adaptive_pareto_search,
    get_tier,
    grid_search,
    hypervolume,
)

MOONCAKE = (
    pathlib.Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "traces"
    / "mooncake-fast25-conversation"
    / "conversation_trace.jsonl"
)
BLOCK_BYTES = get_model("Llama-3-8B").kv_bytes_per_block(512)

Trace = list[tuple[float, list[int]]]


def synthetic_stream(total_blocks: int, seed: int = 0) -> Trace:
    """Multi-turn conversations over one shared system-prompt block, Zipf-popular.

    Each request picks a conversation (Zipf, s = 1.1, over 5,000), resends its history
    and appends 1-4 new blocks; a new conversation starts with 4-30 blocks. Arrivals are
    Poisson at 3.4 requests/s, the Mooncake rate. Prompts average about 35 blocks
    (Mooncake: 24) and reuse more (about 0.79 of blocks hit an unbounded cache; 0.37).
    """
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** 1.1 for k in range(5000)]
    chains: dict[int, list[int]] = {}
    next_hash = 1
    trace: Trace = []
    t = 0.0
    blocks = 0
    while blocks < total_blocks:
        conv = rng.choices(range(5000), weights)[0]
        chain = chains.get(conv)
        if chain is None or len(chain) > 60:
            chain = [0]
            grow = rng.randint(4, 30)
        else:
            grow = rng.randint(1, 4)
        chain = chain + list(range(next_hash, next_hash + grow))
        next_hash += grow
        chains[conv] = chain
        t += rng.expovariate(3.4)
        trace.append((t, chain))
        blocks += len(chain)
    return trace


class DictLRU:
    """The baseline: one OrderedDict LRU, no tiers, no TTL, same leading-run lookups."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def fetch(self, hashes: Sequence[int]) -> int:
        found = 0
        for h in hashes:
            if h not in self.blocks:
                break
            found += 1
        for h in reversed(hashes[:found]):
            self.blocks.move_to_end(h)
        return found

    def offload(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            if h in self.blocks:
                self.blocks.move_to_end(h)
                continue
            self.blocks[h] = None
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)


def stream_figures(trace: Trace) -> dict[str, float | int]:
    dram = get_tier("dram").with_capacity(256 << 30)  # 4,096 blocks of 64 MiB
    disk = get_tier("disk").with_capacity(1024 << 30)  # 16,384 blocks
    blocks = sum(len(h) for _, h in trace)
    store = TieredPrefixStore((dram, disk), BLOCK_BYTES, ttl=FixedTTL({"disk": 600.0}))
    start = time.perf_counter()
    hits = 0
    for t, hashes in trace:
        hits += store.fetch(hashes, t).blocks
        store.offload(hashes, t)
    ours = time.perf_counter() - start

    lru = DictLRU((256 + 1024) * (1 << 30) // BLOCK_BYTES)
    start = time.perf_counter()
    base_hits = 0
    for _, hashes in trace:
        base_hits += lru.fetch(hashes)
        lru.offload(hashes)
    base = time.perf_counter() - start
    ops = 2 * blocks  # every block is looked up once and offered once
    return {
        "stream_blocks": blocks,
        "stream_requests": len(trace),
        "store_block_ops_per_s": ops / ours,
        "dict_lru_block_ops_per_s": ops / base,
        "store_over_dict_lru_seconds": ours / base,
        "store_hit_ratio": hits / blocks,
        "dict_lru_hit_ratio": base_hits / blocks,
        "store_microseconds_per_block_op": 1e6 * ours / ops,
    }


def search_figures(trace: Trace, source: str, quick: bool) -> dict[str, float | int | str]:
    evaluator = ReplayEvaluator(
        trace,
        BLOCK_BYTES,
        prefill_seconds_per_block=0.05,
        decode_seconds_per_request=0.5,
        gpu_price_per_hour=3.0,
        dram=get_tier("dram"),
        disk=get_tier("disk"),
    )
    dram_max, disk_max = (2048, 2400) if quick else (4096, 3600)
    fine = [
        SearchAxis.of("dram_gib", 0, dram_max, 256),
        SearchAxis.of("disk_gib", 0, disk_max, 300),
    ]
    coarse = [
        SearchAxis.of("dram_gib", 0, dram_max // 2, 512, min_step=256, limit=dram_max),
        SearchAxis.of("disk_gib", 0, disk_max * 2 // 3, 600, min_step=300, limit=disk_max),
    ]
    start = time.perf_counter()
    grid = grid_search(evaluator, fine)
    grid_s = time.perf_counter() - start
    start = time.perf_counter()
    adaptive = adaptive_pareto_search(
        evaluator, coarse, expand_threshold=0.02, perf_threshold=0.02, cost_threshold=0.01
    )
    adaptive_s = time.perf_counter() - start
    # One reference point strictly worse than every evaluated configuration (§5.3.1).
    every = [e.objectives.as_minimization() for e in grid.evaluations + adaptive.evaluations]
    ref = [max(p[k] for p in every) * 1.1 + 1e-9 if k != 1 else 0.0 for k in range(3)]
    hv_grid = hypervolume([e.objectives.as_minimization() for e in grid.front], ref)
    hv_adaptive = hypervolume([e.objectives.as_minimization() for e in adaptive.front], ref)
    return {
        "search_trace": source,
        "search_requests": len(trace),
        "grid_evaluations": len(grid.evaluations),
        "adaptive_evaluations": len(adaptive.evaluations),
        "adaptive_over_grid_evaluations": len(adaptive.evaluations) / len(grid.evaluations),
        "grid_seconds": grid_s,
        "adaptive_seconds": adaptive_s,
        "adaptive_over_grid_seconds": adaptive_s / grid_s,
        "seconds_per_evaluation": grid_s / len(grid.evaluations),
        "grid_front_size": len(grid.front),
        "adaptive_front_size": len(adaptive.front),
        "adaptive_over_grid_hypervolume": hv_adaptive / hv_grid if hv_grid else 0.0,
    }


def main() -> None:
    args = parse_args(__doc__ or "")
    total = 100_000 if args.quick else 1_000_000
    figures: dict[str, float | int | str] = {}
    figures.update(stream_figures(synthetic_stream(total)))
    requests = 600 if args.quick else 2000
    if MOONCAKE.is_file():
        with MOONCAKE.open() as f:
            rows = [json.loads(line) for _, line in zip(range(requests), f, strict=False)]
        trace: Trace = [(r["timestamp"] / 1000.0, r["hash_ids"]) for r in rows]
        source = "mooncake-fast25-conversation"
    else:
        trace = synthetic_stream(24 * requests, seed=1)
        source = "synthetic (Mooncake trace not found at ../shared/traces)"
    figures.update(search_figures(trace, source, args.quick))
    write_result("tiers", figures, args.out)


if __name__ == "__main__":
    main()
