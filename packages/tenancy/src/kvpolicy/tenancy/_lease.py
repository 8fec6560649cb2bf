"""``RedisLeaseGate``: admission that stays exact across gateway replicas sharing one Redis.

Every decision and every release is one Lua script, so it runs atomically inside Redis in
one round trip: replicas deciding at the same instant can never together exceed an
entitlement's concurrency, token budget or KV bytes, and the priority, debt and burst of
seed 004 are computed inside the same scripts, so replicas decide as one
:class:`~kvpolicy.tenancy.TokenPoolGate` would. Each admitted request
is a lease with a TTL that its holder renews (:meth:`RedisLeaseGate.renew`); capacity held by
a crashed replica comes back when its leases expire, and a late release of an expired lease
changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from importlib import resources
from typing import Any

import attrs
from attrs import field, frozen
from attrs.validators import ge, instance_of

from kvpolicy.kvmodel import GateDecision, ModelSpec, Request
from kvpolicy.tenancy._entitlements import (
    Resources,
    TokenEntitlement,
    TokenPool,
    fundable_tokens,
)
from kvpolicy.tenancy._gate import GateConfig
from kvpolicy.tenancy._math import retry_after

__all__ = ["LeaseRelease", "OutagePolicy", "RedisLeaseGate"]

_log = logging.getLogger("kvpolicy.tenancy")

# The scripts are Lua files beside this module (lua/*.lua): common.lua, seed 004's state
# kept whole in Redis, and one file per script that runs after it. Each script's first
# lines say its arguments and answer; tests/test_lua.py compiles and lints them.


def _lua(name: str) -> str:
    return (resources.files("kvpolicy.tenancy") / "lua" / f"{name}.lua").read_text()


_LUA_COMMON = _lua("common")
_LUA_ACQUIRE = _LUA_COMMON + _lua("acquire")
_LUA_RELEASE = _LUA_COMMON + _lua("release")
_LUA_RENEW = _LUA_COMMON + _lua("renew")
_LUA_CHARGE = _LUA_COMMON + _lua("charge")
_LUA_HOLD = _LUA_COMMON + _lua("hold")
_LUA_STATE = _LUA_COMMON + _lua("state")
SCRIPTS = ("acquire", "release", "renew", "charge", "hold", "state")
"""The scripts, each run after ``common.lua``."""


@frozen
class OutagePolicy:
    """What a :class:`RedisLeaseGate` does while Redis cannot be reached.

    By default every class fails closed: a request is denied with reason
    ``"state-unavailable"`` (and a short Retry-After) until Redis answers, so that no limit
    is ever exceeded, whatever the number of replicas: a replica alone cannot know what the
    others hold. ``local_fraction`` trades that for availability: each replica may admit,
    on its own, up to ``fraction`` of an entitlement's *baseline* concurrency (rounded
    down; the leases it held before the outage count) for each service class named, e.g.
    ``OutagePolicy({"dedicated": 0.5, "guaranteed": 0.5})`` keeps half of every reservation
    served by each replica. Then an entitlement may exceed its concurrency during an outage
    by up to one replica's allowance per other replica (the others' holdings are unknown).
    What was admitted or released locally is reconciled with Redis when it answers again:
    leases still running are adopted, tokens served are charged, releases are replayed
    (each exactly once: releases are idempotent).
    """

    local_fraction: dict[str, float] = field(factory=dict)
    """Service class name -> fraction of baseline concurrency a replica admits alone, in
    [0, 1]; a class absent (the default: all) fails closed."""
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
    debt: float | None = None
    """The entitlement's service debt after the release (``None`` when not known: Redis
    away, or nothing released)."""
    priority: float | None = None
    """Its priority weight after the release (``None`` likewise)."""


_ADMIT = GateDecision(admitted=True)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'{name}' must be int: {value!r}")
    if value < 0:
        raise ValueError(f"'{name}' must be >= 0: {value!r}")
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLeaseGate:
    """Seed 004's admission (§4.3), exact across gateway replicas sharing one Redis.

    Every decision, release and renewal is one Lua script: one round trip, atomic inside
    Redis. The checks are :class:`~kvpolicy.tenancy.TokenPoolGate`'s, in its order and with
    its reasons (``"unknown-tenant"``, ``"oversized"``, ``"concurrency"``, ``"tokens"``,
    ``"kv-cache"``, ``"pool-full"``, ``"priority"``), its priority weights (eq. 1), debt
    (eq. 2) and burst intensity (eq. 3), its admission threshold and reservations: replicas
    sharing one Redis decide as one in-process gate would on the same sequence, and never
    together exceed an entitlement's concurrency, token budget or KV bytes, nor (unless
    ``GateConfig.overcommit``) the pool's. Over a contended pool only a request whose
    priority exceeds the threshold (or within a reservation) is admitted.
    ``"state-unavailable"`` is the one reason of its own (see :class:`OutagePolicy`).

    The debt and burst updates run inside the scripts, lazily: an entitlement is brought up
    to date when a script touches it (the idle intervals in closed form), so the update
    costs O(1) per decision whatever the number of tenants, and the weights of entitlements
    with requests in flight (at most the pool's concurrency) are refreshed once per
    ``update_interval_s``, by the first contended decision that needs the threshold.

    Time is Redis's clock (``clock="redis"``: replicas need no synchronised clocks), or the
    ``time`` given to each call (``clock="request"``: replays and simulations).

    A request is charged ``prompt_len + max_output_tokens`` tokens and that many tokens of KV
    at admission; :meth:`release` books what it really produced (clamped to the charge).
    Each admitted request is a lease with a TTL that its holder renews (:meth:`renew`).

    Keys live under ``{namespace}`` (a Redis Cluster hash tag): ``:pool``, ``:leases``,
    ``:lease-data``, ``:priority`` and ``:e:<tenant>``. An entitlement's key expires
    ``idle_ttl_s`` after it was last touched, so tenants without traffic leave no state.
    """

    def __init__(
        self,
        pool: TokenPool,
        bytes_per_token: int | ModelSpec,
        client: Any,
        *,
        config: GateConfig | None = None,
        namespace: str = "kvpolicy",
        clock: str = "redis",
        lease_ttl_s: float = 30.0,
        idle_ttl_s: float = 3600.0,
        outage: OutagePolicy | None = None,
        default_entitlement: TokenEntitlement | None = None,
        async_client: Any = None,
        recovery_s: float | None = None,
    ) -> None:
        """Build a gate over a redis-py client (``redis.Redis``; see :meth:`from_url`).

        Args:
            pool: the pool and its entitlements.
            bytes_per_token: KV bytes of one token, or a model whose KV size gives it.
            client: a redis-py client.
            config: coefficients, control interval, bucket window and Retry-After bounds
                (those of :class:`~kvpolicy.tenancy.TokenPoolGate`); defaults when ``None``.
            namespace: key prefix; replicas of one pool share it.
            clock: ``"redis"`` (Redis's clock) or ``"request"`` (the ``time`` of each call).
            lease_ttl_s: lease lifetime without renewal, seconds.
            idle_ttl_s: lifetime of an entitlement's state without traffic, seconds.
            outage: what to do while Redis is away; defaults when ``None``.
            default_entitlement: the entitlement of a tenant the pool does not name; ``None``
                denies such requests with ``"unknown-tenant"``. It may not reserve capacity.
            async_client: a ``redis.asyncio.Redis`` on the same server, for :meth:`acheck`
                (used from one event loop); ``None`` runs :meth:`check` in a thread instead.
            recovery_s: how long no request is admitted after Redis lost the pool's state
                or a replica saw it fail, so that every replica re-adopts its leases and
                pushes its outage admissions first (longer than the renewal interval of
                the replicas). ``None``: ``lease_ttl_s / 3`` with ``clock="redis"``, 0 with
                ``clock="request"`` (replays have no outages). A lost state is told from
                a first start by the replicas: the window opens when the first script to
                find no pool state comes from a replica that had seen it.
        """
        if not isinstance(pool, TokenPool):
            raise TypeError(f"'pool' must be TokenPool: {pool!r}")
        if isinstance(bytes_per_token, ModelSpec):
            bytes_per_token = bytes_per_token.kv_bytes_per_token()
        self._bpt = _count("bytes_per_token", bytes_per_token)
        if self._bpt == 0:
            raise ValueError("'bytes_per_token' must be > 0: 0")
        config = GateConfig() if config is None else config
        if not isinstance(config, GateConfig):
            raise TypeError(f"'config' must be GateConfig: {config!r}")
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"'namespace' must be a non-empty str: {namespace!r}")
        if clock not in ("redis", "request"):
            raise ValueError(f"'clock' must be 'redis' or 'request': {clock!r}")
        for name, value, most in (
            ("lease_ttl_s", lease_ttl_s, 86_400.0),
            ("idle_ttl_s", idle_ttl_s, 30 * 86_400.0),
        ):
            if not (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value > 0
            ):
                raise ValueError(f"'{name}' must be finite and > 0: {value!r}")
            if value > most:
                raise ValueError(f"'{name}' must be <= {most:g}: {value!r}")
        if recovery_s is None:
            recovery_s = lease_ttl_s / 3 if clock == "redis" else 0.0
        if not (
            isinstance(recovery_s, int | float)
            and not isinstance(recovery_s, bool)
            and math.isfinite(recovery_s)
            and 0 <= recovery_s <= 86_400
        ):
            raise ValueError(f"'recovery_s' must be finite, >= 0 and <= 86400: {recovery_s!r}")
        if default_entitlement is not None:
            if not isinstance(default_entitlement, TokenEntitlement):
                raise TypeError(
                    f"'default_entitlement' must be TokenEntitlement: {default_entitlement!r}"
                )
            if default_entitlement.service_class.protected:
                raise ValueError(
                    "'default_entitlement' must not reserve capacity: service class "
                    f"{default_entitlement.service_class.name!r}"
                )
        self._pool = pool
        self._config = config
        self._client = client
        self._clock = clock
        self._ns = "{" + namespace + "}"
        self._keys = [
            f"{self._ns}:pool",
            f"{self._ns}:leases",
            f"{self._ns}:lease-data",
            f"{self._ns}:priority",
            f"{self._ns}:released",
        ]
        self._window = config.window_s
        self._ttl = float(lease_ttl_s)
        self._idle = max(math.ceil(idle_ttl_s), math.ceil(lease_ttl_s) + 1)
        self._outage = OutagePolicy() if outage is None else outage
        self._default = default_entitlement
        self._ents = {e.tenant: e for e in pool.entitlements}
        self._capacity = pool.capacity  # its tokens/s rescaled by scale_throughput
        cap, c = pool.capacity, config.coefficients
        res_tps, res_kv, res_slots = pool.reserved
        self._held_tokens = repr(min(res_tps, cap.tokens_per_s) * self._window)
        self._common: list[Any] = [
            self._ns,
            "",
            repr(config.update_interval_s),
            repr(c.alpha_slo),
            repr(c.alpha_burst),
            repr(c.alpha_debt),
            repr(c.gamma_d),
            repr(c.gamma_b),
            repr(pool.mean_slo_s),
            repr(cap.tokens_per_s),
            repr(cap.tokens_per_s * self._window),
            cap.concurrency,
            cap.kv_bytes,
            res_kv,
            res_slots,
            "0",  # the recovery window: 0 until this replica has seen the pool's state
        ]
        self._recovery = repr(float(recovery_s))
        self._specs: dict[str, str] = {}
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, int, int]] = {}  # leases this replica holds
        # What happened while Redis was away, pushed by _reconcile (one at a time: the
        # lock) when it answers again: leases admitted here, releases and tokens to book,
        # and whether this replica saw Redis fail (the recovery window opens first).
        self._reconciling = threading.Lock()
        self._local_ids: set[str] = set()  # admitted here, not yet adopted by Redis
        self._adopting: set[str] = set()  # being adopted by the reconciliation under way
        self._pending_release: dict[str, int] = {}
        self._pending_charge: dict[str, int] = {}
        self._saw_outage = False
        self._acquire = client.register_script(_LUA_ACQUIRE)
        self._release = client.register_script(_LUA_RELEASE)
        self._renew = client.register_script(_LUA_RENEW)
        self._charge = client.register_script(_LUA_CHARGE)
        self._state = client.register_script(_LUA_STATE)
        self._hold = client.register_script(_LUA_HOLD)
        self._aclient = async_client
        if async_client is not None:
            self._aacquire = async_client.register_script(_LUA_ACQUIRE)
            self._arelease = async_client.register_script(_LUA_RELEASE)

    @classmethod
    def from_url(
        cls, pool: TokenPool, bytes_per_token: int | ModelSpec, url: str, **kwargs: Any
    ) -> RedisLeaseGate:
        """Connect to ``url`` (``redis://host:port/db``) with redis-py (the ``redis`` extra),
        with a blocking client and an asyncio one (for :meth:`acheck`).

        The asyncio client of a ``redis://`` URL is the gateway's own
        (:class:`~kvpolicy.tenancy._resp.LeanRedis`): concurrent calls pipelined on one
        connection, at a fraction of redis-py's CPU per call (``asyncio_client="redis-py"``
        takes redis-py's). redis-py's (for other URLs, ``rediss://`` and ``unix://``) holds
        at most ``max_connections`` (default 64) and a call that finds them all busy waits
        for one up to ``pool_timeout_s`` (default 2 s), rather than failing at once: with
        redis-py's default pool a burst of concurrent checks (36-43 of them at 500
        requests/s on the 2-core development machine) found the pool full and were
        answered ``state-unavailable`` as if Redis were away.
        """
        import redis
        import redis.asyncio

        from kvpolicy.tenancy._resp import LeanRedis

        max_connections = int(kwargs.pop("max_connections", 64))
        pool_timeout_s = float(kwargs.pop("pool_timeout_s", 2.0))
        which = kwargs.pop("asyncio_client", "lean")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if not pool_timeout_s > 0:
            raise ValueError(f"pool_timeout_s must be > 0, got {pool_timeout_s}")
        if which not in ("lean", "redis-py"):
            raise ValueError(f"'asyncio_client' must be 'lean' or 'redis-py': {which!r}")
        outage = kwargs.get("outage") or OutagePolicy()
        opts: dict[str, Any] = {
            "socket_timeout": outage.timeout_s,
            "socket_connect_timeout": outage.timeout_s,
            "retry_on_timeout": False,
        }
        client = redis.Redis.from_url(url, **opts)
        if "async_client" not in kwargs:
            if which == "lean" and url.startswith("redis://"):
                kwargs["async_client"] = LeanRedis(url, outage.timeout_s)
            else:
                connections = redis.asyncio.BlockingConnectionPool.from_url(
                    url, max_connections=max_connections, timeout=pool_timeout_s, **opts
                )
                kwargs["async_client"] = redis.asyncio.Redis.from_pool(connections)
        return cls(pool, bytes_per_token, client, **kwargs)

    # -- inspection --------------------------------------------------------------------

    @property
    def pool(self) -> TokenPool:
        """The pool and its entitlements."""
        return self._pool

    @property
    def config(self) -> GateConfig:
        """The gate's settings."""
        return self._config

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement governing ``tenant`` (the default one if the pool has none)."""
        ent = self._ents.get(tenant)
        return ent if ent is not None else self._default

    @property
    def tokens_per_s(self) -> float:
        """The pool's tokens per second this replica assumes now (after any
        :meth:`scale_throughput`; kvmodel's ``ThroughputScalable``)."""
        return self._capacity.tokens_per_s

    def scale_throughput(self, factor: float, time: float | None = None) -> None:
        """Multiply every token rate this replica sends to Redis by ``factor``: the pool's
        tokens/s and each entitlement's baseline and burst tokens/s (the default
        entitlement's too); KV bytes and concurrency are unchanged. The buckets in Redis
        keep their levels, capped at their new depths when next refilled. Every replica
        must apply the same factor (:class:`~kvpolicy.tenancy.SharedThroughputRefresh`
        does); until then each refills at the rate it assumes. ``time`` is ignored.

        Raises:
            TypeError: ``factor`` is not a number.
            ValueError: ``factor`` is not finite and > 0; nothing changes.
        """
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise TypeError(f"'factor' must be a number: {factor!r}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"'factor' must be a finite number > 0: {factor!r}")
        if factor == 1.0:
            return

        def rate(r: Resources) -> Resources:
            return attrs.evolve(r, tokens_per_s=r.tokens_per_s * factor)

        def scaled(e: TokenEntitlement) -> TokenEntitlement:
            burst = None if e.burst is None else rate(e.burst)
            return attrs.evolve(e, baseline=rate(e.baseline), burst=burst)

        ents = {t: scaled(e) for t, e in self._ents.items()}
        default = None if self._default is None else scaled(self._default)
        cap = rate(self._capacity)
        reserved = sum(e.baseline.tokens_per_s for e in ents.values() if e.service_class.protected)
        with self._lock:
            self._ents, self._default, self._capacity, self._specs = ents, default, cap, {}
            self._held_tokens = repr(min(reserved, cap.tokens_per_s) * self._window)
            self._common[9] = repr(cap.tokens_per_s)
            self._common[10] = repr(cap.tokens_per_s * self._window)

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

    def state(self, tenant: str, time: float | None = None) -> tuple[float, float, float]:
        """``(debt, burst, priority)`` of ``tenant``'s entitlement as of ``time`` (Redis's
        clock when ``clock="redis"``): eqs. (2), (3) and (1). One round trip.

        Raises:
            KeyError: the tenant has no entitlement and there is no default one.
        """
        ent = self.entitlement(tenant)
        if ent is None:
            raise KeyError(f"'tenant' has no entitlement: {tenant!r}")
        args = [*self._args(time), self._idle, tenant, self._spec(tenant, ent)]
        res = self._state(keys=self._keys, args=args)
        debt, burst, weight = (float(_text(v)) for v in res)
        return debt, burst, weight

    def debt(self, tenant: str, time: float | None = None) -> float:
        """Service debt ``d_e`` (eq. 2) of ``tenant``."""
        return self.state(tenant, time)[0]

    def priority(self, tenant: str, time: float | None = None) -> float:
        """Priority weight ``w_e`` (eq. 1) of ``tenant``."""
        return self.state(tenant, time)[2]

    # -- decisions ---------------------------------------------------------------------

    def max_request_tokens(self, tenant: str) -> int:
        """The largest ``prompt_len + max_output_tokens`` the entitlement can ever fund."""
        ent = self.entitlement(tenant)
        if ent is None:
            return 0
        return fundable_tokens(ent.limits, self._capacity, self._window, self._bpt)

    def check(
        self, request: Request, time: float | None = None, *, max_output_tokens: int | None = None
    ) -> GateDecision:
        """Admit ``request`` (a lease held until :meth:`release`), or deny it.

        ``time`` (seconds) is the clock with ``clock="request"`` and ignored otherwise.
        ``max_output_tokens`` overrides the entitlement's (a request's ``max_tokens``).

        Raises:
            TypeError: ``request`` is not a Request, ``max_output_tokens`` not an int, or
                ``time`` not a number.
            ValueError: ``max_output_tokens`` or ``time`` is negative (or ``time`` missing
                with ``clock="request"``); ``request`` is already held. Nothing changes.
        """
        prepared = self._prepare(request, time, max_output_tokens)
        if isinstance(prepared, GateDecision):
            return prepared
        ent, tok, kv, args = prepared
        try:
            self._reconcile()
            res = self._acquire(keys=self._keys, args=args)
        except _redis_errors() as err:
            self._failed()
            return self._check_locally(request.request_id, request.tenant, ent, tok, kv, err)
        return self._decided(request, tok, kv, res)

    async def acheck(
        self, request: Request, time: float | None = None, *, max_output_tokens: int | None = None
    ) -> GateDecision:
        """:meth:`check` on an asyncio event loop: the round trip does not block the loop.

        It needs the asyncio client of :meth:`from_url` (``async_client``); without one it
        runs :meth:`check` in a worker thread. Same arguments, results and errors.
        """
        if self._aclient is None:
            return await asyncio.to_thread(
                self.check, request, time, max_output_tokens=max_output_tokens
            )
        prepared = self._prepare(request, time, max_output_tokens)
        if isinstance(prepared, GateDecision):
            return prepared
        ent, tok, kv, args = prepared
        try:
            if self._outstanding():
                await asyncio.to_thread(self._reconcile)
            res = await self._aacquire(keys=self._keys, args=args)
        except _async_errors() as err:
            if isinstance(err, RuntimeError) and not _closed_transport(err):
                raise
            self._failed()
            await self._aclient.connection_pool.disconnect(inuse_connections=False)
            return self._check_locally(request.request_id, request.tenant, ent, tok, kv, err)
        return self._decided(request, tok, kv, res)

    def close(self) -> None:
        """Close the blocking client's connections (it reconnects if used again)."""
        self._client.close()

    async def aclose(self) -> None:
        """Close the asyncio client's connections (at the end of its event loop); it
        reconnects if used again."""
        if self._aclient is not None:
            await self._aclient.aclose()

    def _prepare(
        self, request: Request, time: float | None, max_output_tokens: int | None
    ) -> GateDecision | tuple[TokenEntitlement, int, int, list[Any]]:
        """Check the arguments; a decision that needs no Redis, or the script's arguments."""
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be Request: {request!r}")
        if max_output_tokens is not None:
            _count("max_output_tokens", max_output_tokens)
        common = self._args(time)
        rid = request.request_id
        if rid in self._held:
            raise ValueError(f"'request' {rid!r} is already admitted and not released")
        tenant = request.tenant
        ent = self.entitlement(tenant)
        cfg = self._config
        if ent is None:
            return GateDecision(False, cfg.max_retry_s, "unknown-tenant")
        out = ent.max_output_tokens if max_output_tokens is None else max_output_tokens
        tok = request.prompt_len + out
        kv = tok * self._bpt
        if tok > self.max_request_tokens(tenant):
            return GateDecision(False, cfg.max_retry_s, "oversized")
        lim = ent.limits
        args = [
            *common,
            rid,
            tenant,
            tok,
            kv,
            repr(self._ttl),
            self._idle,
            self._spec(tenant, ent),
            lim.concurrency,
            repr(lim.tokens_per_s),
            repr(lim.tokens_per_s * self._window),
            lim.kv_bytes,
            int(cfg.overcommit),
            repr(cfg.contention_level),
            self._held_tokens,
        ]
        return ent, tok, kv, args

    def _seen(self) -> None:
        """Redis answered: from now on a missing pool state means it was lost."""
        self._common[15] = self._recovery

    def _decided(self, request: Request, tok: int, kv: int, res: Any) -> GateDecision:
        """The decision from the acquire script's answer ``res``."""
        self._seen()
        rid = request.request_id
        status = int(res[0])
        if status == -1:
            raise ValueError(f"'request' {rid!r} is already admitted and not released")
        if status == 1:
            with self._lock:
                self._held[rid] = (request.tenant, tok, kv)
            return _ADMIT
        cfg = self._config
        reason = _text(res[1])
        if reason == "state-unavailable":  # the recovery window: its remaining seconds
            wait = min(max(float(_text(res[2])), cfg.min_retry_s), cfg.max_retry_s)
            return GateDecision(False, wait, reason)
        slots, need_kv, need_tok, inf, htok, hkv, drain = (float(_text(v)) for v in res[2:9])
        wait = retry_after(
            slots_needed=slots,
            kv_bytes_needed=need_kv,
            tokens_needed=need_tok,
            in_flight=max(0, int(inf)),
            in_flight_tokens=max(0.0, htok),
            in_flight_kv_bytes=max(0.0, hkv),
            drain_tokens_per_s=drain,
            min_s=cfg.min_retry_s,
            max_s=cfg.max_retry_s,
        )
        return GateDecision(False, wait, reason)

    def release(
        self,
        request: Request | str,
        produced_tokens: int | None = None,
        *,
        time: float | None = None,
    ) -> LeaseRelease:
        """Free what ``request`` (or its id) holds and book the tokens it really produced.

        ``produced_tokens`` counts prompt and output tokens (``None``: the full charge stays).
        More than the charge is clamped to it and logged, never charged. Releasing twice,
        releasing a request never admitted, or releasing after the lease expired changes
        nothing and returns ``released=False``. The served tokens feed the entitlement's
        debt and burst at the end of the control interval.

        Raises:
            TypeError, ValueError: ``produced_tokens`` is not a non-negative int, or ``time``
                is not a valid time (see :meth:`check`). Nothing changes.
        """
        prepared = self._prepare_release(request, produced_tokens, time)
        if isinstance(prepared, LeaseRelease):
            return prepared
        rid, actual, mine, clamped, args = prepared
        try:
            self._reconcile()
            unadopted = self._release_unadopted(rid, mine, actual)
            if unadopted is not None:
                return unadopted
            res = self._release(keys=self._keys, args=args)
        except _redis_errors():
            self._failed()
            return self._release_later(rid, actual, mine, clamped)
        return self._released(res, actual, clamped)

    async def arelease(
        self,
        request: Request | str,
        produced_tokens: int | None = None,
        *,
        time: float | None = None,
    ) -> LeaseRelease:
        """:meth:`release` on an asyncio event loop (see :meth:`acheck`)."""
        if self._aclient is None:
            return await asyncio.to_thread(self.release, request, produced_tokens, time=time)
        prepared = self._prepare_release(request, produced_tokens, time)
        if isinstance(prepared, LeaseRelease):
            return prepared
        rid, actual, mine, clamped, args = prepared
        try:
            if self._outstanding():
                await asyncio.to_thread(self._reconcile)
            unadopted = self._release_unadopted(rid, mine, actual)
            if unadopted is not None:
                return unadopted
            res = await self._arelease(keys=self._keys, args=args)
        except _async_errors() as err:
            if isinstance(err, RuntimeError) and not _closed_transport(err):
                raise
            self._failed()
            await self._aclient.connection_pool.disconnect(inuse_connections=False)
            return self._release_later(rid, actual, mine, clamped)
        return self._released(res, actual, clamped)

    def _prepare_release(
        self, request: Request | str, produced_tokens: int | None, time: float | None
    ) -> LeaseRelease | tuple[str, int, tuple[str, int, int] | None, bool, list[Any]]:
        """Check the arguments and forget the lease here; a result that needs no Redis, or
        what the release script needs."""
        rid = request.request_id if isinstance(request, Request) else request
        if not isinstance(rid, str):
            raise TypeError(f"'request' must be Request or str: {request!r}")
        actual = -1 if produced_tokens is None else _count("produced_tokens", produced_tokens)
        common = self._args(time)
        with self._lock:
            mine = self._held.pop(rid, None)
            # Admitted here while Redis was away and not being adopted now: book it here.
            # (One being adopted is released in Redis once the adoption is through.)
            local = mine is not None and rid in self._local_ids and rid not in self._adopting
            if local:
                assert mine is not None
                out = self._release_locally(rid, mine, actual)
        clamped = mine is not None and actual > mine[1]
        if clamped:
            _log.warning(
                "release of %r reports %d tokens, more than its charge %d: clamped",
                rid,
                actual,
                mine[1] if mine else 0,
            )
        if local:
            return out
        return rid, actual, mine, clamped, [*common, rid, actual, self._idle]

    def _release_unadopted(
        self, rid: str, mine: tuple[str, int, int] | None, actual: int
    ) -> LeaseRelease | None:
        """After a reconciliation: a lease admitted here whose adoption failed is booked
        here (``None``: release it in Redis)."""
        if mine is None:
            return None
        with self._lock:
            if rid in self._local_ids:
                return self._release_locally(rid, mine, actual)
        return None

    def _release_later(
        self, rid: str, actual: int, mine: tuple[str, int, int] | None, clamped: bool
    ) -> LeaseRelease:
        """Redis is away: replay the release when it answers again."""
        if mine is None:
            return LeaseRelease(False, 0)
        with self._lock:
            if rid in self._local_ids:  # admitted here and never adopted
                return self._release_locally(rid, mine, actual)
            self._pending_release[rid] = actual
        tok = mine[1] if actual < 0 else min(actual, mine[1])
        return LeaseRelease(True, tok, clamped)

    def _released(self, res: Any, actual: int, clamped: bool) -> LeaseRelease:
        """The outcome from the release script's answer ``res``."""
        self._seen()
        charged = int(_text(res[0]))
        if charged < 0:
            return LeaseRelease(False, 0)
        tok = charged if actual < 0 else min(actual, charged)
        debt, weight = _text(res[1]), _text(res[2])
        if not debt:  # the entitlement's state expired while the lease lived
            return LeaseRelease(True, tok, clamped)
        return LeaseRelease(True, tok, clamped, float(debt), float(weight))

    def renew(self, time: float | None = None) -> tuple[int, int, int]:
        """Extend every lease this replica holds (call it every ``lease_ttl_s / 3``), adopt
        those Redis lost, reclaim expired leases of any replica, and reconcile what was
        decided while Redis was away. One round trip.

        Returns:
            ``(renewed, adopted, reclaimed)`` lease counts.

        Raises:
            redis.exceptions.ConnectionError: Redis is still away (nothing is lost).
        """
        common = self._args(time)
        try:
            self._reconcile()
            with self._lock:  # the leases admitted here are adopted by _reconcile alone
                held = [(r, v) for r, v in self._held.items() if r not in self._local_ids]
            res = self._renew(keys=self._keys, args=self._renew_args(common, held))
        except _redis_errors():
            self._failed()
            raise
        self._seen()
        return int(res[0]), int(res[1]), int(res[2])

    # -- internals ---------------------------------------------------------------------

    def _args(self, time: float | None) -> list[Any]:
        if self._clock == "redis":
            return self._common
        if time is None:
            raise ValueError("'time' is required with clock='request': None")
        if isinstance(time, bool) or not isinstance(time, int | float):
            raise TypeError(f"'time' must be a number: {time!r}")
        if not (math.isfinite(time) and time >= 0):
            raise ValueError(f"'time' must be finite and >= 0: {time!r}")
        args = list(self._common)
        args[1] = repr(float(time))
        return args

    def _spec(self, tenant: str, ent: TokenEntitlement) -> str:
        spec = self._specs.get(tenant)
        if spec is None:
            cls, base, lim = ent.service_class, ent.baseline, ent.limits
            spec = " ".join(
                (
                    repr(cls.weight),
                    repr(ent.slo_target_s),
                    repr(base.tokens_per_s),
                    str(base.kv_bytes),
                    str(base.concurrency),
                    "1" if cls.accumulates_debt else "0",
                    "1" if cls.protected else "0",
                    repr(lim.tokens_per_s),
                    repr(lim.tokens_per_s * self._window),
                )
            )
            self._specs[tenant] = spec
        return spec

    def _renew_args(
        self, common: list[Any], held: list[tuple[str, tuple[str, int, int]]]
    ) -> list[Any]:
        args: list[Any] = [*common, self._idle, repr(self._ttl)]
        for rid, (tenant, tok, kv) in held:
            ent = self.entitlement(tenant)
            assert ent is not None  # held leases were admitted under an entitlement
            args += [rid, tenant, tok, kv, self._spec(tenant, ent)]
        return args

    # -- outage --------------------------------------------------------------------------

    def _check_locally(
        self, rid: str, tenant: str, ent: TokenEntitlement, tok: int, kv: int, err: Exception
    ) -> GateDecision:
        """Admit on this replica alone while Redis is away: while the leases it holds of the
        entitlement (admitted before the outage or during it) are under its allowance."""
        frac = self._outage.local_fraction.get(ent.service_class.name, 0.0)
        allowance = int(ent.baseline.concurrency * frac)
        with self._lock:
            mine = sum(1 for t, _, _ in self._held.values() if t == tenant)
            if mine >= allowance:
                _log.warning("redis unavailable (%s): %r denied", err, rid)
                if _may_have_run(err):
                    # The script may have admitted it before the answer was lost: release
                    # it when Redis answers (a release of a lease never made changes
                    # nothing), so that it holds nothing until its lease expires.
                    self._pending_release[rid] = -1
                return GateDecision(False, self._config.min_retry_s * 20, "state-unavailable")
            self._local_ids.add(rid)
            self._held[rid] = (tenant, tok, kv)
        return GateDecision(admitted=True)

    def _release_locally(self, rid: str, mine: tuple[str, int, int], actual: int) -> LeaseRelease:
        """Book the release of a lease Redis never saw (the caller holds ``_lock``)."""
        tenant, tok, _ = mine
        charged = tok if actual < 0 else min(actual, tok)
        self._local_ids.discard(rid)
        self._pending_charge[tenant] = self._pending_charge.get(tenant, 0) + charged
        return LeaseRelease(True, charged, actual > tok)

    def _failed(self) -> None:
        """Redis failed a call: reconcile when it answers, on fresh connections (those in
        the pool may be to a server that is gone)."""
        self._saw_outage = True
        self._client.connection_pool.disconnect(inuse_connections=False)

    def _outstanding(self) -> bool:
        return bool(
            self._saw_outage or self._local_ids or self._pending_release or self._pending_charge
        )

    def _reconcile(self) -> None:
        """Push what happened while Redis was away (raises while it still is): open the
        recovery window, adopt the leases admitted here, replay releases, charge tokens.

        The one place where this happens, one caller at a time (``_reconciling``): each
        lease is adopted once, each release replayed once, each token charged once.
        """
        if not self._outstanding():
            return
        with self._reconciling:
            common = self._common
            if self._saw_outage:
                self._saw_outage = False
                try:
                    if any(f > 0 for f in self._outage.local_fraction.values()):
                        # a replica may have admitted alone: let each push its leases
                        self._hold(keys=self._keys, args=common)
                except BaseException:
                    self._saw_outage = True
                    raise
            with self._lock:
                adopt = [(r, self._held[r]) for r in self._local_ids if r in self._held]
                self._adopting = {r for r, _ in adopt}
                releases = dict(self._pending_release)
                charges = dict(self._pending_charge)
            # Releases first: Redis then counts no finished request beside the adopted ones.
            for rid, actual in releases.items():
                self._release(keys=self._keys, args=[*common, rid, actual, self._idle])
                with self._lock:
                    self._pending_release.pop(rid, None)
            try:
                if adopt:
                    self._renew(keys=self._keys, args=self._renew_args(common, adopt))
                    with self._lock:
                        self._local_ids.difference_update(self._adopting)
            finally:
                with self._lock:
                    self._adopting = set()
            for tenant, amount in charges.items():
                ent = self.entitlement(tenant)
                assert ent is not None
                spec = self._spec(tenant, ent)
                self._charge(keys=self._keys, args=[*common, self._idle, tenant, amount, spec])
                with self._lock:
                    left = self._pending_charge.get(tenant, 0) - amount
                    if left:
                        self._pending_charge[tenant] = left
                    else:
                        self._pending_charge.pop(tenant, None)


def _closed_transport(err: RuntimeError) -> bool:
    """redis-py's asyncio client writing to a connection closed under it (a reconnect racing
    a failure: uvloop's "the handler is closed") fails like a lost connection."""
    return "handler is closed" in str(err) or "closed=True" in str(err)


def _may_have_run(err: Exception) -> bool:
    """Whether a script that failed with ``err`` may have run in Redis: a timeout or a
    connection lost after the command was sent, not a failed connect or an exhausted pool."""
    text = str(err)
    return not ("connecting to" in text or "Too many connections" in text)


def _async_errors() -> tuple[type[Exception], ...]:
    """What the asyncio client raises when Redis is away (RuntimeError: see
    :func:`_closed_transport`; others are re-raised)."""
    return (*_redis_errors(), RuntimeError)


def _redis_errors() -> tuple[type[Exception], ...]:
    import redis

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
