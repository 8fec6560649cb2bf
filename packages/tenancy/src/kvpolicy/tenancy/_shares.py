"""A token-pool gate for one server, built from a manifest or from shares of the server.

This is the ``token-pool`` implementation of the ``kvpolicy.gateway`` entry-point group:
``build(GATEWAY, "token-pool", params, context=...)`` calls :func:`token_pool_gateway` with
the server's :class:`~kvpolicy.kvmodel.ServerContext`. Give either

- ``manifest``: a manifest (a path or an inline mapping) in absolute units;
- or ``tenants``: baselines as *shares* of the server's capacity, which then need no numbers
  that depend on the model and the GPU::

      tenants:
        chat:      {service_class: guaranteed, share: 0.3, slo_target_s: 2.0}
        long-tail: {service_class: spot, share: 0.1, burst_share: 0.5}
      default: {service_class: spot, share: 0.1}   # each tenant not named (optional)

  or ``default: split``: the tenants of the workload (the context's requests) that are not
  named share, equally and as ``elastic`` tenants that may burst into the whole pool, what
  the named tenants present in the workload do not reserve, so the shares never sum above
  the capacity: a workload whose requests carry no tenant tag is one tenant that owns the
  whole pool. (A live gateway that knows no workload gives every unknown tenant the rest.)

The pool's capacity is the server's: its KV pool in bytes, ``max_batch`` sequences and its
sustained tokens per second (``tokens_per_s`` overrides the context's). An entitlement's
baseline is ``share`` of each; its burst limits ``burst_share`` of each (classes that burst
only; default: the whole pool).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

from kvpolicy.kvmodel import ServerContext
from kvpolicy.tenancy._classes import service_class
from kvpolicy.tenancy._entitlements import Resources, TokenEntitlement, TokenPool
from kvpolicy.tenancy._gate import GateConfig, TokenPoolGate
from kvpolicy.tenancy._manifest import load_manifest

__all__ = ["token_pool_gateway"]

_SHARE_KEYS = ("service_class", "share", "burst_share", "slo_target_s", "max_output_tokens")


def _fraction(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"'{where}' must be a number in (0, 1]: {value!r}")
    return float(value)


def _share_entitlement(
    tenant: str, raw: object, capacity: Resources, where: str
) -> TokenEntitlement:
    """An entitlement whose baseline (and burst) are shares of ``capacity``.

    Raises:
        ValueError / TypeError: an unknown key, a missing or bad share (named by ``where``).
    """
    if not isinstance(raw, Mapping):
        raise TypeError(f"'{where}' must be a mapping: {raw!r}")
    for key in raw:
        if key not in _SHARE_KEYS:
            raise ValueError(f"unknown key '{where}.{key!s}'; allowed: {', '.join(_SHARE_KEYS)}")
    if "share" not in raw:
        raise ValueError(f"'{where}' needs a 'share' of the server's capacity")

    def resources(frac: float) -> Resources:
        return Resources(
            tokens_per_s=capacity.tokens_per_s * frac,
            kv_bytes=max(1, int(capacity.kv_bytes * frac)),
            concurrency=max(1, round(capacity.concurrency * frac)),
        )

    cls = service_class(raw.get("service_class", "elastic"))
    baseline = resources(_fraction(f"{where}.share", raw["share"]))
    burst = None
    if cls.can_burst:
        burst = resources(_fraction(f"{where}.burst_share", raw.get("burst_share", 1.0)))
        if not baseline.fits_in(burst):
            burst = baseline
    extra = {k: raw[k] for k in ("slo_target_s", "max_output_tokens") if k in raw}
    return TokenEntitlement(
        tenant=tenant, service_class=cls, baseline=baseline, burst=burst, **extra
    )


def _split(named: dict[str, object], context: ServerContext) -> tuple[dict[str, object], float]:
    """The named tenants plus one elastic entitlement per unnamed tenant of the workload,
    sharing what the named tenants present reserve; and that rest."""
    present = {r.tenant for r in context.requests}
    if present:
        named = {t: spec for t, spec in named.items() if t in present}
    reserved = 0.0
    for t, spec in named.items():
        share = spec.get("share") if isinstance(spec, Mapping) else None
        reserved += _fraction(f"tenants.{t}.share", share)
    rest = max(0.0, 1.0 - reserved)
    unnamed = sorted(present - set(named))
    out = dict(named)
    if unnamed and rest > 0:
        each = rest / len(unnamed)
        for t in unnamed:
            out[t] = {"service_class": "elastic", "share": each}
    return out, rest


def token_pool_gateway(
    manifest: str | Mapping[str, object] | None = None,
    tenants: Mapping[str, object] | None = None,
    default: Mapping[str, object] | str | None = None,
    tokens_per_s: float | None = None,
    window_s: float | None = None,
    update_interval_s: float | None = None,
    min_retry_s: float | None = None,
    max_retry_s: float | None = None,
    overcommit: bool | None = None,
    contention_level: float | None = None,
    *,
    context: ServerContext,
) -> TokenPoolGate:
    """The token-pool gate in front of the server ``context`` describes.

    Args:
        manifest: a manifest file path or mapping (absolute units).
        tenants: tenant name -> share spec (see the module docstring).
        default: share spec of each tenant not named, or ``"split"`` (see the module
            docstring), or None (tenants not named are denied).
        tokens_per_s: the server's sustained tokens/s (default: the context's).
        window_s: :class:`GateConfig` ``window_s`` (None: its default); likewise
            ``update_interval_s``, ``min_retry_s``, ``max_retry_s``, ``overcommit`` and
            ``contention_level``.
        context: the server.

    Raises:
        ValueError / TypeError: neither or both of ``manifest`` and ``tenants``, a bad share
            or key (named), or a manifest the tenancy package rejects.
    """
    if (manifest is None) == (tenants is None):
        raise ValueError("give exactly one of 'manifest' or 'tenants'")
    tps = context.tokens_per_s
    if tokens_per_s is not None:
        if isinstance(tokens_per_s, bool) or not isinstance(tokens_per_s, int | float):
            raise TypeError(f"'tokens_per_s' must be a number: {tokens_per_s!r}")
        if not tokens_per_s > 0:
            raise ValueError(f"'tokens_per_s' must be > 0: {tokens_per_s!r}")
        tps = float(tokens_per_s)
    settings = {
        k: v
        for k, v in (
            ("window_s", window_s),
            ("update_interval_s", update_interval_s),
            ("min_retry_s", min_retry_s),
            ("max_retry_s", max_retry_s),
            ("overcommit", overcommit),
            ("contention_level", contention_level),
        )
        if v is not None
    }
    config = GateConfig(**settings)  # type: ignore[arg-type]
    capacity = Resources(
        tokens_per_s=tps,
        kv_bytes=context.kv_capacity_tokens * context.model.kv_bytes_per_token(),
        concurrency=context.max_batch,
    )
    if isinstance(default, str) and default != "split":
        raise ValueError(f"'default' must be a share mapping or 'split': {default!r}")
    fallback = None
    if manifest is not None:
        if default == "split":
            raise ValueError("'default: split' needs 'tenants' (shares), not a manifest")
        source = pathlib.Path(manifest) if isinstance(manifest, str) else manifest
        pool = load_manifest(source)
    else:
        if not isinstance(tenants, Mapping):
            raise ValueError(f"'tenants' must be a mapping: {tenants!r}")
        specs = {str(k): v for k, v in tenants.items()}
        if default == "split":
            specs, rest = _split(specs, context)
            if rest > 0 and not context.requests:
                fallback = _share_entitlement(
                    "default", {"service_class": "elastic", "share": rest}, capacity, "default"
                )
        if not specs:
            raise ValueError(f"'tenants' must name at least one tenant: {tenants!r}")
        ents = [
            _share_entitlement(name, spec, capacity, f"tenants.{name}")
            for name, spec in specs.items()
        ]
        pool = TokenPool(name=context.model.name, capacity=capacity, entitlements=ents)
    if isinstance(default, Mapping):
        fallback = _share_entitlement("default", default, capacity, "default")
    return TokenPoolGate(pool, context.model, config=config, default_entitlement=fallback)
