"""The backends a gateway spreads requests over, and how it routes and watches them.

Backends come from repeated ``--backend URL`` flags or from the pool manifest's
``backends:`` list (the TokenPool's ``backendRef``), each optionally weighted and labelled
with its model and GPU; the ``routing:`` section names the router (an entry point of
``kvpolicy.routing``, built by :func:`kvpolicy.kvmodel.build`: the simulator's classes) and
the intervals of the scrapes and health checks::

    backends:
      - url: http://vllm-0:8000
        weight: 2            # share of the pool's capacity this backend brings (default 1)
        model: Llama-3-8B    # labels the router sees
        gpu: H100-SXM
      - url: http://vllm-1:8000
        kv_events: tcp://vllm-1:5557   # its KV cache events: the prefix index follows them
    routing:
      router: prefix-aware   # any name of `kvpolicy.routing`
      params: {}
      scrape_interval_s: 1.0
      max_signal_age_s: 3.0
      block_chars: 64        # the approximate prefix index's text chunk
      health: {interval_s: 2.0, path: /health, backoff_s: 1.0, max_backoff_s: 30.0}

Every bad value is a :class:`~kvpolicy.tenancy.ManifestError` naming the field (or the
flag) and the value, raised before anything starts.
"""

from __future__ import annotations

import math
import os
import pathlib
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from attrs import field, frozen
from attrs.validators import ge, gt, instance_of

from kvpolicy.kvmodel import AUTOSCALING, ROUTING, Autoscaler, RegistryError, Router, build
from kvpolicy.tenancy._entitlements import Resources, TokenPool
from kvpolicy.tenancy._errors import ManifestError
from kvpolicy.tenancy._health import HealthConfig

__all__ = [
    "BackendSpec",
    "FleetSettings",
    "RoutingConfig",
    "backend_url",
    "build_autoscaler",
    "build_router",
    "fleet_schemas",
    "fleet_settings",
    "kv_events_endpoint",
    "load_backends",
    "load_routing",
]


def _finite_positive(_inst: object, attribute: Any, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"'{attribute.name}' must be finite and > 0: {value!r}")


def backend_url(url: object, where: str) -> str:
    """``url`` checked and normalised (no trailing ``/``): an ``http://`` or ``https://``
    URL with a host; ``where`` names the flag or field in the error.

    Raises:
        ManifestError: anything else, named with ``where`` and the value.
    """
    if not isinstance(url, str):
        raise ManifestError(f"{where} must be an http(s):// URL: {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError as err:
        raise ManifestError(f"{where} is not a URL ({err}): {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ManifestError(f"{where} must be an http:// or https:// URL with a host: {url!r}")
    if parts.query or parts.fragment:
        raise ManifestError(f"{where} must not carry a query or fragment: {url!r}")
    return url.rstrip("/")


@frozen
class BackendSpec:
    """One backend: where it is, its share of the pool and its labels."""

    url: str = field(validator=instance_of(str))
    """Base URL (``http://host:port``, any path prefix kept); also the backend's id."""
    weight: float = field(default=1.0, converter=float, validator=_finite_positive)
    """Share of the pool's capacity the backend brings, relative to the others' (a larger
    GPU: a larger weight); the pool follows the healthy backends' weights."""
    model: str = field(default="", validator=instance_of(str))
    """Label of the model it serves (empty: unlabelled)."""
    gpu: str = field(default="", validator=instance_of(str))
    """Label of its GPU (empty: unlabelled)."""
    kv_events: str = field(default="", validator=instance_of(str))
    """ZMQ address of its KV cache event publisher (vLLM's ``--kv-events-config``
    endpoint, ``kvpolicy sim backend --kv-events``): its prefix index then drops the
    blocks it evicts (empty: the index is the gateway's guess alone)."""


_BACKEND_KEYS = frozenset({"url", "weight", "model", "gpu", "kv_events"})
_ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


def kv_events_endpoint(value: object, where: str) -> str:
    """``value`` checked as a ZMQ address (``tcp://host:port``, ``ipc://path``); ``where``
    names the field in the error.

    Raises:
        ManifestError: anything else, named with ``where`` and the value.
    """
    if not isinstance(value, str) or not value.startswith(_ZMQ_SCHEMES):
        raise ManifestError(f"{where} must be a ZMQ address like tcp://host:5557: {value!r}")
    if value.startswith("tcp://"):
        host, _, port = value[len("tcp://") :].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ManifestError(f"{where} must be tcp://host:port: {value!r}")
    return value


def _spec(raw: object, where: str) -> BackendSpec:
    if isinstance(raw, str):
        return BackendSpec(backend_url(raw, where))
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where} must be a URL or a mapping with 'url': {raw!r}")
    unknown = sorted(map(str, raw.keys() - _BACKEND_KEYS))
    if unknown:
        known = ", ".join(sorted(_BACKEND_KEYS))
        raise ManifestError(f"{where}: unknown key {unknown[0]!r} (known: {known})")
    if "url" not in raw:
        raise ManifestError(f"{where}: missing key 'url'")
    url = backend_url(raw["url"], f"{where}.url")
    weight = raw.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ManifestError(f"{where}.weight must be a number > 0: {weight!r}")
    for key in ("model", "gpu"):
        if not isinstance(raw.get(key, ""), str):
            raise ManifestError(f"{where}.{key} must be a string: {raw[key]!r}")
    events = raw.get("kv_events") or ""
    if events:
        events = kv_events_endpoint(events, f"{where}.kv_events")
    try:
        return BackendSpec(url, weight, raw.get("model", ""), raw.get("gpu", ""), events)
    except ValueError as err:
        raise ManifestError(f"{where}: {err}") from None


def load_backends(
    urls: Sequence[str | BackendSpec] = (), manifest: Mapping[str, Any] | None = None
) -> tuple[BackendSpec, ...]:
    """The backends of ``--backend`` flags (``urls``, or specs already built) and of the
    manifest's ``backends:``.

    Both may be given: the flags come first, then the manifest's list.

    Raises:
        ManifestError: a URL that is not http(s), a bad weight or label, a backend given
            twice, or no backend at all (each naming the flag or field and the value).
    """
    if isinstance(urls, str):
        urls = [urls]
    specs = [
        u if isinstance(u, BackendSpec) else BackendSpec(backend_url(u, "'--backend'"))
        for u in urls
    ]
    raw = (manifest or {}).get("backends")
    if raw is not None:
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise ManifestError(f"backends must be a list: {raw!r}")
        specs += [_spec(item, f"backends[{i}]") for i, item in enumerate(raw)]
    if not specs:
        raise ManifestError("no backend: give '--backend URL' or a 'backends:' list")
    seen: set[str] = set()
    for spec in specs:
        key = _identity(spec.url)
        if key in seen:
            raise ManifestError(f"backend {spec.url!r} is given twice")
        seen.add(key)
    followed = [s.url for s in specs if s.kv_events]
    if followed:
        from kvpolicy.tenancy._kv_events import kv_events_missing

        missing = kv_events_missing()
        if missing is not None:
            raise ManifestError(f"backends {followed!r} publish KV events; {missing}")
    return tuple(specs)


def _identity(url: str) -> str:
    """What makes two backend URLs the same backend: scheme, host (case-folded), port."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}{parts.path.rstrip('/')}"


@frozen
class RoutingConfig:
    """How the gateway routes over its backends and watches them."""

    router: str = field(default="least-requests", validator=instance_of(str))
    """Entry-point name in ``kvpolicy.routing`` (used with two backends or more)."""
    params: Mapping[str, Any] = field(factory=dict, validator=instance_of(dict))
    """Keyword params of the router."""
    scrape_interval_s: float = field(default=1.0, converter=float, validator=ge(0.0))
    """Seconds between scrapes of each backend's ``/metrics`` (0: never scrape)."""
    metrics_path: str = field(default="/metrics", validator=instance_of(str))
    """Path of the backends' Prometheus exposition."""
    max_signal_age_s: float = field(default=3.0, converter=float, validator=gt(0.0))
    """A scraped signal older than this is stale: the router sees the gateway's own counts."""
    block_chars: int = field(default=64, validator=[instance_of(int), ge(1)])
    """Characters of prompt text per block of the approximate prefix index (about 16
    tokens of English text)."""
    index_blocks: int = field(default=65_536, validator=[instance_of(int), ge(1)])
    """Blocks the approximate prefix index keeps per backend (least recently used go
    first), unless the backend reports its KV blocks (``vllm:cache_config_info``)."""
    health: HealthConfig = field(factory=HealthConfig, validator=instance_of(HealthConfig))
    """Active checks and passive ejection."""


_ROUTING_KEYS = frozenset(
    {
        "router",
        "params",
        "scrape_interval_s",
        "metrics_path",
        "max_signal_age_s",
        "block_chars",
        "index_blocks",
        "health",
    }
)
_HEALTH_KEYS = frozenset(
    {"interval_s", "timeout_s", "path", "failures", "backoff_s", "max_backoff_s"}
)


def _section(raw: object, allowed: frozenset[str], where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where} must be a mapping: {raw!r}")
    unknown = sorted(map(str, raw.keys() - allowed))
    if unknown:
        raise ManifestError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})"
        )
    return raw


def load_routing(
    manifest: Mapping[str, Any] | None = None, router: str | None = None
) -> RoutingConfig:
    """The manifest's ``routing:`` section; ``router`` (the ``--router`` flag) overrides its
    router (its params then apply only when the names agree).

    Raises:
        ManifestError: an unknown key or a bad value, named with its path.
    """
    raw = (manifest or {}).get("routing") or {}
    sec = dict(_section(raw, _ROUTING_KEYS, "routing"))
    if "health" in sec:
        health = _section(sec["health"], _HEALTH_KEYS, "routing.health")
        try:
            sec["health"] = HealthConfig(**health)
        except (TypeError, ValueError) as err:
            raise ManifestError(f"routing.health: {err}") from None
    if router is not None:
        if sec.get("router") not in (None, router):
            sec.pop("params", None)
        sec["router"] = router
    try:
        return RoutingConfig(**sec)
    except (TypeError, ValueError) as err:
        raise ManifestError(f"routing: {err}") from None


def build_router(config: RoutingConfig) -> Router:
    """The router ``config`` names, built from the ``kvpolicy.routing`` entry points.

    Raises:
        ManifestError: an unknown router (the installed ones listed) or params it rejects.
    """
    try:
        return build(ROUTING, config.router, dict(config.params))
    except RegistryError as err:
        raise ManifestError(f"routing.router (--router): {err}") from None


_AUTOSCALING_KEYS = frozenset({"autoscaler", "params"})


def build_autoscaler(
    manifest: Mapping[str, Any] | None,
    name: str | None,
    pool: TokenPool,
    backends: int,
) -> Autoscaler | None:
    """The autoscaler of the manifest's ``autoscaling:`` section (``{autoscaler: NAME,
    params: {...}}``) or of ``--autoscaler NAME`` (which wins), built from the
    ``kvpolicy.autoscaling`` entry points; None when neither names one.

    ``token-pool`` (seed 004) gets the pool by default, and one replica sized as the
    pool's capacity over the ``backends`` configured (each brings its share).

    Raises:
        ManifestError: an unknown key or autoscaler (the installed ones listed), or params
            it rejects.
    """
    raw = (manifest or {}).get("autoscaling") or {}
    sec = _section(raw, _AUTOSCALING_KEYS, "autoscaling")
    if name is None:
        name = sec.get("autoscaler")
    elif sec.get("autoscaler") not in (None, name):
        sec = {}
    if name is None:
        return None
    params = sec.get("params") or {}
    if not isinstance(params, Mapping):
        raise ManifestError(f"autoscaling.params must be a mapping: {params!r}")
    params = dict(params)
    if name == "token-pool":
        cap = pool.capacity
        n = max(1, backends)
        params.setdefault("pool", pool)
        params.setdefault(
            "replica",
            Resources(
                cap.tokens_per_s / n, max(1, cap.kv_bytes // n), max(1, cap.concurrency // n)
            ),
        )
    try:
        return build(AUTOSCALING, name, params)
    except RegistryError as err:
        raise ManifestError(f"autoscaling.autoscaler (--autoscaler): {err}") from None


_URL = {"type": "string", "pattern": "^https?://[^/?#]+"}
_NUMBER_GE0 = {"type": "number", "minimum": 0}
_NUMBER_GT0 = {"type": "number", "exclusiveMinimum": 0}
_COUNT = {"type": "integer", "minimum": 1}


def _closed(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": props,
    }


def fleet_schemas() -> dict[str, dict[str, Any]]:
    """JSON schemas of a pool manifest's ``backends``, ``routing`` and ``autoscaling``
    sections (what :func:`load_backends`, :func:`load_routing` and
    :func:`build_autoscaler` read)."""
    backend = _closed(
        {
            "url": _URL,
            "weight": _NUMBER_GT0,
            "model": {"type": "string"},
            "gpu": {"type": "string"},
            "kv_events": {"type": "string", "pattern": "^(tcp|ipc|inproc)://"},
        },
        ("url",),
    )
    health = _closed(
        {
            "interval_s": _NUMBER_GE0,
            "timeout_s": _NUMBER_GT0,
            "path": {"type": "string"},
            "failures": _COUNT,
            "backoff_s": _NUMBER_GT0,
            "max_backoff_s": _NUMBER_GT0,
        }
    )
    routing = _closed(
        {
            "router": {"type": "string"},
            "params": {"type": "object"},
            "scrape_interval_s": _NUMBER_GE0,
            "metrics_path": {"type": "string"},
            "max_signal_age_s": _NUMBER_GT0,
            "block_chars": _COUNT,
            "index_blocks": _COUNT,
            "health": health,
        }
    )
    autoscaling = _closed({"autoscaler": {"type": "string"}, "params": {"type": "object"}})
    return {
        "backends": {"type": "array", "items": {"oneOf": [_URL, backend]}},
        "routing": routing,
        "autoscaling": autoscaling,
    }


class FleetSettings(NamedTuple):
    """The backends, routing and autoscaler of a gateway (see :func:`fleet_settings`)."""

    backends: tuple[BackendSpec, ...]
    routing: RoutingConfig | None
    autoscaler: Autoscaler | None


def fleet_settings(
    config: str | os.PathLike[str] | Mapping[str, Any],
    backends: Sequence[str] = (),
    router: str | None = None,
    autoscaler: str | None = None,
    *,
    backends_required: bool = True,
) -> FleetSettings:
    """The fleet of a pool manifest and the ``--backend``/``--router``/``--autoscaler``
    flags, checked before anything starts (routing is None for one ``--backend`` and no
    ``routing:`` section: it is proxied to as before). With ``backends_required=False``
    (checking a manifest alone) no backend is no error.

    Raises:
        ManifestError: a bad backend (not http(s), given twice, none at all), an unknown
            router or autoscaler (the installed ones listed), or a bad routing setting.
    """
    from kvpolicy.tenancy._manifest import _read, load_manifest

    raw = config if isinstance(config, Mapping) else _read(pathlib.Path(config))
    if not isinstance(raw, Mapping):
        raw = {}
    if backends or raw.get("backends") is not None or backends_required:
        specs = load_backends(backends, raw)
    else:
        specs = ()
    routing = None
    if len(specs) > 1 or raw.get("routing") or router is not None:
        routing = load_routing(raw, router)
        if len(specs) > 1:
            build_router(routing)  # an unknown router fails here, before serving
    pool = load_manifest(raw)
    scaler = build_autoscaler(raw, autoscaler, pool, len(specs))
    return FleetSettings(specs, routing, scaler)
