"""``TokenPoolGate``: seed 004's ordered admission checks at the gateway (§4.3)."""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable

import attrs
from attrs import field, frozen
from attrs.validators import gt, instance_of

from kvpolicy.kvmodel import GateDecision, ModelSpec, Request
from kvpolicy.tenancy._entitlements import (
    Resources,
    TokenEntitlement,
    TokenPool,
    check_reserved_fit,
)
from kvpolicy.tenancy._errors import UnknownRequestError
from kvpolicy.tenancy._math import PriorityCoefficients
from kvpolicy.tenancy._store import (
    EntitlementState,
    Holding,
    InMemoryStateStore,
    PoolState,
    StateStore,
)

__all__ = ["GateConfig", "TokenPoolGate", "admission_decision"]

_log = logging.getLogger("kvpolicy.tenancy")

_ADMIT = GateDecision(admitted=True)


MAX_SECONDS = 86_400.0
"""The longest control interval, bucket window or Retry-After a gate takes (a day): beyond
it a bucket would fund years of traffic at once, and Redis's arithmetic loses precision."""


def _finite_positive(_inst: object, attribute: object, value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        name = getattr(attribute, "name", "?")
        raise ValueError(f"'{name}' must be finite, > 0 and <= {MAX_SECONDS:g}: {value!r}")


def _fraction(_inst: object, attribute: object, value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"'{getattr(attribute, 'name', '?')}' must be in (0, 1]: {value!r}")


@frozen
class GateConfig:
    """Settings of a :class:`TokenPoolGate`."""

    coefficients: PriorityCoefficients = field(
        factory=PriorityCoefficients, validator=instance_of(PriorityCoefficients)
    )
    """``alpha`` and ``gamma`` values of eqs. (1)-(3)."""
    update_interval_s: float = field(default=5.0, converter=float, validator=_finite_positive)
    """Seconds between debt and burst updates (the step ``k`` of eq. 2). With the paper's
    ``gamma_d = 0.7`` a 5 s step brings a debt of 0.775 under 0.03 in 50 s, the "near zero
    within approximately 50 seconds" of experiment 2."""
    window_s: float = field(default=60.0, converter=float, validator=_finite_positive)
    """Depth of every token bucket in seconds of its rate (60: a tokens-per-minute budget)."""
    min_retry_s: float = field(default=0.05, converter=float, validator=gt(0.0))
    """Shortest Retry-After, seconds."""
    max_retry_s: float = field(default=60.0, converter=float, validator=_finite_positive)
    """Longest Retry-After, seconds; also the answer when waiting cannot help."""
    overcommit: bool = field(default=False, validator=instance_of(bool))
    """Whether a request whose priority exceeds the admission threshold is admitted over a
    full pool, as in seed 004 (§4.3: "requests with sufficient priority are admitted" and
    the server queues the excess). ``False`` (the default): the pool's concurrency, KV bytes
    and token budget are hard limits like an entitlement's, and a request that would pass
    one of them (idle reservations counted as taken) is denied ``"pool-full"`` whatever its
    priority. The paper's replays (``tenancy replay``) set it."""
    contention_level: float = field(default=1.0, converter=float, validator=_fraction)
    """Fraction of the pool's capacity (each of slots, KV bytes and token budget) from which
    the pool counts as contended (§4.3 check 5): past it only a request whose priority
    exceeds the threshold is admitted. 1 is the paper's "pool is full"; with
    ``overcommit=False`` a level under 1 keeps the capacity above it for the entitlements of
    higher priority."""

    def __attrs_post_init__(self) -> None:
        if self.max_retry_s < self.min_retry_s:
            raise ValueError(
                f"'max_retry_s' must be >= 'min_retry_s' ({self.min_retry_s}): {self.max_retry_s}"
            )


def admission_decision(
    ent: TokenEntitlement,
    s: EntitlementState,
    ps: PoolState,
    config: GateConfig,
    reserved: tuple[float, int, int],
    cost: int,
    kv: int,
    time: float,
    outranks: Callable[[], bool],
) -> tuple[GateDecision, EntitlementState | None, PoolState | None]:
    """Seed 004's ordered checks (§4.3, after ``unknown-tenant`` and ``oversized``) for
    one request, as a pure function of value objects: the spec that both gates implement
    (``RedisLeaseGate``'s Lua is checked against it by ``tests/test_conformance.py`` and
    the replay of ``tests/test_lease.py``).

    Args:
        ent: the request's entitlement (its limits, baseline and class).
        s: the entitlement's state now (in flight, buckets, debt and burst).
        ps: the pool's state, brought up to ``time`` (its control interval).
        config: the gate's settings.
        reserved: the pool's reserved baselines ``(tokens/s, KV bytes, slots)``.
        cost: tokens charged (``prompt_len + max_output_tokens``); ``kv`` their KV bytes.
        time: seconds, the buckets' clock.
        outranks: whether the entitlement's priority (eq. 1) exceeds the admission
            threshold, asked only over a contended pool (it costs a walk of the weights).

    Returns:
        ``(decision, entitlement state, pool state)``: the new states to store (``None``:
        unchanged). A request that meets a contended pool (denied by it, or admitted over
        it on priority) counts as contention in the entitlement's state: in that interval
        a service gap below the baseline is debt (eq. 2).
    """
    limits = ent.limits
    rate = limits.tokens_per_s
    depth = rate * config.window_s
    cap = ps.capacity
    pool_depth = cap.tokens_per_s * config.window_s

    def wait(
        slots: float,
        kv_bytes: float,
        tokens: float,
        n: int,
        n_tok: float,
        n_kv: float,
        drain: float,
    ) -> float:
        return _wait(config, slots, kv_bytes, tokens, n, n_tok, n_kv, drain)

    # Refill the token buckets up to ``time`` (never backwards).
    s_time = max(time, s.bucket_time)
    level = min(depth, s.bucket + (s_time - s.bucket_time) * rate)
    p_time = max(time, ps.bucket_time)
    pool_level = min(pool_depth, ps.bucket + (p_time - ps.bucket_time) * cap.tokens_per_s)
    drain = min(rate, cap.tokens_per_s)

    if s.in_flight + 1 > limits.concurrency:  # §4.3 check (3)
        w = wait(1, 0, 0, s.in_flight, s.tokens, s.kv_bytes, drain)
        return GateDecision(False, w, "concurrency"), None, None
    if cost > level:  # §4.3 check (4)
        w = wait(0, 0, cost - level, s.in_flight, s.tokens, s.kv_bytes, rate)
        return GateDecision(False, w, "tokens"), None, None
    if s.kv_bytes + kv > limits.kv_bytes:  # the KV dimension of §3.1
        need = s.kv_bytes + kv - limits.kv_bytes
        w = wait(0, need, 0, s.in_flight, s.tokens, s.kv_bytes, drain)
        return GateDecision(False, w, "kv-cache"), None, None
    base = ent.baseline
    protected = ent.service_class.protected
    within = protected and s.in_flight + 1 <= base.concurrency and s.kv_bytes + kv <= base.kv_bytes
    if within and not config.overcommit and cost > pool_level:  # §4.3 check (5)
        w = wait(0, 0, cost - pool_level, 0, 0, 0, cap.tokens_per_s)
        return GateDecision(False, w, "pool-full"), _contended(s), None
    res_tps, res_kv, res_slots = reserved
    over = False  # admitted over a contended pool on priority (check 6)
    if not within:  # §4.3 checks (5) and (6): a full pool, pool contention
        # Reservations are held for their entitlements even when idle (Table 1), so the
        # pool is full at ``in flight + unused reservations``; with a hard pool the
        # reserved token rates' window is held back from the shared token bucket too.
        slots_after = ps.in_flight + res_slots - ps.reserved_used_slots + 1
        kv_after = ps.kv_bytes + res_kv - ps.reserved_used_kv_bytes + kv
        need_slots: float = slots_after - cap.concurrency
        need_kv: float = kv_after - cap.kv_bytes
        need_tokens = cost - pool_level
        if not config.overcommit:
            need_tokens += min(res_tps, cap.tokens_per_s) * config.window_s
        reason = ""
        if not config.overcommit and (need_slots > 0 or need_kv > 0 or need_tokens > 0):
            reason = "pool-full"
        else:
            frac = config.contention_level
            if frac < 1:  # contended from ``frac`` of the capacity on
                need_slots = slots_after - frac * cap.concurrency
                need_kv = kv_after - frac * cap.kv_bytes
                need_tokens += (1 - frac) * pool_depth
            over = need_slots > 0 or need_kv > 0 or need_tokens > 0
            if over and not (
                outranks()
                and (  # a dedicated burst leaves the reservations and protected holdings whole
                    not protected
                    or (
                        ps.protected_in_flight + res_slots - ps.reserved_used_slots + 1
                        <= cap.concurrency
                        and ps.protected_kv_bytes + res_kv - ps.reserved_used_kv_bytes + kv
                        <= cap.kv_bytes
                    )
                )
            ):
                reason = "priority"
        if reason:
            w = wait(
                max(0, need_slots),
                max(0, need_kv),
                max(0.0, need_tokens),
                ps.in_flight,
                ps.tokens,
                ps.kv_bytes,
                cap.tokens_per_s,
            )
            return GateDecision(False, w, reason), _contended(s), None

    if protected:
        n = s.in_flight
        prot_slots = ps.protected_in_flight + 1
        prot_kv = ps.protected_kv_bytes + kv
        used_slots = ps.reserved_used_slots + (
            min(n + 1, base.concurrency) - min(n, base.concurrency)
        )
        used_kv = ps.reserved_used_kv_bytes + (
            min(s.kv_bytes + kv, base.kv_bytes) - min(s.kv_bytes, base.kv_bytes)
        )
    else:
        prot_slots, prot_kv = ps.protected_in_flight, ps.protected_kv_bytes
        used_slots, used_kv = ps.reserved_used_slots, ps.reserved_used_kv_bytes
    new_s = EntitlementState(
        s.in_flight + 1,
        s.kv_bytes + kv,
        s.tokens + cost,
        level - cost,
        s_time,
        s.burst,
        s.debt,
        s.served + cost,
        s.contended + over,
    )
    new_ps = PoolState(
        cap,
        ps.in_flight + 1,
        ps.kv_bytes + kv,
        ps.tokens + cost,
        pool_level - cost,
        p_time,
        prot_slots,
        prot_kv,
        used_slots,
        used_kv,
        ps.next_tick,
    )
    return _ADMIT, new_s, new_ps


def _contended(s: EntitlementState) -> EntitlementState:
    """``s`` having met a contended pool once more."""
    return attrs.evolve(s, contended=s.contended + 1)


def _wait(
    config: GateConfig,
    slots: float,
    kv_bytes: float,
    tokens: float,
    in_flight: int,
    in_flight_tokens: float,
    in_flight_kv: float,
    drain: float,
) -> float:
    # retry_after of _math without argument checks: every value here is the gate's own.
    wait = tokens / drain
    if slots > 0 or kv_bytes > 0:
        if in_flight <= 0 or in_flight_tokens <= 0:
            return config.max_retry_s
        completions = drain * in_flight / in_flight_tokens
        wait = max(wait, slots / completions)
        if kv_bytes > 0:
            if in_flight_kv <= 0:
                return config.max_retry_s
            wait = max(wait, kv_bytes * in_flight / (completions * in_flight_kv))
    return min(config.max_retry_s, max(config.min_retry_s, wait))


def _bytes_per_token(value: int | ModelSpec) -> int:
    if isinstance(value, ModelSpec):
        return value.kv_bytes_per_token()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"'bytes_per_token' must be int or ModelSpec: {value!r}")
    if value <= 0:
        raise ValueError(f"'bytes_per_token' must be > 0: {value!r}")
    return value


def _check_time(time: float) -> float:
    if isinstance(time, bool) or not isinstance(time, int | float):
        raise TypeError(f"'time' must be a number: {time!r}")
    if not (math.isfinite(time) and time >= 0):
        raise ValueError(f"'time' must be finite and >= 0: {time!r}")
    return float(time)


class TokenPoolGate:
    """Admission at the gateway with token-pool entitlements: kvmodel's ``RequestGate``.

    Each arriving request goes through the checks of seed 004 §4.3 in order; the first that
    fails denies it (HTTP 429) with a Retry-After from the capacity model
    (:func:`~kvpolicy.tenancy.retry_after`) and a reason:

    1. ``"unknown-tenant"``: no entitlement for ``request.tenant`` and no
       ``default_entitlement`` (Retry-After is ``max_retry_s``: waiting does not help).
    2. Output length bound: the request is charged ``prompt_len + max_output_tokens`` of its
       entitlement and that many tokens of KV (a gateway does not know ``decode_len``).
       ``"oversized"`` when that can never fit the entitlement's limits or the pool.
    3. ``"concurrency"``: the entitlement's in-flight count is at its limit ``r_e``.
    4. ``"tokens"``: the entitlement's token bucket (rate ``lambda_e``, depth ``window_s``
       seconds of it) lacks the request's tokens; then ``"kv-cache"``: its KV bytes in flight
       plus the request's exceed ``chi_e``.
    5. ``"pool-full"``: the request does not fit the pool's free slots, KV bytes or token
       bucket, where reservations not in use count as taken (a reservation is held even
       when idle, Table 1). Not with ``GateConfig.overcommit``, where check 6 decides.
    6. ``"priority"``: the pool is contended (past ``GateConfig.contention_level`` of its
       capacity, counted as in check 5; with ``overcommit`` and the default level 1, the
       paper's "pool is full") and the entitlement's priority ``w_e`` (eq. 1) does not
       exceed the admission threshold, the minimum priority among entitlements with
       requests in flight.

    A dedicated or guaranteed request within its reserved baseline skips checks 5 and 6 (a
    reservation is never reclaimed), and a dedicated request above its baseline is admitted
    only while reserved and protected holdings stay within capacity. Limits are the burst
    limits for classes that burst, the baseline otherwise. By default the pool's capacity
    is never exceeded; with ``overcommit`` (seed 004) admitting by priority over a full
    pool over-commits it: the backend queues the request while lower-priority work drains,
    and lower-priority requests are denied meanwhile.

    :meth:`release` returns what a request held and books its actual tokens
    (``prompt_len + decode_len``) instead of the charge. Every ``update_interval_s`` seconds
    of request time the debt (eq. 2) and burst intensity (eq. 3) of every entitlement are
    updated from the tokens served in the interval and whether the entitlement met a
    contended pool (denied by it or admitted over it on priority: only then does a
    shortfall below baseline count as debt; see
    :func:`~kvpolicy.tenancy.service_gap`).

    Request times need not be monotonic across calls; a time earlier than one already seen
    neither refills a bucket nor runs an update.

    State lives in a :class:`StateStore`. The admission threshold is kept by each gate from
    its own admissions and rebuilt from the store at every update, so several gates over one
    in-process store agree on it within one update interval. Replicas in several processes
    share a :class:`~kvpolicy.tenancy.RedisLeaseGate`, which makes these same decisions
    atomically in Redis.
    """

    __slots__ = (
        "_bound",
        "_bpt",
        "_config",
        "_default",
        "_ents",
        "_heap",
        "_mean_slo",
        "_pool",
        "_reserved",
        "_store",
        "_weights",
    )

    def __init__(
        self,
        pool: TokenPool,
        bytes_per_token: int | ModelSpec,
        *,
        config: GateConfig | None = None,
        store: StateStore | None = None,
        default_entitlement: TokenEntitlement | None = None,
    ) -> None:
        """Build a gate.

        Args:
            pool: the pool and its entitlements.
            bytes_per_token: KV bytes of one token, or a model whose KV size gives it.
            config: gate settings; defaults when ``None``.
            store: where state lives; a fresh :class:`InMemoryStateStore` when ``None``.
            default_entitlement: the entitlement (its ``tenant`` is ignored) of a tenant the
                pool does not name, copied per tenant; ``None`` denies such requests with
                ``"unknown-tenant"``. It may not be dedicated or guaranteed: a reservation
                per unforeseen tenant could not be honoured.
        """
        if not isinstance(pool, TokenPool):
            raise TypeError(f"'pool' must be TokenPool: {pool!r}")
        config = GateConfig() if config is None else config
        if not isinstance(config, GateConfig):
            raise TypeError(f"'config' must be GateConfig: {config!r}")
        store = InMemoryStateStore() if store is None else store
        if not isinstance(store, StateStore):
            raise TypeError(f"'store' must implement StateStore: {store!r}")
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
        self._bpt = _bytes_per_token(bytes_per_token)
        self._pool = pool
        self._config = config
        self._store = store
        self._default = default_entitlement
        self._bound: dict[str, TokenEntitlement] = {e.tenant: e for e in pool.entitlements}
        self._ents: dict[str, TokenEntitlement] = dict(self._bound)
        self._mean_slo = pool.mean_slo_s
        self._reserved = pool.reserved
        self._weights: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        if store.pool() is None:
            cap = pool.capacity
            store.put_pool(
                PoolState(
                    capacity=cap,
                    bucket=cap.tokens_per_s * config.window_s,
                    next_tick=config.update_interval_s,
                )
            )
        self._rebuild()

    # -- inspection -------------------------------------------------------------------

    @property
    def pool(self) -> TokenPool:
        """The pool as configured (its capacity before any :meth:`set_capacity`)."""
        return self._pool

    @property
    def entitlements(self) -> tuple[TokenEntitlement, ...]:
        """The entitlements bound now (the pool's, plus :meth:`bind`, minus :meth:`unbind`)."""
        return tuple(self._bound.values())

    @property
    def config(self) -> GateConfig:
        """The gate's settings."""
        return self._config

    @property
    def bytes_per_token(self) -> int:
        """KV bytes charged per token."""
        return self._bpt

    @property
    def tokens_per_s(self) -> float:
        """The pool's tokens per second now (after any :meth:`set_capacity` or
        :meth:`scale_throughput`)."""
        return self.pool_state().capacity.tokens_per_s

    @property
    def default_entitlement(self) -> TokenEntitlement | None:
        """The entitlement copied for tenants the pool does not name, if any."""
        return self._default

    def entitlement(self, tenant: str) -> TokenEntitlement | None:
        """The entitlement that governs ``tenant`` (a copy of the default one if need be)."""
        return self._lookup(tenant)

    def usage(self, tenant: str) -> EntitlementState:
        """The state of ``tenant``'s entitlement (all zero before its first request)."""
        state = self._store.entitlement(tenant)
        return EntitlementState() if state is None else state

    def pool_state(self) -> PoolState:
        """The pool's state."""
        state = self._store.pool()
        assert state is not None  # put in __init__
        return state

    def priority(self, tenant: str) -> float:
        """Current priority weight ``w_e`` (eq. 1) of ``tenant``.

        Raises:
            KeyError: the tenant has no entitlement and there is no default one.
        """
        ent = self._lookup(tenant)
        if ent is None:
            raise KeyError(f"'tenant' has no entitlement: {tenant!r}")
        return self._weight_of(tenant, ent)

    def threshold(self) -> float:
        """Admission threshold under contention: the minimum priority among entitlements with
        requests in flight (``inf`` when nothing is in flight)."""
        heap = self._heap
        while heap:
            weight, tenant = heap[0]
            state = self._store.entitlement(tenant)
            if state is not None and state.in_flight > 0 and self._weights.get(tenant) == weight:
                return weight
            heapq.heappop(heap)
        return math.inf

    # -- RequestGate --------------------------------------------------------------------

    def check(
        self, request: Request, time: float, *, max_output_tokens: int | None = None
    ) -> GateDecision:
        """Admit ``request`` arriving at ``time`` (seconds), or deny it with a Retry-After.

        ``max_output_tokens`` overrides the entitlement's output bound (a request's own
        ``max_tokens``): the request is charged ``prompt_len + max_output_tokens``.

        Raises:
            TypeError: ``request`` is not a :class:`~kvpolicy.kvmodel.Request`, ``time`` is
                not a number or ``max_output_tokens`` not an int.
            ValueError: ``time`` is negative or not finite, ``max_output_tokens`` negative,
                or ``request`` is already admitted and not released (nothing changes).
        """
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be Request: {request!r}")
        if max_output_tokens is not None:
            if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int):
                raise TypeError(f"'max_output_tokens' must be int: {max_output_tokens!r}")
            if max_output_tokens < 0:
                raise ValueError(f"'max_output_tokens' must be >= 0: {max_output_tokens!r}")
        time = _check_time(time)
        store = self._store
        tenant = request.tenant
        if store.holding(request.request_id) is not None:
            raise ValueError(
                f"'request' {request.request_id!r} is already admitted and not released"
            )
        ps = self._advance(time)
        ent = self._lookup(tenant)
        cfg = self._config
        if ent is None:
            return GateDecision(False, cfg.max_retry_s, "unknown-tenant")
        s = store.entitlement(tenant)
        limits = ent.limits
        rate = limits.tokens_per_s
        depth = rate * cfg.window_s
        if s is None:
            s = EntitlementState(bucket=depth, bucket_time=time)
        cap = ps.capacity
        out = ent.max_output_tokens if max_output_tokens is None else max_output_tokens
        cost = request.prompt_len + out
        kv = cost * self._bpt
        pool_depth = cap.tokens_per_s * cfg.window_s
        if cost > depth or cost > pool_depth or kv > limits.kv_bytes or kv > cap.kv_bytes:
            return GateDecision(False, cfg.max_retry_s, "oversized")

        decision, new_s, new_ps = admission_decision(
            ent,
            s,
            ps,
            cfg,
            self._reserved,
            cost,
            kv,
            time,
            lambda: self._weight_of(tenant, ent) > self.threshold(),
        )
        if new_s is not None:
            store.put_entitlement(tenant, new_s)
        if not decision.admitted:
            return decision
        assert new_ps is not None  # an admission changes the pool
        store.put_pool(new_ps)
        store.put_holding(request.request_id, Holding(tenant, cost, kv))
        if s.in_flight == 0:
            heapq.heappush(self._heap, (self._weight_of(tenant, ent), tenant))
        return _ADMIT

    def release(self, request: Request, time: float, *, tokens: int | None = None) -> None:
        """Return what the admitted ``request`` held; book its actual tokens (``tokens``
        when given, prompt and output: a gateway counts them from the response; else
        ``request.total_len``).

        The buckets get back the difference between the charge (``prompt_len +
        max_output_tokens``) and the actual ``prompt_len + decode_len``, and the interval's
        served tokens are corrected the same way. A request cannot produce more than its
        ``max_output_tokens``: a ``decode_len`` beyond it is clamped to the charge (logged at
        INFO on the ``kvpolicy.tenancy`` logger), never charged.

        Raises:
            TypeError: ``request`` is not a Request, ``time`` is not a number or ``tokens``
                not an int.
            ValueError: ``time`` is negative or not finite, or ``tokens`` negative.
            UnknownRequestError: the gate holds nothing for ``request`` (never admitted, or
                released already); nothing changes.
        """
        if not isinstance(request, Request):
            raise TypeError(f"'request' must be Request: {request!r}")
        time = _check_time(time)
        if tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int):
                raise TypeError(f"'tokens' must be an int: {tokens!r}")
            if tokens < 0:
                raise ValueError(f"'tokens' must be >= 0: {tokens!r}")
        store = self._store
        held = store.holding(request.request_id)
        if held is None:
            raise UnknownRequestError(
                f"'request' {request.request_id!r} is not held by this gate "
                "(never admitted, or released already)"
            )
        ps = self._advance(time)
        tenant = held.tenant
        ent = self._lookup(tenant)
        s = store.entitlement(tenant)
        assert ent is not None  # a holding implies an entitlement and its state
        assert s is not None
        cfg = self._config
        cap = ps.capacity
        rate = ent.limits.tokens_per_s
        actual = request.total_len if tokens is None else tokens
        if actual > held.tokens:
            _log.info(
                "release of %r reports %d tokens, more than the %d it could produce: clamped",
                request.request_id,
                actual,
                held.tokens,
            )
            actual = held.tokens
        refund = held.tokens - actual
        s_time = max(time, s.bucket_time)
        level = min(rate * cfg.window_s, s.bucket + (s_time - s.bucket_time) * rate + refund)
        p_time = max(time, ps.bucket_time)
        pool_level = min(
            cap.tokens_per_s * cfg.window_s,
            ps.bucket + (p_time - ps.bucket_time) * cap.tokens_per_s + refund,
        )
        base = ent.baseline
        if ent.service_class.protected:
            n = s.in_flight
            prot_slots = ps.protected_in_flight - 1
            prot_kv = ps.protected_kv_bytes - held.kv_bytes
            used_slots = ps.reserved_used_slots - (
                min(n, base.concurrency) - min(n - 1, base.concurrency)
            )
            used_kv = ps.reserved_used_kv_bytes - (
                min(s.kv_bytes, base.kv_bytes) - min(s.kv_bytes - held.kv_bytes, base.kv_bytes)
            )
        else:
            prot_slots, prot_kv = ps.protected_in_flight, ps.protected_kv_bytes
            used_slots, used_kv = ps.reserved_used_slots, ps.reserved_used_kv_bytes
        store.put_entitlement(
            tenant,
            EntitlementState(
                s.in_flight - 1,
                s.kv_bytes - held.kv_bytes,
                s.tokens - held.tokens,
                level,
                s_time,
                s.burst,
                s.debt,
                s.served - refund,
                s.contended,
            ),
        )
        store.put_pool(
            PoolState(
                cap,
                ps.in_flight - 1,
                ps.kv_bytes - held.kv_bytes,
                ps.tokens - held.tokens,
                pool_level,
                p_time,
                prot_slots,
                prot_kv,
                used_slots,
                used_kv,
                ps.next_tick,
            )
        )
        store.put_holding(request.request_id, None)

    # -- capacity -----------------------------------------------------------------------

    def set_capacity(self, capacity: Resources, time: float) -> None:
        """Change the pool's capacity at ``time`` (an outage, a recovery, autoscaling).

        Work in flight stays admitted; an over-committed pool denies lower-priority requests
        until it drains.

        Raises:
            TypeError: ``capacity`` is not :class:`Resources`.
            ValueError: the reserved baselines do not fit ``capacity`` (nothing changes):
                reservations are never shrunk, so the pool must shed them first.
        """
        if not isinstance(capacity, Resources):
            raise TypeError(f"'capacity' must be Resources: {capacity!r}")
        time = _check_time(time)
        check_reserved_fit(self._bound.values(), capacity)
        ps = self._advance(time)
        old = ps.capacity
        p_time = max(time, ps.bucket_time)
        level = ps.bucket + (p_time - ps.bucket_time) * old.tokens_per_s
        level = min(level, old.tokens_per_s * self._config.window_s)
        level = min(level, capacity.tokens_per_s * self._config.window_s)
        self._store.put_pool(
            PoolState(
                capacity,
                ps.in_flight,
                ps.kv_bytes,
                ps.tokens,
                level,
                p_time,
                ps.protected_in_flight,
                ps.protected_kv_bytes,
                ps.reserved_used_slots,
                ps.reserved_used_kv_bytes,
                ps.next_tick,
            )
        )

    def scale_throughput(self, factor: float, time: float) -> None:
        """Multiply every token rate by ``factor`` at ``time``: the pool's tokens/s and each
        entitlement's baseline and burst tokens/s (the default entitlement's too).

        For a pool sized in *shares* of a server whose throughput was an estimate, when the
        server turns out faster (``factor > 1``) or slower than estimated: every tenant keeps
        its share. KV bytes and concurrency are unchanged. Each token bucket is refilled up
        to ``time`` at its old rate, then keeps its level, capped at its new depth.
        Implements kvmodel's ``ThroughputScalable``.

        Raises:
            TypeError: ``factor`` is not a number.
            ValueError: ``factor`` is not finite and > 0, or ``time`` is bad; nothing changes.
        """
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise TypeError(f"'factor' must be a number: {factor!r}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"'factor' must be a finite number > 0: {factor!r}")
        time = _check_time(time)
        if factor == 1.0:
            return

        def scaled(ent: TokenEntitlement) -> TokenEntitlement:
            burst = None if ent.burst is None else _scale_rate(ent.burst, factor)
            return attrs.evolve(ent, baseline=_scale_rate(ent.baseline, factor), burst=burst)

        # Built (and validated) before anything changes.
        bound = {t: scaled(e) for t, e in self._bound.items()}
        ents = {t: scaled(e) for t, e in self._ents.items()}
        default = None if self._default is None else scaled(self._default)
        cap = _scale_rate(self.pool_state().capacity, factor)
        window = self._config.window_s
        store = self._store
        for tenant in store.tenants():
            state = store.entitlement(tenant)
            ent = self._lookup(tenant)
            if state is None or ent is None:
                continue
            rate = ent.limits.tokens_per_s
            when = max(time, state.bucket_time)
            level = min(rate * window, state.bucket + (when - state.bucket_time) * rate)
            level = min(level, rate * factor * window)
            store.put_entitlement(tenant, attrs.evolve(state, bucket=level, bucket_time=when))
        self._bound, self._ents, self._default = bound, ents, default
        self._rebind()
        # Never below the scaled reservations (a product may round one ulp above).
        tps = max(cap.tokens_per_s, self._reserved[0])
        self.set_capacity(attrs.evolve(cap, tokens_per_s=tps), time)

    def bind(self, entitlement: TokenEntitlement, time: float) -> None:
        """Bind a new entitlement to the pool at ``time`` (a tenant joins).

        It starts with a full bucket and no debt or burst, and the pool-average SLO of eq. (1)
        now includes it. A reservation granted while the pool is busy is honoured at once:
        the pool over-commits until lower classes drain.

        Raises:
            TypeError: ``entitlement`` is not a :class:`TokenEntitlement`.
            ValueError: the tenant is bound already, has requests in flight (under the default
                entitlement), or the reserved baselines would no longer fit the current
                capacity; nothing changes.
        """
        if not isinstance(entitlement, TokenEntitlement):
            raise TypeError(f"'entitlement' must be TokenEntitlement: {entitlement!r}")
        time = _check_time(time)
        tenant = entitlement.tenant
        if tenant in self._bound:
            raise ValueError(f"'entitlement' tenant {tenant!r} is bound already")
        self._require_idle(tenant)
        check_reserved_fit([*self._bound.values(), entitlement], self.pool_state().capacity)
        self._advance(time)
        self._bound[tenant] = entitlement
        self._ents[tenant] = entitlement
        self._store.put_entitlement(
            tenant,
            EntitlementState(
                bucket=entitlement.limits.tokens_per_s * self._config.window_s, bucket_time=time
            ),
        )
        self._rebind()

    def unbind(self, tenant: str, time: float) -> None:
        """Remove ``tenant``'s entitlement at ``time`` (a tenant leaves); its reservation is
        freed. Later requests of the tenant get the default entitlement, if any.

        Raises:
            ValueError: the tenant is not bound, or has requests in flight; nothing changes.
        """
        time = _check_time(time)
        if tenant not in self._bound:
            raise ValueError(f"'tenant' is not bound: {tenant!r}")
        self._require_idle(tenant)
        self._advance(time)
        del self._bound[tenant]
        del self._ents[tenant]
        self._store.put_entitlement(tenant, EntitlementState())
        self._rebind()

    # -- internals ----------------------------------------------------------------------

    def _require_idle(self, tenant: str) -> None:
        state = self._store.entitlement(tenant)
        if state is not None and state.in_flight > 0:
            raise ValueError(
                f"'tenant' {tenant!r} has {state.in_flight} requests in flight; release them first"
            )

    def _rebind(self) -> None:
        bound = self._bound.values()
        self._mean_slo = sum(e.slo_target_s for e in bound) / len(bound) if bound else 1.0
        tps, kv, conc = 0.0, 0, 0
        for ent in bound:
            if ent.service_class.protected:
                tps += ent.baseline.tokens_per_s
                kv += ent.baseline.kv_bytes
                conc += ent.baseline.concurrency
        self._reserved = (tps, kv, conc)
        self._rebuild()

    def _lookup(self, tenant: str) -> TokenEntitlement | None:
        ent = self._ents.get(tenant)
        if ent is None and self._default is not None:
            default = self._default
            ent = TokenEntitlement(
                tenant,
                default.service_class,
                default.baseline,
                default.burst,
                default.slo_target_s,
                default.max_output_tokens,
            )
            self._ents[tenant] = ent
        return ent

    def _weight_of(self, tenant: str, ent: TokenEntitlement) -> float:
        weight = self._weights.get(tenant)
        if weight is None:
            state = self._store.entitlement(tenant)
            weight = self._weight(ent, state or EntitlementState())
            self._weights[tenant] = weight
        return weight

    def _weight(self, ent: TokenEntitlement, state: EntitlementState) -> float:
        # Eq. (1) of seed 004; for credit (d < 0) the reciprocal debt factor of
        # priority_weight, so that the weight stays positive.
        c = self._config.coefficients
        d = state.debt
        owed = 1.0 + c.alpha_debt * d if d >= 0 else 1.0 / (1.0 - c.alpha_debt * d)
        return (
            ent.service_class.weight
            / (1.0 + c.alpha_slo * ent.slo_target_s / self._mean_slo)
            / (1.0 + c.alpha_burst * state.burst)
            * owed
        )

    def _advance(self, time: float) -> PoolState:
        """Run the debt and burst updates due by ``time``; return the pool's state."""
        store = self._store
        ps = store.pool()
        assert ps is not None  # put in __init__
        if time < ps.next_tick:
            return ps
        interval = self._config.update_interval_s
        # Ticks after the first see an interval with nothing served and no contention.
        idle = math.floor((time - ps.next_tick) / interval)
        for tenant in store.tenants():
            state = store.entitlement(tenant)
            ent = self._lookup(tenant)
            if state is None or ent is None:
                continue  # a tenant only another gate over a shared store knows
            store.put_entitlement(tenant, self._tick(ent, state, idle))
        ps = PoolState(
            ps.capacity,
            ps.in_flight,
            ps.kv_bytes,
            ps.tokens,
            ps.bucket,
            ps.bucket_time,
            ps.protected_in_flight,
            ps.protected_kv_bytes,
            ps.reserved_used_slots,
            ps.reserved_used_kv_bytes,
            ps.next_tick + (idle + 1) * interval,
        )
        store.put_pool(ps)
        self._rebuild()
        return ps

    def _tick(self, ent: TokenEntitlement, s: EntitlementState, idle: int) -> EntitlementState:
        c = self._config.coefficients
        interval = self._config.update_interval_s
        base = ent.baseline
        served = max(0.0, s.served) / interval
        debt = s.debt
        if ent.service_class.accumulates_debt:
            # Eq. (2); the gap of §3.3 counts as debt only in an interval where the tenant
            # met a contended pool (was denied by it, or admitted over it on priority).
            gap = max(-1.0, min(1.0, (base.tokens_per_s - served) / base.tokens_per_s))
            if not s.contended:
                gap = min(0.0, gap)
            debt = c.gamma_d * debt + (1.0 - c.gamma_d) * gap
            debt *= c.gamma_d**idle  # idle intervals: gap 0
        # Eq. (3) and its EWMA.
        kv_over = max(0.0, s.kv_bytes / base.kv_bytes - 1.0)
        conc_over = max(0.0, s.in_flight / base.concurrency - 1.0)
        delta = max(0.0, served / base.tokens_per_s - 1.0) + kv_over + conc_over
        burst = c.gamma_b * s.burst + (1.0 - c.gamma_b) * delta
        if idle:
            steady = kv_over + conc_over
            burst = steady + (burst - steady) * c.gamma_b**idle
        return EntitlementState(
            s.in_flight,
            s.kv_bytes,
            s.tokens,
            s.bucket,
            s.bucket_time,
            burst,
            debt,
            0.0,
            0,
        )

    def _rebuild(self) -> None:
        """Recompute every weight and the threshold heap from the store."""
        store = self._store
        self._weights = {}
        heap: list[tuple[float, str]] = []
        for tenant in store.tenants():
            ent = self._lookup(tenant)
            state = store.entitlement(tenant)
            if ent is None or state is None:
                continue
            weight = self._weight(ent, state)
            self._weights[tenant] = weight
            if state.in_flight > 0:
                heap.append((weight, tenant))
        heapq.heapify(heap)
        self._heap = heap


def _scale_rate(resources: Resources, factor: float) -> Resources:
    return attrs.evolve(resources, tokens_per_s=resources.tokens_per_s * factor)
