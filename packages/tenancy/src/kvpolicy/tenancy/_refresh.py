"""The gateway's idea of the server's throughput, refreshed from the service observed.

A token-pool gateway sized in shares of the server admits tokens at the rate the server was
*estimated* to sustain (the simulator's ``server_capacity``, from the workload's typical
lengths; an operator's benchmark for a real fleet). When the estimate is off — a trace
whose lengths drift, prefix caching that makes prompts cheaper, a time model calibrated on
another machine — the gateway either throttles work the server could take (429s, clients
who give up) or lets a queue build at the server.
Every ``window_s`` seconds :class:`ThroughputRefresh` compares what the server served with
the estimate and rescales the gate (kvmodel's ``ThroughputScalable``); the simulator's front
door feeds it, and so does the gateway over an in-process gate:

* **saturated** (the server was busy — requests waited, its batch was full, or an
  iteration used its whole token budget — for at least ``saturated_share`` of the window's
  time): the server ran flat out, so what it served *is* its throughput: the estimate
  moves to the observed rate (down or up).
* **throttled** (the server had room — busy for less than ``room_share`` of the window,
  and at least ``on_time_share`` of the requests that finished met the latency targets:
  first token within ``ttft_s`` of arriving, ``tpot_s`` per output token after it — yet
  the gateway denied requests for lack of tokens): the buckets, not the server, were the
  bottleneck: the estimate rises by ``probe``.
* **late** (fewer than ``on_time_share`` of the finished requests met the targets, and an
  earlier probe raised the estimate above where it started): the probe cost latency, not
  bought throughput: the estimate falls by ``probe``, never below where it started.
* otherwise the estimate stays: it limited nobody, or the server was busy enough (a
  prefill-heavy mix keeps it compute-bound for long stretches) that admitting more would
  cost latency rather than add throughput.

A step is clamped to ``[1 / max_step, max_step]`` and ignored within ``deadband``; a window
with fewer than ``min_completions`` completions says too little and changes nothing.
"""

from __future__ import annotations

import logging
import math
import time as _time
from collections.abc import Callable
from typing import Any

from attrs import field, frozen
from attrs.validators import ge, gt, instance_of, le

from kvpolicy.kvmodel import ThroughputScalable

__all__ = ["RefreshConfig", "SharedThroughputRefresh", "ThroughputRefresh", "refresh_factor"]

_log = logging.getLogger("kvpolicy.tenancy")


@frozen
class RefreshConfig:
    """How often and how far the gateway's throughput estimate follows the server."""

    window_s: float = field(default=0.0, converter=float, validator=ge(0.0))
    """Seconds (of simulated or wall time) between two refreshes; 0 never refreshes."""
    saturated_share: float = field(default=0.9, converter=float, validator=[gt(0.0), le(1.0)])
    """Share of a window's time the server must be busy (requests waiting, the batch full,
    or the token budget used up) for the window to count as saturated."""
    room_share: float = field(default=0.3, converter=float, validator=[ge(0.0), le(1.0)])
    """Busy share below which the server had room (a throttled window may probe up)."""
    ttft_s: float = field(default=2.0, converter=float, validator=gt(0.0))
    """Time-to-first-token target (the stack's SLO) of finished requests."""
    tpot_s: float = field(default=0.1, converter=float, validator=gt(0.0))
    """Time-per-output-token target (the stack's SLO) of finished requests."""
    on_time_share: float = field(default=0.95, converter=float, validator=[ge(0.0), le(1.0)])
    """Share of a window's completions that must meet both targets for it to probe up."""
    probe: float = field(default=1.5, converter=float, validator=gt(1.0))
    """Factor by which a throttled window raises the estimate."""
    max_step: float = field(default=2.0, converter=float, validator=gt(1.0))
    """Largest factor (and smallest, as its inverse) of one refresh."""
    deadband: float = field(default=0.05, converter=float, validator=[ge(0.0), le(0.5)])
    """Relative changes smaller than this are ignored."""
    min_completions: int = field(default=20, validator=[instance_of(int), ge(1)])
    """Completions a window needs before it can say anything."""


def refresh_factor(
    config: RefreshConfig,
    estimate: float,
    served_tokens: float,
    window_s: float,
    busy_share: float,
    token_denials: int,
    completions: int,
    on_time: int | None = None,
    floor: float = 0.0,
) -> float:
    """The factor to apply to the gateway's throughput estimate after one window.

    Args:
        config: the refresh rules.
        estimate: tokens/s the gateway assumes now (> 0).
        served_tokens: prompt plus output tokens of the requests that finished in the window.
        window_s: the window's length in seconds (> 0).
        busy_share: share of the window's time in which the server was busy.
        token_denials: 429s of the window answered by a token bucket.
        completions: requests that finished in the window.
        on_time: those of them that met the latency targets (None: all).
        floor: tokens/s a late window never takes the estimate below (where it started).

    Returns:
        1.0 for no change, else a factor in ``[1 / max_step, max_step]``.
    """
    return _rule(
        config,
        estimate,
        served_tokens,
        window_s,
        busy_share,
        token_denials,
        completions,
        on_time,
        floor,
    )[1]


def _rule(
    config: RefreshConfig,
    estimate: float,
    served_tokens: float,
    window_s: float,
    busy_share: float,
    token_denials: int,
    completions: int,
    on_time: int | None,
    floor: float,
) -> tuple[str, float]:
    """(the rule that applies: saturated, late, probe or hold; its factor)."""
    if completions < config.min_completions or not (estimate > 0 and window_s > 0):
        return "hold", 1.0
    met = completions if on_time is None else on_time
    late = met < config.on_time_share * completions
    if busy_share >= config.saturated_share:
        rule, factor = "saturated", served_tokens / window_s / estimate
    elif late and estimate > floor:
        rule, factor = "late", max(1.0 / config.probe, floor / estimate)
    elif token_denials > 0 and busy_share < config.room_share and not late:
        rule, factor = "probe", config.probe
    else:
        return "hold", 1.0
    factor = min(config.max_step, max(1.0 / config.max_step, factor))
    if abs(factor - 1.0) < config.deadband or not math.isfinite(factor):
        return "hold", 1.0
    return rule, factor


class ThroughputRefresh:
    """Feeds :func:`refresh_factor` from one run and rescales the gate.

    The front door tells it whether each iteration was busy, each completion and each 429;
    at the end of every window it rescales the gate and starts the next window. A probe
    that a late window takes back makes the next probe wait twice as many eligible windows
    in a row (exponential backoff), so that a server at its latency limit is not probed
    every other window.

    Args:
        gate: the gateway to rescale.
        config: the refresh rules (``window_s > 0``).
    """

    __slots__ = (
        "_busy",
        "_completions",
        "_config",
        "_denials",
        "_floor",
        "_gate",
        "_on_time",
        "_patience",
        "_ready",
        "_served",
        "_start",
        "refreshes",
    )

    def __init__(self, gate: ThroughputScalable, config: RefreshConfig) -> None:
        if config.window_s <= 0:
            raise ValueError(f"'window_s' must be > 0 to refresh: {config.window_s!r}")
        self._gate = gate
        self._config = config
        self._floor = gate.tokens_per_s
        self._patience = 1  # eligible windows in a row a probe needs
        self._ready = 0
        self._start = 0.0
        self._busy = 0.0
        self._served = 0.0
        self._completions = 0
        self._on_time = 0
        self._denials = 0
        self.refreshes: list[tuple[float, float]] = []
        """(time, tokens/s assumed from then on) of every change made."""

    def completed(self, tokens: int, ttft: float, tpot: float) -> None:
        """A request of ``tokens`` prompt plus output tokens finished; its first token came
        ``ttft`` seconds after it first arrived, then one every ``tpot`` seconds."""
        self._served += tokens
        self._completions += 1
        self._on_time += ttft <= self._config.ttft_s and tpot <= self._config.tpot_s

    def denied(self, reason: str) -> None:
        """The gateway answered 429 for ``reason``."""
        if reason == "tokens":
            self._denials += 1

    def iteration(self, started: float, now: float, busy: bool) -> None:
        """The server ran from ``started`` to ``now`` (one iteration, or a run of decode
        iterations); ``busy`` if requests waited, the batch was full or the token budget
        was used up. Time between iterations (an idle server) is not busy."""
        if busy:
            self._busy += now - max(started, self._start)
        elapsed = now - self._start
        if elapsed < self._config.window_s:
            return
        gate = self._gate
        rule, factor = _rule(
            self._config,
            gate.tokens_per_s,
            self._served,
            elapsed,
            self._busy / elapsed,
            self._denials,
            self._completions,
            self._on_time,
            min(self._floor, gate.tokens_per_s),
        )
        if rule == "probe":
            self._ready += 1
            if self._ready < self._patience:
                factor = 1.0
            else:
                self._ready = 0
        else:
            self._ready = 0
            if rule == "late":
                self._patience *= 2
        if factor != 1.0:
            gate.scale_throughput(factor, now)
            self.refreshes.append((now, gate.tokens_per_s))
        self._start = now
        self._completions = self._on_time = self._denials = 0
        self._served = self._busy = 0.0


class SharedThroughputRefresh(ThroughputRefresh):
    """:class:`ThroughputRefresh` for gateway replicas sharing one Redis (each over its
    :class:`~kvpolicy.tenancy.RedisLeaseGate`): what every replica observes is pooled, one
    decision is taken per window for all, and every replica applies it, so that all of
    them assume the same throughput.

    Windows are numbered on ``clock`` (wall time by default: the replicas' clocks agree
    to well under a window). At its first call in window ``k + 1`` a replica adds what it
    observed in window ``k`` (tokens served, completions, those on time, token denials, busy
    and observed seconds) to Redis; the first replica to reach window ``k + 2`` decides
    window ``k`` (every replica has pushed it by then) from the pooled counts with
    :func:`refresh_factor`'s rules, the busy share being the pooled busy seconds over the
    pooled observed seconds, and stores the new estimate (optimistic transaction: one
    decision per window whatever the number of replicas). Every replica then scales its
    gate to the stored estimate. The estimate, the floor a late window never goes under
    and the probe backoff live in Redis too. While Redis is away nothing changes (logged).

    Args:
        gate: this replica's gate.
        config: the refresh rules (``window_s > 0``).
        client: a redis-py client of the gates' Redis.
        namespace: the gates' namespace (keys ``{namespace}:refresh...``).
        clock: seconds on a clock shared by the replicas.
    """

    __slots__ = ("_client", "_clock", "_elapsed", "_k", "_key")

    def __init__(
        self,
        gate: ThroughputScalable,
        config: RefreshConfig,
        client: Any,
        *,
        namespace: str = "kvpolicy",
        clock: Callable[[], float] = _time.time,
    ) -> None:
        super().__init__(gate, config)
        self._client = client
        self._clock = clock
        self._key = "{" + namespace + "}:refresh"
        self._k: int | None = None
        self._elapsed = 0.0

    def iteration(self, started: float, now: float, busy: bool) -> None:
        """The server ran from ``started`` to ``now`` (this replica's clock; only the
        duration counts), ``busy`` or not; a new window on the shared clock pushes the last
        one, decides the one before it and brings the gate to the shared estimate."""
        seconds = max(0.0, now - started)
        self._elapsed += seconds
        if busy:
            self._busy += seconds
        k = math.floor(self._clock() / self._config.window_s)
        if self._k is None:
            self._k = k
            return
        if k == self._k:
            return
        done, self._k = self._k, k
        counts = {
            "served": self._served,
            "busy": self._busy,
            "elapsed": self._elapsed,
            "completions": self._completions,
            "on_time": self._on_time,
            "denials": self._denials,
        }
        self._served = self._busy = self._elapsed = 0.0
        self._completions = self._on_time = self._denials = 0
        import redis

        try:
            self._push(done, counts)
            self._decide(k - 2)
            self._follow(now)
        except redis.exceptions.RedisError as err:
            _log.warning("throughput refresh skipped: redis unavailable (%s)", err)

    def _push(self, k: int, counts: dict[str, float]) -> None:
        key = f"{self._key}:{k}"
        pipe = self._client.pipeline(transaction=True)
        for name, value in counts.items():
            pipe.hincrbyfloat(key, name, value)
        pipe.expire(key, max(60, math.ceil(10 * self._config.window_s)))
        pipe.hsetnx(self._key, "estimate", repr(self._gate.tokens_per_s))
        pipe.hsetnx(self._key, "floor", repr(self._floor))
        pipe.execute()

    def _decide(self, k: int) -> None:
        """Decide window ``k`` once for all replicas (``WATCH``/``MULTI`` on the state)."""
        import redis

        with self._client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self._key)
                    state = {_text(a): float(_text(b)) for a, b in pipe.hgetall(self._key).items()}
                    if state.get("decided", -math.inf) >= k or "estimate" not in state:
                        pipe.unwatch()
                        return
                    raw = pipe.hgetall(f"{self._key}:{k}")
                    window = {_text(a): float(_text(b)) for a, b in raw.items()}
                    estimate = state["estimate"]
                    patience = int(state.get("patience", 1))
                    ready = int(state.get("ready", 0))
                    elapsed = window.get("elapsed", 0.0)
                    rule, factor = _rule(
                        self._config,
                        estimate,
                        window.get("served", 0.0),
                        self._config.window_s,
                        window.get("busy", 0.0) / elapsed if elapsed > 0 else 0.0,
                        int(window.get("denials", 0)),
                        int(window.get("completions", 0)),
                        int(window.get("on_time", 0)),
                        min(state.get("floor", estimate), estimate),
                    )
                    if rule == "probe":
                        ready += 1
                        if ready < patience:
                            factor = 1.0
                        else:
                            ready = 0
                    else:
                        ready = 0
                        if rule == "late":
                            patience *= 2
                    pipe.multi()
                    pipe.hset(
                        self._key,
                        mapping={
                            "decided": k,
                            "estimate": repr(estimate * factor),
                            "patience": patience,
                            "ready": ready,
                        },
                    )
                    pipe.execute()
                    return
                except redis.exceptions.WatchError:
                    continue

    def _follow(self, now: float) -> None:
        """Scale the gate to the shared estimate."""
        raw = self._client.hget(self._key, "estimate")
        if raw is None:
            return
        target = float(_text(raw))
        current = self._gate.tokens_per_s
        if target > 0 and abs(target / current - 1.0) > 1e-9:
            self._gate.scale_throughput(target / current, now)
            self.refreshes.append((now, self._gate.tokens_per_s))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
