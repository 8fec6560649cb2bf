"""One replica's capacity at the SLO, from the time model: what an autoscaler sizes by.

A replica at saturation (:func:`server_capacity`) has a queue that grows
without bound; a replica an autoscaler can count on serves a rate at which its requests
still meet the SLO. The batch is a queue with ``B`` servers (the sequences its KV pool and
batch hold, each request holding one slot for its prefill and its ``D`` decode
iterations), so the rate at the SLO is:

- ``B``: the largest batch, within what the KV pool holds (each request in flight the KV
  it holds on average over its time in the batch, :func:`slot_kv_tokens`) and the
  engine's ``max_batch``, whose iteration (``B``
  decodes and the prefill chunks of the ``B / D`` requests that join per iteration) meets
  the TPOT target;
- the load ``a`` (requests in flight, Erlangs) at which the chance that a request waits
  longer for a slot than its TTFT budget (the target less its prefill and first
  iteration) is at most ``miss``: Erlang C's ``C(B, a) · exp(-(B - a) · t / S)``, with
  ``S`` the time a request holds its slot, its ``D`` iterations;
- tokens per second ``a / S · (P + D)``;
- the share of the KV pool held at that load: ``min(a, B)`` slots' KV over the pool (what
  the token pool's KV dimension sizes a replica by: a pool filled to the last block
  preempts and queues).

These are a model's figures (Poisson arrivals, exponential holding times); the runs
measure what they give.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from attrs import frozen

from kvpolicy.sim._config import EngineConfig, SLOConfig
from kvpolicy.sim._timing import TimingModel

__all__ = [
    "SLOCapacity",
    "erlang_c",
    "server_capacity",
    "slo_capacity",
    "slo_load",
    "slot_kv_tokens",
]


def server_capacity(
    timing: TimingModel,
    engine: EngineConfig,
    capacity_tokens: int,
    mean_prompt: float = 1024.0,
    mean_output: float = 256.0,
) -> float:
    """Sustained tokens per second of one simulated server at saturation.

    Tokens (prompt and output alike, as seed 004 counts them) per second are the roofline's
    rate for requests of ``mean_prompt`` and ``mean_output`` tokens:
    ``B = min(max_batch, capacity / (P + D/2))`` sequences decode together, so a request
    costs ``D · t_decode(B) / B`` of decode time (``t_decode(B)`` reads the weights and
    ``B · (P + D/2)`` tokens of KV) plus the compute of its prefill, and the server serves
    ``(P + D) / cost`` tokens per second.
    """
    p, d = max(mean_prompt, 1.0), max(mean_output, 1.0)
    batch = max(1, min(engine.max_batch, int(capacity_tokens // (p + d / 2))))
    kv = batch * (p + d / 2)
    decode = timing.iteration_time(batch, kv, kv)
    prefill = timing.iteration_time(p, 0, p * (p + 1) / 2) - timing.overhead_s
    return (p + d) / (d * decode / batch + prefill)


def erlang_c(servers: int, load: float) -> float:
    """Erlang C: the chance that an arrival waits, ``servers`` busy at offered ``load``
    (Erlangs, below ``servers``); 1.0 at or above it."""
    if servers < 1:
        raise ValueError(f"'servers' must be >= 1: {servers!r}")
    if not (math.isfinite(load) and load >= 0):
        raise ValueError(f"'load' must be finite and >= 0: {load!r}")
    if load >= servers:
        return 1.0
    b = 1.0  # Erlang B, by its recursion over the servers
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return servers * b / (servers - load * (1.0 - b))


def slo_load(servers: int, service_s: float, wait_s: float, miss: float) -> float:
    """The largest offered load (Erlangs) at which at most ``miss`` of the arrivals wait
    longer than ``wait_s`` for one of ``servers`` slots, each held ``service_s`` seconds
    (0.0 when even an idle queue misses: ``wait_s <= 0``)."""
    if not (0.0 < miss < 1.0):
        raise ValueError(f"'miss' must be in (0, 1): {miss!r}")
    if not (math.isfinite(service_s) and service_s > 0):
        raise ValueError(f"'service_s' must be finite and > 0: {service_s!r}")
    if wait_s <= 0:
        return 0.0
    lo, hi = 0.0, float(servers)
    for _ in range(50):
        mid = (lo + hi) / 2
        late = erlang_c(servers, mid) * math.exp(-(servers - mid) * wait_s / service_s)
        if late <= miss:
            lo = mid
        else:
            hi = mid
    return lo


@frozen
class SLOCapacity:
    """One replica at the SLO."""

    tokens_per_s: float
    """Tokens (prompt and output) per second it serves within the SLO."""
    concurrency: int
    """Requests in flight at that rate (at least 1)."""
    batch: int
    """Slots: sequences it runs at once within the TPOT target and its KV pool."""
    service_s: float
    """Seconds a request of the mean lengths holds its slot."""
    kv_fill: float = 1.0
    """The share of the KV pool its requests hold at that rate: those running (the load, at
    most the batch) times the KV a slot holds, over the pool (at most 1)."""


def slo_capacity(
    timing: TimingModel,
    engine: EngineConfig,
    capacity_tokens: int,
    mean_prompt: float,
    mean_output: float,
    slo: SLOConfig,
    miss: float = 0.01,
    slot_kv_tokens: float | None = None,
) -> SLOCapacity:
    """One replica's rate at the SLO for requests of ``mean_prompt`` and ``mean_output``
    tokens, at most ``miss`` of them waiting past the TTFT target (see the module).

    ``slot_kv_tokens`` is the KV a request in flight holds on average over its time in the
    batch (None: ``P + D/2``, right when all requests are alike). With lengths that vary,
    a long request holds more KV for longer: by Little's law the KV a busy slot holds is
    ``sum((p + d/2) * d) / sum(d)`` over the requests (:func:`slot_kv_tokens`), and that
    is what the pool divides into slots.
    """
    p, d = max(mean_prompt, 1.0), max(mean_output, 1.0)
    per_slot = p + d / 2 if slot_kv_tokens is None else max(slot_kv_tokens, 1.0)

    def iteration_s(b: int) -> float:
        joining = b / d  # requests that finish, and join, per iteration
        kv = b * per_slot
        return timing.iteration_time(b + joining * p, kv, kv + joining * p * (p + 1) / 2)

    batch = max(1, min(engine.max_batch, int(capacity_tokens // per_slot)))
    lo, hi = 1, batch  # the largest batch whose iteration meets the TPOT target
    if iteration_s(batch) > slo.tpot_s:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if iteration_s(mid) <= slo.tpot_s:
                lo = mid
            else:
                hi = mid - 1
        batch = lo
    step = iteration_s(batch)
    prefill = timing.iteration_time(p, 0, p * (p + 1) / 2)
    # A request holds its slot for its decode iterations (its prefill chunks ride in the
    # iterations, whose time counts them): ``batch`` requests per ``service`` seconds is
    # the saturation rate, and the rate at the SLO that times the load the queue bears.
    service = d * step
    load = slo_load(batch, service, slo.ttft_s - prefill - step, miss)
    concurrency = max(1, int(load))
    return SLOCapacity(
        tokens_per_s=load / service * (p + d),
        concurrency=concurrency,
        batch=batch,
        service_s=service,
        kv_fill=min(1.0, min(concurrency, batch) * per_slot / max(capacity_tokens, 1)),
    )


def slot_kv_tokens(lengths: Iterable[tuple[int, int]]) -> float:
    """The KV tokens a request in flight holds, averaged over the time requests of these
    ``(prompt, output)`` lengths spend in the batch: ``sum((p + d/2) * d) / sum(d)`` (a
    request holds about ``p + d/2`` for ``d`` iterations). 0.0 with no output tokens."""
    held = weight = 0.0
    for prompt, output in lengths:
        held += (prompt + output / 2) * output
        weight += output
    return held / weight if weight else 0.0
