"""One call from a workload, a model, a GPU and a stack to a result."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from kvpolicy.kvmodel import GPUSpec, ModelSpec, Request
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._engine import Engine, ProgressFn, RunRecord, pool_capacity_tokens
from kvpolicy.sim._metrics import Summary, summarize
from kvpolicy.sim._parts import build_gateway, build_tiers
from kvpolicy.sim._stack import Stack, build_stack
from kvpolicy.sim._timing import TimingModel

__all__ = ["SimResult", "check_config", "simulate"]


@frozen(eq=False)
class SimResult:
    """The outcome of :func:`simulate`."""

    stack: str
    """Stack name."""
    workload: str
    """Workload name."""
    model: str
    """Model name."""
    gpu: str
    """GPU name."""
    summary: Summary
    """The figures."""
    record: RunRecord
    """The raw per-request times and time series (for plots)."""


def _engine(
    requests: Sequence[Request],
    model: ModelSpec,
    gpu: GPUSpec,
    cfg: StackConfig,
    built: Stack,
    timing: TimingModel | None,
    attention: AttentionModel | None,
    seed: int,
) -> Engine:
    tm = timing if timing is not None else TimingModel(model, gpu, **cfg.timing.constants())
    gate, store = built.gate, built.prefix_store
    if gate is None and cfg.gateway.name != "none":
        n = max(len(requests), 1)
        lengths = (
            sum(r.prompt_len for r in requests) / n if requests else 1024.0,
            sum(r.decode_len for r in requests) / n if requests else 256.0,
        )
        capacity = pool_capacity_tokens(tm, cfg.engine)
        gate = build_gateway(cfg.gateway, tm, cfg.engine, capacity, lengths)
    if store is None:
        store = build_tiers(cfg.tiers, tm, cfg.engine.block_size, requests)
    return Engine(
        tm,
        cfg.engine,
        admission=built.admission,
        eviction=built.eviction,
        eviction_config=cfg.eviction,
        preemption=built.preemption,
        preemption_config=cfg.preemption,
        attention=attention if attention is not None else cfg.attention.build(),
        seed=seed,
        gate=gate,
        gateway_config=cfg.gateway,
        prefix_store=store,
    )


def check_config(
    requests: Sequence[Request], model: ModelSpec, gpu: GPUSpec, config: StackConfig
) -> int:
    """Check that ``config`` can serve ``requests`` on ``model``/``gpu``, running nothing.

    Returns:
        How many requests will be rejected (longer than the context or the KV pool).

    Raises:
        ConfigError: an unknown policy, gateway or tier store (or a bad parameter of one),
            an eviction budget below two iterations' tokens, or no request that fits at all.
    """
    reqs = tuple(requests)
    engine = _engine(reqs, model, gpu, config, build_stack(config), None, None, 0)
    return int(engine.check_fits(reqs).sum())


def simulate(
    requests: Sequence[Request],
    model: ModelSpec,
    gpu: GPUSpec,
    config: StackConfig | None = None,
    *,
    workload_name: str = "workload",
    stack: Stack | None = None,
    timing: TimingModel | None = None,
    attention: AttentionModel | None = None,
    progress: ProgressFn | None = None,
    seed: int = 0,
) -> SimResult:
    """Serve ``requests`` on ``model``/``gpu`` with the policy stack ``config``.

    Args:
        requests: the workload, sorted by arrival time.
        model: the model served.
        gpu: the accelerator.
        config: the stack; defaults to the engine's own mechanics only.
        workload_name: name shown in reports.
        stack: prebuilt policy objects, replacing those ``config`` names (for policies
            that are not registered by name).
        timing: time model; defaults to :class:`TimingModel` of ``model`` and ``gpu``.
        attention: synthetic attention model for token eviction.
        progress: called as ``progress(done, total)``.
        seed: seed of the synthetic attention scores.

    Raises:
        ConfigError: an unknown policy, or no request fits in memory (before anything runs).
    """
    cfg = config if config is not None else StackConfig()
    built = stack if stack is not None else build_stack(cfg)
    reqs = tuple(requests)
    engine = _engine(reqs, model, gpu, cfg, built, timing, attention, seed)
    record = engine.run(reqs, progress=progress)
    return SimResult(
        stack=cfg.name,
        workload=workload_name,
        model=model.name,
        gpu=gpu.name,
        summary=summarize(record, cfg.slo, gpu),
        record=record,
    )
