"""The gateway and the prefix tiers of a stack, built for one model on one engine.

Both need the server they sit in front of (the gateway) or below (the tiers): KV bytes per
token, the KV pool and the engine's throughput. The simulator holds no policy of its own:
the gateway is kvpolicy-tenancy's :class:`~kvpolicy.tenancy.TokenPoolGate` and the store
kvpolicy-tiers' :class:`~kvpolicy.tiers.TieredPrefixStore`; this module only translates a
stack file's ``params`` into their constructors.

``gateway: {name: token-pool, params: ...}`` takes either

- ``manifest``: a kvpolicy-tenancy manifest (a path or an inline mapping) in absolute units;
- or ``tenants``: baselines as *shares* of this server's capacity, which then need no
  numbers that depend on the model and the GPU::

      tenants:
        chat:      {service_class: guaranteed, share: 0.3, slo_target_s: 2.0}
        long-tail: {service_class: spot, share: 0.1, burst_share: 0.5}
      default: {service_class: spot, share: 0.1}   # tenants not named (optional)

  The pool's capacity is the server's: its KV pool in bytes, ``max_batch`` sequences, and
  ``tokens_per_s`` (default: the roofline's sustained rate for the workload's mean prompt and
  output lengths, see :func:`server_capacity`).
  An entitlement's baseline is ``share`` of each; its burst limits ``burst_share`` of each
  (classes that burst only; default: the whole pool).

and optionally the gate's settings (``window_s``, ``update_interval_s``, ``min_retry_s``,
``max_retry_s``). ``tiers: {name: tiered, params: {dram_gib: 64, disk_gib: 512, ttl_s: ...}}``
puts DRAM (and disk, when ``disk_gib`` > 0) below HBM; ``ttl_s`` is one TTL for every tier
or a mapping of tier name to seconds (default: no expiry, LRU only). ``group_ttl`` instead
gives the slowest tier (disk; DRAM when it is the only one) seed 003's ROI-aware per-group
TTLs (Algorithm 2)::

    tiers: {name: tiered, params: {dram_gib: 16, disk_gib: 256,
            group_ttl: {budget_block_s: 2.0e6, top_k: 8, depth: 2, fit_fraction: 0.5}}}

The groups and their TTLs are fitted on the first ``fit_fraction`` of the workload's
requests that carry prefix hashes (a trace of arrival times and block chains), within a
storage budget of ``budget_block_s`` block-seconds in that tier; the simulator shows the store
every prompt's chain as it arrives, so each block gets its group's TTL.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from kvpolicy.kvmodel import PrefixStore, Request, RequestGate
from kvpolicy.sim._config import EngineConfig, GatewayConfig, TiersConfig
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._timing import TimingModel

__all__ = ["GATEWAY_NAMES", "TIERS_NAMES", "build_gateway", "build_tiers", "server_capacity"]

GATEWAY_NAMES: tuple[str, ...] = ("none", "token-pool")
"""Gateway names (``token-pool`` needs kvpolicy-tenancy)."""

TIERS_NAMES: tuple[str, ...] = ("none", "tiered")
"""Prefix tier names (``tiered`` needs kvpolicy-tiers)."""

_GATE_SETTINGS = ("window_s", "update_interval_s", "min_retry_s", "max_retry_s")
_SHARE_KEYS = ("service_class", "share", "burst_share", "slo_target_s", "max_output_tokens")
_GIB = 2**30


def _import(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist = module.replace("kvpolicy.", "kvpolicy-")
        raise ConfigError(f"{what} needs {module}: pip install {dist}") from exc


def server_capacity(
    timing: TimingModel,
    engine: EngineConfig,
    capacity_tokens: int,
    mean_prompt: float = 1024.0,
    mean_output: float = 256.0,
) -> tuple[float, int, int]:
    """``(tokens_per_s, kv_bytes, concurrency)`` of one simulated server.

    Tokens per second (prompt and output tokens alike, as seed 004 counts them) are the
    roofline's sustained rate for requests of ``mean_prompt`` and ``mean_output`` tokens at
    saturation: ``B = min(max_batch, capacity / (P + D/2))`` sequences decode together, so a
    request costs ``D · t_decode(B) / B`` of decode time (``t_decode(B)`` reads the weights
    and ``B · (P + D/2)`` tokens of KV) plus the compute of its prefill, and the server
    serves ``(P + D) / cost`` tokens per second.
    """
    p, d = max(mean_prompt, 1.0), max(mean_output, 1.0)
    batch = max(1, min(engine.max_batch, int(capacity_tokens // (p + d / 2))))
    kv = batch * (p + d / 2)
    decode = timing.iteration_time(batch, kv, kv)
    prefill = timing.iteration_time(p, 0, p * (p + 1) / 2) - timing.overhead_s
    tokens_per_s = (p + d) / (d * decode / batch + prefill)
    return tokens_per_s, capacity_tokens * timing.kv_bytes_per_token, engine.max_batch


def _check_keys(where: str, raw: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"unknown key {where}.{key!s}; allowed: {', '.join(allowed)}")


def _share_entitlement(
    tenancy: Any, tenant: str, raw: object, capacity: tuple[float, int, int], where: str
) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping: {raw!r}")
    _check_keys(where, raw, _SHARE_KEYS)
    if "share" not in raw:
        raise ConfigError(f"{where} needs a 'share' of the server's capacity")
    tps, kv, conc = capacity

    def resources(frac: object, key: str) -> Any:
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac <= 1:
            raise ConfigError(f"{where}.{key} must be a number in (0, 1]: {frac!r}")
        return tenancy.Resources(
            tokens_per_s=tps * frac,
            kv_bytes=max(1, int(kv * frac)),
            concurrency=max(1, round(conc * frac)),
        )

    try:
        cls = tenancy.service_class(raw.get("service_class", "elastic"))
        baseline = resources(raw["share"], "share")
        burst = None
        if cls.can_burst:
            burst = resources(raw.get("burst_share", 1.0), "burst_share")
            if not baseline.fits_in(burst):
                burst = baseline
        kwargs: dict[str, Any] = {}
        for key in ("slo_target_s", "max_output_tokens"):
            if key in raw:
                kwargs[key] = raw[key]
        return tenancy.TokenEntitlement(
            tenant=tenant, service_class=cls, baseline=baseline, burst=burst, **kwargs
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def build_gateway(
    config: GatewayConfig,
    timing: TimingModel,
    engine: EngineConfig,
    capacity_tokens: int,
    mean_lengths: tuple[float, float] = (1024.0, 256.0),
) -> RequestGate | None:
    """The gateway ``config`` names, in front of a server of ``capacity_tokens`` KV tokens.

    ``mean_lengths`` (prompt, output) of the traffic size the default ``tokens_per_s``.

    Raises:
        ConfigError: an unknown name or key (named), bad shares, a manifest the tenancy
            package rejects, or kvpolicy-tenancy not installed.
    """
    if config.name == "none":
        return None
    if config.name not in GATEWAY_NAMES:
        raise ConfigError(f"unknown gateway {config.name!r}; known: {', '.join(GATEWAY_NAMES)}")
    tenancy = _import("kvpolicy.tenancy", f"gateway {config.name!r}")
    params = dict(config.params)
    _check_keys(
        "gateway.params",
        params,
        ("manifest", "tenants", "default", "tokens_per_s", *_GATE_SETTINGS),
    )
    if ("manifest" in params) == ("tenants" in params):
        raise ConfigError(
            "gateway 'token-pool' needs exactly one of params.manifest or params.tenants"
        )
    gate_settings = {k: params[k] for k in _GATE_SETTINGS if k in params}
    capacity = server_capacity(timing, engine, capacity_tokens, *mean_lengths)
    if "tokens_per_s" in params:
        tps = params["tokens_per_s"]
        if isinstance(tps, bool) or not isinstance(tps, int | float) or not tps > 0:
            raise ConfigError(f"gateway.params.tokens_per_s must be a number > 0: {tps!r}")
        capacity = (float(tps), capacity[1], capacity[2])
    try:
        settings = tenancy.GateConfig(**gate_settings)
        if "manifest" in params:
            source = params["manifest"]
            if isinstance(source, str):
                source = pathlib.Path(source)
            pool = tenancy.load_manifest(source)
        else:
            raw = params["tenants"]
            if not isinstance(raw, Mapping) or not raw:
                raise ConfigError(f"gateway.params.tenants must be a non-empty mapping: {raw!r}")
            ents = [
                _share_entitlement(
                    tenancy, str(name), spec, capacity, f"gateway.params.tenants.{name}"
                )
                for name, spec in raw.items()
            ]
            pool = tenancy.TokenPool(
                name=timing.model.name,
                capacity=tenancy.Resources(
                    tokens_per_s=capacity[0], kv_bytes=capacity[1], concurrency=capacity[2]
                ),
                entitlements=ents,
            )
        default = None
        if "default" in params:
            default = _share_entitlement(
                tenancy, "default", params["default"], capacity, "gateway.params.default"
            )
        gate: RequestGate = tenancy.TokenPoolGate(
            pool, timing.model, config=settings, default_entitlement=default
        )
    except ConfigError:
        raise
    except (TypeError, ValueError, OSError) as exc:
        raise ConfigError(f"gateway {config.name!r}: {exc}") from exc
    return gate


_GROUP_KEYS = ("budget_block_s", "top_k", "depth", "fit_fraction")


def _group_policy(tiers: Any, raw: object, requests: Sequence[Request], tier: str) -> Any:
    """Algorithm 2's per-group TTLs of ``tier``, fitted on the head of ``requests``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"tiers.params.group_ttl must be a mapping: {raw!r}")
    _check_keys("tiers.params.group_ttl", raw, _GROUP_KEYS)
    if "budget_block_s" not in raw:
        raise ConfigError("tiers.params.group_ttl needs budget_block_s (disk block-seconds)")
    fraction = raw.get("fit_fraction", 0.5)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ConfigError(f"tiers.params.group_ttl.fit_fraction must be in (0, 1]: {fraction!r}")
    chains = [(r.arrival_time, list(r.prefix_hashes)) for r in requests if r.prefix_hashes]
    if not chains:
        raise ConfigError("tiers.params.group_ttl needs requests with prefix hashes to fit on")
    trace = chains[: max(1, int(len(chains) * fraction))]
    depth = raw.get("depth", 1)
    groups = tiers.prefix_groups(trace, raw.get("top_k", 8), depth)
    plan = tiers.allocate_group_ttls(groups, raw["budget_block_s"])
    return plan.policy(tier=tier, depth=depth)


def build_tiers(
    config: TiersConfig,
    timing: TimingModel,
    block_size: int,
    requests: Sequence[Request] = (),
) -> PrefixStore | None:
    """The prefix store ``config`` names, for KV blocks of ``block_size`` tokens.

    ``requests`` (the workload) are needed only to fit ``group_ttl``.

    Raises:
        ConfigError: an unknown name or key (named), a bad size or TTL, or kvpolicy-tiers
            not installed.
    """
    if config.name == "none":
        return None
    if config.name not in TIERS_NAMES:
        raise ConfigError(f"unknown tiers {config.name!r}; known: {', '.join(TIERS_NAMES)}")
    tiers = _import("kvpolicy.tiers", f"tiers {config.name!r}")
    params = dict(config.params)
    _check_keys("tiers.params", params, ("dram_gib", "disk_gib", "ttl_s", "group_ttl"))
    try:
        sizes = {"dram": params.get("dram_gib", 64), "disk": params.get("disk_gib", 0)}
        specs = []
        for name, gib in sizes.items():
            if isinstance(gib, bool) or not isinstance(gib, int | float) or gib < 0:
                raise ConfigError(f"tiers.params.{name}_gib must be a number >= 0: {gib!r}")
            if gib > 0:
                specs.append(tiers.get_tier(name).with_capacity(int(gib * _GIB)))
        if not specs:
            raise ConfigError("tiers 'tiered' needs dram_gib or disk_gib > 0")
        ttl = params.get("ttl_s")
        policy = None
        if "group_ttl" in params:
            if ttl is not None:
                raise ConfigError("tiers.params: give ttl_s or group_ttl, not both")
            # The group TTLs govern the slowest tier (disk, as in seed 003 §5.3.2; DRAM
            # when it is the only one); the faster tier above it keeps LRU without expiry.
            policy = _group_policy(tiers, params["group_ttl"], requests, specs[-1].name)
        elif isinstance(ttl, Mapping):
            policy = tiers.FixedTTL({str(k): float(v) for k, v in ttl.items()})
        elif ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int | float):
                raise ConfigError(f"tiers.params.ttl_s must be seconds or a mapping: {ttl!r}")
            policy = tiers.FixedTTL({s.name: float(ttl) for s in specs})
        store: PrefixStore = tiers.TieredPrefixStore(
            specs, block_bytes=block_size * timing.kv_bytes_per_token, ttl=policy
        )
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tiers {config.name!r}: {exc}") from exc
    return store
