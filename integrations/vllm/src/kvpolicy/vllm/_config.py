"""The one validated config object of kvpolicy inside vLLM.

A deployment writes one JSON (or YAML) mapping and hands it to vLLM as
``--additional-config '{"kvpolicy": {...}}'`` or as a file path / JSON text in the
``KVPOLICY_VLLM_CONFIG`` environment variable::

    {
      "admission": {"name": "rate-limited", "params": {"window": 256}},
      "max_admissions_per_step": 8,
      "preemption": {"name": "least-progressed-first"},
      "tenancy": {"manifest": "pool.yaml", "default_tenant": "batch", "quotas": true},
      "offload": {"group_ttls": {"1234": 900.0}, "residual_ttl_s": 30.0}
    }

Every section is optional and off when absent. Policy names resolve through kvmodel's one
resolver (:func:`kvpolicy.kvmodel.build`), so an unknown name or a bad param fails here, at
startup, with the field named, and never inside the engine loop.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from attrs import field, frozen
from attrs.validators import instance_of, optional

from kvpolicy.kvmodel import (
    ADMISSION,
    EVICTION,
    PREEMPTION,
    AdmissionPolicy,
    EvictionPolicy,
    Group,
    PreemptionPolicy,
    RegistryError,
    build,
)
from kvpolicy.tenancy import TenancyError, TokenPool, load_manifest
from kvpolicy.vllm._errors import ConfigError

__all__ = [
    "ENV_VAR",
    "BlockEvictionConfig",
    "KVPolicyConfig",
    "OffloadConfig",
    "PolicyChoice",
    "TenancyConfig",
    "load_config",
]

ENV_VAR = "KVPOLICY_VLLM_CONFIG"
"""Environment variable holding a config file path or JSON text."""
ADDITIONAL_CONFIG_KEY = "kvpolicy"
"""Key of the config in vLLM's ``--additional-config`` mapping."""


def _frozen_params(value: Mapping[str, Any] | None) -> MappingProxyType[str, Any]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError(f"'params' must be a mapping: {value!r}")
    return MappingProxyType(dict(value))


@frozen
class PolicyChoice:
    """A policy named by its entry point and its keyword params."""

    name: str = field(validator=instance_of(str))
    """Entry-point name, e.g. ``rate-limited`` (``kvpolicy.kvmodel.names(group)`` lists them)."""
    params: MappingProxyType[str, Any] = field(factory=dict, converter=_frozen_params)
    """Keyword params of the implementation."""

    def build(self, group: Group[Any], where: str) -> Any:
        """Build a fresh instance through kvmodel's resolver; ``where`` names the field."""
        try:
            return build(group, self.name, self.params)
        except RegistryError as exc:
            raise ConfigError(f"'{where}': {exc}") from exc


def _positive_cap(_inst: object, attribute: Any, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{attribute.name}' must be an int: {value!r}")
    if value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1 (0 would admit nothing): {value!r}")


def _pool(value: TokenPool | Mapping[str, Any] | str | os.PathLike[str]) -> TokenPool:
    if isinstance(value, TokenPool):
        return value
    try:
        return load_manifest(value)
    except TenancyError as exc:
        raise ConfigError(f"'tenancy.manifest': {exc}") from exc


@frozen
class TenancyConfig:
    """Tenants, their priorities and their entitlements (kvpolicy-tenancy's token pool)."""

    pool: TokenPool = field(converter=_pool)
    """The token pool and its entitlements (a manifest mapping or file path is loaded)."""
    tenant_key: str = field(default="tenant", validator=instance_of(str))
    """Key of the tenant in a request's ``SamplingParams.extra_args`` (or, lower-cased with
    an ``x-`` prefix, in the headers vLLM forwards as ``trace_headers``)."""
    default_tenant: str | None = field(default=None, validator=optional(instance_of(str)))
    """Tenant of a request that names none; None rejects such requests."""
    priorities: bool = field(default=True, validator=instance_of(bool))
    """Set each request's vLLM priority from tenancy's priority formula (eq. 1 of seed 004)."""
    quotas: bool = field(default=True, validator=instance_of(bool))
    """Cap each tenant's running requests at its entitlement's concurrency limit."""

    def __attrs_post_init__(self) -> None:
        if self.default_tenant is not None and self.pool.entitlement(self.default_tenant) is None:
            known = ", ".join(e.tenant for e in self.pool.entitlements) or "none"
            raise ConfigError(
                f"'tenancy.default_tenant': tenant {self.default_tenant!r} has no entitlement "
                f"in pool {self.pool.name!r} (entitled: {known})"
            )


def _ttl(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"'{where}' must be a number of seconds: {value!r}")
    f = float(value)
    if math.isnan(f) or f < 0:
        raise ConfigError(f"'{where}' must be >= 0 seconds (or inf): {value!r}")
    return f


def _group_ttls(value: Mapping[Any, Any]) -> MappingProxyType[int, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"'offload.group_ttls' must be a mapping: {value!r}")
    out: dict[int, float] = {}
    for key, ttl in value.items():
        try:
            k = int(key)
        except (TypeError, ValueError):
            raise ConfigError(
                f"'offload.group_ttls' keys must be int group hashes: {key!r}"
            ) from None
        out[k] = _ttl(f"offload.group_ttls[{key!r}]", ttl)
    return MappingProxyType(out)


def _residual(value: object) -> float:
    return _ttl("offload.residual_ttl_s", value)


@frozen
class OffloadConfig:
    """tiers' per-group TTL for vLLM's CPU offloading cache (seed 003 Algorithm 2)."""

    group_ttls: MappingProxyType[int, float] = field(factory=dict, converter=_group_ttls)
    """Seconds by prefix-group key (the int hash of a group's first block)."""
    residual_ttl_s: float = field(default=math.inf, converter=_residual)
    """Seconds for blocks of any other group (inf: plain LRU)."""
    depth: int = field(default=1, validator=instance_of(int))
    """Prefix-tree depth that names a group (see ``kvpolicy.tiers.group_key``)."""

    def __attrs_post_init__(self) -> None:
        if self.depth < 1:
            raise ConfigError(f"'offload.depth' must be >= 1: {self.depth!r}")


def _at_least_one(_inst: object, attribute: Any, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'block_eviction.{attribute.name}' must be an int: {value!r}")
    if value < 1:
        raise ValueError(f"'block_eviction.{attribute.name}' must be >= 1: {value!r}")


@frozen
class BlockEvictionConfig:
    """Block-level Token-PD (the prototype of :class:`~kvpolicy.vllm.BlockEvictionScheduler`)."""

    policy: PolicyChoice = field(validator=instance_of(PolicyChoice))
    """Eviction policy (``kvpolicy.eviction`` entry point), e.g. ``token-pd``; its unit is
    a whole block, valued at the sum of its tokens' values."""
    budget_blocks: int = field(validator=_at_least_one)
    """Most full blocks resident across the running batch after an eviction round."""
    interval: int = field(default=1, validator=_at_least_one)
    """Most steps between two rounds."""

    def __attrs_post_init__(self) -> None:
        self.build()

    def build(self) -> EvictionPolicy:
        """A fresh eviction policy."""
        policy: EvictionPolicy = self.policy.build(EVICTION, "block_eviction.policy")
        return policy


@frozen
class KVPolicyConfig:
    """Which kvpolicy features a vLLM server runs; each is off when left out."""

    admission: PolicyChoice | None = field(
        default=None, validator=optional(instance_of(PolicyChoice))
    )
    """Admission policy (``kvpolicy.admission`` entry point), e.g. ``rate-limited``."""
    max_admissions_per_step: int | None = field(default=None, validator=_positive_cap)
    """A hard cap on requests joining the running batch per step (None: no cap)."""
    preemption: PolicyChoice | None = field(
        default=None, validator=optional(instance_of(PolicyChoice))
    )
    """Preemption order (``kvpolicy.preemption`` entry point), e.g. ``cost-aware``."""
    tenancy: TenancyConfig | None = field(
        default=None, validator=optional(instance_of(TenancyConfig))
    )
    """Tenants' priorities and entitlements."""
    offload: OffloadConfig | None = field(
        default=None, validator=optional(instance_of(OffloadConfig))
    )
    """Group TTLs of the CPU offloading cache policy."""
    block_eviction: BlockEvictionConfig | None = field(
        default=None, validator=optional(instance_of(BlockEvictionConfig))
    )
    """Block-level Token-PD (prototype; needs :class:`~kvpolicy.vllm.BlockEvictionScheduler`)."""
    allow_untested_vllm: bool = field(default=False, validator=instance_of(bool))
    """Run on a vLLM release this package was not tested against."""

    def __attrs_post_init__(self) -> None:
        # Build each policy once now, so a bad name or param fails at startup.
        self.admission_policy()
        self.preemption_policy()

    def admission_policy(self) -> AdmissionPolicy | None:
        """A fresh admission policy, or None when admission is off."""
        if self.admission is None:
            return None
        policy: AdmissionPolicy = self.admission.build(ADMISSION, "admission")
        return policy

    def preemption_policy(self) -> PreemptionPolicy | None:
        """A fresh preemption order, or None when vLLM's own order is kept."""
        if self.preemption is None:
            return None
        policy: PreemptionPolicy = self.preemption.build(PREEMPTION, "preemption")
        return policy


_TOP = {
    "admission",
    "max_admissions_per_step",
    "preemption",
    "tenancy",
    "offload",
    "block_eviction",
    "allow_untested_vllm",
}
_SECTIONS: dict[str, set[str]] = {
    "admission": {"name", "params"},
    "preemption": {"name", "params"},
    "tenancy": {"manifest", "tenant_key", "default_tenant", "priorities", "quotas"},
    "offload": {"group_ttls", "residual_ttl_s", "depth"},
    "block_eviction": {"policy", "budget_blocks", "interval"},
}


def _keys(value: object, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"'{where}' must be a mapping: {value!r}")
    for key in value:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise ConfigError(f"'{where}': unknown key {key!r} (known: {known})")
    return value


def _read(source: str | os.PathLike[str]) -> Any:
    text = os.fspath(source)
    if text.lstrip().startswith("{"):
        where = "JSON text"
    else:
        path = pathlib.Path(text)
        if not path.is_file():
            raise ConfigError(f"kvpolicy config file not found: {text!r}")
        where = str(path)
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as exc:
                raise ConfigError(f"{where}: reading YAML needs PyYAML ({exc})") from exc
            return yaml.safe_load(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"kvpolicy config ({where}) is not valid JSON: {exc}") from exc


def load_config(source: Mapping[str, Any] | str | os.PathLike[str]) -> KVPolicyConfig:
    """Build a :class:`KVPolicyConfig` from a mapping, JSON text or a JSON/YAML file path.

    Raises:
        ConfigError: an unknown key, an unknown policy name, an impossible value; the message
            names the field (``admission.name``, ``tenancy.default_tenant``, ...).
        TypeError: a value of the wrong type, named.
    """
    raw = _read(source) if isinstance(source, str | os.PathLike) else source
    top = _keys(raw, _TOP, "kvpolicy config")
    kwargs: dict[str, Any] = {}
    for key in ("admission", "preemption"):
        if top.get(key) is not None:
            sec = _keys(top[key], _SECTIONS[key], key)
            if "name" not in sec:
                raise ConfigError(f"'{key}': missing key 'name'")
            kwargs[key] = PolicyChoice(sec["name"], sec.get("params"))
    if top.get("tenancy") is not None:
        sec = dict(_keys(top["tenancy"], _SECTIONS["tenancy"], "tenancy"))
        if "manifest" not in sec:
            raise ConfigError("'tenancy': missing key 'manifest'")
        kwargs["tenancy"] = TenancyConfig(pool=sec.pop("manifest"), **sec)
    if top.get("offload") is not None:
        kwargs["offload"] = OffloadConfig(**_keys(top["offload"], _SECTIONS["offload"], "offload"))
    if top.get("block_eviction") is not None:
        sec = dict(_keys(top["block_eviction"], _SECTIONS["block_eviction"], "block_eviction"))
        pol = _keys(sec.pop("policy", None), _SECTIONS["admission"], "block_eviction.policy")
        if "name" not in pol:
            raise ConfigError("'block_eviction.policy': missing key 'name'")
        if "budget_blocks" not in sec:
            raise ConfigError("'block_eviction': missing key 'budget_blocks'")
        kwargs["block_eviction"] = BlockEvictionConfig(
            PolicyChoice(pol["name"], pol.get("params")), **sec
        )
    for key in ("max_admissions_per_step", "allow_untested_vllm"):
        if key in top:
            kwargs[key] = top[key]
    try:
        return KVPolicyConfig(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def config_from_vllm(additional_config: object) -> KVPolicyConfig:
    """The config from vLLM's ``additional_config`` (key ``kvpolicy``), else from the
    ``KVPOLICY_VLLM_CONFIG`` environment variable, else an all-off config."""
    if isinstance(additional_config, Mapping) and ADDITIONAL_CONFIG_KEY in additional_config:
        return load_config(additional_config[ADDITIONAL_CONFIG_KEY])
    env = os.environ.get(ENV_VAR)
    if env:
        return load_config(env)
    return KVPolicyConfig()
