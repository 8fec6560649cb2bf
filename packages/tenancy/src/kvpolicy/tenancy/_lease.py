"""``RedisLeaseGate``: admission that stays exact across gateway replicas sharing one Redis.

Every decision and every release is one Lua script, so it runs atomically inside Redis in
one round trip: replicas deciding at the same instant can never together exceed an
entitlement's concurrency, token budget or KV bytes, nor the pool's. Each admitted request
is a lease with a TTL that its holder renews (:meth:`RedisLeaseGate.renew`); capacity held by
a crashed replica comes back when its leases expire, and a late release of an expired lease
changes nothing.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from attrs import field, frozen
from attrs.validators import ge, instance_of

from kvpolicy.kvmodel import GateDecision, ModelSpec, Request
from kvpolicy.tenancy._entitlements import TokenEntitlement, TokenPool

__all__ = ["LeaseRelease", "OutagePolicy", "RedisLeaseGate"]

_log = logging.getLogger("kvpolicy.tenancy")

# Shared Lua: the clock, refills and freeing one lease. A lease is stored in the hash
# ``KEYS[3]`` as "tokens kv tenant"; its expiry is its score in the sorted set ``KEYS[2]``.
_LUA_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ns = ARGV[1]
local pool = KEYS[1]
local leases = KEYS[2]
local data = KEYS[3]
local function num(v, d) if v then return tonumber(v) end return d end
local function refund(key, amount)
  local v = redis.call('HMGET', key, 'b', 'depth')
  if v[1] and v[2] then
    redis.call('HSET', key, 'b', math.min(tonumber(v[2]), tonumber(v[1]) + amount))
  end
end
local function free(id, actual)
  local v = redis.call('HGET', data, id)
  if not v then return nil end
  local tok, kv, tenant = string.match(v, '^(%d+) (%d+) (.*)$')
  tok = tonumber(tok)
  kv = tonumber(kv)
  local ekey = ns .. ':e:' .. tenant
  for _, key in ipairs({ekey, pool}) do
    if redis.call('EXISTS', key) == 1 then
      redis.call('HINCRBY', key, 'inf', -1)
      redis.call('HINCRBY', key, 'kv', -kv)
      redis.call('HINCRBY', key, 'tok', -tok)
      if actual >= 0 then refund(key, tok - math.min(actual, tok)) end
    end
  end
  redis.call('HDEL', data, id)
  redis.call('ZREM', leases, id)
  return tok
end
local function reclaim(limit)
  local gone = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(gone) do free(id, -1) end
  return #gone
end
local function hold(id, tenant, tok, kv, ttl, idle)
  local ekey = ns .. ':e:' .. tenant
  for _, key in ipairs({ekey, pool}) do
    redis.call('HINCRBY', key, 'inf', 1)
    redis.call('HINCRBY', key, 'kv', kv)
    redis.call('HINCRBY', key, 'tok', tok)
  end
  redis.call('HSET', data, id, tok .. ' ' .. kv .. ' ' .. tenant)
  redis.call('ZADD', leases, now + ttl, id)
  redis.call('EXPIRE', ekey, idle)
end
"""

# ARGV: ns, id, tenant, tokens, kv, ttl_s, idle_s,
#       e_conc, e_rate, e_depth, e_kv, p_conc, p_rate, p_depth, p_kv
# Returns {1, ''} or {0, reason, wait_s, in_flight, tokens_in_flight}; {-1, 'duplicate'}.
_LUA_ACQUIRE = (
    _LUA_COMMON
    + """
reclaim(8)
local id, tenant = ARGV[2], ARGV[3]
local tok, kv, ttl, idle = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
if redis.call('HEXISTS', data, id) == 1 then return {-1, 'duplicate'} end
local ekey = ns .. ':e:' .. tenant
local levels = {}
local scopes = {{ekey, 8}, {pool, 12}}
for i, s in ipairs(scopes) do
  local key, a = s[1], s[2]
  local conc, rate = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local depth, kvcap = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local v = redis.call('HMGET', key, 'inf', 'kv', 'tok', 'b', 'bt')
  local inf, hkv, htok = num(v[1], 0), num(v[2], 0), num(v[3], 0)
  local level = math.min(depth, num(v[4], depth) + math.max(0, now - num(v[5], now)) * rate)
  levels[i] = {level, depth}
  local prefix = 'entitlement-'
  if i == 2 then prefix = 'pool-' end
  if inf + 1 > conc then
    return {0, prefix .. 'concurrency', '0', tostring(inf), tostring(htok), tostring(rate)}
  end
  if tok > level then
    return {0, prefix .. 'tokens', tostring((tok - level) / rate), tostring(inf),
            tostring(htok), tostring(rate)}
  end
  if hkv + kv > kvcap then
    return {0, prefix .. 'kv-cache', '0', tostring(inf), tostring(htok), tostring(rate)}
  end
end
for i, s in ipairs(scopes) do
  redis.call('HSET', s[1], 'b', levels[i][1] - tok, 'bt', now, 'depth', levels[i][2])
end
hold(id, tenant, tok, kv, ttl, idle)
return {1, ''}
"""
)

# ARGV: ns, id, actual (-1: charge in full). Returns {charged or -1}.
_LUA_RELEASE = (
    _LUA_COMMON
    + """
local tok = free(ARGV[2], tonumber(ARGV[3]))
if not tok then return -1 end
return tok
"""
)

# ARGV: ns, ttl_s, idle_s, then (id, tenant, tokens, kv) per lease held by the caller.
# Extends each lease; re-adopts one Redis lost (a restart, or an expiry while its holder was
# stalled), counting it again without a limit check: the request is really running.
# Returns {renewed, adopted, reclaimed}.
_LUA_RENEW = (
    _LUA_COMMON
    + """
local reclaimed = reclaim(64)
local ttl, idle = tonumber(ARGV[2]), ARGV[3]
local renewed, adopted = 0, 0
for i = 4, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HEXISTS', data, id) == 1 then
    redis.call('ZADD', leases, now + ttl, id)
    redis.call('EXPIRE', ns .. ':e:' .. ARGV[i + 1], idle)
    renewed = renewed + 1
  else
    hold(id, ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), ttl, idle)
    adopted = adopted + 1
  end
end
return {renewed, adopted, reclaimed}
"""
)

# ARGV: ns, tenant, tokens: charge tokens served while Redis was away to both buckets.
_LUA_CHARGE = (
    _LUA_COMMON
    + """
local amount = tonumber(ARGV[3])
for _, key in ipairs({ns .. ':e:' .. ARGV[2], pool}) do
  local v = redis.call('HMGET', key, 'b')
  if v[1] then redis.call('HSET', key, 'b', tonumber(v[1]) - amount) end
end
return 1
"""
)


def _local_default(name: str) -> float:
    return 0.5 if name in ("dedicated", "guaranteed") else 0.0


@frozen
class OutagePolicy:
    """What a :class:`RedisLeaseGate` does while Redis cannot be reached.

    Each replica may admit, on its own, up to ``fraction`` of an entitlement's *baseline*
    concurrency (rounded down) for each service class named in ``local_fraction``; a class
    at 0 (or absent) fails closed: its requests are denied with reason
    ``"state-unavailable"``. The default keeps half the baseline of dedicated and guaranteed
    entitlements (a reservation is a promise) and fails closed for elastic, spot and
    preemptible. What was admitted or released locally is reconciled with Redis when it
    answers again: leases still running are adopted, tokens served are charged, releases are
    replayed (each exactly once: releases are idempotent).
    """

    local_fraction: dict[str, float] = field(
        factory=lambda: {
            n: _local_default(n)
            for n in ("dedicated", "guaranteed", "elastic", "spot", "preemptible")
        }
    )
    """Service class name -> fraction of baseline concurrency admitted locally, in [0, 1]."""
    timeout_s: float = field(default=0.25, converter=float, validator=ge(0.001))
    """Socket timeout of each Redis call: how long a decision may block on a dead Redis."""

    def __attrs_post_init__(self) -> None:
        for name, value in self.local_fraction.items():
            if not isinstance(value, int | float) or not (0.0 <= value <= 1.0):
                raise ValueError(f"'local_fraction[{name!r}]' must be in [0, 1]: {value!r}")


@frozen
class LeaseRelease:
    """The outcome of :meth:`RedisLeaseGate.release`."""

    released: bool = field(validator=instance_of(bool))
    """Whether a held lease was freed (``False``: released twice, never admitted, expired)."""
    charged_tokens: int = field(validator=instance_of(int))
    """Tokens kept charged to the buckets (0 when nothing was released)."""
    clamped: bool = field(default=False, validator=instance_of(bool))
    """The caller reported more tokens than the request could produce; the charge was
    clamped to what was charged at admission."""


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{name}' must be int: {value!r}")
    if value < 0:
        raise ValueError(f"'{name}' must be >= 0: {value!r}")
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeaseGate:
    """Exact admission across replicas: hard limits and leases, atomically in Redis.

    Checks, in order and atomically: the entitlement's concurrency, token bucket (rate
    ``tokens_per_s``, depth ``window_s`` seconds of it) and KV bytes (its burst limits, or
    baseline), then the pool's. Reasons are ``"entitlement-concurrency"``,
    ``"entitlement-tokens"``, ``"entitlement-kv-cache"``, the same with ``pool-``,
    ``"oversized"`` (can never fit), ``"unknown-tenant"`` and ``"state-unavailable"``.
    Time is Redis's clock, so replicas need no synchronised clocks.

    A request is charged ``prompt_len + max_output_tokens`` tokens and that many tokens of KV
    at admission; :meth:`release` books what it really produced (clamped to the charge).

    Keys live under ``{namespace}`` (a Redis Cluster hash tag): ``:pool``, ``:leases``,
    ``:lease-data`` and ``:e:<tenant>``. An entitlement's key expires ``idle_ttl_s`` after
    its last admission or renewal, so tenants without traffic leave no state behind.
    """

    def __init__(
        self,
        pool: TokenPool,
        bytes_per_token: int | ModelSpec,
        client: Any,
        *,
        namespace: str = "kvpolicy",
        window_s: float = 60.0,
        lease_ttl_s: float = 30.0,
        idle_ttl_s: float = 3600.0,
        outage: OutagePolicy | None = None,
        default_entitlement: TokenEntitlement | None = None,
        min_retry_s: float = 0.05,
        max_retry_s: float = 60.0,
    ) -> None:
        """Build a gate over a redis-py client (``redis.Redis``; see :meth:`from_url`)."""
        if not isinstance(pool, TokenPool):
            raise TypeError(f"'pool' must be TokenPool: {pool!r}")
        if isinstance(bytes_per_token, ModelSpec):
            bytes_per_token = bytes_per_token.kv_bytes_per_token()
        self._bpt = _count("bytes_per_token", bytes_per_token)
        if self._bpt == 0:
            raise ValueError("'bytes_per_token' must be > 0: 0")
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"'namespace' must be a non-empty str: {namespace!r}")
        for name, value in (
            ("window_s", window_s),
            ("lease_ttl_s", lease_ttl_s),
            ("idle_ttl_s", idle_ttl_s),
            ("min_retry_s", min_retry_s),
            ("max_retry_s", max_retry_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"'{name}' must be finite and > 0: {value!r}")
        if default_entitlement is not None and not isinstance(
            default_entitlement, TokenEntitlement
        ):
            raise TypeError(
                f"'default_entitlement' must be TokenEntitlement: {default_entitlement!r}"
            )
        self._pool = pool
        self._client = client
        self._ns = "{" + namespace + "}"
        self._keys = [f"{self._ns}:pool", f"{self._ns}:leases", f"{self._ns}:lease-data"]
        self._window = float(window_s)
        self._ttl = float(lease_ttl_s)
        self._idle = max(math.ceil(idle_ttl_s), math.ceil(lease_ttl_s) + 1)
        self._outage = OutagePolicy() if outage is None else outage
        self._default = default_entitlement
        self._min_retry = float(min_retry_s)
        self._max_retry = float(max_retry_s)
        self._ents = {e.tenant: e for e in pool.entitlements}
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, int, int]] = {}  # leases this replica holds
        self._local: dict[str, int] = {}  # tenant -> leases admitted while Redis was away
        self._local_ids: set[str] = set()
        self._pending_release: dict[str, int] = {}
        self._pending_charge: dict[str, int] = {}
        self._acquire = client.register_script(_LUA_ACQUIRE)
        self._release = client.register_script(_LUA_RELEASE)
        self._renew = client.register_script(_LUA_RENEW)
        self._charge = client.register_script(_LUA_CHARGE)

    @classmethod
    def from_url(
        cls, pool: TokenPool, bytes_per_token: int | ModelSpec, url: str, **kwargs: Any
    ) -> RedisLeaseGate:
        """Connect to ``url`` (``redis://host:port/db``) with redis-py (the ``redis`` extra)."""
        import redis

        outage = kwargs.get("outage") or OutagePolicy()
        client = redis.Redis.from_url(
            url,
            socket_timeout=outage.timeout_s,
            socket_connect_timeout=outage.timeout_s,
            retry_on_timeout=False,
        )
        return cls(pool, bytes_per_token, client, **kwargs)

    # -- inspection --------------------------------------------------------------------

    @property
    def pool(self) -> TokenPool:
        """The pool and its entitlements."""
        return self._pool

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement governing ``tenant`` (the default one if the pool has none)."""
        ent = self._ents.get(tenant)
        return ent if ent is not None else self._default

    def held(self) -> int:
        """Leases this replica holds now."""
        return len(self._held)

    def usage(self, tenant: str | None = None) -> dict[str, int]:
        """In-flight counters in Redis: ``in_flight``, ``kv_bytes``, ``tokens`` of ``tenant``'s
        entitlement, or of the pool when ``tenant`` is ``None`` (zeros when absent)."""
        key = self._keys[0] if tenant is None else f"{self._ns}:e:{tenant}"
        raw = self._client.hmget(key, "inf", "kv", "tok")
        inf, kv, tok = (int(_text(v)) if v is not None else 0 for v in raw)
        return {"in_flight": inf, "kv_bytes": kv, "tokens": tok}

    # -- decisions ---------------------------------------------------------------------

    def max_request_tokens(self, tenant: str) -> int:
        """The largest ``prompt_len + max_output_tokens`` the entitlement can ever fund."""
        ent = self.entitlement(tenant)
        if ent is None:
            return 0
        lim, cap = ent.limits, self._pool.capacity
        return int(
            min(
                lim.tokens_per_s * self._window,
                cap.tokens_per_s * self._window,
                lim.kv_bytes // self._bpt,
                cap.kv_bytes // self._bpt,
            )
        )

    def check(
        self, request: Request, time: float | None = None, *, max_output_tokens: int | None = None
    ) -> GateDecision:
        """Admit ``request`` (a lease held until :meth:`release`), or deny it.

        ``time`` is accepted for kvmodel's ``RequestGate`` shape and ignored: Redis's clock
        decides. ``max_output_tokens`` overrides the entitlement's (a request's
        ``max_tokens``).

        Raises:
            TypeError: ``request`` is not a Request, or ``max_output_tokens`` not an int.
            ValueError: ``max_output_tokens`` is negative; ``request`` is already held by
                this gate. Nothing changes.
        """
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be Request: {request!r}")
        if max_output_tokens is not None:
            _count("max_output_tokens", max_output_tokens)
        rid = request.request_id
        if rid in self._held:
            raise ValueError(f"'request' {rid!r} is already admitted and not released")
        ent = self.entitlement(request.tenant)
        if ent is None:
            return GateDecision(False, self._max_retry, "unknown-tenant")
        out = ent.max_output_tokens if max_output_tokens is None else max_output_tokens
        tok = request.prompt_len + out
        kv = tok * self._bpt
        if tok > self.max_request_tokens(request.tenant):
            return GateDecision(False, self._max_retry, "oversized")
        lim, cap = ent.limits, self._pool.capacity
        args = [
            self._ns,
            rid,
            request.tenant,
            tok,
            kv,
            self._ttl,
            self._idle,
            lim.concurrency,
            lim.tokens_per_s,
            lim.tokens_per_s * self._window,
            lim.kv_bytes,
            cap.concurrency,
            cap.tokens_per_s,
            cap.tokens_per_s * self._window,
            cap.kv_bytes,
        ]
        try:
            self._reconcile()
            res = self._acquire(keys=self._keys, args=args)
        except _redis_errors() as err:
            return self._check_locally(rid, request.tenant, ent, tok, kv, err)
        status = int(res[0])
        if status == -1:
            raise ValueError(f"'request' {rid!r} is already admitted and not released")
        if status == 1:
            with self._lock:
                self._held[rid] = (request.tenant, tok, kv)
            return GateDecision(admitted=True)
        reason = _text(res[1])
        wait, inf, htok, rate = (float(_text(v)) for v in res[2:6])
        if wait <= 0:  # a slot or KV bytes: when in-flight work drains at ``rate``
            wait = self._max_retry if inf <= 0 or htok <= 0 else htok / (rate * inf)
        return GateDecision(False, min(self._max_retry, max(self._min_retry, wait)), reason)

    def release(self, request: Request | str, produced_tokens: int | None = None) -> LeaseRelease:
        """Free what ``request`` (or its id) holds and book the tokens it really produced.

        ``produced_tokens`` counts prompt and output tokens (``None``: the full charge stays).
        More than the charge is clamped to it and logged, never charged. Releasing twice,
        releasing a request never admitted, or releasing after the lease expired changes
        nothing and returns ``released=False``.

        Raises:
            TypeError, ValueError: ``produced_tokens`` is not a non-negative int.
        """
        rid = request.request_id if isinstance(request, Request) else request
        if not isinstance(rid, str):
            raise TypeError(f"'request' must be Request or str: {request!r}")
        actual = -1 if produced_tokens is None else _count("produced_tokens", produced_tokens)
        with self._lock:
            mine = self._held.pop(rid, None)
        clamped = mine is not None and actual > mine[1]
        if clamped:
            _log.warning(
                "release of %r reports %d tokens, more than its charge %d: clamped",
                rid,
                actual,
                mine[1] if mine else 0,
            )
        if mine is not None and rid in self._local_ids:
            return self._release_locally(rid, mine, actual)
        try:
            self._reconcile()
            charged = int(self._release(keys=self._keys, args=[self._ns, rid, actual]))
        except _redis_errors():
            if mine is None:
                return LeaseRelease(False, 0)
            with self._lock:
                self._pending_release[rid] = actual
            tok = mine[1] if actual < 0 else min(actual, mine[1])
            return LeaseRelease(True, tok, clamped)
        if charged < 0:
            return LeaseRelease(False, 0)
        tok = charged if actual < 0 else min(actual, charged)
        return LeaseRelease(True, tok, clamped)

    def renew(self) -> tuple[int, int, int]:
        """Extend every lease this replica holds (call it every ``lease_ttl_s / 3``), adopt
        those Redis lost, reclaim expired leases of any replica, and reconcile what was
        decided while Redis was away. One round trip.

        Returns:
            ``(renewed, adopted, reclaimed)`` lease counts.

        Raises:
            redis.exceptions.ConnectionError: Redis is still away (nothing is lost).
        """
        self._reconcile()
        args: list[Any] = [self._ns, self._ttl, self._idle]
        with self._lock:
            for rid, (tenant, tok, kv) in self._held.items():
                args += [rid, tenant, tok, kv]
        res = self._renew(keys=self._keys, args=args)
        return int(res[0]), int(res[1]), int(res[2])

    # -- outage --------------------------------------------------------------------------

    def _check_locally(
        self, rid: str, tenant: str, ent: TokenEntitlement, tok: int, kv: int, err: Exception
    ) -> GateDecision:
        frac = self._outage.local_fraction.get(ent.service_class.name, 0.0)
        allowance = int(ent.baseline.concurrency * frac)
        with self._lock:
            if self._local.get(tenant, 0) >= allowance:
                _log.warning("redis unavailable (%s): %r denied", err, rid)
                return GateDecision(False, self._min_retry * 20, "state-unavailable")
            self._local[tenant] = self._local.get(tenant, 0) + 1
            self._local_ids.add(rid)
            self._held[rid] = (tenant, tok, kv)
        return GateDecision(admitted=True)

    def _release_locally(self, rid: str, mine: tuple[str, int, int], actual: int) -> LeaseRelease:
        tenant, tok, _ = mine
        charged = tok if actual < 0 else min(actual, tok)
        with self._lock:
            self._local_ids.discard(rid)
            self._local[tenant] -= 1
            self._pending_charge[tenant] = self._pending_charge.get(tenant, 0) + charged
        return LeaseRelease(True, charged, actual > tok)

    def _reconcile(self) -> None:
        """Push what happened while Redis was away (raises while it still is)."""
        if not (self._local_ids or self._pending_release or self._pending_charge):
            return
        with self._lock:
            adopt = [(r, self._held[r]) for r in self._local_ids if r in self._held]
            releases = dict(self._pending_release)
            charges = dict(self._pending_charge)
        if adopt:
            args: list[Any] = [self._ns, self._ttl, self._idle]
            for rid, (tenant, tok, kv) in adopt:
                args += [rid, tenant, tok, kv]
            self._renew(keys=self._keys, args=args)
            with self._lock:
                for rid, (tenant, _, _) in adopt:
                    self._local_ids.discard(rid)
                    self._local[tenant] -= 1
        for rid, actual in releases.items():
            self._release(keys=self._keys, args=[self._ns, rid, actual])
            with self._lock:
                self._pending_release.pop(rid, None)
        for tenant, amount in charges.items():
            self._charge(keys=self._keys, args=[self._ns, tenant, amount])
            with self._lock:
                self._pending_charge[tenant] -= amount
                if not self._pending_charge[tenant]:
                    del self._pending_charge[tenant]


def _redis_errors() -> tuple[type[Exception], ...]:
    import redis

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
