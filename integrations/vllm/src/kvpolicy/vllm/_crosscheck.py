"""The simulator against vLLM's real scheduler on the same explicit requests.

The one module of kvpolicy-vllm that imports kvpolicy-sim (lazily, inside
:func:`crosscheck`), since comparing the two is its job. Both sides get the same block
size, block count (vLLM keeps one block as its null block, so the simulator's pool is
``(num_blocks - 1) * block_size`` tokens), max batch and per-step token budget, and the
same kvpolicy admission and preemption policies by name.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvpolicy.vllm._config import load_config
from kvpolicy.vllm._errors import ConfigError
from kvpolicy.vllm._harness import WorkloadRequest, make_scheduler, run_workload

__all__ = ["crosscheck", "load_workload", "spearman"]


def _ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # Ties share their mean rank.
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return np.asarray(sums[inverse] / counts[inverse], dtype=np.float64)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equally long sequences (ties: mean ranks)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"'a' and 'b' must be 1-D of equal length: {x.shape}, {y.shape}")
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return 1.0 if sx == sy else 0.0
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def load_workload(spec: str) -> list[WorkloadRequest]:
    """``uniform:N[:SEED[:GAP]]`` (prompts 16-1024, outputs 16-512 tokens, distinct; with
    ``GAP``, Poisson arrivals a mean of ``GAP`` steps apart) or a JSON file of
    ``[{"prompt_len": .., "max_tokens": .., "prefix": .., "arrival_step": ..}]``
    (``prefix``: tokens shared with every other request carrying the same ``prefix_id``)."""
    if spec.startswith("uniform:"):
        parts = spec.split(":")
        n, seed = int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
        gap = float(parts[3]) if len(parts) > 3 else 0.0
        rng = random.Random(seed)
        out, t = [], 0.0
        for i in range(n):
            prompt, tokens = rng.randint(16, 1024), rng.randint(16, 512)
            out.append(WorkloadRequest(str(i), [i % 997 + 3] * prompt, tokens, int(t)))
            if gap > 0:
                t += rng.expovariate(1.0 / gap)
        return out
    path = pathlib.Path(spec)
    if not path.is_file():
        raise ConfigError(f"'--workload': neither uniform:N nor a file: {spec!r}")
    out = []
    for i, row in enumerate(json.loads(path.read_text())):
        shared = [int(row.get("prefix_id", 0)) + 1] * int(row.get("prefix", 0))
        own = [i % 997 + 3] * (int(row["prompt_len"]) - len(shared))
        step = int(row.get("arrival_step", 0))
        out.append(WorkloadRequest(str(i), shared + own, int(row["max_tokens"]), step))
    return out


def _sim_requests(workload: Sequence[WorkloadRequest], block_size: int) -> list[Any]:
    from kvpolicy.kvmodel import Request, chain_block_hashes

    return [
        Request(
            request_id=r.request_id,
            prompt_len=len(r.prompt),
            decode_len=r.max_tokens,
            prefix_hashes=chain_block_hashes(list(r.prompt), block_size),
            hash_block_size=block_size,
            arrival_time=float(r.arrival_step),
        )
        for r in sorted(workload, key=lambda r: r.arrival_step)
    ]


def _rel(sim: float, real: float) -> float | None:
    return None if real == 0 else sim / real - 1.0


def crosscheck(
    workload: Sequence[WorkloadRequest],
    num_blocks: int,
    *,
    block_size: int = 16,
    max_batch: int = 256,
    token_budget: int = 2048,
    prefix_caching: bool = False,
    kvpolicy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Steps, preemptions and recomputed tokens of vLLM's scheduler and of kvpolicy-sim's
    ``vllm`` stack on ``workload``, their relative differences (sim / vLLM - 1) and the
    rank correlation of per-request finish steps.

    Requests may arrive over time (``arrival_step``): the simulator runs on a time model in
    which every iteration lasts exactly one second (a fixed overhead of 1 s on a device of
    unbounded speed), so its clock counts vLLM's steps, idle ones included.

    Raises:
        ConfigError: a kvpolicy config with features the simulator's stack cannot take.
    """
    cfg = load_config(dict(kvpolicy or {}))
    if cfg.tenancy is not None or cfg.block_eviction is not None:
        raise ConfigError("crosscheck: only 'admission' and 'preemption' have a sim side")
    from kvpolicy.vllm._scheduler import KVPolicyScheduler

    cls = None if kvpolicy is None else KVPolicyScheduler
    sched = make_scheduler(
        cls,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_batch,
        max_num_batched_tokens=token_budget,
        enable_prefix_caching=prefix_caching,
        kvpolicy=kvpolicy,
    )
    real = run_workload(sched, workload)

    sim = importlib.import_module("kvpolicy.sim")
    from kvpolicy.kvmodel import GPU_PRESETS, MODEL_PRESETS

    stack = sim.get_stack("vllm")
    engine = sim.EngineConfig(
        block_size=block_size,
        prefix_caching=prefix_caching,
        max_batch=max_batch,
        token_budget=token_budget,
        kv_capacity_tokens=(num_blocks - 1) * block_size,
    )
    changes: dict[str, Any] = {"engine": engine}
    if cfg.admission is not None:
        changes["admission"] = sim.AdmissionConfig(cfg.admission.name, dict(cfg.admission.params))
    if cfg.preemption is not None:
        changes["preemption"] = sim.PreemptionConfig(
            cfg.preemption.name, dict(cfg.preemption.params)
        )
    import attrs

    stack = attrs.evolve(stack, **changes)
    requests = _sim_requests(workload, block_size)
    model = MODEL_PRESETS["SmolLM2-135M"]
    # One iteration = one second exactly: arrivals at step k arrive at time k, and the
    # clock after an iteration is the number of vLLM steps done, idle ones included.
    gpu = attrs.evolve(
        GPU_PRESETS["H100-SXM"], name="unit-step", hbm_bandwidth=1e300, peak_flops=1e300
    )
    timing = sim.TimingModel(model, gpu, overhead_s=1.0)
    result = sim.simulate(requests, model, gpu, stack, workload_name="crosscheck", timing=timing)
    rec = result.record
    sim_finish = {r.request_id: float(f) for r, f in zip(rec.requests, rec.finish, strict=True)}
    ids = [r.request_id for r in workload]
    row_real = {
        "steps": real.steps,
        "preemptions": real.preemptions,
        "recomputed_tokens": real.recomputed_tokens,
    }
    row_sim = {
        "steps": round(float(rec.end_time)),
        "preemptions": int(np.asarray(rec.preemptions).sum()),
        "recomputed_tokens": int(rec.recomputed_tokens),
    }
    return {
        "requests": len(workload),
        "num_blocks": num_blocks,
        "block_size": block_size,
        "prefix_caching": prefix_caching,
        "kvpolicy": dict(kvpolicy or {}),
        "vllm": row_real,
        "sim": row_sim,
        "relative_difference": {k: _rel(row_sim[k], row_real[k]) for k in row_real},
        "finish_rank_correlation": spearman(
            [real.finish_step[i] for i in ids], [sim_finish[i] for i in ids]
        ),
    }
