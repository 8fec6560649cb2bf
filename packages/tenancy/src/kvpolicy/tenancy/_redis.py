"""A :class:`StateStore` in Redis, shared by several gateway replicas (§4.3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

import attrs

from kvpolicy.tenancy._entitlements import Resources
from kvpolicy.tenancy._store import EntitlementState, Holding, PoolState

__all__ = ["RedisStateStore"]


class _Client(Protocol):
    """The few redis-py calls the store makes."""

    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: str) -> Any: ...
    def hget(self, name: str, key: str) -> Any: ...
    def hset(self, name: str, key: str, value: str) -> Any: ...
    def hdel(self, name: str, *keys: str) -> Any: ...
    def hkeys(self, name: str) -> Any: ...


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStateStore:
    """Gate state in Redis: one hash of entitlement states, one of holdings, one pool key.

    Keys live under ``namespace`` (``<namespace>:entitlements``, ``<namespace>:holdings``,
    ``<namespace>:pool``), so one Redis serves several pools. Values are JSON.

    Each call is one Redis command, atomic on its own; a gate's decision reads, then writes
    several keys, so replicas deciding at the same instant may each admit into the last free
    slot (the paper's auth service has the same read-decide-write shape). The over-admission
    is bounded by the number of replicas and is corrected as requests are released.
    """

    __slots__ = ("_client", "_ents", "_holds", "_pool")

    def __init__(self, client: _Client, namespace: str = "kvpolicy:tenancy") -> None:
        """Wrap a redis-py client (``redis.Redis(...)``; bytes or decoded responses)."""
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"'namespace' must be a non-empty str: {namespace!r}")
        for method in ("get", "set", "hget", "hset", "hdel", "hkeys"):
            if not callable(getattr(client, method, None)):
                raise TypeError(f"'client' must be a redis client (no {method}()): {client!r}")
        self._client = client
        self._ents = f"{namespace}:entitlements"
        self._holds = f"{namespace}:holdings"
        self._pool = f"{namespace}:pool"

    @classmethod
    def from_url(cls, url: str, namespace: str = "kvpolicy:tenancy") -> RedisStateStore:
        """Connect to ``url`` (``redis://host:port/db``) with redis-py (the ``redis`` extra)."""
        try:
            import redis
        except ImportError as err:
            raise ImportError(
                "RedisStateStore needs redis-py: "
                "pip install --find-links dist 'kvpolicy-tenancy[redis]'"
            ) from err
        return cls(redis.Redis.from_url(url), namespace)

    def entitlement(self, tenant: str) -> EntitlementState | None:
        """The state of ``tenant``'s entitlement, or ``None`` before its first request."""
        raw = self._client.hget(self._ents, tenant)
        return None if raw is None else EntitlementState(**json.loads(_text(raw)))

    def put_entitlement(self, tenant: str, state: EntitlementState) -> None:
        """Replace the state of ``tenant``'s entitlement."""
        self._client.hset(self._ents, tenant, json.dumps(attrs.asdict(state)))

    def tenants(self) -> Iterator[str]:
        """Every tenant that has a state."""
        return iter(sorted(_text(k) for k in self._client.hkeys(self._ents)))

    def pool(self) -> PoolState | None:
        """The pool's state, or ``None`` before the first gate wrote it."""
        raw = self._client.get(self._pool)
        if raw is None:
            return None
        doc = json.loads(_text(raw))
        doc["capacity"] = Resources(**doc["capacity"])
        return PoolState(**doc)

    def put_pool(self, state: PoolState) -> None:
        """Replace the pool's state."""
        self._client.set(self._pool, json.dumps(attrs.asdict(state)))

    def holding(self, request_id: str) -> Holding | None:
        """What the admitted request ``request_id`` holds, or ``None``."""
        raw = self._client.hget(self._holds, request_id)
        return None if raw is None else Holding(*json.loads(_text(raw)))

    def put_holding(self, request_id: str, holding: Holding | None) -> None:
        """Record what ``request_id`` holds; ``None`` forgets it."""
        if holding is None:
            self._client.hdel(self._holds, request_id)
        else:
            value = json.dumps([holding.tenant, holding.tokens, holding.kv_bytes])
            self._client.hset(self._holds, request_id, value)
