"""A consumer of vLLM's KV cache events that feeds tiers' reuse analysis.

vLLM publishes ``KVEventBatch`` messages (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``) over ZMQ when started with ``--kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'``.
:class:`KVEventsConsumer` rebuilds the prefix chains from the events (each stored block
names its parent, so a request that reuses a cached prefix shows up as new blocks whose
parent is already known) and turns them into tiers' hash trace: one entry per run of
blocks stored together, with the whole chain from the first block. From it,
:meth:`recommend` computes seed 003's per-group TTLs (``prefix_groups`` then
``allocate_group_ttls``) and prints them as the ``offload`` section of the kvpolicy config.

``python -m kvpolicy.vllm.events tcp://localhost:5557 --seconds 60 --budget 1e6`` does
that for a live server.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from kvpolicy.tiers import (
    GroupTTLAllocation,
    ReuseAnalysis,
    allocate_group_ttls,
    analyze_reuse,
    prefix_groups,
)

__all__ = ["KVEventsConsumer", "block_key"]


def block_key(block_hash: bytes | int) -> int:
    """The int key of a vLLM block hash, as vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
    converts it (the low 64 bits, big-endian); ints pass through."""
    if isinstance(block_hash, int):
        return block_hash
    if isinstance(block_hash, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(block_hash), "big") & ((1 << 64) - 1)
    raise TypeError(f"'block_hash' must be bytes or int: {block_hash!r}")


class KVEventsConsumer:
    """Reuse statistics of a vLLM server from its KV cache events.

    Args:
        max_blocks: parent links remembered (the oldest are forgotten beyond it).
    """

    def __init__(self, max_blocks: int = 1 << 20) -> None:
        if isinstance(max_blocks, bool) or not isinstance(max_blocks, int):
            raise TypeError(f"'max_blocks' must be an int: {max_blocks!r}")
        if max_blocks < 1:
            raise ValueError(f"'max_blocks' must be >= 1: {max_blocks!r}")
        self._parent: OrderedDict[int, int | None] = OrderedDict()
        self._max = max_blocks
        self.trace: list[tuple[float, tuple[int, ...]]] = []
        """(time, chain) per run of stored blocks: tiers' ``HashTrace``."""
        self.stored = 0
        """Blocks stored (``BlockStored``)."""
        self.removed = 0
        """Blocks removed from HBM (``BlockRemoved``)."""
        self.cleared = 0
        """``AllBlocksCleared`` events."""

    def _chain(self, block: int | None) -> list[int]:
        out: list[int] = []
        seen: set[int] = set()
        while block is not None and block not in seen:
            seen.add(block)
            out.append(block)
            block = self._parent.get(block)
        out.reverse()
        return out

    def feed(self, ts: float, events: Iterable[Any]) -> None:
        """Consume one batch's events (vLLM ``KVCacheEvent`` objects) stamped ``ts`` seconds."""
        run: list[int] = []
        prefix: list[int] = []
        for ev in events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                hashes = [block_key(h) for h in ev.block_hashes]
                parent = None if ev.parent_block_hash is None else block_key(ev.parent_block_hash)
                if not (run and parent == run[-1]):
                    self._close(ts, prefix, run)
                    prefix, run = self._chain(parent), []
                for h in hashes:
                    self._parent[h] = parent
                    self._parent.move_to_end(h)
                    parent = h
                run.extend(hashes)
                self.stored += len(hashes)
                while len(self._parent) > self._max:
                    self._parent.popitem(last=False)
            elif kind == "BlockRemoved":
                self.removed += len(ev.block_hashes)
            elif kind == "AllBlocksCleared":
                self.cleared += 1
        self._close(ts, prefix, run)

    def _close(self, ts: float, prefix: list[int], run: list[int]) -> None:
        if run:
            self.trace.append((float(ts), (*prefix, *run)))

    def feed_batch(self, batch: Any) -> None:
        """Consume a ``KVEventBatch`` (its ``ts`` and ``events``)."""
        self.feed(batch.ts, batch.events)

    def analysis(self) -> ReuseAnalysis:
        """tiers' reuse analysis of the chains seen so far."""
        return analyze_reuse(self.trace)

    def recommend(self, budget: float, top_k: int = 8, depth: int = 1) -> GroupTTLAllocation:
        """Seed 003's per-group TTLs for a storage ``budget`` in block-seconds."""
        return allocate_group_ttls(prefix_groups(self.trace, top_k, depth), budget)

    @staticmethod
    def offload_section(alloc: GroupTTLAllocation, depth: int = 1) -> dict[str, Any]:
        """The ``offload`` section of the kvpolicy config applying ``alloc``."""
        ttls = {str(k): t for k, t in zip(alloc.keys, alloc.ttls, strict=True) if k is not None}
        residual = next(
            (t for k, t in zip(alloc.keys, alloc.ttls, strict=True) if k is None), math.inf
        )
        return {"group_ttls": ttls, "residual_ttl_s": residual, "depth": depth}

    def subscribe(self, endpoint: str, seconds: float, topic: str = "") -> int:
        """Read ``KVEventBatch`` messages from vLLM's ZMQ publisher for ``seconds``.

        Returns:
            The number of batches consumed.
        """
        import importlib
        import time

        from vllm.distributed.kv_events import KVEventBatch

        # vLLM's own dependencies (no type stubs): looked up at run time.
        msgspec = importlib.import_module("msgspec")
        zmq = importlib.import_module("zmq")

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        try:
            sock.connect(endpoint)
            sock.setsockopt_string(zmq.SUBSCRIBE, topic)
            deadline = time.monotonic() + seconds
            n = 0
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(min(left, 0.1) * 1000)):
                    continue
                _topic, _seq, payload = sock.recv_multipart()
                self.feed_batch(decoder.decode(payload))
                n += 1
            return n
        finally:
            sock.close(linger=0)


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(
        prog="python -m kvpolicy.vllm.events",
        description="Group-TTL recommendation for a live vLLM server from its KV events.",
    )
    p.add_argument("endpoint", help="vLLM's KV events ZMQ endpoint, e.g. tcp://localhost:5557")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to listen")
    p.add_argument("--budget", type=float, required=True, help="storage budget, block-seconds")
    p.add_argument("--top-k", type=int, default=8, help="prefix groups with their own TTL")
    p.add_argument("--depth", type=int, default=1, help="prefix-tree depth naming a group")
    args = p.parse_args(argv)
    consumer = KVEventsConsumer()
    batches = consumer.subscribe(args.endpoint, args.seconds)
    if not consumer.trace:
        print(json.dumps({"batches": batches, "error": "no BlockStored events seen"}))
        return 1
    alloc = consumer.recommend(args.budget, args.top_k, args.depth)
    reuse = consumer.analysis()
    out = {
        "batches": batches,
        "blocks_stored": consumer.stored,
        "blocks_removed": consumer.removed,
        "reuse_ratio": reuse.reuse_ratio,
        "offload": KVEventsConsumer.offload_section(alloc, args.depth),
    }
    print(json.dumps(out, indent=2))
    return 0
