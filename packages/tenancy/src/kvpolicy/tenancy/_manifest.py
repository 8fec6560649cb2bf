"""Token-pool manifests: a pool and its entitlements as a JSON or YAML mapping (§4.2)."""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from kvpolicy.kvmodel import ModelSpec
from kvpolicy.tenancy._entitlements import (
    Resources,
    TokenEntitlement,
    TokenPool,
    _short,
    over_capacity,
    renamed,
)
from kvpolicy.tenancy._errors import ManifestError
from kvpolicy.tenancy._gate import GateConfig, TokenPoolGate
from kvpolicy.tenancy._lease import RedisLeaseGate
from kvpolicy.tenancy._math import PriorityCoefficients
from kvpolicy.tenancy._store import StateStore
from kvpolicy.tenancy._yaml import load_yaml, paused_gc

__all__ = ["dump_manifest", "load_gate", "load_lease_gate", "load_manifest", "load_yaml"]

_GIB = 2**30
_RESOURCE_KEYS = frozenset({"tokens_per_s", "kv_bytes", "kv_cache_gib", "concurrency"})
_ENTITLEMENT_KEYS = frozenset(
    {"tenant", "service_class", "baseline", "burst", "slo_target_s", "max_output_tokens"}
)
_POOL_KEYS = frozenset({"name", "capacity"})
_TOP_KEYS = frozenset({"pool", "entitlements", "default", "gate"})
_TOP_KEYS |= {"backends", "routing", "autoscaling"}  # a gateway's fleet (read by _backends)
_COEFFICIENT_KEYS = frozenset({"alpha_slo", "alpha_burst", "alpha_debt", "gamma_d", "gamma_b"})
_GATE_KEYS = _COEFFICIENT_KEYS | {
    "update_interval_s",
    "window_s",
    "min_retry_s",
    "max_retry_s",
    "overcommit",
    "contention_level",
}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if type(value) is dict:  # the common case, without an ABC check
        return value
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where} must be a mapping: {_short(value)}")
    return value


def _keys(value: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = value.keys() - allowed
    if unknown:
        key = sorted(map(str, unknown))[0]
        raise ManifestError(
            f"{where}: unknown key {_short(key)} (known: {', '.join(sorted(allowed))})"
        )


def _err(where: str, err: Exception) -> ManifestError:
    """``err`` (a value's validation) under its path, at most 300 characters of it."""
    text = str(err)
    return ManifestError(f"{where}: {text if len(text) <= 300 else text[:297] + '...'}")


def _require(value: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in value:
        raise ManifestError(f"{where}: missing key {key!r}")
    return value[key]


def _resources(value: object, where: str) -> Resources:
    """``value`` as Resources."""
    m = _mapping(value, where)
    _keys(m, _RESOURCE_KEYS, where)
    if "kv_bytes" in m and "kv_cache_gib" in m:
        raise ManifestError(f"{where}: give 'kv_bytes' or 'kv_cache_gib', not both")
    if "kv_cache_gib" in m:
        gib = m["kv_cache_gib"]
        if isinstance(gib, bool) or not isinstance(gib, int | float):
            raise ManifestError(f"{where}.kv_cache_gib must be a number: {_short(gib)}")
        if not (isinstance(gib, float) or abs(gib) < 2**53) or not (
            math.isfinite(gib) and 0 < gib <= 2**53 / _GIB
        ):
            raise ManifestError(
                f"{where}.kv_cache_gib must be finite, > 0 and <= {2**53 / _GIB:g}: {_short(gib)}"
            )
        kv: object = round(gib * _GIB)
    else:
        kv = _require(m, "kv_bytes", where)
    try:
        return Resources(
            tokens_per_s=_require(m, "tokens_per_s", where),
            kv_bytes=kv,  # type: ignore[arg-type]
            concurrency=_require(m, "concurrency", where),
        )
    except (TypeError, ValueError) as err:
        raise _err(where, err) from err


def _entitlement(value: object, where: str) -> TokenEntitlement:
    m = _mapping(value, where)
    _keys(m, _ENTITLEMENT_KEYS, where)
    kwargs: dict[str, Any] = {
        "tenant": _require(m, "tenant", where),
        "service_class": _require(m, "service_class", where),
        "baseline": _resources(_require(m, "baseline", where), f"{where}.baseline"),
    }
    if m.get("burst") is not None:
        kwargs["burst"] = _resources(m["burst"], f"{where}.burst")
    for key in ("slo_target_s", "max_output_tokens"):
        if key in m:
            kwargs[key] = m[key]
    try:
        return TokenEntitlement(**kwargs)
    except (TypeError, ValueError) as err:
        raise _err(where, err) from err


class _Quick:
    """Entitlements of a large manifest at less cost per entry: equal baselines and bursts
    (a large manifest repeats a few) become one :class:`Resources`, built once, and an
    error's path is only written when there is an error."""

    def __init__(self) -> None:
        self._resources: dict[Any, Resources] = {}
        self._templates: dict[Any, TokenEntitlement] = {}

    def resources(self, value: object) -> Resources | None:
        """``value`` as Resources, shared with equal ones; ``None`` when it is not valid."""
        if type(value) is not dict:
            return None
        values = tuple(value.values())
        # The types too: True == 1 and 1.0 == 1, but neither is a valid count.
        key = (tuple(value), tuple(map(type, values)), values)
        try:
            got = self._resources.get(key)
        except TypeError:  # an unhashable value: not valid
            return None
        if got is None:
            try:
                got = self._resources[key] = _resources(value, "")
            except ManifestError:
                return None
        return got

    def entitlement(self, value: object) -> TokenEntitlement | None:
        """``value`` as an entitlement; ``None`` when it is not valid (then
        :func:`_entitlement` names what is wrong). Entitlements equal but for their tenant
        are copies of the first, their names validated."""
        if type(value) is not dict or not value.keys() <= _ENTITLEMENT_KEYS:
            return None
        get = value.get
        baseline = self.resources(get("baseline"))
        burst = get("burst")
        if burst is not None:
            burst = self.resources(burst)
            if burst is None:
                return None
        tenant = get("tenant")
        if baseline is None or tenant is None:
            return None
        rest = [get(k, _Quick) for k in _REST]
        key = (id(baseline), id(burst), *rest, *map(type, rest))
        try:
            template = self._templates.get(key)
            if template is not None:
                return renamed(template, tenant)
            kwargs = dict(value, baseline=baseline, burst=burst)
            template = self._templates[key] = TokenEntitlement(**kwargs)
        except (TypeError, ValueError):  # TypeError: also an unhashable value
            return None
        return template


_REST = ("service_class", "slo_target_s", "max_output_tokens")  # the fields but the tenant's


def load_manifest(source: Mapping[str, Any] | str | os.PathLike[str]) -> TokenPool:
    """Build a :class:`TokenPool` from a manifest mapping or a ``.json``/``.yaml`` file.

    The manifest is::

        pool:
          name: qwen3-8b
          capacity: {tokens_per_s: 240, kv_cache_gib: 16, concurrency: 16}
        entitlements:
          - tenant: sample
            service_class: guaranteed      # dedicated | guaranteed | elastic | spot | preemptible
            slo_target_s: 0.2
            max_output_tokens: 256         # charged per request at admission
            baseline: {tokens_per_s: 100, kv_cache_gib: 2, concurrency: 4}
            burst: {tokens_per_s: 200, kv_cache_gib: 4, concurrency: 8}   # optional

    KV capacity is ``kv_bytes`` or ``kv_cache_gib`` (GiB, as the paper's resource). YAML files
    need PyYAML (the ``yaml`` extra). The optional ``default`` and ``gate`` sections are read
    by :func:`load_gate` (and checked here).

    Raises:
        ManifestError: an unknown or missing key (named with its path, e.g.
            ``entitlements[1].baseline``), a wrong value, or a file that cannot be parsed.
    """
    if isinstance(source, str | os.PathLike):
        source = _read(pathlib.Path(source))
    m = _mapping(source, "manifest")
    _keys(m, _TOP_KEYS, "manifest")
    pool = _mapping(_require(m, "pool", "manifest"), "pool")
    _keys(pool, _POOL_KEYS, "pool")
    capacity = _resources(_require(pool, "capacity", "pool"), "pool.capacity")
    raw = m.get("entitlements", [])
    if not isinstance(raw, list | tuple):
        raise ManifestError(f"entitlements must be a list: {_short(raw)}")
    quick = _Quick()
    with paused_gc():
        ents = [
            quick.entitlement(e) or _entitlement(e, f"entitlements[{i}]") for i, e in enumerate(raw)
        ]
    default = _default(m)
    window = _config(m).window_s
    checked: set[tuple[int, int]] = set()  # (id of the limits, max_output_tokens) passed
    for i, ent in enumerate([*ents, *([default] if default else [])]):
        key = (id(ent.limits), ent.max_output_tokens)  # the limits are shared (_Quick)
        if key in checked:
            continue
        where = "default" if i == len(ents) else f"entitlements[{i}]"
        _check_fundable(ent, capacity, window, where)
        try:
            over_capacity(i, ent, capacity)
        except ValueError as err:
            raise ManifestError(str(err).replace(f"'entitlements[{i}]", f"'{where}")) from None
        checked.add(key)
    try:
        return TokenPool(name=_require(pool, "name", "pool"), capacity=capacity, entitlements=ents)
    except (TypeError, ValueError) as err:
        raise _err("pool", err) from err


def _check_fundable(ent: TokenEntitlement, cap: Resources, window_s: float, where: str) -> None:
    """Reject an entitlement whose smallest request (one prompt token plus
    ``max_output_tokens``) no token bucket could ever hold: it would be denied forever."""
    need = 1 + ent.max_output_tokens
    depth = min(ent.limits.tokens_per_s, cap.tokens_per_s) * window_s
    if need > depth:
        raise ManifestError(
            f"{where}.max_output_tokens: {ent.max_output_tokens} can never be funded: a "
            f"request needs at least {need} tokens, the token bucket holds {depth:g} "
            f"(tokens_per_s x window_s {window_s:g})"
        )


def _default(m: Mapping[str, Any]) -> TokenEntitlement | None:
    raw = m.get("default")
    if raw is None:
        return None
    raw = _mapping(raw, "default")
    if "tenant" in raw:
        raise ManifestError("default: unknown key 'tenant' (the default serves every tenant)")
    return _entitlement({**raw, "tenant": "*"}, "default")


def _config(m: Mapping[str, Any]) -> GateConfig:
    raw = _mapping(m.get("gate", {}), "gate")
    _keys(raw, _GATE_KEYS, "gate")
    coefficients = {k: v for k, v in raw.items() if k in _COEFFICIENT_KEYS}
    rest = {k: v for k, v in raw.items() if k not in _COEFFICIENT_KEYS}
    try:
        return GateConfig(coefficients=PriorityCoefficients(**coefficients), **rest)
    except (TypeError, ValueError) as err:
        raise ManifestError(f"gate: {err}") from err


def load_gate(
    source: Mapping[str, Any] | str | os.PathLike[str],
    bytes_per_token: int | ModelSpec,
    *,
    store: StateStore | None = None,
) -> TokenPoolGate:
    """A :class:`TokenPoolGate` from a manifest (see :func:`load_manifest`) with two optional
    sections::

        default:                 # the entitlement of tenants the manifest does not name
          service_class: spot
          baseline: {tokens_per_s: 50, kv_cache_gib: 1, concurrency: 2}
        gate:                    # GateConfig and PriorityCoefficients fields
          update_interval_s: 5
          alpha_debt: 4.0

    Raises:
        ManifestError: as :func:`load_manifest`, also for the two sections.
    """
    if isinstance(source, str | os.PathLike):
        source = _read(pathlib.Path(source))
    pool = load_manifest(source)
    m = _mapping(source, "manifest")
    try:
        return TokenPoolGate(
            pool,
            bytes_per_token,
            config=_config(m),
            store=store,
            default_entitlement=_default(m),
        )
    except ValueError as err:
        raise ManifestError(f"default: {err}") from err


def load_lease_gate(
    source: Mapping[str, Any] | str | os.PathLike[str],
    bytes_per_token: int | ModelSpec,
    url: str,
    **kwargs: Any,
) -> RedisLeaseGate:
    """A :class:`~kvpolicy.tenancy.RedisLeaseGate` over the Redis at ``url`` from a manifest
    with the ``default`` and ``gate`` sections of :func:`load_gate` (``kwargs``: the gate's
    other settings, e.g. ``namespace``).

    Raises:
        ManifestError: as :func:`load_gate`.
    """
    gate = load_gate(source, bytes_per_token)
    return RedisLeaseGate.from_url(
        gate.pool,
        bytes_per_token,
        url,
        config=gate.config,
        default_entitlement=gate.default_entitlement,
        **kwargs,
    )


def _read(path: pathlib.Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise ManifestError(f"cannot read manifest {str(path)!r}: {err}") from err
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            return json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ManifestError(f"manifest {str(path)!r} is not JSON: {_short(str(err))}") from err
    if suffix in (".yaml", ".yml"):
        return load_yaml(text, str(path))
    raise ManifestError(f"manifest must end in .json, .yaml or .yml: {str(path)!r}")


def _dump_resources(r: Resources) -> dict[str, Any]:
    return {"tokens_per_s": r.tokens_per_s, "kv_bytes": r.kv_bytes, "concurrency": r.concurrency}


def dump_manifest(pool: TokenPool) -> dict[str, Any]:
    """The manifest mapping of ``pool`` (``load_manifest(dump_manifest(p)) == p``).

    Service classes are written by name, so a pool with a custom :class:`ServiceClass` does
    not round-trip.
    """
    if not isinstance(pool, TokenPool):
        raise TypeError(f"'pool' must be TokenPool: {pool!r}")
    ents = []
    for e in pool.entitlements:
        ent: dict[str, Any] = {
            "tenant": e.tenant,
            "service_class": e.service_class.name,
            "slo_target_s": e.slo_target_s,
            "max_output_tokens": e.max_output_tokens,
            "baseline": _dump_resources(e.baseline),
        }
        if e.burst is not None:
            ent["burst"] = _dump_resources(e.burst)
        ents.append(ent)
    return {
        "pool": {"name": pool.name, "capacity": _dump_resources(pool.capacity)},
        "entitlements": ents,
    }
