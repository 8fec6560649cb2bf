"""A TTL-based HBM-offload store over DRAM and disk (the storage model of seed 003, Fig. 4).

Blocks that HBM's prefix cache drops are offered to :meth:`TieredPrefixStore.offload`;
they land in the fastest tier, pushing that tier's least recently used block one tier down
when it is full (DRAM -> disk, "Tier 1: DRAM (LRU)", "Tier 2: Disk/SSD" of Fig. 4), and
out of the store when the last tier is full. Every block also carries a TTL per tier
(:mod:`kvpolicy.tiers._ttl`), counted from its last use; expired blocks are removed lazily.

Layout of one tier: one ``OrderedDict[hash -> last use]`` per distinct TTL value, oldest
first. With one TTL per tier (the usual case) that queue is in LRU order and in expiry
order at once, so both capacity eviction and expiry pop from its front in O(1)::

    tier "disk", ttl 600 s:   front -> [h17 @ 3.0] [h4 @ 9.5] [h8 @ 12.0] <- back (newest)
                               expires at 603.0, then 609.5, ...

Group TTLs (:class:`GroupTTL`) give one queue per distinct TTL; eviction then compares
the queue fronts (O(number of distinct TTLs)).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from attrs import field, frozen

from kvpolicy.kvmodel import TierFetch
from kvpolicy.tiers._check import is_sequence
from kvpolicy.tiers._spec import TierSpec
from kvpolicy.tiers._ttl import FixedTTL, TTLPolicy

__all__ = ["StoreStats", "TierStats", "TieredPrefixStore"]


@frozen
class TierStats:
    """Counters of one tier since the store was built."""

    name: str
    """Tier name."""
    capacity_bytes: int
    """Provisioned capacity."""
    blocks: int
    """Blocks held now (expired blocks not yet removed included)."""
    bytes_stored: int
    """Bytes held now."""
    hits: int
    """Fetched blocks found in this tier."""
    misses: int
    """Fetch lookups that reached this tier and did not find the block in it or above."""
    expirations: int
    """Blocks removed because their TTL in this tier ran out."""
    demotions: int
    """Blocks pushed from this tier to a slower one to make room."""
    drops: int
    """Blocks pushed out of the store from this tier (no slower tier took them)."""
    bytes_written: int
    """Bytes stored into this tier (offloads, promotions and demotions)."""
    write_seconds: float
    """Seconds of those writes, one transfer per block (latency + bytes / bandwidth)."""
    bytes_read: int
    """Bytes fetched back towards HBM from this tier."""
    byte_seconds: float
    """Integral of bytes held over time up to the last call (expired blocks count until
    their expiry, not until their lazy removal): the usage the TTL cost of §4.3 prices."""


@frozen
class StoreStats:
    """Counters of a :class:`TieredPrefixStore`; see :meth:`TieredPrefixStore.stats`."""

    time: float
    """Time of the last call."""
    tiers: tuple[TierStats, ...]
    """Per tier, fastest first."""
    offloaded: int
    """Blocks offered to :meth:`~TieredPrefixStore.offload`."""
    refused: int
    """Offered blocks that no tier would hold (capacity 0 or TTL 0 everywhere)."""
    fetches: int
    """Calls of :meth:`~TieredPrefixStore.fetch`."""
    blocks_requested: int
    """Blocks asked for by fetches."""
    blocks_found: int
    """Blocks found by fetches (the leading runs)."""
    fetch_seconds: float = field(default=0.0)
    """Sum of the transfer seconds returned by fetches."""

    @property
    def hit_ratio(self) -> float:
        """Blocks found over blocks requested (0 when nothing was requested)."""
        return self.blocks_found / self.blocks_requested if self.blocks_requested else 0.0


def _check_hashes(block_hashes: Sequence[int]) -> None:
    if not is_sequence(block_hashes):
        raise TypeError(f"'block_hashes' must be a sequence of int hashes: {block_hashes!r}")
    if set(map(type, block_hashes)) <= {int}:  # the common case, checked at C speed
        return
    for h in block_hashes:
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"'block_hashes' must hold int hashes: {h!r}")


class TieredPrefixStore:
    """HBM offload below the GPU: tiers in order (fastest first), LRU demotion, TTL expiry.

    Implements :class:`kvpolicy.kvmodel.PrefixStore`. Every operation is O(1) amortised
    per block (O(distinct TTLs) when a tier holds several TTL values).

    Transfer time: a fetch pays, **per block**, the latency of the tier it sits in plus
    ``block_bytes / read_bandwidth`` (each block is one I/O; a batched reader that pays the
    latency once per call would be faster, and is not modelled). ``TierFetch.tier`` names
    the slowest tier used.

    Promotion: a fetched block moves to the fastest tier that will hold it, with a fresh
    last use (and so a fresh TTL); HBM takes a copy, the store keeps its own. Offering a
    block the store already holds does the same. Within one call the blocks are placed
    last-first, so a chain's first blocks are the most recently used and a full tier
    demotes a chain's tail before its head (a lookup is a run from the first block).

    Example:
        >>> from kvpolicy.tiers import FixedTTL, get_tier
        >>> dram = get_tier("dram").with_capacity(4 << 20)
        >>> disk = get_tier("disk").with_capacity(8 << 20)
        >>> store = TieredPrefixStore((dram, disk), block_bytes=2 << 20,
        ...                           ttl=FixedTTL({"disk": 60.0}))
        >>> store.offload([1, 2, 3], time=0.0)  # 2 blocks fit in DRAM, 1 goes to disk
        >>> fetched = store.fetch([1, 2, 3, 4], time=1.0)
        >>> fetched.blocks, fetched.tier
        (3, 'disk')
    """

    __slots__ = (
        "_area",
        "_block_bytes",
        "_bytes_read",
        "_bytes_written",
        "_cap",
        "_count",
        "_demotions",
        "_drops",
        "_expirations",
        "_fetch_seconds",
        "_fetches",
        "_fixed",
        "_found",
        "_hits",
        "_home",
        "_lost",
        "_names",
        "_now",
        "_offloaded",
        "_queues",
        "_read_cost",
        "_refused",
        "_requested",
        "_tiers",
        "_ttl",
        "_where",
        "_write_cost",
        "_write_seconds",
    )

    def __init__(
        self, tiers: Sequence[TierSpec], block_bytes: int, ttl: TTLPolicy | None = None
    ) -> None:
        """Build an empty store.

        Args:
            tiers: the tiers below HBM, fastest first (typically DRAM then disk); names
                must be distinct.
            block_bytes: bytes of one KV block (``ModelSpec`` bytes per token times the
                block size).
            ttl: the TTL policy; default no expiry anywhere (pure LRU tiers).
        """
        if not is_sequence(tiers):
            raise TypeError(f"'tiers' must be a sequence of TierSpec: {tiers!r}")
        if not tiers:
            raise ValueError(f"'tiers' must not be empty: {tiers!r}")
        for t in tiers:
            if not isinstance(t, TierSpec):
                raise TypeError(f"'tiers' must hold TierSpec values: {t!r}")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"'tiers' must have distinct names: {names!r}")
        if isinstance(block_bytes, bool) or not isinstance(block_bytes, int):
            raise TypeError(f"'block_bytes' must be an int: {block_bytes!r}")
        if block_bytes <= 0:
            raise ValueError(f"'block_bytes' must be > 0: {block_bytes!r}")
        if ttl is not None and not isinstance(ttl, TTLPolicy):
            raise TypeError(f"'ttl' must be a TTLPolicy: {ttl!r}")
        n = len(tiers)
        self._tiers = tuple(tiers)
        self._names = tuple(names)
        self._block_bytes = block_bytes
        self._ttl: TTLPolicy = ttl if ttl is not None else FixedTTL()
        # A FixedTTL is read once per tier instead of once per block (the hot path).
        self._fixed: tuple[float, ...] | None = (
            tuple(self._ttl.ttl(0, name) for name in names)
            if isinstance(self._ttl, FixedTTL)
            else None
        )
        self._cap = [t.capacity_bytes // block_bytes for t in tiers]
        # With a FixedTTL every block's first tier is the same: the "home" tier.
        self._home = (
            next((i for i in range(n) if self._cap[i] > 0 and self._fixed[i] > 0), -1)
            if self._fixed is not None
            else -1
        )
        self._read_cost = [t.read_seconds(block_bytes) for t in tiers]
        self._write_cost = [t.write_seconds(block_bytes) for t in tiers]
        self._queues: list[dict[float, OrderedDict[int, float]]] = [{} for _ in range(n)]
        if self._fixed is not None:
            for i, tier_ttl in enumerate(self._fixed):
                if self._cap[i] > 0 and tier_ttl > 0:
                    self._queues[i][tier_ttl] = OrderedDict()
        self._where: dict[int, tuple[int, float]] = {}
        self._count = [0] * n
        self._now = 0.0
        self._area = [0.0] * n
        self._hits = [0] * n
        self._lost = 0  # fetches that stopped at a block held nowhere
        self._expirations = [0] * n
        self._demotions = [0] * n
        self._drops = [0] * n
        self._bytes_written = [0] * n
        self._write_seconds = [0.0] * n
        self._bytes_read = [0] * n
        self._offloaded = 0
        self._refused = 0
        self._fetches = 0
        self._requested = 0
        self._found = 0
        self._fetch_seconds = 0.0

    @property
    def tiers(self) -> tuple[TierSpec, ...]:
        """The tiers, fastest first."""
        return self._tiers

    @property
    def ttl(self) -> TTLPolicy:
        """The TTL policy the store was built with."""
        return self._ttl

    @property
    def block_bytes(self) -> int:
        """Bytes of one block."""
        return self._block_bytes

    def __len__(self) -> int:
        return len(self._where)

    def tier_of(self, block_hash: int) -> str | None:
        """Name of the tier holding ``block_hash`` now (an expired block still counts until
        a call at a later time removes it), or ``None``."""
        loc = self._where.get(block_hash)
        return None if loc is None else self._names[loc[0]]

    # -- the PrefixStore protocol ------------------------------------------------------

    def offload(self, block_hashes: Sequence[int], time: float) -> None:
        """Store blocks that HBM dropped at ``time``; each becomes most recently used.

        Raises:
            TypeError: a hash is not an int, or ``time`` is not a number.
            ValueError: ``time`` is negative, not finite, or earlier than the last call.
        """
        _check_hashes(block_hashes)
        now = self._advance(time)
        self._offloaded += len(block_hashes)
        self._promote(reversed(block_hashes), now)

    def observe_prompt(self, block_hashes: Sequence[int], time: float) -> None:
        """Show the TTL policy a prompt's whole chain (kvmodel's ``PromptObserver``).

        A :class:`GroupTTL` learns from it which prefix group each block belongs to
        (:meth:`GroupTTL.assign`); other policies ignore it. Call it when a request arrives,
        before its blocks are offloaded.

        Raises:
            TypeError: a hash is not an int, or ``time`` is not a number.
            ValueError: ``time`` is negative, not finite, or earlier than the last call.
        """
        _check_hashes(block_hashes)
        self._advance(time)
        assign = getattr(self._ttl, "assign", None)
        if assign is not None:
            assign(block_hashes)

    def fetch(self, block_hashes: Sequence[int], time: float) -> TierFetch:
        """The leading run of ``block_hashes`` held here, promoted and timed.

        Returns:
            Blocks found (stops at the first miss), their transfer seconds (sum over blocks
            of the latency plus ``block_bytes / read_bandwidth`` of each block's tier) and
            the slowest tier used.

        Raises:
            TypeError: a hash is not an int, or ``time`` is not a number.
            ValueError: ``time`` is negative, not finite, or earlier than the last call.
        """
        _check_hashes(block_hashes)
        now = self._advance(time)
        self._fetches += 1
        self._requested += len(block_hashes)
        where = self._where
        queues = self._queues
        per_tier = [0] * len(self._tiers)
        found = 0
        for h in block_hashes:
            loc = where.get(h)
            if loc is None:
                break
            i, ttl = loc
            if ttl != math.inf and queues[i][ttl][h] + ttl < now:
                self._expire(h, loc, now)  # expired, not yet swept (lazy removal)
                break
            per_tier[i] += 1
            found += 1
        if found < len(block_hashes):
            self._lost += 1
        seconds = 0.0
        slowest = -1
        for i, count in enumerate(per_tier):
            if count:
                self._hits[i] += count
                self._bytes_read[i] += count * self._block_bytes
                seconds += count * self._read_cost[i]
                slowest = i
        self._promote(reversed(block_hashes[:found]), now)
        self._found += found
        self._fetch_seconds += seconds
        return TierFetch(
            blocks=found,
            seconds=seconds,
            tier=self._names[slowest] if slowest >= 0 else "",
        )

    # -- statistics --------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """Counters since the store was built, as of the last call."""
        bb = self._block_bytes
        # A lookup reaches tier i when the block is in a slower tier or nowhere.
        misses = [self._lost + sum(self._hits[i + 1 :]) for i in range(len(self._tiers))]
        tiers = tuple(
            TierStats(
                name=t.name,
                capacity_bytes=t.capacity_bytes,
                blocks=self._count[i],
                bytes_stored=self._count[i] * bb,
                hits=self._hits[i],
                misses=misses[i],
                expirations=self._expirations[i],
                demotions=self._demotions[i],
                drops=self._drops[i],
                bytes_written=self._bytes_written[i],
                write_seconds=self._write_seconds[i],
                bytes_read=self._bytes_read[i],
                byte_seconds=self._area[i],
            )
            for i, t in enumerate(self._tiers)
        )
        return StoreStats(
            time=self._now,
            tiers=tiers,
            offloaded=self._offloaded,
            refused=self._refused,
            fetches=self._fetches,
            blocks_requested=self._requested,
            blocks_found=self._found,
            fetch_seconds=self._fetch_seconds,
        )

    # -- internals ---------------------------------------------------------------------

    def _advance(self, time: float) -> float:
        """Validate ``time``, integrate usage up to it and sweep expired queue fronts."""
        if isinstance(time, bool) or not isinstance(time, int | float):
            raise TypeError(f"'time' must be a number of seconds: {time!r}")
        now = float(time)
        if not math.isfinite(now) or now < 0:
            raise ValueError(f"'time' must be finite and >= 0: {time!r}")
        if now < self._now:
            raise ValueError(f"'time' must not go backwards: {time!r} < {self._now!r}")
        dt = now - self._now
        if dt > 0:
            bb = self._block_bytes
            for i, c in enumerate(self._count):
                if c:
                    self._area[i] += c * bb * dt
            self._now = now
            self._sweep(now)
        return now

    def _sweep(self, now: float) -> None:
        for i, by_ttl in enumerate(self._queues):
            for ttl, queue in by_ttl.items():
                while queue:
                    h, last = next(iter(queue.items()))
                    if last + ttl >= now:
                        break
                    self._expire(h, (i, ttl), now)

    def _expire(self, h: int, loc: tuple[int, float], now: float) -> None:
        i, ttl = loc
        last = self._queues[i][ttl].pop(h)
        del self._where[h]
        self._count[i] -= 1
        self._expirations[i] += 1
        # Usage stops at the expiry, not at this (lazy) removal.
        self._area[i] -= self._block_bytes * (now - (last + ttl))

    def _promote(self, block_hashes: Iterable[int], now: float) -> None:
        """Make each block most recently used at ``now`` in the fastest tier holding it.

        A block already in that tier moves to the back of its queue (no copy is written);
        any other block is moved up, which may demote others.
        """
        where = self._where
        fixed = self._fixed
        home = self._home
        home_queue = self._queues[home][fixed[home]] if fixed is not None and home >= 0 else None
        for h in block_hashes:
            loc = where.get(h)
            if loc is not None:
                if home_queue is not None and loc[0] == home:
                    home_queue[h] = now
                    home_queue.move_to_end(h)
                    continue
                if fixed is None and self._first_tier(h) == loc[0]:
                    ttl = self._tier_ttl(h, loc[0])
                    if ttl == loc[1]:
                        queue = self._queues[loc[0]][ttl]
                        queue[h] = now
                        queue.move_to_end(h)
                        continue
                self._remove(h, loc)
            self._place(h, 0, now, now)

    def _first_tier(self, h: int) -> int:
        """Index of the fastest tier that would hold ``h`` now, or -1."""
        for i in range(len(self._tiers)):
            if self._cap[i] > 0 and self._tier_ttl(h, i) > 0:
                return i
        return -1

    def _remove(self, h: int, loc: tuple[int, float]) -> float:
        i, ttl = loc
        last = self._queues[i][ttl].pop(h)
        del self._where[h]
        self._count[i] -= 1
        return last

    def _tier_ttl(self, h: int, i: int) -> float:
        fixed = self._fixed
        if fixed is not None:
            return fixed[i]
        ttl = self._ttl.ttl(h, self._names[i])
        if not ttl >= 0:  # also rejects NaN
            name = self._names[i]
            raise ValueError(f"TTL policy returned an invalid TTL for tier {name!r}: {ttl!r}")
        return float(ttl)

    def _place(self, h: int, i: int, last: float, now: float) -> None:
        """Put ``h`` (last used at ``last``) in tier ``i`` or below, cascading LRU victims."""
        n = len(self._tiers)
        fixed = self._fixed
        victim_from = -1  # the tier the block being placed was pushed out of, if any
        while True:
            ttl = 0.0
            while i < n:
                if self._cap[i] > 0:
                    ttl = fixed[i] if fixed is not None else self._tier_ttl(h, i)
                    if ttl > 0:
                        break
                i += 1
            if i >= n:
                if victim_from < 0:
                    self._refused += 1
                else:
                    self._drops[victim_from] += 1
                return
            if last + ttl < now:  # a victim already past its TTL in this tier
                self._expirations[i] += 1
                return
            if victim_from >= 0:
                self._demotions[victim_from] += 1
            victim: tuple[int, float] | None = None
            if self._count[i] >= self._cap[i]:
                victim = self._pop_lru(i)
            by_ttl = self._queues[i]
            queue = by_ttl.get(ttl)
            if queue is None:
                queue = by_ttl[ttl] = OrderedDict()
            queue[h] = last
            self._where[h] = (i, ttl)
            self._count[i] += 1
            self._bytes_written[i] += self._block_bytes
            self._write_seconds[i] += self._write_cost[i]
            if victim is None:
                return
            h, last = victim
            victim_from = i
            i += 1

    def _pop_lru(self, i: int) -> tuple[int, float]:
        """Remove and return the least recently used block of tier ``i``."""
        by_ttl = self._queues[i]
        if len(by_ttl) == 1:
            queue = next(iter(by_ttl.values()))
            h, last = queue.popitem(last=False)
            del self._where[h]
            self._count[i] -= 1
            return h, last
        best_ttl = 0.0
        best_last = math.inf
        for ttl, queue in by_ttl.items():
            if queue:
                last = next(iter(queue.values()))
                if last < best_last:
                    best_last, best_ttl = last, ttl
        h, last = self._queues[i][best_ttl].popitem(last=False)
        del self._where[h]
        self._count[i] -= 1
        return h, last
