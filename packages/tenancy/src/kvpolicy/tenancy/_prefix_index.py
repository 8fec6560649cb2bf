"""Which prompt prefixes each backend probably holds in its KV cache (approximate).

Without a tokenizer the gateway cannot name a prompt's KV blocks as the engine does, so
it names the prompt's *text* in fixed chunks: the prompt (each chat message's role and
text, in order) is cut into chunks of ``block_chars`` characters and each chunk is hashed
with the digest of the chunk before it (BLAKE2b, 8 bytes), so that equal hashes mean equal
prefixes, as the engine's own block hashes do, and every process computes the same hashes:
``kvpolicy sim backend`` names its cached blocks with this function, so the blocks its KV
events report are the gateway's (:mod:`kvpolicy.tenancy._kv_events`). A trailing partial
chunk gets no hash.

:class:`PrefixIndex` remembers the chains sent to one backend, the least recently used
dropped first beyond its capacity (the backend's KV blocks when it reports them): an
engine evicts its prefix cache by recency too, so the index forgets roughly what the
engine forgets. It cannot see an eviction the engine makes early under memory pressure:
the precise index of vLLM's KV events (``BlockStored``/``BlockRemoved``) would.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, KeysView, Mapping, Sequence, Set
from typing import Any

__all__ = ["FleetPrefixIndex", "PrefixIndex", "prompt_text", "text_block_hashes"]


def prompt_text(doc: Mapping[str, Any], chat: bool) -> str:
    """The text of a request body's prompt, as the index chunks it: each chat message's
    role and text (text parts of a content list joined), or the completion prompt."""
    if chat:
        out: list[str] = []
        for m in doc.get("messages") or ():
            if not isinstance(m, Mapping):
                continue
            content = m.get("content", "")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            out.append(f"<{m.get('role', '')}>{content}\n")
        return "".join(out)
    prompt = doc.get("prompt", "")
    if isinstance(prompt, list):
        return "".join(str(p) for p in prompt)
    return prompt if isinstance(prompt, str) else ""


def text_block_hashes(text: str, block_chars: int) -> tuple[int, ...]:
    """Chained hashes of ``text``'s full chunks of ``block_chars`` bytes of UTF-8 (each a
    BLAKE2b digest of 8 bytes keyed with the one before: the same in every process, as
    unsigned 64-bit ints)."""
    if block_chars < 1:
        raise ValueError(f"'block_chars' must be >= 1: {block_chars!r}")
    data = text.encode("utf-8", "surrogatepass")
    out = []
    prev = b""
    for i in range(0, len(data) - block_chars + 1, block_chars):
        prev = hashlib.blake2b(data[i : i + block_chars], digest_size=8, key=prev).digest()
        out.append(int.from_bytes(prev))
    return tuple(out)


class PrefixIndex:
    """The block hashes sent to one backend, least recently used first out.

    Args:
        capacity: the most blocks kept (the backend's KV blocks when known).
    """

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        """See the class docstring."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"'capacity' must be an int >= 1: {capacity!r}")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def add(self, hashes: Sequence[int]) -> None:
        """Record that a prompt with these chained hashes went to the backend (its blocks
        become the most recently used)."""
        self.add_evicting(hashes)

    def add_evicting(self, hashes: Sequence[int]) -> list[int]:
        """:meth:`add`, returning the blocks it pushed out."""
        blocks = self._blocks
        # Last block first: the first block ends the most recently used, so a prefix is
        # forgotten from its tail, as an engine frees a sequence's blocks.
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        out = []
        while len(blocks) > self.capacity:
            out.append(blocks.popitem(last=False)[0])
        return out

    def blocks(self) -> Iterable[int]:
        """The blocks held, least recently used first."""
        return iter(self._blocks)

    def remove(self, hashes: Iterable[int]) -> None:
        """Forget blocks the backend evicted (unknown ones are ignored)."""
        for h in hashes:
            self._blocks.pop(h, None)

    def resize(self, capacity: int) -> None:
        """Keep at most ``capacity`` blocks from now on (the oldest go first)."""
        self.resize_evicting(capacity)

    def resize_evicting(self, capacity: int) -> list[int]:
        """:meth:`resize`, returning the blocks it pushed out."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"'capacity' must be an int >= 1: {capacity!r}")
        self.capacity = capacity
        out = []
        while len(self._blocks) > capacity:
            out.append(self._blocks.popitem(last=False)[0])
        return out

    def resident(self) -> KeysView[int]:
        """The blocks held, as a live read-only set (it follows the index: a router's view
        holds it for the decision it is shown in, without a copy)."""
        return self._blocks.keys()

    def matching(self, hashes: Sequence[int]) -> frozenset[int]:
        """Those of ``hashes`` held (what a router needs of the index for one request)."""
        blocks = self._blocks
        return frozenset(h for h in hashes if h in blocks)

    def clear(self) -> None:
        """Forget everything (the backend restarted: its cache is empty)."""
        self._blocks.clear()


_NOBODY: frozenset[str] = frozenset()


class FleetPrefixIndex:
    """A :class:`PrefixIndex` per backend and, across them, which backends hold each block,
    so that a request's matches are found from its own blocks, whatever the fleet's size.

    Args:
        backends: the backends' ids.
        capacity: the most blocks kept per backend (:meth:`resize` changes one's).
    """

    __slots__ = ("_holders", "_indexes")

    def __init__(self, backends: Iterable[str], capacity: int) -> None:
        """See the class docstring."""
        self._indexes = {b: PrefixIndex(capacity) for b in backends}
        self._holders: dict[int, set[str]] = {}

    def __getitem__(self, backend: str) -> PrefixIndex:
        """The index of one backend (read it; change it through this class)."""
        return self._indexes[backend]

    def add(self, backend: str, hashes: Sequence[int]) -> None:
        """A prompt with these chained hashes went to ``backend``."""
        index = self._indexes[backend]
        holders = self._holders
        for h in hashes:
            owners = holders.get(h)
            if owners is None:
                holders[h] = {backend}
            else:
                owners.add(backend)
        self._forget(backend, index.add_evicting(hashes))

    def remove(self, backend: str, hashes: Iterable[int]) -> None:
        """``backend`` evicted these blocks."""
        hashes = list(hashes)
        self._indexes[backend].remove(hashes)
        self._forget(backend, hashes)

    def resize(self, backend: str, capacity: int) -> None:
        """Keep at most ``capacity`` blocks for ``backend`` (its oldest go first)."""
        index = self._indexes[backend]
        if capacity != index.capacity:
            self._forget(backend, index.resize_evicting(capacity))

    def clear(self, backend: str) -> None:
        """``backend`` restarted: it holds nothing."""
        index = self._indexes[backend]
        self._forget(backend, list(index.blocks()))
        index.clear()

    def holders(self, block: int) -> Set[str]:
        """The backends holding ``block`` (empty: none); read it, do not change it."""
        return self._holders.get(block, _NOBODY)

    def _forget(self, backend: str, hashes: Iterable[int]) -> None:
        holders = self._holders
        for h in hashes:
            owners = holders.get(h)
            if owners is not None:
                owners.discard(backend)
                if not owners:
                    del holders[h]

    def matching(self, hashes: Sequence[int]) -> dict[str, frozenset[int]]:
        """For each backend holding the first of ``hashes``, the leading run of them it
        holds (a chained hash names its whole prefix, so the run is what it can reuse);
        backends holding none are absent. Backends with runs of equal length share one
        frozenset."""
        holders = self._holders
        if not hashes:
            return {}
        first = holders.get(hashes[0])
        if not first:
            return {}
        alive = set(first)
        out: dict[str, frozenset[int]] = {}
        k = 1
        for h in hashes[1:]:
            owners = holders.get(h)
            kept = alive & owners if owners else set()
            if len(kept) < len(alive):
                run = frozenset(hashes[:k])
                for b in alive - kept:
                    out[b] = run
                alive = kept
                if not alive:
                    return out
            k += 1
        run = frozenset(hashes[:k])
        for b in alive:
            out[b] = run
        return out
