"""The :class:`Workload` value type and :func:`describe`, its summary for reports."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import attrs
import numpy as np
from attrs import field, frozen
from attrs.validators import deep_iterable, ge, instance_of, min_len

from kvpolicy.kvmodel import Request
from kvpolicy.sim.workloads._tenants import TenantSpec

__all__ = ["Workload", "describe"]

_PERCENTILES = (50, 90, 99)


def _to_requests(value: Iterable[Request]) -> tuple[Request, ...]:
    return tuple(value)


def _to_notes(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_specs(value: Iterable[TenantSpec]) -> tuple[TenantSpec, ...]:
    return tuple(value)


def _check_specs(_inst: object, _attribute: object, value: tuple[TenantSpec, ...]) -> None:
    names: set[str] = set()
    for i, spec in enumerate(value):
        if not isinstance(spec, TenantSpec):
            raise TypeError(f"'tenant_specs[{i}]' must be a TenantSpec: {spec!r}")
        if spec.name in names:
            raise ValueError(f"'tenant_specs' must have unique names: {spec.name!r} repeats")
        names.add(spec.name)


def _check_requests(_inst: object, _attribute: object, value: tuple[Request, ...]) -> None:
    seen: set[str] = set()
    previous = -math.inf
    for i, request in enumerate(value):
        if not isinstance(request, Request):
            raise TypeError(f"'requests[{i}]' must be a kvpolicy.kvmodel.Request: {request!r}")
        if request.arrival_time < previous:
            raise ValueError(
                f"'requests' must be sorted by arrival_time: requests[{i}] arrives at "
                f"{request.arrival_time!r}, before requests[{i - 1}] at {previous!r}"
            )
        if request.request_id in seen:
            raise ValueError(f"'requests' must have unique ids: {request.request_id!r} repeats")
        seen.add(request.request_id)
        previous = request.arrival_time


@frozen
class Workload:
    """A replayable sequence of requests, from a trace file or a generator.

    A workload is a value: every transformation (:meth:`head`, :meth:`with_rate`) returns a
    new one. The simulator replays ``requests`` in order, each at its ``arrival_time``.
    """

    name: str = field(validator=[instance_of(str), min_len(1)])  # type: ignore[arg-type]
    """Short name used in reports (the preset name, or the trace file's stem)."""
    requests: tuple[Request, ...] = field(converter=_to_requests, validator=_check_requests)
    """The requests, sorted by ``arrival_time`` (ties keep their order); ids are unique."""
    source: str = field(validator=instance_of(str))
    """Where the requests come from: a file path, or ``"synthetic:<name>"``."""
    skipped_rows: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Malformed rows left out by a loader run with ``skip_bad=True``."""
    clamped_rows: int = field(default=0, validator=[instance_of(int), ge(0)])
    """Rows kept with a zero prompt or output length raised to 1 token (see the loaders)."""
    notes: tuple[str, ...] = field(
        default=(), converter=_to_notes, validator=deep_iterable(instance_of(str))
    )
    """Decisions a loader or generator took that a reader of the results should know."""
    tenant_specs: tuple[TenantSpec, ...] = field(
        default=(), converter=_to_specs, validator=_check_specs
    )
    """What is known of the tenants (share, service class), e.g. to set a gateway's
    entitlements: a generated workload's configured tenants, ServeGen's clients; empty for
    traces without tenants. Every request's tenant has a spec when any is given."""

    def __attrs_post_init__(self) -> None:
        if self.tenant_specs:
            known = {t.name for t in self.tenant_specs}
            for i, r in enumerate(self.requests):
                if r.tenant not in known:
                    raise ValueError(
                        f"'tenant_specs' must describe every tenant: requests[{i}] has "
                        f"tenant {r.tenant!r}"
                    )

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.requests)

    @property
    def start_time(self) -> float:
        """Arrival time of the first request (0.0 when empty)."""
        return self.requests[0].arrival_time if self.requests else 0.0

    @property
    def duration(self) -> float:
        """Seconds from the first arrival to the last (0.0 for fewer than two requests)."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_time - self.requests[0].arrival_time

    @property
    def tenants(self) -> tuple[str, ...]:
        """The tenants that send requests, sorted by name."""
        return tuple(sorted({r.tenant for r in self.requests}))

    @property
    def mean_rate(self) -> float:
        """Arrivals per second, ``1 / mean inter-arrival time`` (``inf`` if all arrive at once).

        Raises:
            ValueError: fewer than two requests (no inter-arrival time exists).
        """
        if len(self.requests) < 2:
            raise ValueError(f"'mean_rate' needs at least 2 requests: {len(self.requests)}")
        span = self.duration
        return (len(self.requests) - 1) / span if span > 0 else math.inf

    @property
    def max_total_len(self) -> int:
        """Most tokens one request holds at completion (0 when empty): the KV a simulator
        must be able to fit for the workload to be servable at all."""
        return max((r.total_len for r in self.requests), default=0)

    @property
    def summary(self) -> dict[str, Any]:
        """The same dictionary as :func:`describe`."""
        return describe(self)

    def arrival_times(self) -> np.ndarray:
        """Arrival times as a ``(num_requests,) float64`` array, non-decreasing."""
        return np.fromiter(
            (r.arrival_time for r in self.requests), dtype=np.float64, count=len(self.requests)
        )

    def head(self, num_requests: int) -> Workload:
        """The first ``num_requests`` requests (all of them if there are fewer)."""
        if isinstance(num_requests, bool) or not isinstance(num_requests, int):
            raise TypeError(f"'num_requests' must be int: {num_requests!r}")
        if num_requests < 0:
            raise ValueError(f"'num_requests' must be >= 0: {num_requests}")
        if num_requests >= len(self.requests):
            return self
        return attrs.evolve(self, requests=self.requests[:num_requests])  # specs stay valid

    def with_context_limit(self, context_len: int) -> Workload:
        """Cut every request to at most ``context_len`` tokens (prompt plus output).

        A serving front end keeps a conversation inside the model's context window by
        dropping its oldest tokens, so the prompt is cut first (from the front, which
        invalidates its prefix hashes) and the output only when it alone does not fit
        (it keeps ``context_len - 1`` tokens and a one-token prompt). The number of requests
        cut is put in ``notes``.

        Raises:
            ValueError: ``context_len`` < 2.
        """
        if isinstance(context_len, bool) or not isinstance(context_len, int):
            raise TypeError(f"'context_len' must be int: {context_len!r}")
        if context_len < 2:
            raise ValueError(f"'context_len' must be >= 2: {context_len}")
        cut = sum(1 for r in self.requests if r.total_len > context_len)
        if cut == 0:
            return self
        requests = tuple(_clip_to_context(r, context_len) for r in self.requests)
        note = f"{cut} requests cut to the {context_len}-token context (prompt cut first)"
        return attrs.evolve(self, requests=requests, notes=(*self.notes, note))

    def with_rate(self, rate: float) -> Workload:
        """Stretch or compress time about the first arrival so that :attr:`mean_rate` is ``rate``.

        The shape of the arrival process (its CV, its bursts) is kept; only the time unit
        changes, which is how a trace is replayed "at high load".

        Raises:
            ValueError: ``rate`` is not finite and > 0, or the workload has no time span.
        """
        rate = _positive_rate(rate)
        current = self.mean_rate
        if not math.isfinite(current):
            raise ValueError(f"'rate' cannot be set on a workload that spans no time: {rate!r}")
        factor = current / rate
        t0 = self.start_time
        scaled = tuple(
            attrs.evolve(r, arrival_time=t0 + (r.arrival_time - t0) * factor) for r in self.requests
        )
        note = f"arrival times scaled by {factor:.6g} to a mean rate of {rate:g} req/s"
        return attrs.evolve(self, requests=scaled, notes=(*self.notes, note))


def _clip_to_context(request: Request, context_len: int) -> Request:
    """``request`` cut to ``context_len`` tokens: the prompt loses its oldest tokens first."""
    if request.total_len <= context_len:
        return request
    decode = min(request.decode_len, context_len - 1)
    prompt = context_len - decode
    hashes = request.prefix_hashes
    if hashes and prompt < request.prompt_len:
        # Dropping leading tokens changes every block, so no prefix survives the cut.
        hashes = ()
    return attrs.evolve(
        request,
        prompt_len=prompt,
        decode_len=decode,
        prefix_hashes=hashes,
    )


def _positive_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        raise TypeError(f"'rate' must be a number: {rate!r}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"'rate' must be finite and > 0: {rate!r}")
    return float(rate)


def _length_stats(values: np.ndarray) -> dict[str, float | int | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "total": 0}
    p50, p90, p99 = np.percentile(values, _PERCENTILES)
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": int(values.max()),
        "total": int(values.sum()),
    }


def _prefix_stats(requests: tuple[Request, ...]) -> dict[str, float | int]:
    refs = sum(len(r.prefix_hashes) for r in requests)
    if refs == 0:
        return {"requests_with_hashes": 0, "block_references": 0, "unique_blocks": 0,
                "hit_ratio": 0.0}  # fmt: skip
    chained = itertools.chain.from_iterable(r.prefix_hashes for r in requests)
    try:
        flat = np.fromiter(chained, dtype=np.int64, count=refs)
        flat.sort()  # sort + diff: several times faster than np.unique on millions of ints
        unique = int(np.count_nonzero(np.diff(flat))) + 1
    except OverflowError:  # hashes outside int64: count them the slow way
        unique = len(set(itertools.chain.from_iterable(r.prefix_hashes for r in requests)))
    return {
        "requests_with_hashes": sum(1 for r in requests if r.prefix_hashes),
        "block_references": refs,
        "unique_blocks": unique,
        # With an unbounded cache every reference after a hash's first one is a hit.
        "hit_ratio": (refs - unique) / refs,
    }


def describe(workload: Workload) -> dict[str, Any]:
    """Summary statistics of a workload, as JSON-ready plain values.

    Returns a dictionary with the keys ``name``, ``source``, ``num_requests``,
    ``skipped_rows``, ``clamped_rows``, ``notes`` (list), ``duration_s``, ``mean_rate_rps``
    and ``interarrival_cv`` (``None`` when undefined: fewer than two requests, or no time
    span), ``prompt_tokens`` and ``decode_tokens`` (each ``mean``, ``p50``, ``p90``, ``p99``,
    ``max``, ``total``), ``tenants`` (per tenant: ``requests``, ``share``, ``priorities``,
    ``prompt_tokens_mean``, ``decode_tokens_mean``, and ``service_class`` from
    :attr:`Workload.tenant_specs` or ``None``) and ``prefix`` (``requests_with_hashes``,
    ``block_references``, ``unique_blocks``, ``hit_ratio`` of an unbounded prefix cache).

    The inter-arrival CV is ``std / mean`` of the gaps between consecutive arrivals
    (population standard deviation), the statistic quoted in the traces' PROVENANCE files.
    """
    if not isinstance(workload, Workload):
        raise TypeError(f"'workload' must be a Workload: {workload!r}")
    reqs = workload.requests
    n = len(reqs)
    prompt = np.fromiter((r.prompt_len for r in reqs), dtype=np.int64, count=n)
    decode = np.fromiter((r.decode_len for r in reqs), dtype=np.int64, count=n)
    gaps = np.diff(workload.arrival_times())
    rate: float | None = None
    cv: float | None = None
    if gaps.size and gaps.mean() > 0:
        rate = float(1.0 / gaps.mean())
        cv = float(gaps.std() / gaps.mean())
    by_tenant: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        by_tenant.setdefault(r.tenant, []).append(i)
    specs = {t.name: t for t in workload.tenant_specs}
    tenants: dict[str, dict[str, Any]] = {}
    for name in sorted(by_tenant):
        idx = np.asarray(by_tenant[name])
        priorities = Counter(reqs[i].priority for i in by_tenant[name])
        tenants[name] = {
            "requests": int(idx.size),
            "share": idx.size / n,
            "priorities": sorted(priorities),
            "prompt_tokens_mean": float(prompt[idx].mean()),
            "decode_tokens_mean": float(decode[idx].mean()),
            "service_class": specs[name].service_class if name in specs else None,
        }
    return {
        "name": workload.name,
        "source": workload.source,
        "num_requests": n,
        "skipped_rows": workload.skipped_rows,
        "clamped_rows": workload.clamped_rows,
        "notes": list(workload.notes),
        "duration_s": workload.duration,
        "mean_rate_rps": rate,
        "interarrival_cv": cv,
        "prompt_tokens": _length_stats(prompt),
        "decode_tokens": _length_stats(decode),
        "tenants": tenants,
        "prefix": _prefix_stats(reqs),
    }
