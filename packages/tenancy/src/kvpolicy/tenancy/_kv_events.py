"""vLLM's KV cache events, read and written: what makes a backend's prefix index precise.

vLLM publishes its prefix cache's changes over ZMQ (``--kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}'``):
each message is three frames (topic, an 8-byte big-endian sequence number, the payload) and
the payload is a msgpack ``KVEventBatch``, an array ``[ts, events, data_parallel_rank?]``
whose events are arrays tagged by their kind, fields in order, trailing defaults omitted:

* ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id?,
  medium?, ...]``: blocks now cached, first block first;
* ``["BlockRemoved", block_hashes, medium?, ...]``: blocks evicted;
* ``["AllBlocksCleared"]``: the whole cache dropped.

A block hash is an int, or bytes taken as vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
takes them (the low 64 bits, big-endian). :func:`decode_event_batch` reads a payload
(fields added by later vLLM versions are ignored), :func:`encode_event_batch` writes one
(``kvpolicy sim backend --kv-events`` publishes with it), and :class:`KVEventFollower`
subscribes to one backend's publisher and hands each batch to the gateway's index of that
backend (:meth:`kvpolicy.tenancy._fleet.Fleet.start`). pyzmq and msgspec come with the
``kv-events`` extra (``pip install 'kvpolicy-tenancy[kv-events]'``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = [
    "KVEvent",
    "KVEventError",
    "KVEventFollower",
    "decode_event_batch",
    "encode_event_batch",
    "event_block_key",
    "kv_events_missing",
]

_log = logging.getLogger("kvpolicy.tenancy")

STORED = "BlockStored"
REMOVED = "BlockRemoved"
CLEARED = "AllBlocksCleared"
_MASK = (1 << 64) - 1


class KVEventError(ValueError):
    """A payload that is not a KV event batch (what is wrong named)."""


class KVEvent(NamedTuple):
    """One event of a batch, its hashes as ints (:func:`event_block_key`)."""

    kind: str
    """``BlockStored``, ``BlockRemoved`` or ``AllBlocksCleared``."""
    hashes: tuple[int, ...] = ()
    """The blocks stored or removed, first block first (none for a clear)."""
    parent: int | None = None
    """The block before the first stored one (None: the stored run starts a prompt)."""
    block_size: int | None = None
    """Tokens per block of a stored run (None: not given)."""


def event_block_key(block_hash: object) -> int:
    """The int of a block hash as an event carries it: an int as is (it must fit in 64
    bits, signed or not), bytes as their low 64 bits, big-endian (vLLM's int hashes).

    Raises:
        KVEventError: anything else.
    """
    if isinstance(block_hash, bool):
        raise KVEventError(f"a block hash must be an int or bytes: {block_hash!r}")
    if isinstance(block_hash, int):
        if not -(1 << 63) <= block_hash <= _MASK:
            raise KVEventError(f"a block hash must fit in 64 bits: {block_hash!r}")
        return block_hash
    if isinstance(block_hash, bytes | bytearray | memoryview):
        return int.from_bytes(bytes(block_hash), "big") & _MASK
    raise KVEventError(f"a block hash must be an int or bytes: {block_hash!r}")


def _msgspec() -> Any:
    return importlib.import_module("msgspec")  # no type stubs: looked up at run time


def kv_events_missing() -> str | None:
    """Why KV events cannot be followed here (a message naming the extra), or None."""
    missing = []
    for module in ("zmq", "msgspec"):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append("pyzmq" if module == "zmq" else module)
    if not missing:
        return None
    return f"KV events need {' and '.join(missing)}: pip install 'kvpolicy-tenancy[kv-events]'"


def _hashes(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise KVEventError(f"{where} must be a list of block hashes: {value!r}")
    return tuple(event_block_key(h) for h in value)


def _event(raw: object, i: int) -> KVEvent | None:
    where = f"events[{i}]"
    if not isinstance(raw, list | tuple) or not raw or not isinstance(raw[0], str):
        raise KVEventError(f"{where} must be an array tagged with its kind: {raw!r}")
    kind = raw[0]
    if kind == STORED:
        if len(raw) < 3:
            raise KVEventError(f"{where} (BlockStored) needs block_hashes and parent: {raw!r}")
        parent = None if raw[2] is None else event_block_key(raw[2])
        size = raw[4] if len(raw) > 4 and isinstance(raw[4], int) and raw[4] > 0 else None
        return KVEvent(STORED, _hashes(raw[1], f"{where}.block_hashes"), parent, size)
    if kind == REMOVED:
        if len(raw) < 2:
            raise KVEventError(f"{where} (BlockRemoved) needs block_hashes: {raw!r}")
        return KVEvent(REMOVED, _hashes(raw[1], f"{where}.block_hashes"))
    if kind == CLEARED:
        return KVEvent(CLEARED)
    return None  # a kind this version does not know: skipped, the others still apply


def decode_event_batch(payload: bytes) -> tuple[float, list[KVEvent]]:
    """``(ts, events)`` of a msgpack ``KVEventBatch`` payload (unknown kinds left out).

    Raises:
        KVEventError: the payload is not msgpack or not a batch (what is wrong named);
            nothing of it is returned then.
    """
    msgspec = _msgspec()
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as err:
        raise KVEventError(f"not msgpack: {err}") from None
    if (
        not isinstance(raw, list)
        or len(raw) < 2
        or isinstance(raw[0], bool)
        or not isinstance(raw[0], int | float)
        or not isinstance(raw[1], list)
    ):
        raise KVEventError(f"a batch must be [ts, events, ...]: {raw!r:.200}")
    events = [e for i, item in enumerate(raw[1]) if (e := _event(item, i)) is not None]
    return float(raw[0]), events


def encode_event_batch(ts: float, events: Sequence[KVEvent], medium: str = "GPU") -> bytes:
    """The msgpack payload of a batch of ``events`` stamped ``ts`` (as vLLM encodes it; a
    stored run's token ids are left empty)."""
    out: list[list[Any]] = []
    for e in events:
        if e.kind == STORED:
            out.append([STORED, list(e.hashes), e.parent, [], e.block_size or 0, None, medium])
        elif e.kind == REMOVED:
            out.append([REMOVED, list(e.hashes), medium])
        elif e.kind == CLEARED:
            out.append([CLEARED])
        else:
            raise ValueError(f"'kind' must be {STORED}, {REMOVED} or {CLEARED}: {e.kind!r}")
    return bytes(_msgspec().msgpack.encode([float(ts), out]))


class KVEventFollower:
    """Follows one backend's KV event publisher and hands each batch's events to ``apply``.

    A payload that is not a batch is logged (the first of each reason) and skipped, never
    fatal; a publisher that is not up yet is waited for (ZMQ reconnects by itself).

    Args:
        endpoint: the publisher's ZMQ address (``tcp://host:port``).
        apply: called with the events of each batch, in order.
        topic: the topic prefix to subscribe to (empty: all).
    """

    def __init__(
        self, endpoint: str, apply: Callable[[list[KVEvent]], None], topic: str = ""
    ) -> None:
        """See the class docstring."""
        self.endpoint = endpoint
        self.apply = apply
        self.topic = topic
        self.batches = 0
        """Batches applied."""
        self.errors = 0
        """Messages skipped as malformed."""
        self.last_error = ""
        self.seq: int | None = None
        """Sequence number of the last batch (vLLM's second frame)."""
        self.gaps = 0
        """Batches missed, from the sequence numbers (a slow subscriber loses messages)."""

    async def run(self) -> None:
        """Read and apply batches until cancelled; a failure is logged and the
        subscription made anew a second later."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("KV events of %s: subscription failed; again in 1 s", self.endpoint)
                await asyncio.sleep(1.0)

    async def _follow(self) -> None:
        zmq = importlib.import_module("zmq")
        zmq_asyncio = importlib.import_module("zmq.asyncio")
        ctx = zmq_asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        try:
            sock.connect(self.endpoint)
            sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
            while True:
                frames = await sock.recv_multipart()
                self.receive(frames)
        finally:
            sock.close(linger=0)

    def receive(self, frames: Sequence[bytes]) -> None:
        """Apply one message (its frames: topic, sequence number, payload; or the payload
        alone)."""
        try:
            if not frames:
                raise KVEventError("an empty message")
            if len(frames) >= 3 and len(frames[-2]) == 8:
                seq = int.from_bytes(frames[-2], "big")
                if self.seq is not None and seq > self.seq + 1:
                    self.gaps += seq - self.seq - 1
                self.seq = seq
            _ts, events = decode_event_batch(frames[-1])
        except KVEventError as err:
            self.errors += 1
            why = str(err)
            if why != self.last_error:
                _log.warning("KV events of %s: message skipped (%s)", self.endpoint, why)
            self.last_error = why
            return
        self.apply(events)
        self.batches += 1

    def start(self) -> asyncio.Task[None]:
        """:meth:`run` as a task of the running loop."""
        return asyncio.create_task(self.run())
