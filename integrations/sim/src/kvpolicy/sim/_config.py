"""Configuration of one simulated server: engine limits and the policy stack.

A stack file is YAML with optional sections, each a component's own config::

    gateway:   {name: token-pool, params: {manifest: pools.yaml}, max_retries: 3}
    admission: {name: rate-limited, params: {cap: 5}}
    eviction:  {name: token-pd, budget_fraction: 0.5, every: 512}
    preemption: {name: least-progressed-first, mode: recompute}
    tiers:     {name: tiered, params: {dram_bytes: 64e9, disk_bytes: 1e12}}
    engine:    {block_size: 16, prefix_caching: true, max_batch: 256, token_budget: 2048}
    slo:       {ttft_s: 2.0, tpot_s: 0.1}
    timing:    {bandwidth_efficiency: 0.75, flops_efficiency: 0.55, overhead_s: 0.0005}
    attention: {file: my-fit.json}     # or {params: {sink_weight: 24.9, ...}}
    fleet:     {replicas: 4, router: prefix-aware, autoscaler: {name: threshold, params: {}}}

An unknown key anywhere is a :class:`ConfigError` naming the key and the keys allowed.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import ge, gt, in_, instance_of, le, optional

from kvpolicy.sim._errors import ConfigError

__all__ = [
    "AdmissionConfig",
    "AttentionConfig",
    "EngineConfig",
    "EvictionConfig",
    "GatewayConfig",
    "PreemptionConfig",
    "SLOConfig",
    "StackConfig",
    "TiersConfig",
    "TimingConfig",
    "load_stack",
    "stack_from_dict",
]


def _params(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"'params' must be a mapping: {value!r}")
    return dict(value)


def _int(minimum: int, default: int) -> int:
    return field(default=default, validator=[instance_of(int), ge(minimum)])


@frozen
class EngineConfig:
    """Limits of the serving engine itself (what vLLM calls its scheduler config)."""

    block_size: int = _int(1, 16)
    """Tokens per paged KV block."""
    prefix_caching: bool = field(default=True, validator=instance_of(bool))
    """Share full prompt blocks with equal prefix hashes; freed cached blocks are reused LRU."""
    max_batch: int = _int(1, 256)
    """Most running requests at once (vLLM's ``max_num_seqs``)."""
    token_budget: int = _int(1, 2048)
    """Tokens computed per iteration, decode and prefill chunks together (chunked prefill)."""
    gpu_memory_utilization: float = field(default=0.9, validator=[gt(0.0), le(1.0)])
    """Fraction of HBM the server may use; the KV pool is what is left after the weights."""
    kv_capacity_tokens: int | None = field(
        default=None, validator=optional([instance_of(int), ge(1)])
    )
    """Override of the KV pool size in tokens (``M`` of seed 002); ``None`` plans it."""
    max_macro_steps: int = _int(1, 256)
    """Most decode iterations advanced at once when nothing else happens between them."""

    def __attrs_post_init__(self) -> None:
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"'kv_capacity_tokens' must hold at least one block of {self.block_size}: "
                f"{self.kv_capacity_tokens}"
            )


@frozen
class AdmissionConfig:
    """Which admission policy decides how many waiting requests join each iteration."""

    name: str = field(default="none", validator=instance_of(str))
    """A name known to :func:`kvpolicy.sim.build_stack`; ``none`` admits while memory fits."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """Keyword arguments of the policy's constructor."""


@frozen
class EvictionConfig:
    """Which token eviction policy holds resident KV to a budget, and the budget."""

    name: str = field(default="none", validator=instance_of(str))
    """A name known to :func:`kvpolicy.sim.build_stack`; ``none`` keeps every token."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """Keyword arguments of the policy's constructor."""
    budget_fraction: float = field(default=0.5, validator=[gt(0.0), le(1.0)])
    """Resident-token budget as a fraction of the KV pool."""
    every: int | None = field(default=None, validator=optional([instance_of(int), ge(1)]))
    """The policy's cadence: it is wrapped in kvpolicy-evict's ``Periodic(policy, every)``,
    which wants a round (observe the attention accumulated since the last one, then evict)
    every ``every`` iterations. ``None`` (the default) is the bare policy: rounds only when
    the next iteration's growth would pass the budget. Either way the budget holds at every
    iteration. Attention is summed over the iterations between rounds, so accumulating
    scores (H2O, Token-PD's running return) see the same totals; a longer cadence only
    delays evictions a policy makes under its budget (Token-PD's keep rule). A request that
    lives between two rounds is never shown to the policy. 512 iterations (about 3 s of
    decode for an 8B model) keeps the policy calls to a few per request; the cost of a
    round grows with the batch."""
    idle_rounds: bool = field(default=True, validator=instance_of(bool))
    """Run the cadence's rounds while resident tokens are well under the budget. False
    runs rounds only within a quarter of the budget (or when the budget would be passed):
    far cheaper when memory is plentiful, and no policy evicts by its own rule meanwhile;
    the attention accumulated since a stream's last round is observed at once."""
    evict_ahead: int = _int(0, 16)
    """Iterations of KV growth a round leaves room for below the budget (at most a quarter
    of the budget), so that rounds under memory pressure come every ``evict_ahead``
    iterations rather than every one."""


@frozen
class PreemptionConfig:
    """Which order preempts running requests when blocks run out, and how."""

    name: str = field(default="none", validator=instance_of(str))
    """A name known to :func:`kvpolicy.sim.build_stack`; ``none`` preempts the last admitted
    first, as vLLM does."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """Keyword arguments of the policy's constructor."""
    mode: str = field(default="recompute", validator=in_(("recompute", "swap", "restart")))
    """``recompute`` drops the KV and recomputes prompt and outputs on return (vLLM);
    ``swap`` moves the KV to a CPU tier and back; ``restart`` drops the outputs too, so the
    request starts over at decode stage 0 (seed 002's eviction model, §2.2 step 3)."""
    pcie_bandwidth: float = field(default=25e9, converter=float, validator=gt(0.0))
    """Bytes per second between GPU and the CPU tier (PCIe 4.0 x16 sustains about 25 GB/s)."""
    cpu_swap_bytes: int = _int(0, 64 * 2**30)
    """Capacity of the CPU swap tier in bytes; a preemption that does not fit recomputes."""


@frozen
class GatewayConfig:
    """Which gateway answers requests before the server (429 + Retry-After), and how its
    clients retry."""

    name: str = field(default="none", validator=instance_of(str))
    """A name known to :func:`kvpolicy.sim.build_stack`; ``none`` lets every request in."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """The gateway's own settings (for ``token-pool``, kvpolicy-tenancy's manifest)."""
    max_retries: int = _int(0, 3)
    """Denials a client accepts before it gives up on a request (its retries honour each
    Retry-After)."""
    min_backoff_s: float = field(default=0.05, converter=float, validator=gt(0.0))
    """Wait of a client told to retry after 0 seconds, so that a retry is never instant."""
    refresh_s: float = field(default=0.0, converter=float, validator=ge(0.0))
    """Seconds of simulated time between two refreshes of the gateway's throughput estimate
    from the service observed at the server (:class:`kvpolicy.sim.ThroughputRefresh`);
    0 keeps the estimate the gateway was built with. Needs a gateway that can be rescaled
    (kvmodel's ``ThroughputScalable``, as ``token-pool`` is)."""


@frozen
class TiersConfig:
    """Which store keeps KV prefix blocks below HBM (DRAM, disk) once the GPU drops them."""

    name: str = field(default="none", validator=instance_of(str))
    """A name known to :func:`kvpolicy.sim.build_stack`; ``none`` loses dropped blocks (vLLM's
    GPU-only prefix cache)."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """The store's own settings (tier sizes, TTLs)."""


def _opt_fraction() -> Any:
    return field(
        default=None,
        converter=attrs.converters.optional(float),
        validator=optional([gt(0.0), le(1.0)]),
    )


@frozen
class TimingConfig:
    """Calibration constants of the roofline time model (``kvpolicy sim fit-timing`` fits
    them to measurements); ``None`` keeps :class:`~kvpolicy.sim.TimingModel`'s default."""

    bandwidth_efficiency: float | None = _opt_fraction()
    """``eta_bw``: fraction of HBM bandwidth sustained by decode."""
    flops_efficiency: float | None = _opt_fraction()
    """``eta_f``: fraction of peak FLOP/s sustained by prefill."""
    overhead_s: float | None = field(
        default=None, converter=attrs.converters.optional(float), validator=optional(ge(0.0))
    )
    """Fixed seconds per iteration."""
    tp: int | None = field(default=None, validator=optional([instance_of(int), ge(1)]))
    """Tensor-parallel GPUs serving the model (weights and KV heads split, all-reduces
    timed); None is one GPU. The KV pool is one GPU's share."""

    def constants(self) -> dict[str, float]:
        """The constants set, as keyword arguments of :class:`~kvpolicy.sim.TimingModel`."""
        return {k: v for k, v in attrs.asdict(self).items() if v is not None}


@frozen
class AttentionConfig:
    """The synthetic attention model token eviction observes: the default fit to
    SmolLM2-135M, a fit of your own (``kvpolicy sim fit-attention --out FILE``), or
    parameters given inline."""

    file: str | None = field(default=None, validator=optional(instance_of(str)))
    """A JSON file written by ``kvpolicy sim fit-attention --out`` (relative to the working
    directory)."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """Parameters of :class:`~kvpolicy.sim.AttentionModel` (over the file's, if both)."""

    def build(self) -> Any:
        """The :class:`~kvpolicy.sim.AttentionModel`, or ``None`` for the default.

        Raises:
            ConfigError: the file cannot be read or parsed, or a parameter is unknown or
                out of range (named).
        """
        if self.file is None and not self.params:
            return None
        from kvpolicy.sim._attention import AttentionModel

        data: dict[str, Any] = {}
        try:
            if self.file is not None:
                data = AttentionModel.from_json(
                    pathlib.Path(self.file).read_text(encoding="utf-8")
                ).to_dict()
            return AttentionModel.from_dict({**data, **self.params})
        except (OSError, TypeError, ValueError) as exc:
            where = f"attention file {self.file!r}" if self.file else "attention.params"
            raise ConfigError(f"{where}: {exc}") from exc


@frozen
class SLOConfig:
    """Latency targets a request must meet to count as served within its SLO."""

    ttft_s: float = field(default=2.0, converter=float, validator=gt(0.0))
    """Time to first token, seconds."""
    tpot_s: float = field(default=0.1, converter=float, validator=gt(0.0))
    """Mean time per output token after the first, seconds."""


def _non_negative_finite(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"'{attribute.name}' must be a finite number >= 0: {value!r}")


@frozen
class PolicyChoice:
    """A policy of the fleet found by name (a router or an autoscaler) and its params."""

    name: str = field(validator=instance_of(str))
    """Entry-point name (``round-robin``, ``prefix-aware``, ``threshold``, ...)."""
    params: dict[str, Any] = field(factory=dict, converter=_params)
    """Keyword parameters of the policy."""


def _choice(value: object) -> PolicyChoice:
    """A policy given by name or as ``{name, params}``."""
    if isinstance(value, PolicyChoice):
        return value
    if isinstance(value, str):
        return PolicyChoice(value)
    if isinstance(value, Mapping):
        extra = sorted(set(map(str, value)) - {"name", "params"})
        if extra:
            raise ValueError(f"unknown key {extra[0]!r}; allowed: name, params")
        if "name" not in value:
            raise ValueError(f"a policy needs a 'name': {dict(value)!r}")
        return PolicyChoice(value["name"], value.get("params") or {})
    raise TypeError(f"must be a name or {{name, params}}: {value!r}")


@frozen
class ReplicaSpec:
    """The model and GPU of some replicas of a heterogeneous fleet (preset names)."""

    model: str | None = field(default=None, validator=optional(instance_of(str)))
    """Model preset (None: the run's model)."""
    gpu: str | None = field(default=None, validator=optional(instance_of(str)))
    """GPU preset (None: the run's GPU)."""


def _specs(value: object) -> tuple[ReplicaSpec, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"'specs' must be a list of {{model, gpu}}: {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, ReplicaSpec):
            out.append(item)
        elif isinstance(item, Mapping):
            extra = sorted(set(map(str, item)) - {"model", "gpu"})
            if extra:
                raise ValueError(f"'specs[{i}]': unknown key {extra[0]!r}; allowed: model, gpu")
            out.append(ReplicaSpec(**item))
        else:
            raise TypeError(f"'specs[{i}]' must be a mapping {{model, gpu}}: {item!r}")
    return tuple(out)


@frozen
class FleetConfig:
    """A fleet of replicas of the engine behind one front door and one router.

    Replica ``k`` (in start order) runs ``specs[k % len(specs)]``; without specs every
    replica serves the run's model on its GPU.
    """

    replicas: int = _int(1, 1)
    """Replicas serving at the start (with an autoscaler, its starting count)."""
    specs: tuple[ReplicaSpec, ...] = field(default=(), converter=_specs)
    """Model and GPU of the replicas, in turn (empty: the run's)."""
    router: PolicyChoice = field(default=PolicyChoice("round-robin"), converter=_choice)
    """Which replica serves each admitted request (``kvpolicy.routing``)."""
    autoscaler: PolicyChoice = field(default=PolicyChoice("none"), converter=_choice)
    """How many replicas the fleet should have (``kvpolicy.autoscaling``; ``none``: fixed)."""
    min_replicas: int = _int(1, 1)
    """Fewest replicas an autoscaler may ask for."""
    max_replicas: int | None = field(default=None, validator=optional([instance_of(int), ge(1)]))
    """Most replicas an autoscaler may ask for (None: no bound but the autoscaler's)."""
    signal_delay_s: float = field(default=0.0, converter=float, validator=_non_negative_finite)
    """Age of the replica views the router and the autoscaler see, seconds (a scrape's lag)."""
    decision_interval_s: float = field(default=30.0, converter=float, validator=gt(0.0))
    """Seconds between two decisions of the autoscaler."""
    load_bandwidth: float = field(default=2e9, converter=float, validator=gt(0.0))
    """Bytes per second at which a new replica loads its model's weights."""
    startup_s: float = field(default=30.0, converter=float, validator=_non_negative_finite)
    """Seconds a new replica takes to start besides loading its weights."""
    reclaim_draining: bool = field(default=False, validator=instance_of(bool))
    """Whether a rise of the autoscaler's target takes draining replicas back (those with
    the most requests still on them first) before starting new ones: they serve again at
    once, where a new replica serves after its provisioning delay and holds one more GPU."""

    def __attrs_post_init__(self) -> None:
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"'min_replicas' ({self.min_replicas}) must be <= 'max_replicas' "
                f"({self.max_replicas})"
            )
        if self.autoscaler.name != "none":
            if self.replicas < self.min_replicas:
                raise ValueError(
                    f"'replicas' ({self.replicas}) must be >= 'min_replicas' ({self.min_replicas})"
                )
            if self.max_replicas is not None and self.replicas > self.max_replicas:
                raise ValueError(
                    f"'replicas' ({self.replicas}) must be <= 'max_replicas' ({self.max_replicas})"
                )


@frozen
class StackConfig:
    """A whole policy stack: engine limits, admission, eviction, preemption, SLO."""

    name: str = field(default="stack", validator=instance_of(str))
    """Display name in tables and reports."""
    engine: EngineConfig = field(factory=EngineConfig, validator=instance_of(EngineConfig))
    """Engine limits."""
    admission: AdmissionConfig = field(
        factory=AdmissionConfig, validator=instance_of(AdmissionConfig)
    )
    """Admission policy."""
    eviction: EvictionConfig = field(factory=EvictionConfig, validator=instance_of(EvictionConfig))
    """Token eviction policy and budget."""
    preemption: PreemptionConfig = field(
        factory=PreemptionConfig, validator=instance_of(PreemptionConfig)
    )
    """Preemption order and mode."""
    slo: SLOConfig = field(factory=SLOConfig, validator=instance_of(SLOConfig))
    """Latency targets."""
    gateway: GatewayConfig = field(factory=GatewayConfig, validator=instance_of(GatewayConfig))
    """Gateway in front of the server and its clients' retries."""
    tiers: TiersConfig = field(factory=TiersConfig, validator=instance_of(TiersConfig))
    """Prefix tiers below HBM."""
    timing: TimingConfig = field(factory=TimingConfig, validator=instance_of(TimingConfig))
    """Calibration of the time model."""
    attention: AttentionConfig = field(
        factory=AttentionConfig, validator=instance_of(AttentionConfig)
    )
    """Synthetic attention model for token eviction."""
    fleet: FleetConfig = field(factory=FleetConfig, validator=instance_of(FleetConfig))
    """Replicas, router and autoscaler (one replica: the single engine)."""


_SECTIONS: dict[str, type] = {
    "engine": EngineConfig,
    "admission": AdmissionConfig,
    "eviction": EvictionConfig,
    "preemption": PreemptionConfig,
    "slo": SLOConfig,
    "gateway": GatewayConfig,
    "tiers": TiersConfig,
    "timing": TimingConfig,
    "attention": AttentionConfig,
    "fleet": FleetConfig,
}


_MOVED: dict[tuple[str, str], str] = {
    ("eviction", "interval"): (
        "eviction.interval is no longer a setting of the simulator: cadence is the policy's "
        "wrapper (kvpolicy-evict's Periodic). Write 'every: {value}' instead "
        "(eviction: {{name: ..., every: {value}}}), or leave it out for rounds only when "
        "the budget needs one"
    ),
}
"""Keys of earlier stack files, with what to write instead."""


def _build(cls: type, section: str, raw: object) -> Any:
    if raw is None:
        return cls()
    if isinstance(raw, str) and "name" in {a.name for a in attrs.fields(cls)}:
        return cls(name=raw)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"stack section {section!r} must be a mapping: {raw!r}")
    allowed = [a.name for a in attrs.fields(cls)]
    for key in raw:
        moved = _MOVED.get((section, str(key)))
        if moved is not None:
            raise ConfigError(moved.format(value=raw[key]))
        if key not in allowed:
            raise ConfigError(
                f"unknown key {section}.{key!s} in stack; allowed: {', '.join(allowed)}"
            )
    try:
        return cls(**raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"stack section {section!r}: {exc}") from exc


def stack_from_dict(data: Mapping[str, Any], *, name: str | None = None) -> StackConfig:
    """Build a :class:`StackConfig` from a parsed stack file.

    Raises:
        ConfigError: an unknown key (named with its section) or a bad value.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"a stack must be a mapping: {data!r}")
    allowed = ["name", *_SECTIONS]
    for key in data:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!s} in stack; allowed: {', '.join(allowed)}")
    parts = {s: _build(cls, s, data.get(s)) for s, cls in _SECTIONS.items()}
    stack_name = name if name is not None else data.get("name", "stack")
    if not isinstance(stack_name, str):
        raise ConfigError(f"stack 'name' must be a string: {stack_name!r}")
    return StackConfig(name=stack_name, **parts)


def load_stack(path: str | pathlib.Path) -> StackConfig:
    """Read a YAML stack file; its name defaults to the file's stem.

    Raises:
        ConfigError: the file is not valid YAML, or has an unknown key or a bad value.
        FileNotFoundError: no such file.
    """
    from kvpolicy.tenancy import ManifestError, load_yaml

    p = pathlib.Path(path)
    text = p.read_text(encoding="utf-8")
    try:  # the safe loader refuses aliases (a bomb) and duplicate keys
        data = load_yaml(text, str(p))
    except ManifestError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: a stack file must hold a mapping, got {type(data).__name__}")
    try:
        return stack_from_dict(data, name=data.get("name", p.stem))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
