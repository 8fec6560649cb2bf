"""One call from a workload, a model, a GPU and a stack to a result."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from attrs import frozen

from kvpolicy.kvmodel import (
    AUTOSCALING,
    ROUTING,
    Autoscaler,
    GPUSpec,
    ModelSpec,
    RegistryError,
    Request,
    Router,
    ServerContext,
    build,
    describe,
    get_gpu,
    get_model,
    names,
)
from kvpolicy.sim._attention import AttentionModel
from kvpolicy.sim._config import (
    EngineConfig,
    FleetConfig,
    GatewayConfig,
    PolicyChoice,
    StackConfig,
    TiersConfig,
)
from kvpolicy.sim._engine import Engine, ProgressFn, RunRecord, pool_capacity_tokens
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._fleet import EngineFactory, Fleet, FleetRecord, summarize_fleet
from kvpolicy.sim._metrics import Summary, summarize
from kvpolicy.sim._sizing import server_capacity, slo_capacity, slot_kv_tokens
from kvpolicy.sim._stack import Stack, build_stack
from kvpolicy.sim._timing import TimingModel
from kvpolicy.tenancy import RefreshConfig, Resources

__all__ = [
    "SimResult",
    "autoscaler_sizing",
    "check_config",
    "fleet_parts",
    "server_capacity",
    "server_context",
    "simulate",
]


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
    notes: tuple[str, ...] = ()
    """What the workload's loader noted (fallbacks, rows fixed or skipped, pooled clients)."""
    fleet: FleetRecord | None = None
    """The replicas of a fleet run (None: one engine)."""


def _typical_lengths(requests: Sequence[Request], limit: int) -> tuple[float, float]:
    """Mean prompt and output length of the requests that can run (at most ``limit``
    tokens), with the longest 1% left out so that a few huge rows don't set the rate."""
    fits = sorted(
        (r.total_len, r.prompt_len, r.decode_len) for r in requests if r.total_len <= limit
    )
    if not fits:
        return 1024.0, 256.0
    keep = fits[: max(1, len(fits) - len(fits) // 100)]
    return (
        sum(p for _, p, _ in keep) / len(keep),
        sum(d for _, _, d in keep) / len(keep),
    )


def server_context(
    requests: Sequence[Request], timing: TimingModel, engine: EngineConfig
) -> ServerContext:
    """The server a stack's gateway and tiers are built for: ``timing``'s model on its GPU
    with ``engine``'s pool, serving ``requests``: the typical lengths of those that can run
    (the longest 1% aside) size its sustained tokens per second."""
    capacity = pool_capacity_tokens(timing, engine)
    prompt, output = _typical_lengths(requests, min(timing.model.max_context, capacity))
    return ServerContext(
        model=timing.model,
        block_size=engine.block_size,
        kv_capacity_tokens=capacity,
        max_batch=engine.max_batch,
        tokens_per_s=server_capacity(timing, engine, capacity, prompt, output),
        requests=tuple(requests),
    )


def _engine(
    requests: Sequence[Request],
    model: ModelSpec,
    gpu: GPUSpec,
    cfg: StackConfig,
    built: Stack | None,
    timing: TimingModel | None,
    attention: AttentionModel | None,
    seed: int,
) -> Engine:
    tm = timing if timing is not None else TimingModel(model, gpu, **cfg.timing.constants())
    context = None
    if cfg.gateway.name != "none" or cfg.tiers.name != "none":
        context = server_context(requests, tm, cfg.engine)
    if built is None:
        built = build_stack(cfg, context)
    else:
        # Prebuilt policies; the gateway and tiers the stack file names fill what is missing.
        part = build_stack(
            attrs.evolve(StackConfig(), gateway=cfg.gateway, tiers=cfg.tiers), context
        )
        built = attrs.evolve(
            built,
            gate=built.gate if built.gate is not None else part.gate,
            prefix_store=built.prefix_store
            if built.prefix_store is not None
            else part.prefix_store,
        )
    return Engine(
        tm,
        cfg.engine,
        built,
        eviction_config=cfg.eviction,
        preemption_config=cfg.preemption,
        gateway_config=cfg.gateway,
        slo_config=cfg.slo,
        attention=attention if attention is not None else cfg.attention.build(),
        seed=seed,
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
    if config.fleet != FleetConfig():
        parts = fleet_parts(reqs, model, gpu, config, None, None, 0)
        return int(parts[0](0).check_fits(reqs).sum())
    engine = _engine(reqs, model, gpu, config, None, None, None, 0)
    return int(engine.check_fits(reqs).sum())


def _fleet_policy(
    field: str,
    group: Any,
    choice: PolicyChoice,
    context: ServerContext,
    sized: dict[str, object] | None = None,
) -> Any:
    """Build ``choice`` of ``group``; ``sized`` gives the params the simulator knows (a
    replica's rate at the SLO) to an implementation that accepts them and was not given
    them."""
    known = names(group)
    if choice.name not in known:
        raise ConfigError(
            f"{field}: unknown {group.kind} {choice.name!r}; known: {', '.join(known)}"
        )
    params = dict(choice.params)
    if sized:
        accepted = {spec.name for spec in describe(group, choice.name)}
        for key, value in sized.items():
            if key in accepted and key not in params:
                params[key] = value
    try:
        return build(group, choice.name, params, context=context)
    except RegistryError as exc:
        raise ConfigError(f"{field}: {exc}") from exc


def autoscaler_sizing(
    requests: Sequence[Request], timing: TimingModel, cfg: StackConfig
) -> dict[str, object]:
    """What an autoscaler sizes one replica by, from the time model at the stack's SLO
    (:func:`~kvpolicy.sim._sizing.slo_capacity` for the workload's typical lengths, the
    longest 1% aside, each slot holding the KV its requests hold over their time in it):
    ``per_replica_tokens_per_s`` (the planner's), ``replica`` (the token pool's
    tokens/s, KV bytes and concurrency) and ``kv_fill`` (the share of the KV bytes its
    requests hold at that rate, the token pool's KV dimension), given to an autoscaler that
    accepts them when the stack file does not set them."""
    capacity = pool_capacity_tokens(timing, cfg.engine)
    limit = min(timing.model.max_context, capacity)
    prompt, output = _typical_lengths(requests, limit)
    fits = sorted(
        (r.total_len, r.prompt_len, r.decode_len) for r in requests if r.total_len <= limit
    )
    typical = fits[: max(1, len(fits) - len(fits) // 100)]  # the longest 1% aside, as above
    slot = slot_kv_tokens((p, d) for _, p, d in typical) or None
    at_slo = slo_capacity(
        timing, cfg.engine, capacity, prompt, output, cfg.slo, slot_kv_tokens=slot
    )
    return {
        "per_replica_tokens_per_s": at_slo.tokens_per_s,
        "replica": Resources(
            tokens_per_s=at_slo.tokens_per_s,
            kv_bytes=capacity * timing.model.kv_bytes_per_token(),
            concurrency=at_slo.concurrency,
        ),
        "kv_fill": at_slo.kv_fill,
    }


def _spec(field: str, value: str | None, default: Any, lookup: Any) -> Any:
    if value is None:
        return default
    try:
        return lookup(value)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{field}: {exc}") from exc


def fleet_parts(
    requests: Sequence[Request],
    model: ModelSpec,
    gpu: GPUSpec,
    cfg: StackConfig,
    timing: TimingModel | None,
    attention: AttentionModel | None,
    seed: int,
) -> tuple[EngineFactory, Router, Autoscaler | None, Stack]:
    """What a fleet run of ``cfg.fleet`` is built from, checked before anything runs: the
    engine of each replica (its own policies; the gateway is the fleet's), the router,
    the autoscaler and the fleet's gateway (in a :class:`Stack`, ``gate`` alone).

    Each distinct replica spec is built once here, so a model that does not fit its GPU,
    an unknown preset, router or autoscaler (the known ones listed) is a
    :class:`ConfigError` naming the field.
    """
    fleet = cfg.fleet
    reqs = tuple(requests)
    per_replica = attrs.evolve(cfg, gateway=GatewayConfig())
    specs: list[tuple[ModelSpec, GPUSpec]] = []
    for i, spec in enumerate(fleet.specs):
        m = _spec(f"fleet.specs[{i}].model", spec.model, model, get_model)
        g = _spec(f"fleet.specs[{i}].gpu", spec.gpu, gpu, get_gpu)
        specs.append((m, g))

    def engines(k: int) -> Engine:
        if not specs:
            return _engine(reqs, model, gpu, per_replica, None, timing, attention, seed)
        m, g = specs[k % len(specs)]
        try:
            return _engine(reqs, m, g, per_replica, None, None, attention, seed)
        except ConfigError as exc:
            raise ConfigError(f"fleet.specs[{k % len(specs)}]: {exc}") from exc

    for k in range(max(1, len(specs))):
        engines(k)  # every spec fits its GPU, every policy builds
    first = engines(0)
    context = server_context(reqs, first.timing, cfg.engine)
    router = _fleet_policy("fleet.router", ROUTING, fleet.router, context)
    autoscaler = None
    if fleet.autoscaler.name != "none":
        sized = autoscaler_sizing(reqs, first.timing, cfg)
        autoscaler = _fleet_policy(
            "fleet.autoscaler", AUTOSCALING, fleet.autoscaler, context, sized
        )
    gate = None
    if cfg.gateway.name != "none":
        # One gateway for the fleet, sized for the replicas it starts with.
        n = fleet.replicas
        scaled = attrs.evolve(
            context,
            kv_capacity_tokens=context.kv_capacity_tokens * n,
            max_batch=context.max_batch * n,
            tokens_per_s=context.tokens_per_s * n,
        )
        only_gate = attrs.evolve(StackConfig(), gateway=cfg.gateway, tiers=TiersConfig())
        gate = build_stack(only_gate, scaled).gate
    return engines, router, autoscaler, Stack(gate=gate)


def _simulate_fleet(
    reqs: tuple[Request, ...],
    model: ModelSpec,
    gpu: GPUSpec,
    cfg: StackConfig,
    timing: TimingModel | None,
    attention: AttentionModel | None,
    progress: ProgressFn | None,
    seed: int,
) -> tuple[FleetRecord, Summary]:
    engines, router, autoscaler, front = fleet_parts(reqs, model, gpu, cfg, timing, attention, seed)
    refresh = None
    if cfg.gateway.refresh_s > 0:
        refresh = RefreshConfig(
            window_s=cfg.gateway.refresh_s, ttft_s=cfg.slo.ttft_s, tpot_s=cfg.slo.tpot_s
        )
    record = Fleet(
        engines,
        router,
        cfg.fleet,
        autoscaler=autoscaler,
        gate=front.gate,
        gateway_config=cfg.gateway,
        refresh=refresh,
    ).run(reqs, progress=progress)
    return record, summarize_fleet(record, cfg.slo, gpu)


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
    notes: Sequence[str] = (),
) -> SimResult:
    """Serve ``requests`` on ``model``/``gpu`` with the policy stack ``config``.

    A ``config`` whose ``fleet`` section differs from the default runs a fleet of
    replicas (:class:`~kvpolicy.sim.Fleet`); the result then carries its replicas.

    Args:
        requests: the workload, sorted by arrival time.
        model: the model served.
        gpu: the accelerator.
        config: the stack; defaults to the engine's own mechanics only.
        workload_name: name shown in reports.
        stack: prebuilt policy objects, replacing those ``config`` names (for policies
            that are not registered by name; one engine only).
        timing: time model; defaults to :class:`TimingModel` of ``model`` and ``gpu``.
        attention: synthetic attention model for token eviction.
        progress: called as ``progress(done, total)``.
        seed: seed of the synthetic attention scores.
        notes: the workload's notes, carried into the result (and its reports).

    Raises:
        ConfigError: an unknown policy, router or autoscaler, a replica spec that does not
            fit its GPU, or no request fits in memory (before anything runs).
    """
    cfg = config if config is not None else StackConfig()
    reqs = tuple(requests)
    if cfg.fleet != FleetConfig():
        if stack is not None:
            raise ConfigError("'stack' (prebuilt policies) runs one engine, not a fleet")
        fleet, summary = _simulate_fleet(reqs, model, gpu, cfg, timing, attention, progress, seed)
        return SimResult(
            stack=cfg.name,
            workload=workload_name,
            model=model.name,
            gpu=gpu.name,
            summary=summary,
            record=fleet.record,
            notes=tuple(notes),
            fleet=fleet,
        )
    engine = _engine(reqs, model, gpu, cfg, stack, timing, attention, seed)
    record = engine.run(reqs, progress=progress)
    return SimResult(
        stack=cfg.name,
        workload=workload_name,
        model=model.name,
        gpu=gpu.name,
        summary=summarize(record, cfg.slo, gpu),
        record=record,
        notes=tuple(notes),
    )
