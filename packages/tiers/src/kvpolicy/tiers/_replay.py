"""A fast evaluator for the Pareto search: replay a hash trace through a store.

Seed 003 evaluates each configuration with an end-to-end serving simulator
(kvpolicy-sim plays that part). This module is the cheap stand-in the library ships: it
replays ``(time, block_hashes)`` requests through :class:`TieredPrefixStore` with no
GPU model. Each request first fetches its prefix (the store serves the leading run it
holds) and then offers all its blocks back (HBM keeps nothing between requests: a
request's blocks are dropped to the store when it finishes, at its arrival time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from attrs import field, frozen
from attrs.validators import ge, gt, instance_of

from kvpolicy.tiers._cost import serving_cost
from kvpolicy.tiers._pareto import Objectives
from kvpolicy.tiers._reuse import HashTrace, _validate
from kvpolicy.tiers._spec import GIB, TierSpec
from kvpolicy.tiers._store import StoreStats, TieredPrefixStore
from kvpolicy.tiers._ttl import FixedTTL

__all__ = ["ReplayEvaluator", "ReplayResult", "replay"]


@frozen(eq=False)
class ReplayResult:
    """What a replay measured, per request and in total."""

    blocks_per_request: npt.NDArray[np.int64]
    """(requests,) int64: blocks each request asked for."""
    hits_per_request: npt.NDArray[np.int64]
    """(requests,) int64: leading blocks the store served."""
    seconds_per_request: npt.NDArray[np.float64]
    """(requests,) float64: transfer seconds of those blocks."""
    span_seconds: float
    """Time from the first to the last request."""
    stats: StoreStats
    """The store's counters at the end."""

    @property
    def requests(self) -> int:
        """Requests replayed."""
        return int(self.blocks_per_request.size)

    @property
    def blocks(self) -> int:
        """Blocks asked for."""
        return int(self.blocks_per_request.sum())

    @property
    def hit_blocks(self) -> int:
        """Blocks served by the store."""
        return int(self.hits_per_request.sum())

    @property
    def load_seconds(self) -> float:
        """Transfer seconds of the served blocks."""
        return float(self.seconds_per_request.sum())

    @property
    def hit_ratio(self) -> float:
        """Served blocks over asked blocks."""
        return self.hit_blocks / self.blocks if self.blocks else 0.0


def replay(
    trace: HashTrace,
    store: TieredPrefixStore,
    *,
    on_request: Callable[[Sequence[int]], None] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through ``store``: fetch each prefix, then offload its blocks.

    Args:
        trace: ``(time, block_hashes)`` rows in time order.
        store: the store (its state carries over between calls).
        on_request: called with each request's hashes first, e.g. ``GroupTTL.assign``.
    """
    _validate(trace)
    if not isinstance(store, TieredPrefixStore):
        raise TypeError(f"'store' must be a TieredPrefixStore: {store!r}")
    n = len(trace)
    sizes = np.zeros(n, dtype=np.int64)
    hits = np.zeros(n, dtype=np.int64)
    seconds = np.zeros(n, dtype=np.float64)
    for k, (t, hashes) in enumerate(trace):
        if on_request is not None:
            on_request(hashes)
        got = store.fetch(hashes, t)
        store.offload(hashes, t)
        sizes[k] = len(hashes)
        hits[k] = got.blocks
        seconds[k] = got.seconds
    span = float(trace[-1][0]) - float(trace[0][0]) if trace else 0.0
    return ReplayResult(
        blocks_per_request=sizes,
        hits_per_request=hits,
        seconds_per_request=seconds,
        span_seconds=span,
        stats=store.stats(),
    )


def _trace(value: HashTrace) -> tuple[tuple[float, tuple[int, ...]], ...]:
    _validate(value)
    return tuple((float(t), tuple(h)) for t, h in value)


def _positive_finite(_inst: object, attribute: object, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        name = getattr(attribute, "name", "value")
        raise ValueError(f"'{name}' must be finite and > 0: {value!r}")


@frozen
class ReplayEvaluator:
    """Objectives of a (DRAM GiB, disk GiB, disk TTL) configuration by trace replay.

    Called with a configuration mapping that may hold ``"dram_gib"``, ``"disk_gib"`` and
    ``"ttl_s"`` (disk TTL in seconds; DRAM keeps blocks until LRU demotion); missing keys
    keep :attr:`dram`, :attr:`disk` and no disk expiry. The model, per request:

    * a request loads its cached prefix when that is faster than recomputing it, and
      recomputes it otherwise (Observation 2: disk reloads can be slower than prefill);
    * latency = the load (or recompute) of the cached prefix + prefill of the rest;
    * GPU busy seconds = recomputed blocks · prefill seconds + decode seconds;
    * throughput = requests / GPU busy seconds (a saturated GPU: Observation 3, hits
      turn directly into throughput);
    * cost = eq. (2): GPU busy hours at the GPU price + both tiers' provisioned capacity
      over the trace span.

    It ignores queueing, batching and the overlap of loads with compute; use
    kvpolicy-sim when those matter (Observations 1, 2 and 4 of seed 003 are about them).
    """

    trace: tuple[tuple[float, tuple[int, ...]], ...] = field(converter=_trace)
    """The requests, ``(time, block_hashes)``."""
    block_bytes: int = field(validator=[instance_of(int), gt(0)])
    """Bytes per block."""
    prefill_seconds_per_block: float = field(converter=float, validator=_positive_finite)
    """GPU seconds to recompute one block's KV."""
    decode_seconds_per_request: float = field(converter=float, validator=_positive_finite)
    """GPU seconds per request besides prefill (decode), independent of the cache."""
    gpu_price_per_hour: float = field(converter=float, validator=[ge(0.0)])
    """Price of one GPU-hour (c_GPU of eq. (2))."""
    dram: TierSpec = field(validator=instance_of(TierSpec))
    """The DRAM tier; ``dram_gib`` resizes it."""
    disk: TierSpec = field(validator=instance_of(TierSpec))
    """The disk tier; ``disk_gib`` resizes it."""

    def __attrs_post_init__(self) -> None:
        if self.dram.name == self.disk.name:
            raise ValueError(f"'disk' must be named apart from 'dram': {self.disk.name!r}")

    def run(self, config: Mapping[str, float]) -> ReplayResult:
        """Replay the trace under ``config`` and return the raw measurements."""
        if not isinstance(config, Mapping):
            raise TypeError(f"'config' must be a mapping of axis name to value: {config!r}")
        unknown = set(config) - {"dram_gib", "disk_gib", "ttl_s"}
        if unknown:
            raise ValueError(f"'config' has unknown keys: {sorted(unknown)!r}")
        dram, disk = self.dram, self.disk
        if "dram_gib" in config:
            dram = dram.with_capacity(_bytes("dram_gib", config["dram_gib"]))
        if "disk_gib" in config:
            disk = disk.with_capacity(_bytes("disk_gib", config["disk_gib"]))
        ttls = {disk.name: float(config["ttl_s"])} if "ttl_s" in config else {}
        store = TieredPrefixStore((dram, disk), self.block_bytes, ttl=FixedTTL(ttls))
        return replay(self.trace, store)

    def __call__(self, config: Mapping[str, float]) -> Objectives:
        """The :class:`Objectives` of ``config`` (see the class docstring)."""
        r = self.run(config)
        p = self.prefill_seconds_per_block
        recompute_hits = r.hits_per_request * p
        load = r.seconds_per_request <= recompute_hits
        recomputed = np.where(load, r.blocks_per_request - r.hits_per_request, r.blocks_per_request)
        prefill = recomputed * p
        per_request = np.where(load, r.seconds_per_request, 0.0) + prefill
        busy = float(prefill.sum()) + r.requests * self.decode_seconds_per_request
        n = max(r.requests, 1)
        tiers = [t.with_capacity(cap) for t, cap in _capacities(r.stats, self)]
        return Objectives(
            latency=float(per_request.sum()) / n,
            throughput=r.requests / busy if busy > 0 else 0.0,
            cost=serving_cost(
                busy / 3600.0, self.gpu_price_per_hour, tiers, r.span_seconds / 3600.0
            ),
        )


def _capacities(stats: StoreStats, ev: ReplayEvaluator) -> list[tuple[TierSpec, int]]:
    by_name = {t.name: t.capacity_bytes for t in stats.tiers}
    return [(ev.dram, by_name[ev.dram.name]), (ev.disk, by_name[ev.disk.name])]


def _bytes(name: str, gib: float) -> int:
    if isinstance(gib, bool) or not isinstance(gib, int | float):
        raise TypeError(f"'{name}' must be a number of GiB: {gib!r}")
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"'{name}' must be finite and >= 0: {gib!r}")
    return round(gib * GIB)
