"""Per-step overhead of Token-PD, H2O and LRU at 256 streams, 10^5 to 10^7 cached tokens.

One *step* is one decode iteration of a batch-global cache held at its budget: every stream
inserts one token (Token-PD with its predicted return and risk, seed 000's ``CacheInsert``)
through ``insert_many``, then ``evict(budget)`` frees as many tokens (``CacheEvict``). The
cache starts full and evicts ~256 tokens per step. Attention feedback is measured apart
(``observe`` of every resident token of every stream, one step), because it is O(cached
tokens) by nature and on a GPU comes from the attention kernel itself.

Figures: mean CPU ms per step (the process's own CPU time: the machines here are shared),
mean, median and p99 wall ms per step for each policy and size, and the ratio of each policy
to LRU (the baseline measured in the same run). Seed 000 claims < 0.9 ms per batch of 256
streams on an A100; the target here is < 1 ms for Token-PD at 10^6 tokens on this CPU.

The ``mixed`` row is Token-PD-mixed as ``kvpolicy.evict.hf.PolicyCache`` drives it: one
policy per decoder layer of SmolLM2-135M (its costs: 768, 432, 240 bytes per token at 16, 8,
4 bits), two rows whose prompts of 171 and 125 tokens are replayed token by token and then
16 decoded tokens each (insert and observe each row, then ``allocate`` at 25% of the bytes
of every token at 16 bits): CPU and wall us per ``allocate`` and per insert+observe, and the
knapsack alone on the recorded inputs of every 4th ``allocate``, ``ScaledChains.choose``
(what ``allocate`` runs) against ``choose_states`` (the general solver, same states) in the
same run.

Run: ``python benchmarks/bench_evict_overhead.py [--quick] [--mixed-only] [--out results/bench]``
(``--quick`` caps the size at 10^6 and drives 4 layers in the mixed row instead of 30;
``--mixed-only`` measures the mixed row alone).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import numpy as np
from _harness import parse_args, write_result

from kvpolicy.evict import (
    H2OPolicy,
    LRUPolicy,
    MixedConfig,
    PrecisionCosts,
    ScoredPolicy,
    TokenPDConfig,
    TokenPDMixed,
    TokenPDPolicy,
    choose_states,
)
from kvpolicy.kvmodel import ModelSpec

STREAMS = 256
WARMUP = 64
STEPS = 384


def _signals(rng: np.random.Generator, n: int) -> np.ndarray:
    # Heavy-tailed returns, as attention mass is; risk from a 50% coefficient of variation.
    r = rng.pareto(1.5, n) * 1e-4
    return np.column_stack((r, (0.5 * r) ** 2))


def _build(name: str, total: int, rng: np.random.Generator) -> ScoredPolicy:
    per = total // STREAMS
    policy: ScoredPolicy
    if name == "token-pd":
        policy = TokenPDPolicy(TokenPDConfig(num_sink=4, recent_window=16))
    elif name == "h2o":
        policy = H2OPolicy(recent_window=64, num_sink=4)
    else:
        policy = LRUPolicy()
    pos = np.arange(per, dtype=np.int64)
    for s in range(STREAMS):
        policy.insert(f"req{s}", pos, _signals(rng, per) if name == "token-pd" else None)
        if name != "token-pd":
            policy.observe(f"req{s}", pos, rng.random(per) * 1e-3)
    return policy


def _steps(
    name: str, policy: ScoredPolicy, total: int, rng: np.random.Generator
) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each measured step (CPU time excludes time other
    processes on a shared machine take from this one)."""
    per = total // STREAMS
    names = [f"req{s}" for s in range(STREAMS)]
    budget = policy.resident_tokens()
    signals = [_signals(rng, STREAMS) if name == "token-pd" else None for _ in range(2)]
    wall, cpu = [], []
    for k in range(WARMUP + STEPS):
        pos = np.full(STREAMS, per + k, dtype=np.int64)
        t0 = time.perf_counter()
        c0 = time.process_time()
        policy.insert_many(names, pos, signals[k % 2])
        policy.evict(budget)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
        assert policy.resident_tokens() <= budget
    return wall[WARMUP:], cpu[WARMUP:]


def _observe_ms(policy: ScoredPolicy, rng: np.random.Generator) -> float:
    views = [(f"req{s}", policy.resident_positions(f"req{s}")) for s in range(STREAMS)]
    att = [rng.random(p.size) / max(p.size, 1) for _, p in views]
    t0 = time.perf_counter()
    for (stream, pos), a in zip(views, att, strict=True):
        policy.observe(stream, pos, a)
    return (time.perf_counter() - t0) * 1e3


class _Recorder:
    """Stands in for a TokenPDMixed's ScaledChains: answers through it and keeps the
    inputs of every 4th call, to time the knapsack alone on them afterwards."""

    def __init__(self, chains: Any) -> None:
        self.chains = chains
        self.calls = 0
        self.inputs: list[tuple[Any, ...]] = []

    def choose(self, *args: Any) -> Any:
        if self.calls % 4 == 0:
            self.inputs.append(tuple(np.copy(a) if isinstance(a, np.ndarray) else a for a in args))
        self.calls += 1
        return self.chains.choose(*args)


def _mixed_row(layers: int) -> dict[str, float | int]:
    """Token-PD-mixed driven as PolicyCache drives it (module docstring)."""
    costs = PrecisionCosts.of(ModelSpec("SmolLM2-135M, one layer", 1, 3, 64))
    mixed = MixedConfig((16, 8, 4), costs)
    prompts, new = (171, 125), 16
    budget = 0.25 * (sum(prompts) + len(prompts) * new) * costs.token_bytes[16]
    rng = np.random.default_rng(0)
    alloc_cpu, alloc_wall, step_cpu, held_max = 0.0, 0.0, 0.0, 0
    calls = 0
    inputs: list[tuple[Any, ...]] = []
    for _ in range(layers):
        policy = TokenPDMixed(mixed=mixed)
        recorder = _Recorder(policy._chains)
        policy._chains = recorder  # type: ignore[assignment]
        held: list[list[int]] = [[] for _ in prompts]
        for i in range(max(prompts) + new):
            c0 = time.process_time()
            for r, length in enumerate(prompts):
                if i < max(prompts) - length:
                    continue
                p = len(held[r]) and held[r][-1] + 1
                policy.insert(f"row{r}", np.array([p], dtype=np.int64))
                held[r].append(p)
                att = rng.random(len(held[r])) ** 4
                policy.observe(f"row{r}", np.array(held[r], dtype=np.int64), att / att.sum())
            step_cpu += time.process_time() - c0
            t0, c0 = time.perf_counter(), time.process_time()
            changes = policy.allocate(budget)
            alloc_cpu += time.process_time() - c0
            alloc_wall += time.perf_counter() - t0
            calls += 1
            for name, (pos, bits) in changes.items():
                r = int(name[3:])
                gone = set(pos[bits == 0].tolist())
                held[r] = [q for q in held[r] if q not in gone]
            held_max = max(held_max, policy.resident_tokens())
        assert policy.resident_bytes() <= budget
        inputs += recorder.inputs
    # The knapsack alone on the recorded inputs: what allocate runs against the general
    # solver, which gives the same states.
    chains, keeps, state_cost = recorder.chains, policy._keeps, policy._state_cost
    fast, general = 0.0, 0.0
    for value, pattern, cap, order in inputs:
        c0 = time.process_time()
        got = chains.choose(value, pattern, cap, order)
        fast += time.process_time() - c0
        c0 = time.process_time()
        want = choose_states(
            value[:, None] * keeps[None, :],
            state_cost,
            cap,
            policy._patterns[pattern],
            priority=order.astype(np.float64),
        )
        general += time.process_time() - c0
        assert got is not None
        assert got.state.tolist() == want.state.tolist()
    return {
        "layers": layers,
        "allocate_calls": calls,
        "most_resident_tokens": held_max,
        "allocate_cpu_us": alloc_cpu / calls * 1e6,
        "allocate_wall_us": alloc_wall / calls * 1e6,
        "insert_observe_cpu_us": step_cpu / calls * 1e6,
        "knapsack_calls": len(inputs),
        "knapsack_chains_cpu_us": fast / len(inputs) * 1e6,
        "knapsack_choose_states_cpu_us": general / len(inputs) * 1e6,
        "knapsack_speedup": general / fast,
    }


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        lambda p: p.add_argument("--mixed-only", action="store_true", help="the mixed row alone"),
    )
    sizes = [] if args.mixed_only else [10**5, 10**6] if args.quick else [10**5, 10**6, 10**7]
    rows = []
    for total in sizes:
        row: dict[str, float | int] = {"cached_tokens": total, "streams": STREAMS}
        for name in ("lru", "h2o", "token-pd"):
            rng = np.random.default_rng(0)
            policy = _build(name, total, rng)
            wall, cpu = _steps(name, policy, total, rng)
            ms = np.asarray(wall) * 1e3
            row[f"{name}_cpu_mean_ms"] = float(np.mean(cpu) * 1e3)
            row[f"{name}_mean_ms"] = float(ms.mean())
            row[f"{name}_median_ms"] = float(np.median(ms))
            row[f"{name}_p99_ms"] = float(np.percentile(ms, 99))
            row[f"{name}_observe_all_ms"] = _observe_ms(policy, rng)
            del policy
            gc.collect()
        for name in ("h2o", "token-pd"):
            row[f"{name}_over_lru_mean"] = row[f"{name}_mean_ms"] / row["lru_mean_ms"]
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    mixed = _mixed_row(4 if args.quick else 30)
    mixed["loadavg_1min"] = os.getloadavg()[0]
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in mixed.items()})
    figures = {"steps_measured": STEPS, "warmup_steps": WARMUP, "rows": rows, "mixed": mixed}
    write_result("evict_overhead", figures, args.out)


if __name__ == "__main__":
    main()
