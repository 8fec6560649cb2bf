"""JSON schemas of the manifest and Kubernetes CRDs of ``TokenPool`` and ``TokenEntitlement``
(§4.2), generated from the key sets :func:`load_manifest` reads."""

from __future__ import annotations

from typing import Any

from kvpolicy.tenancy._backends import fleet_schemas
from kvpolicy.tenancy._classes import SERVICE_CLASSES
from kvpolicy.tenancy._entitlements import TokenPool
from kvpolicy.tenancy._manifest import (
    _COEFFICIENT_KEYS,
    _ENTITLEMENT_KEYS,
    _GATE_KEYS,
    _POOL_KEYS,
    _RESOURCE_KEYS,
    _TOP_KEYS,
    dump_manifest,
)

__all__ = ["CRD_GROUP", "CRD_VERSION", "crd_documents", "custom_resources", "manifest_schema"]

CRD_GROUP = "kvpolicy.io"
"""API group of the custom resources."""
CRD_VERSION = "v1alpha1"
"""Their version."""

_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_COUNT = {"type": "integer", "minimum": 1}
_FIELDS: dict[str, dict[str, Any]] = {
    "tokens_per_s": _POSITIVE,
    "kv_bytes": _COUNT,
    "kv_cache_gib": _POSITIVE,
    "concurrency": _COUNT,
    "tenant": {"type": "string", "minLength": 1},
    "name": {"type": "string", "minLength": 1},
    "service_class": {"type": "string", "enum": sorted(SERVICE_CLASSES)},
    "slo_target_s": _POSITIVE,
    "max_output_tokens": _COUNT,
    "update_interval_s": _POSITIVE,
    "window_s": _POSITIVE,
    "min_retry_s": _POSITIVE,
    "max_retry_s": _POSITIVE,
    "overcommit": {"type": "boolean"},
    "contention_level": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    **{k: {"type": "number"} for k in _COEFFICIENT_KEYS},
}


def _obj(keys: frozenset[str], required: tuple[str, ...], **sub: Any) -> dict[str, Any]:
    props = {k: sub.get(k, _FIELDS.get(k)) for k in sorted(keys)}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": props,
    }


def _resources() -> dict[str, Any]:
    schema = _obj(_RESOURCE_KEYS, ("tokens_per_s", "concurrency"))
    schema["oneOf"] = [{"required": ["kv_bytes"]}, {"required": ["kv_cache_gib"]}]
    return schema


def _entitlement(keys: frozenset[str], required: tuple[str, ...]) -> dict[str, Any]:
    res = _resources()
    return _obj(keys, required, baseline=res, burst=res)


def manifest_schema() -> dict[str, Any]:
    """JSON schema (draft 2020-12) of a pool manifest as :func:`load_manifest` reads it."""
    ent = _entitlement(_ENTITLEMENT_KEYS, ("tenant", "service_class", "baseline"))
    default = _entitlement(_ENTITLEMENT_KEYS - {"tenant"}, ("service_class", "baseline"))
    schema = _obj(
        _TOP_KEYS,
        ("pool",),
        pool=_obj(_POOL_KEYS, ("name", "capacity"), capacity=_resources()),
        entitlements={"type": "array", "items": ent},
        default=default,
        gate=_obj(_GATE_KEYS, ()),
        **fleet_schemas(),
    )
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _crd(kind: str, plural: str, spec: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": ["Pending", "Bound", "Released"]},
            "message": {"type": "string"},
        },
    }
    printer = [
        {"name": c, "type": "string", "jsonPath": f".spec.{c}"}
        for c in columns
        if c in spec["properties"]
    ]
    printer.append({"name": "Phase", "type": "string", "jsonPath": ".status.phase"})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{CRD_GROUP}"},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": CRD_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def crd_documents() -> list[dict[str, Any]]:
    """The ``CustomResourceDefinition`` documents of ``TokenPool`` and ``TokenEntitlement``.

    A TokenPool's spec is the manifest's ``pool`` section less its name (the resource's
    name); a TokenEntitlement's spec is one ``entitlements`` item plus ``pool``, the name of
    the TokenPool it binds to. Status ``phase`` is ``Bound`` once a gateway serves it.
    """
    pool = _obj(frozenset({"capacity"}), ("capacity",), capacity=_resources())
    ent_keys = _ENTITLEMENT_KEYS | {"pool"}
    ent = _entitlement(ent_keys, ("pool", "tenant", "service_class", "baseline"))
    ent["properties"]["pool"] = {"type": "string", "minLength": 1}
    # Kubernetes structural schemas reject $schema and draft keywords beyond OpenAPI v3.
    return [
        _crd("TokenPool", "tokenpools", pool, []),
        _crd("TokenEntitlement", "tokenentitlements", ent, ["pool", "service_class"]),
    ]


def custom_resources(pool: TokenPool, namespace: str = "default") -> list[dict[str, Any]]:
    """``pool`` as custom resources: one TokenPool and one TokenEntitlement per entitlement."""
    doc = dump_manifest(pool)
    api = f"{CRD_GROUP}/{CRD_VERSION}"
    out: list[dict[str, Any]] = [
        {
            "apiVersion": api,
            "kind": "TokenPool",
            "metadata": {"name": pool.name, "namespace": namespace},
            "spec": {"capacity": doc["pool"]["capacity"]},
        }
    ]
    for ent in doc["entitlements"]:
        out.append(
            {
                "apiVersion": api,
                "kind": "TokenEntitlement",
                "metadata": {"name": ent["tenant"], "namespace": namespace},
                "spec": {"pool": pool.name, **ent},
            }
        )
    return out
