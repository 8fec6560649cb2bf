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
import os
import pathlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvpolicy.kvmodel import AdmissionPolicy, CompletionObserver, SchedulerState
from kvpolicy.kvmodel import Request as KVRequest
from kvpolicy.vllm._config import load_config
from kvpolicy.vllm._errors import ConfigError
from kvpolicy.vllm._harness import WorkloadRequest, make_scheduler, run_workload

__all__ = ["SUITE", "crosscheck", "load_workload", "markdown_table", "run_suite", "spearman"]


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


def _request(
    i: int, prompt_len: int, max_tokens: int, arrival_step: int, prefix: int = 0, prefix_id: int = 0
) -> WorkloadRequest:
    # Token ids: the shared prefix is prefix_id + 1 repeated, the rest the request's own id.
    shared = [prefix_id + 1] * prefix
    own = [i % 997 + 3] * (prompt_len - len(shared))
    return WorkloadRequest(str(i), shared + own, max_tokens, arrival_step)


def _int(spec: str, part: str, name: str) -> int:
    try:
        return int(part)
    except ValueError:
        raise ConfigError(f"'--workload' {spec!r}: {name} must be an integer: {part!r}") from None


def _synthetic(spec: str, parts: list[str]) -> list[WorkloadRequest]:
    kind = parts[0]
    n = _int(spec, parts[1], "N") if len(parts) > 1 else 0
    seed = _int(spec, parts[2], "SEED") if len(parts) > 2 else 0
    gap = float(parts[3]) if len(parts) > 3 else 0.0
    if n < 1 or gap < 0 or len(parts) > 4:
        raise ConfigError(f"'--workload' must be {kind}:N[:SEED[:GAP]] with N >= 1: {spec!r}")
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        if kind == "uniform":
            prompt, tokens = rng.randint(16, 1024), rng.randint(16, 512)
            out.append(_request(i, prompt, tokens, int(t)))
        else:
            prompt, tokens = 256 + rng.randint(16, 512), rng.randint(16, 400)
            out.append(_request(i, prompt, tokens, int(t), prefix=256, prefix_id=i % 4))
        if gap > 0:
            t += rng.expovariate(1.0 / gap)
    return out


def _trace(spec: str, parts: list[str]) -> list[WorkloadRequest]:
    if len(parts) < 4:
        raise ConfigError(f"'--workload' must be trace:N:STEP_MS:PATH: {spec!r}")
    n = _int(spec, parts[1], "N")
    step_ms = float(parts[2])
    path = pathlib.Path(":".join(parts[3:]))
    if n < 0 or step_ms < 0:
        raise ConfigError(f"'--workload' {spec!r}: N and STEP_MS must be >= 0")
    if not path.exists():
        raise ConfigError(f"'--workload' {spec!r}: trace file not found: {path}")
    loads = importlib.import_module("kvpolicy.sim.workloads")
    trace = loads.load_trace(path, limit=n or None)
    return [
        _request(
            i,
            r.prompt_len,
            r.decode_len,
            int(r.arrival_time * 1000.0 / step_ms) if step_ms > 0 else 0,
        )
        for i, r in enumerate(trace.requests)
    ]


def load_workload(spec: str) -> list[WorkloadRequest]:
    """The explicit requests of a workload spec.

    - ``uniform:N[:SEED[:GAP]]``: prompts 16-1024, outputs 16-512 tokens, distinct.
    - ``shared:N[:SEED[:GAP]]``: prompts of 256 tokens shared by one of 4 groups (request
      ``i`` in group ``i % 4``) and 16-512 of their own, outputs 16-400 tokens.
    - ``trace:N:STEP_MS:PATH``: the first ``N`` requests (0: all) of a trace file that
      kvpolicy-sim's ``load_trace`` reads (e.g. the Azure conversation trace): its prompt
      and output lengths, and its recorded arrivals with one step lasting ``STEP_MS``
      milliseconds (0: all at step 0).
    - a JSON file of ``[{"prompt_len": .., "max_tokens": .., "prefix": .., "prefix_id": ..,
      "arrival_step": ..}]`` (``prefix``: tokens shared with every other request carrying
      the same ``prefix_id``).

    With ``GAP``, arrivals are Poisson, a mean of ``GAP`` steps apart; without, all at
    step 0.

    Raises:
        ConfigError: a malformed spec, or a file that does not exist.
    """
    parts = spec.split(":")
    if parts[0] in ("uniform", "shared"):
        return _synthetic(spec, parts)
    if parts[0] == "trace":
        return _trace(spec, parts)
    path = pathlib.Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"'--workload': neither uniform:N, shared:N, trace:N:STEP_MS:PATH nor a file: {spec!r}"
        )
    return [
        _request(
            i,
            int(row["prompt_len"]),
            int(row["max_tokens"]),
            int(row.get("arrival_step", 0)),
            prefix=int(row.get("prefix", 0)),
            prefix_id=int(row.get("prefix_id", 0)),
        )
        for i, row in enumerate(json.loads(path.read_text()))
    ]


class _CappedAdmission:
    """The scheduler's admission for the simulator: at most ``cap`` requests join per step;
    within that, ``inner``'s count (every waiting request without one)."""

    def __init__(self, cap: int, inner: AdmissionPolicy | None) -> None:
        self._cap = cap
        self._inner = inner

    def admit(self, state: SchedulerState, waiting: Sequence[KVRequest]) -> int:
        n = len(waiting) if self._inner is None else self._inner.admit(state, waiting)
        return min(n, self._cap)

    def observe_completion(self, request: KVRequest, now: float) -> None:
        inner: object = self._inner
        if isinstance(inner, CompletionObserver):
            inner.observe_completion(request, now)


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
    unbounded speed), so its clock counts vLLM's steps, idle ones included. Both sides see
    the same arrival time, the arrival step: the policies then see the same views on both
    sides (a preemption order breaks ties between requests admitted in the same step with
    the same progress by arrival time, then by request id).

    ``seconds`` gives each side's CPU time (vLLM: ``run_workload`` on the built scheduler;
    sim: ``simulate``), ``speed_ratio`` vLLM's over the simulator's.

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
    t0 = time.process_time()
    real = run_workload(sched, workload, tied_arrivals=True)
    real_s = time.process_time() - t0

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
    built = None
    if cfg.max_admissions_per_step is not None:
        # The scheduler's own cap (vLLM's max_num_active_reqs): no registered name has it.
        # A prebuilt stack replaces every policy the stack config names, so the preemption
        # order is built here too.
        built = sim.Stack(
            admission=_CappedAdmission(cfg.max_admissions_per_step, cfg.admission_policy()),
            preemption=cfg.preemption_policy(),
        )
    elif cfg.admission is not None:
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
    t0 = time.process_time()
    result = sim.simulate(
        requests, model, gpu, stack, workload_name="crosscheck", stack=built, timing=timing
    )
    sim_s = time.process_time() - t0
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
        "seconds": {"vllm": real_s, "sim": sim_s},
        "speed_ratio": real_s / sim_s if sim_s > 0 else None,
    }


_LPF = {"preemption": {"name": "least-progressed-first"}}
_COST = {"preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}}}
_RATE = {"admission": {"name": "rate-limited"}}
_CAP = {"max_admissions_per_step": 4}

SUITE: tuple[tuple[str, str, int, bool, Mapping[str, Any] | None], ...] = (
    ("uniform:400", "uniform:400", 1024, False, None),
    ("uniform:200", "uniform:200", 512, False, None),
    ("uniform:1000", "uniform:1000", 2048, False, None),
    ("uniform:400, arrivals every 8 steps", "uniform:400:0:8", 1024, False, None),
    ("uniform:400, arrivals every 3 steps", "uniform:400:0:3", 1024, False, None),
    ("uniform:1000, arrivals every 5 steps, prefix caching", "uniform:1000:0:5", 2048, True, None),
    ("uniform:400, least-progressed-first", "uniform:400", 1024, False, _LPF),
    ("shared prefixes", "shared:300:1", 768, False, None),
    ("shared prefixes, prefix caching", "shared:300:1", 768, True, None),
    ("shared prefixes, rate-limited admission", "shared:300:1", 768, False, _RATE),
    ("shared prefixes, cost-aware (attention weight 0.01)", "shared:300:1", 768, False, _COST),
    ("shared prefixes, least-progressed-first", "shared:300:1", 768, False, _LPF),
    (
        "shared prefixes, arrivals every 4 steps, prefix caching, least-progressed-first",
        "shared:300:1:4",
        768,
        True,
        _LPF,
    ),
    (
        "shared prefixes, prefix caching, at most 4 admissions per step",
        "shared:300:1",
        768,
        True,
        _CAP,
    ),
    ("Azure conv. 1,000", "trace:1000:0:{trace}", 2048, False, None),
    ("Azure conv. 1,000", "trace:1000:0:{trace}", 1024, False, None),
    (
        "Azure conv. 1,000, recorded arrivals (20 ms steps)",
        "trace:1000:20:{trace}",
        2048,
        False,
        None,
    ),
    (
        "Azure conv. 1,000, recorded arrivals (20 ms steps)",
        "trace:1000:20:{trace}",
        1024,
        False,
        None,
    ),
    ("Azure conv. 1,000, least-progressed-first", "trace:1000:0:{trace}", 1024, False, _LPF),
    (
        "Azure conv. 1,000, cost-aware (attention weight 0.01)",
        "trace:1000:0:{trace}",
        1024,
        False,
        _COST,
    ),
    ("Azure conv. 1,000, rate-limited admission", "trace:1000:0:{trace}", 1024, False, _RATE),
    (
        "Azure conv. 1,000, at most 4 admissions per step, least-progressed-first",
        "trace:1000:0:{trace}",
        1024,
        False,
        {**_CAP, **_LPF},
    ),
    (
        "Azure conv., all 19,366, recorded arrivals (20 ms steps)",
        "trace:0:20:{trace}",
        2048,
        False,
        None,
    ),
)
"""The cross-check table: (label, workload spec, blocks, prefix caching, kvpolicy config);
``{trace}`` stands for the trace file given to :func:`run_suite`."""


def run_suite(
    trace: str | os.PathLike[str] | None,
    *,
    log: Callable[[str], None] | None = None,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every row of :data:`SUITE` that can run: :func:`crosscheck`'s result plus ``label``
    and ``workload``. Rows on ``{trace}`` are skipped (logged) when ``trace`` is None or not
    a file. ``on_row`` gets the rows so far after each one (to save partial results)."""
    say = log or (lambda _: None)
    have_trace = trace is not None and pathlib.Path(trace).is_file()
    if not have_trace:
        say(f"trace rows skipped: no trace file at {trace!r}")
    rows = []
    for label, spec, blocks, caching, config in SUITE:
        if "{trace}" in spec:
            if not have_trace:
                continue
            spec = spec.format(trace=trace)
        out = crosscheck(load_workload(spec), blocks, prefix_caching=caching, kvpolicy=config)
        out.update(label=label, workload=spec)
        say(
            f"{label} on {blocks} blocks: preemptions {out['vllm']['preemptions']} / "
            f"{out['sim']['preemptions']}, recomputed {out['vllm']['recomputed_tokens']} / "
            f"{out['sim']['recomputed_tokens']}"
        )
        rows.append(out)
        if on_row is not None:
            on_row(rows)
    return rows


def _pct(d: float | None) -> str:
    return "n/a" if d is None else f"{d:+.1%}".replace("-", "\u2212")


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The suite's rows as the Markdown table of the package README."""
    lines = [
        "| workload | blocks | steps vLLM / sim | preemptions vLLM / sim | "
        "recomputed vLLM / sim | finish rank corr. | CPU s vLLM / sim |",
        "|---|---:|---|---|---|---:|---|",
    ]
    for r in rows:
        v, s, d = r["vllm"], r["sim"], r["relative_difference"]
        ratio = "" if r["speed_ratio"] is None else f" ({r['speed_ratio']:.0f}\u00d7)"
        lines.append(
            f"| {r['label']} | {r['num_blocks']:,} | {v['steps']:,} / {s['steps']:,} "
            f"({_pct(d['steps'])}) | {v['preemptions']:,} / {s['preemptions']:,} "
            f"({_pct(d['preemptions'])}) | {v['recomputed_tokens']:,} / "
            f"{s['recomputed_tokens']:,} ({_pct(d['recomputed_tokens'])}) | "
            f"{r['finish_rank_correlation']:.3f} | {r['seconds']['vllm']:.1f} / "
            f"{r['seconds']['sim']:.2f}{ratio} |"
        )
    return "\n".join(lines)
