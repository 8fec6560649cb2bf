"""The simulated server's KV cache events, published as vLLM publishes them.

``kvpolicy sim backend --kv-events tcp://127.0.0.1:5557`` binds a ZMQ PUB socket there and,
after each iteration of the engine, publishes what changed in its prefix cache: the blocks
it now caches (``BlockStored``, in runs along their prompts' chains, each run naming the
block before it) and those it evicted (``BlockRemoved``), in vLLM's ``KVEventBatch``
format (three frames: topic, sequence number, msgpack payload; kvpolicy-tenancy's
:func:`~kvpolicy.tenancy.encode_event_batch`). A block is named by the hash the server
caches it under, :func:`~kvpolicy.tenancy.text_block_hashes` of the prompt's text, so a
gateway hashing the same text finds the same blocks.
"""

from __future__ import annotations

import importlib
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from kvpolicy.tenancy import KVEvent, encode_event_batch

__all__ = ["KVEventPublisher"]

_PARENTS = 1 << 20


class KVEventPublisher:
    """Publishes the changes of a prefix cache as vLLM's KV cache events.

    Args:
        endpoint: the ZMQ address to bind (``tcp://127.0.0.1:5557``).
        block_size: tokens per block (each ``BlockStored`` carries it).
        topic: the topic frame of each message.

    Raises:
        ImportError: pyzmq or msgspec is missing (the message names the extra).
        zmq.ZMQError: ``endpoint`` cannot be bound (taken, or not an address).
    """

    def __init__(self, endpoint: str, block_size: int, topic: str = "") -> None:
        """See the class docstring."""
        try:
            zmq = importlib.import_module("zmq")
            importlib.import_module("msgspec")
        except ImportError as err:
            raise ImportError(
                "--kv-events needs pyzmq and msgspec: pip install 'kvpolicy-tenancy[kv-events]'"
            ) from err
        self.endpoint = endpoint
        self.block_size = block_size
        self._topic = topic.encode()
        self._zmq = zmq
        self._sock: Any = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(endpoint)
        except Exception:
            self._sock.close(linger=0)
            raise
        self._held: frozenset[int] = frozenset()
        self._parent: OrderedDict[int, int | None] = OrderedDict()
        self.seq = 0
        """Batches published."""

    def observe(self, hashes: Sequence[int]) -> None:
        """A prompt with these chained block hashes arrived (its blocks' parents noted)."""
        parent: int | None = None
        links = self._parent
        for h in hashes:
            links[h] = parent
            links.move_to_end(h)
            parent = h
        while len(links) > _PARENTS:
            links.popitem(last=False)

    def publish(self, cached: Iterable[int]) -> int:
        """Publish what changed since the last call, the cache now holding ``cached``;
        returns the number of events sent (none: no message)."""
        now = frozenset(cached)
        held = self._held
        if now == held:
            return 0
        stored, removed = now - held, held - now
        self._held = now
        events: list[KVEvent] = []
        if removed:
            events.append(KVEvent("BlockRemoved", tuple(removed)))
        events += self._runs(stored)
        self.seq += 1
        payload = encode_event_batch(time.time(), events)
        self._sock.send_multipart(
            [self._topic, self.seq.to_bytes(8, "big"), payload], flags=self._zmq.NOBLOCK
        )
        return len(events)

    def _runs(self, stored: frozenset[int]) -> list[KVEvent]:
        """``stored`` as runs along their chains, each ``BlockStored`` naming the block
        before its first (a block whose prompt is not known starts a run of its own)."""
        parent = self._parent
        child: dict[int, int] = {}
        for h in stored:
            p = parent.get(h)
            if p is not None and p in stored:
                child[p] = h
        out = []
        for h in stored:
            p = parent.get(h)
            if p is not None and p in stored:
                continue  # not the head of a run
            run = [h]
            while run[-1] in child:
                run.append(child[run[-1]])
            out.append(KVEvent("BlockStored", tuple(run), p, self.block_size))
        return out

    def close(self) -> None:
        """Unbind and close the socket."""
        self._sock.close(linger=0)
