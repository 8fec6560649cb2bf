"""A paged KV block pool with reference counts, copy-on-write and prefix caching (seed 001).

Layout of one request's KV in the pool (``block_size = 4``, 10 tokens)::

    block table:   [ 7 ][ 2 ][ 9 ]          logical block i -> physical block id
    tokens:        t0..t3 t4..t7 t8 t9 _ _   the last block is partly filled

A block is either *free* (reference count 0, on the free list) or *owned* (count >= 1, in
one or more block tables). A free block may still be *cached*: it keeps the hash of the
full prompt block it holds until it is reused, so a later request with the same prefix takes
it back instead of recomputing it. Free blocks are reused least-recently-freed first, which
makes the prefix cache LRU.

Running out of blocks is an expected outcome: :meth:`BlockPool.allocate` and
:meth:`BlockPool.append` return ``None``/``False`` and change nothing. Misuse (double free,
unknown request, writing to a shared block) raises :class:`BlockPoolError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter

from attrs import frozen

from kvpolicy.kvmodel._errors import BlockPoolError

__all__ = ["Allocation", "BlockPool", "PoolStats", "chain_block_hashes", "rechunk_hashes"]

_ROOT = 0x6B76706F6C696379
"""The parent of a prompt's first block (``b"kvpolicy"`` as an int). An int, not None:
``hash(None)`` is the object's address in Python 3.11, different in every process, so hashes
chained from it would not agree between two processes (a saved workload and the run reading
it, a gateway and its backends); a tuple of ints hashes the same everywhere."""


def chain_block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int | None = None
) -> tuple[int, ...]:
    """Chained hashes of the full blocks of ``token_ids``.

    Block ``i``'s hash covers its tokens and the hash of block ``i - 1`` (of a fixed root
    for the first block, without ``parent``), so equal hashes mean equal prefixes, in every
    process alike (the token ids are ints). A trailing partial block gets no hash.
    """
    if block_size <= 0:
        raise ValueError(f"'block_size' must be > 0: {block_size}")
    hashes: list[int] = []
    prev = _ROOT if parent is None else parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(token_ids[start : start + block_size])))
        hashes.append(prev)
    return tuple(hashes)


def rechunk_hashes(
    hashes: Sequence[int], from_block_size: int, to_block_size: int
) -> tuple[int, ...]:
    """Chained block hashes of ``from_block_size`` tokens as hashes of ``to_block_size``.

    A chained hash names its whole prefix, so the hash of a large block is the hash of the
    last small block it ends with: with ``k = to_block_size / from_block_size``, large block
    ``j`` is small block ``(j + 1) k - 1``::

        small:  h0 h1 h2 h3 h4 h5 h6      (from_block_size = 16)
        large:     h1    h3    h5         (to_block_size = 32; h6 ends no full block)

    Raises:
        ValueError: a size below 1, or ``to_block_size`` not a multiple of
            ``from_block_size`` (a block boundary no hash marks).
    """
    for name, value in (("from_block_size", from_block_size), ("to_block_size", to_block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"'{name}' must be an int >= 1: {value!r}")
    if to_block_size % from_block_size:
        raise ValueError(
            f"block size {to_block_size} is not a multiple of the prefix hashes' block size "
            f"{from_block_size}: hashes mark no boundary there"
        )
    k = to_block_size // from_block_size
    if k == 1:
        return tuple(hashes)
    return tuple(hashes[k - 1 :: k])


@frozen
class Allocation:
    """What :meth:`BlockPool.allocate` did for a new request."""

    block_ids: tuple[int, ...]
    """The request's block table."""
    cached_tokens: int
    """Prompt tokens found in the prefix cache (need no prefill)."""


@frozen
class PoolStats:
    """Usage of a :class:`BlockPool` at one instant."""

    num_blocks: int
    """Blocks in the pool."""
    block_size: int
    """Tokens per block."""
    free_blocks: int
    """Blocks with no owner (cached ones included)."""
    used_blocks: int
    """Blocks owned by at least one request."""
    cached_blocks: int
    """Blocks that hold a hashed prompt block (owned or free)."""
    shared_blocks: int
    """Blocks owned by more than one request."""
    num_requests: int
    """Requests holding blocks."""
    logical_tokens: int
    """Tokens summed over requests (a shared block counts once per owner)."""
    stored_tokens: int
    """Token slots filled in used blocks (a shared block counts once)."""
    prefix_queries: int
    """Full prompt blocks looked up in the prefix cache."""
    prefix_hits: int
    """Of those, found."""
    failed_allocations: int
    """Allocations and appends refused for lack of blocks."""
    cow_copies: int
    """Copy-on-write copies made."""

    @property
    def utilisation(self) -> float:
        """Filled slots over the slots of used blocks (1.0 when nothing is used)."""
        slots = self.used_blocks * self.block_size
        return self.stored_tokens / slots if slots else 1.0

    @property
    def prefix_hit_rate(self) -> float:
        """``prefix_hits / prefix_queries`` (0.0 before any query)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


MAX_BLOCKS = 2**26
"""The most blocks a :class:`BlockPool` holds: it keeps a few entries per block (about
2 GB of lists at this bound), far above any GPU's KV blocks."""
MAX_BLOCK_SIZE = 2**20
"""The most tokens per block (vLLM's block sizes are 1 to 256)."""


class BlockPool:
    """Fixed-size KV blocks shared by requests through per-request block tables.

    Args:
        num_blocks: blocks in the pool (> 0).
        block_size: tokens per block (> 0).
        enable_prefix_caching: keep hashes of full prompt blocks for reuse.
        record_dropped: remember the hashes of cached blocks that are reused for other
            content, for :meth:`pop_dropped_hashes` (to offload them to a lower tier).
    """

    __slots__ = (
        "_block_hash",
        "_block_size",
        "_cached",
        "_content",
        "_counters",
        "_dropped",
        "_fill",
        "_has_content",
        "_head",
        "_is_free",
        "_nfree",
        "_num_blocks",
        "_prefix_caching",
        "_queue",
        "_ref",
        "_stale",
        "_tables",
        "_tokens",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        enable_prefix_caching: bool = True,
        record_dropped: bool = False,
    ) -> None:
        for name, value, most in (
            ("num_blocks", num_blocks, MAX_BLOCKS),
            ("block_size", block_size, MAX_BLOCK_SIZE),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"'{name}' must be int: {value!r}")
            if not 0 < value <= most:
                shown = value if abs(value) < 10**18 else "<huge int>"
                raise ValueError(f"'{name}' must be > 0 and <= {most}: {shown}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._prefix_caching = enable_prefix_caching
        # Owners of each block. A block on the free list keeps 1, the count it has once
        # taken, so that allocation and release touch no count of an unshared block.
        self._ref = [1] * num_blocks
        # Filled token slots of each block. Only the last block of a table may be partly
        # filled, and a free block counts as full, so a fresh block needs a write only
        # when it becomes a table's partial last block.
        self._fill = [block_size] * num_blocks
        self._content: list[list[int] | None] = [None] * num_blocks
        self._has_content = False  # whether any token ids were ever recorded
        # The free list, least recently freed first: ``_queue[_head:]`` in order, with
        # ``_is_free[b]`` set for the same blocks and ``_nfree`` their count. A cached block
        # taken back from the middle of the list (a prefix hit) leaves its entry behind:
        # ``_stale[b]`` counts such dead entries of block b, which always come before its
        # live one. Freeing and allocating are list operations over whole runs of blocks
        # and one byte per block (a set of block ids would be megabytes per pool, which a
        # fleet of pools touches all over, missing the cache).
        self._is_free = bytearray(b"\x01") * num_blocks
        self._nfree = num_blocks
        self._queue: list[int] = list(range(num_blocks))
        self._head = 0
        self._stale: dict[int, int] = {}
        self._tables: dict[str, list[int]] = {}
        self._tokens: dict[str, int] = {}
        self._block_hash: dict[int, int] = {}
        self._cached: dict[int, int] = {}  # hash -> block id
        self._counters = {"queries": 0, "hits": 0, "failed": 0, "cow": 0}
        self._dropped: list[int] | None = [] if record_dropped else None

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (cached ones included)."""
        return self._nfree

    def has_request(self, request_id: str) -> bool:
        """Whether ``request_id`` holds blocks here."""
        return request_id in self._tables

    def requests(self) -> list[str]:
        """Ids of the requests holding blocks."""
        return list(self._tables)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        """The physical block ids of ``request_id``, in logical order."""
        return tuple(self._table(request_id))

    def num_tokens(self, request_id: str) -> int:
        """Tokens ``request_id`` holds."""
        self._table(request_id)
        return self._tokens[request_id]

    def ref_count(self, block_id: int) -> int:
        """Owners of ``block_id``."""
        if not 0 <= block_id < self._num_blocks:
            raise BlockPoolError(f"'block_id' out of range [0, {self._num_blocks}): {block_id}")
        return 0 if self._is_free[block_id] else self._ref[block_id]

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is on the free list."""
        return bool(self._is_free[block_id])

    def read(self, request_id: str) -> list[int]:
        """The token ids ``request_id`` wrote (only tokens appended with ids are recorded)."""
        out: list[int] = []
        for b in self._table(request_id):
            out.extend(self._content[b] or [])
        return out

    def pop_dropped_hashes(self) -> list[int]:
        """Hashes of cached blocks reused for other content since the last call, oldest first.

        Empty unless the pool was built with ``record_dropped=True``.
        """
        if not self._dropped:
            return []
        out, self._dropped[:] = list(self._dropped), []
        return out

    def cached_hashes(self, among: Iterable[int] | None = None) -> frozenset[int]:
        """Hashes of the blocks held in the prefix cache now (empty without prefix caching),
        or only those of ``among`` (a prompt's hashes: as cheap as the prompt is long)."""
        if among is None:
            return frozenset(self._cached)
        cached = self._cached
        return frozenset(h for h in among if h in cached)

    def cached_prefix_blocks(self, prefix_hashes: Sequence[int]) -> int:
        """Leading blocks of ``prefix_hashes`` held in the prefix cache now (a pure query)."""
        if not self._prefix_caching:
            return 0
        n = 0
        for h in prefix_hashes:
            if h not in self._cached:
                break
            n += 1
        return n

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that ``num_tokens`` tokens occupy: ``ceil(num_tokens / block_size)``."""
        return -(-num_tokens // self._block_size)

    def stats(self) -> PoolStats:
        """Usage figures now."""
        free = self._is_free
        used = [b for b in range(self._num_blocks) if not free[b]]
        return PoolStats(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            free_blocks=self._nfree,
            used_blocks=len(used),
            cached_blocks=len(self._cached),
            shared_blocks=sum(1 for b in used if self._ref[b] > 1),
            num_requests=len(self._tables),
            logical_tokens=sum(self._tokens.values()),
            stored_tokens=sum(self._fill[b] for b in used),
            prefix_queries=self._counters["queries"],
            prefix_hits=self._counters["hits"],
            failed_allocations=self._counters["failed"],
            cow_copies=self._counters["cow"],
        )

    # ---------------------------------------------------------------- mutations
    def allocate(
        self,
        request_id: str,
        num_tokens: int,
        prefix_hashes: Sequence[int] = (),
        token_ids: Sequence[int] | None = None,
        *,
        hash_block_size: int | None = None,
    ) -> Allocation | None:
        """Give a new request blocks for its first ``num_tokens`` tokens.

        Full blocks whose hash (``prefix_hashes[i]`` for block ``i``) is cached are shared
        instead of allocated. Returns ``None`` and changes nothing when the blocks do not fit.

        Args:
            request_id: a request that holds no blocks yet.
            num_tokens: prompt tokens to hold (>= 0).
            prefix_hashes: chained hashes of the prompt's full blocks (see
                :func:`chain_block_hashes`); may be shorter than the prompt.
            token_ids: optional (num_tokens,) ids to record as the blocks' content.
            hash_block_size: tokens each of ``prefix_hashes`` covers, when the caller knows
                it; hashes made for another block size are refused (re-chunk them with
                :func:`rechunk_hashes`). None: they are taken to be this pool's.

        Raises:
            BlockPoolError: ``request_id`` already holds blocks, or ``hash_block_size`` is
                not this pool's block size.
            ValueError: ``num_tokens`` is negative or ``token_ids`` has another length.
        """
        if request_id in self._tables:
            raise BlockPoolError(f"request {request_id!r} already holds blocks")
        if hash_block_size is not None and prefix_hashes and hash_block_size != self._block_size:
            raise BlockPoolError(
                f"prefix hashes of {hash_block_size}-token blocks given to a pool of "
                f"{self._block_size}-token blocks; re-chunk them with rechunk_hashes"
            )
        self._check_count("num_tokens", num_tokens)
        if token_ids is not None and len(token_ids) != num_tokens:
            raise ValueError(
                f"'token_ids' must have num_tokens={num_tokens} ids: got {len(token_ids)}"
            )
        bs = self._block_size
        full_blocks = num_tokens // bs
        hits: list[int] = []
        if self._prefix_caching:
            for h in list(prefix_hashes)[:full_blocks]:
                block = self._cached.get(h)
                if block is None:
                    break
                hits.append(block)
        free = self._is_free
        hits_from_free = sum(free[b] for b in hits)
        fresh = self.blocks_needed(num_tokens) - len(hits)
        if fresh > self._nfree - hits_from_free:
            self._counters["failed"] += 1
            return None
        if self._prefix_caching:
            self._counters["queries"] += min(len(prefix_hashes), full_blocks)
            self._counters["hits"] += len(hits)
        start = len(hits)
        for b in hits:
            self._take(b)
        table = hits + self._pop_many(fresh)
        self._tables[request_id] = table
        cached_tokens = start * bs
        # Hit blocks and fresh ones are full, but maybe the last.
        if fresh and num_tokens % bs:
            self._fill[table[-1]] = num_tokens % bs
        if token_ids is not None:
            self._has_content = True
            for i in range(start, len(table)):
                self._content[table[i]] = list(token_ids[i * bs : (i + 1) * bs])
        if self._prefix_caching:
            cached, block_hash = self._cached, self._block_hash
            for i in range(start, min(len(prefix_hashes), full_blocks)):
                h = prefix_hashes[i]
                if h not in cached:  # the first block to hold this prefix is the one cached
                    b = table[i]
                    cached[h] = b
                    block_hash[b] = h
        self._tokens[request_id] = num_tokens
        return Allocation(block_ids=tuple(table), cached_tokens=cached_tokens)

    def append(
        self, request_id: str, num_tokens: int = 1, token_ids: Sequence[int] | None = None
    ) -> bool:
        """Grow ``request_id`` by ``num_tokens`` tokens, allocating at block boundaries.

        A shared, partly filled last block is copied first (copy-on-write), so the other
        owners' view never changes. Returns ``False`` and changes nothing when the blocks
        needed are not free.
        """
        table = self._tables.get(request_id)
        if table is None:
            raise BlockPoolError(f"unknown request {request_id!r}")
        if type(num_tokens) is not int or num_tokens < 0:  # the hot path checks cheaply
            self._check_count("num_tokens", num_tokens)
        if token_ids is not None and len(token_ids) != num_tokens:
            raise ValueError(
                f"'token_ids' must have num_tokens={num_tokens} ids: got {len(token_ids)}"
            )
        if num_tokens == 0:
            return True
        bs = self._block_size
        have = self._tokens[request_id]
        partial = have % bs != 0
        cow = partial and self._ref[table[-1]] > 1
        new_blocks = -(-(have + num_tokens) // bs) - len(table)
        if new_blocks + int(cow) > self._nfree:
            self._counters["failed"] += 1
            return False
        if cow:
            self.copy_on_write(request_id, len(table) - 1)
        if token_ids is None:
            # The hot path of a serving loop: fill the last block's free slots, then take
            # the new blocks in one pop and set their fill counts by arithmetic.
            fill = self._fill
            rest = num_tokens
            if partial:
                add = min(bs - have % bs, rest)
                fill[table[-1]] += add
                rest -= add
            if new_blocks:
                fresh = self._pop_many(new_blocks)  # full, but the last
                fill[fresh[-1]] = rest - (new_blocks - 1) * bs
                table.extend(fresh)
            self._tokens[request_id] = have + num_tokens
            return True
        ids = list(token_ids)
        self._has_content = True
        written = 0
        pos = have
        while written < num_tokens:
            idx = pos // bs
            if idx == len(table):
                table.append(self._pop_free())
            b = table[idx]
            if self._ref[b] > 1:
                raise BlockPoolError(  # pragma: no cover - guarded by the copy above
                    f"write to shared block {b} of request {request_id!r}"
                )
            n = min(bs - pos % bs, num_tokens - written)
            self._fill[b] += n
            if ids is not None:
                content = self._content[b]
                if content is None:
                    content = []
                    self._content[b] = content
                content.extend(ids[written : written + n])
            written += n
            pos += n
        self._tokens[request_id] = have + num_tokens
        return True

    def append_many(self, growth: Sequence[tuple[str, int]]) -> bool:
        """Grow each of several requests, ``(request_id, num_tokens)`` pairs, as
        :meth:`append` would one after the other (the same blocks, in the same order),
        all or none: ``False`` and nothing changed when the blocks they need together are
        not free. One call for a batch's step, whose requests cross block boundaries
        together.

        Raises:
            BlockPoolError: an unknown request, or one named twice.
        """
        tables, tokens, ref, bs = self._tables, self._tokens, self._ref, self._block_size
        plan: list[tuple[str, list[int], int, int, int]] = []
        total = 0
        cow = False
        for request_id, num_tokens in growth:
            table = tables.get(request_id)
            if table is None:
                raise BlockPoolError(f"unknown request {request_id!r}")
            if type(num_tokens) is not int or num_tokens < 0:
                self._check_count("num_tokens", num_tokens)
            have = tokens[request_id]
            new_blocks = -(-(have + num_tokens) // bs) - len(table)
            if num_tokens and have % bs and ref[table[-1]] > 1:
                cow = True
                total += 1
            total += new_blocks
            plan.append((request_id, table, have, num_tokens, new_blocks))
        if len({request_id for request_id, _ in growth}) != len(plan):
            raise BlockPoolError("append_many names a request twice")
        if total > self._nfree:
            self._counters["failed"] += 1
            return False
        if cow:  # a copy takes its block between the others: one request at a time
            for request_id, _, _, num_tokens, _ in plan:
                self.append(request_id, num_tokens)
            return True
        fresh = self._pop_many(total) if total else []
        fill = self._fill
        at = 0
        for request_id, table, have, num_tokens, new_blocks in plan:
            rest = num_tokens
            if have % bs:
                add = min(bs - have % bs, rest)
                fill[table[-1]] += add
                rest -= add
            if new_blocks == 1:  # a decode step crosses one block boundary at a time
                block = fresh[at]
                at += 1
                fill[block] = rest
                table.append(block)
            elif new_blocks:
                mine = fresh[at : at + new_blocks]  # full, but the last
                at += new_blocks
                fill[mine[-1]] = rest - (new_blocks - 1) * bs
                table.extend(mine)
            tokens[request_id] = have + num_tokens
        return True

    def copy_on_write(self, request_id: str, block_index: int) -> int | None:
        """Give ``request_id`` a private copy of its logical block ``block_index``.

        Returns the new block id, the same id when the block is not shared, or ``None`` when
        no block is free (nothing changes).
        """
        table = self._table(request_id)
        if not 0 <= block_index < len(table):
            raise BlockPoolError(
                f"'block_index' out of range [0, {len(table)}) for {request_id!r}: {block_index}"
            )
        old = table[block_index]
        if self._ref[old] == 1:
            return old
        if not self._nfree:
            self._counters["failed"] += 1
            return None
        new = self._pop_free()
        self._fill[new] = self._fill[old]
        content = self._content[old]
        self._content[new] = list(content) if content is not None else None
        self._ref[old] -= 1
        table[block_index] = new
        self._counters["cow"] += 1
        return new

    def check_writable(self, request_id: str, block_index: int) -> None:
        """Raise :class:`BlockPoolError` if writing logical block ``block_index`` would
        change another request's view (the block is shared and not yet copied)."""
        table = self._table(request_id)
        if not 0 <= block_index < len(table):
            raise BlockPoolError(
                f"'block_index' out of range [0, {len(table)}) for {request_id!r}: {block_index}"
            )
        b = table[block_index]
        if self._ref[b] > 1:
            raise BlockPoolError(
                f"block {b} of request {request_id!r} is shared by {self._ref[b]} requests; "
                "call copy_on_write() before writing to it"
            )

    def fork(self, parent_id: str, child_id: str) -> None:
        """Make ``child_id`` share every block of ``parent_id`` (no copy; beam or n > 1)."""
        table = self._table(parent_id)
        if child_id in self._tables:
            raise BlockPoolError(f"request {child_id!r} already holds blocks")
        for b in table:
            self._ref[b] += 1
        self._tables[child_id] = list(table)
        self._tokens[child_id] = self._tokens[parent_id]

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id``; blocks nobody else owns return to the
        free list (keeping their prefix hash until reused)."""
        table = self._tables.pop(request_id, None)
        if table is None:
            raise BlockPoolError(f"unknown request {request_id!r} (never allocated or freed)")
        del self._tokens[request_id]
        # Last blocks first, so that a prompt's first blocks stay cached the longest.
        ref = self._ref
        order = table[::-1]
        n = len(order)
        owners = itemgetter(*order)(ref) if n > 1 else tuple(ref[b] for b in order)
        if owners.count(1) == n:  # nobody else owns any: all go back, counts stay 1
            self._release(order)
            if n:
                self._fill[order[0]] = self._block_size  # the only one maybe partial
            return
        back = []
        for b in order:
            if ref[b] == 1:
                back.append(b)
                self._fill[b] = self._block_size
            else:
                ref[b] -= 1
        self._release(back)

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Drop tokens past ``num_tokens`` (rollback of speculative tokens), freeing whole
        blocks no longer needed."""
        table = self._table(request_id)
        self._check_count("num_tokens", num_tokens)
        have = self._tokens[request_id]
        if num_tokens > have:
            raise ValueError(f"'num_tokens' must be <= {have} held by {request_id!r}: {num_tokens}")
        keep = self.blocks_needed(num_tokens)
        if (
            num_tokens % self._block_size
            and self._ref[table[keep - 1]] > 1
            and self.copy_on_write(request_id, keep - 1) is None
        ):
            raise BlockPoolError(f"no free block to copy before truncating {request_id!r}")
        back = []
        for b in table[keep:]:
            if self._ref[b] == 1:
                back.append(b)
                self._fill[b] = self._block_size
            else:
                self._ref[b] -= 1
        self._release(back)
        del table[keep:]
        if keep:
            last = table[-1]
            n = num_tokens - (keep - 1) * self._block_size
            if self._fill[last] != n:
                self._unregister(last)
                self._fill[last] = n
                content = self._content[last]
                if content is not None:
                    del content[n:]
        self._tokens[request_id] = num_tokens

    # ---------------------------------------------------------------- internals
    def _table(self, request_id: str) -> list[int]:
        try:
            return self._tables[request_id]
        except KeyError:
            raise BlockPoolError(f"unknown request {request_id!r}") from None

    @staticmethod
    def _check_count(name: str, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"'{name}' must be int: {value!r}")
        if value < 0:
            raise ValueError(f"'{name}' must be >= 0: {value}")

    def _take(self, block: int) -> None:
        free = self._is_free
        if free[block]:
            free[block] = 0  # its count is 1 already; its entry in the queue is dead
            self._nfree -= 1
            self._stale[block] = self._stale.get(block, 0) + 1
        else:
            self._ref[block] += 1

    def _release(self, blocks: list[int]) -> None:
        """Put owned-once ``blocks`` at the tail of the free list, in order."""
        self._queue.extend(blocks)
        free = self._is_free
        for b in blocks:
            free[b] = 1
        self._nfree += len(blocks)

    def _pop_many(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free list (least recently freed first),
        dropping their cached hashes (recorded for offload when asked) and content; each is
        owned once and full (the caller sets the fill of a partial one). This is the
        allocation hot path: a block with no hash and no content costs one pop."""
        queue, head = self._queue, self._head
        if not self._stale:  # no dead entry: the next n entries are the blocks
            out = queue[head : head + n]
            head += n
        else:
            stale = self._stale
            out = []
            while len(out) < n:
                block = queue[head]
                head += 1
                dead = stale.get(block)
                if dead is None:
                    out.append(block)
                elif dead == 1:
                    del stale[block]
                else:
                    stale[block] = dead - 1
        if head > 4096 and 2 * head > len(queue):
            del queue[:head]
            head = 0
        self._head = head
        free = self._is_free
        for block in out:
            free[block] = 0
        self._nfree -= len(out)
        block_hash = self._block_hash
        if block_hash:
            cached, dropped = self._cached, self._dropped
            for block in out:
                h = block_hash.pop(block, None)
                if h is not None:
                    del cached[h]
                    if dropped is not None:
                        dropped.append(h)
        if self._has_content:
            content = self._content
            for block in out:
                content[block] = None
        return out

    def _pop_free(self) -> int:
        block = self._pop_many(1)[0]
        self._fill[block] = 0
        return block

    def _unregister(self, block: int) -> None:
        h = self._block_hash.pop(block, None)
        if h is not None:
            del self._cached[h]

    def iter_owned(self) -> Iterable[tuple[str, tuple[int, ...]]]:
        """``(request_id, block table)`` for every request (for checks and reports)."""
        for rid, table in self._tables.items():
            yield rid, tuple(table)
