"""tiers' per-group TTL as the cache policy of vLLM's CPU ``OffloadingConnector``.

Select it with ``--kv-transfer-config '{"kv_connector": "OffloadingConnector",
"kv_role": "kv_both", "kv_connector_extra_config": {"cache_policy": "kvpolicy-group-ttl"}}'``
(the plugin registers the name; or ``"cache_policy": "GroupTTLCachePolicy",
"cache_policy_module_path": "kvpolicy.vllm._offload"``). The TTLs come from the
``offload`` section of the kvpolicy config in ``KVPOLICY_VLLM_CONFIG`` (the connector's
policy is built with its capacity only), e.g. from :class:`KVEventsConsumer`'s
recommendation.

A TTL counts from a chunk's last use (its store or its last request-scoped access), as in
kvpolicy-tiers. The CPU pool is bounded and owns its buffer slots, so expiry cannot free a
slot by itself: a chunk past its TTL is the first to go when the pool needs room, and
among the rest the earliest deadline ``last_use + ttl`` goes first, then the least
recently used. With every TTL infinite the policy is LRU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence

from kvpolicy.tiers import GroupTTL
from kvpolicy.vllm._config import ENV_VAR, OffloadConfig, config_from_vllm
from kvpolicy.vllm._events import block_key
from vllm.v1.kv_offload.base import OffloadKey, ReqContext, get_offload_block_hash
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

__all__ = ["GroupTTLCachePolicy"]

_TIER = "dram"


class GroupTTLCachePolicy(CachePolicy):  # type: ignore[misc,unused-ignore]
    """vLLM ``CachePolicy`` applying tiers' ``GroupTTL`` to the CPU offloading cache.

    Args:
        cache_capacity: chunks the CPU pool holds (vLLM passes it).
        config: the group TTLs (default: the ``offload`` section of the kvpolicy config in
            the ``KVPOLICY_VLLM_CONFIG`` environment variable; none means LRU).
        clock: seconds since some origin (default ``time.monotonic``).
    """

    def __init__(
        self,
        cache_capacity: int,
        config: OffloadConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cache_capacity)
        if config is None:
            config = config_from_vllm(None).offload or OffloadConfig()
        if not isinstance(config, OffloadConfig):
            raise TypeError(f"'config' must be an OffloadConfig (from {ENV_VAR}): {config!r}")
        self.ttl_policy = GroupTTL(
            dict(config.group_ttls),
            residual=config.residual_ttl_s,
            tier=_TIER,
            depth=config.depth,
        )
        """The tiers policy deciding each chunk's TTL."""
        self._clock = clock
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._last_use: dict[OffloadKey, float] = {}
        self._tick = 0
        self._order: dict[OffloadKey, int] = {}

    def _use(self, key: OffloadKey, now: float) -> None:
        self._last_use[key] = now
        self._tick += 1
        self._order[key] = self._tick

    def deadline(self, key: OffloadKey) -> float:
        """Time after which ``key`` has outlived its group's TTL (inf: never)."""
        ttl = self.ttl_policy.ttl(block_key(get_offload_block_hash(key)), _TIER)
        return self._last_use[key] + ttl if math.isfinite(ttl) else math.inf

    def expired(self) -> list[OffloadKey]:
        """Chunks past their TTL now, earliest deadline first."""
        now = self._clock()
        keys = [k for k in self.chunks if self.deadline(k) < now]
        return sorted(keys, key=lambda k: (self.deadline(k), self._order[k]))

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of ``key``, or None."""
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        """A newly stored chunk: its use starts now."""
        self.chunks[key] = chunk
        self._use(key, self._clock())

    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` (after a failed store)."""
        self.chunks.pop(key, None)
        self._last_use.pop(key, None)
        self._order.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """A request used ``keys`` (head to tail): learn their group, restart their TTL."""
        ordered = list(keys)
        self.ttl_policy.assign([block_key(get_offload_block_hash(k)) for k in ordered])
        now = self._clock()
        for k in ordered:
            if k in self.chunks:
                self._use(k, now)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """One request's accesses in prefix order: one chain for group assignment."""
        self.touch(order_request_keys(key_groups, req_context), req_context)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Evict exactly ``n`` unpinned chunks: expired first, then earliest deadline, then
        least recently used; None (and no change) when fewer than ``n`` can go."""
        if n <= 0:
            return []
        now = self._clock()
        free = [k for k, c in self.chunks.items() if c.ref_cnt == 0 and k not in protected]
        if len(free) < n:
            return None

        def rank(k: OffloadKey) -> tuple[bool, float, int]:
            d = self.deadline(k)
            return (d >= now, d, self._order[k])

        victims = sorted(free, key=rank)[:n]
        out = [(k, self.chunks[k]) for k in victims]
        for k in victims:
            self.remove(k)
        return out

    def clear(self) -> None:
        """Drop every chunk."""
        self.chunks.clear()
        self._last_use.clear()
        self._order.clear()

    def __repr__(self) -> str:
        return f"GroupTTLCachePolicy(capacity={self.cache_capacity!r}, {self.ttl_policy!r})"
