"""KV cache events: vLLM's wire format read and written, the follower, and the fleet's
prefix index following them (stored blocks join it, evicted ones leave it)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
import subprocess
import sys
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kvpolicy.kvmodel import ReplicaView, RoutingRequest
from kvpolicy.tenancy import (
    BackendSpec,
    HealthConfig,
    KVEvent,
    KVEventError,
    KVEventFollower,
    ManifestError,
    RoutingConfig,
    decode_event_batch,
    encode_event_batch,
    load_backends,
    text_block_hashes,
)
from kvpolicy.tenancy._fleet import Fleet
from kvpolicy.tenancy._kv_events import event_block_key, kv_events_missing

MISSING = kv_events_missing()
needs_extra = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _msgpack(raw: object) -> bytes:
    return bytes(importlib.import_module("msgspec").msgpack.encode(raw))


@needs_extra
class TestWireFormat:
    def test_round_trip(self) -> None:
        """What encode_event_batch writes, decode_event_batch reads back."""
        events = [
            KVEvent("BlockStored", (1, 2, 3), None, 16),
            KVEvent("BlockStored", (4,), 3, 16),
            KVEvent("BlockRemoved", (1, 2)),
            KVEvent("AllBlocksCleared"),
        ]
        ts, back = decode_event_batch(encode_event_batch(12.5, events))
        assert ts == 12.5
        assert back == events

    def test_vllm_layout(self) -> None:
        """vLLM's arrays: bytes hashes as their low 64 bits, later fields and unknown kinds
        ignored, a data-parallel rank after the events."""
        big = (1 << 70) + 5
        raw = [
            1.0,
            [
                ["BlockStored", [big.to_bytes(9, "big"), 7], None, [1] * 32, 16, None, "GPU", 3],
                ["BlockRemoved", [7], "GPU"],
                ["SomethingNew", 1, 2],
            ],
            0,
        ]
        _ts, events = decode_event_batch(_msgpack(raw))
        assert events == [
            KVEvent("BlockStored", (5, 7), None, 16),
            KVEvent("BlockRemoved", (7,)),
        ]

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"ts": 1}, r"a batch must be \[ts, events, \.\.\.\]"),
            ([1.0], r"a batch must be \[ts, events, \.\.\.\]"),
            ([1.0, [5]], r"events\[0\] must be an array tagged with its kind"),
            ([1.0, [["BlockStored", [1]]]], r"events\[0\] \(BlockStored\) needs block_hashes"),
            ([1.0, [["BlockRemoved"]]], r"events\[0\] \(BlockRemoved\) needs block_hashes"),
            ([1.0, [["BlockRemoved", 3]]], r"events\[0\]\.block_hashes must be a list"),
            ([1.0, [["BlockRemoved", [1.5]]]], "a block hash must be an int or bytes: 1.5"),
        ],
    )
    def test_malformed_batches_are_named(self, raw: object, message: str) -> None:
        """A payload that is not a batch raises KVEventError saying what is wrong."""
        with pytest.raises(KVEventError, match=message):
            decode_event_batch(_msgpack(raw))

    def test_not_msgpack(self) -> None:
        with pytest.raises(KVEventError, match="not msgpack"):
            decode_event_batch(b"\xc1")

    def test_block_keys(self) -> None:
        assert event_block_key(-5) == -5
        assert event_block_key(b"\x01\x02") == 258
        with pytest.raises(KVEventError, match="an int or bytes: True"):
            event_block_key(True)
        with pytest.raises(KVEventError, match="must fit in 64 bits"):
            event_block_key(1 << 64)


@needs_extra
class TestFollower:
    def test_batches_apply_in_order_and_gaps_are_counted(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Each message's events reach ``apply``; a malformed one is skipped and logged
        once per reason; a jump in the sequence numbers counts the batches missed."""
        caplog.set_level(logging.WARNING, "kvpolicy.tenancy")
        got: list[list[KVEvent]] = []
        f = KVEventFollower("tcp://127.0.0.1:1", got.append)
        one = encode_event_batch(1.0, [KVEvent("BlockStored", (1,), None, 16)])
        f.receive([b"", (1).to_bytes(8, "big"), one])
        f.receive([b"", (2).to_bytes(8, "big"), b"\xc1"])
        f.receive([b"", (3).to_bytes(8, "big"), b"\xc1"])
        f.receive([b"", (7).to_bytes(8, "big"), one])
        f.receive([])
        assert len(got) == 2
        assert (f.batches, f.errors, f.gaps, f.seq) == (2, 3, 3, 7)
        skipped = [r for r in caplog.records if "message skipped" in r.getMessage()]
        assert len(skipped) == 2  # "not msgpack" once, then "an empty message"

    def test_over_zmq_on_loopback(self) -> None:
        """A real PUB socket on loopback: the follower subscribes and applies a batch."""
        zmq = pytest.importorskip("zmq", reason="pip install 'kvpolicy-tenancy[kv-events]'")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{port}")
        got: list[list[KVEvent]] = []

        async def main() -> None:
            f = KVEventFollower(f"tcp://127.0.0.1:{port}", got.append)
            task = f.start()
            payload = encode_event_batch(2.0, [KVEvent("BlockRemoved", (9,))])
            for seq in range(200):  # until the subscription is up (ZMQ drops before)
                pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
                await asyncio.sleep(0.01)
                if got:
                    break
            task.cancel()

        try:
            asyncio.run(main())
        finally:
            pub.close(linger=0)
        assert got[0] == [KVEvent("BlockRemoved", (9,))]


class Holder:
    """The replica holding most of the request's leading blocks, else the first."""

    def route(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> str | None:
        def run(r: ReplicaView) -> int:
            held = r.resident("gpu")
            n = 0
            for h in request.block_hashes:
                if h not in held:
                    break
                n += 1
            return n

        return max(replicas, key=run).replica_id


class TestFleetFollows:
    def test_stored_then_removed_then_cleared(self) -> None:
        """Stored blocks make a backend the holder of a prefix; removed ones stop it; a
        clear empties its index. The decisions follow."""
        urls = ["http://a:1", "http://b:1"]
        config = RoutingConfig(health=HealthConfig(interval_s=0.0))
        fleet = Fleet([BackendSpec(u) for u in urls], config, Holder(), CollectorRegistry())
        a, b = fleet.backends
        h = text_block_hashes("a long shared system prompt " * 10, 64)
        assert fleet.pick("r", 100, h) is a
        fleet.kv_events(b, [KVEvent("BlockStored", h[:2], None, 16)])
        fleet.kv_events(b, [KVEvent("BlockStored", h[2:], h[1], 16)])
        assert set(fleet.prefix.holders(h[0])) == {b.id}
        assert fleet.pick("r", 100, h) is b
        fleet.kv_events(b, [KVEvent("BlockRemoved", h)])
        assert not fleet.prefix.holders(h[0])
        assert len(b.index) == 0
        assert fleet.pick("r", 100, h) is a
        fleet.kv_events(a, [KVEvent("BlockStored", h, None, 16), KVEvent("AllBlocksCleared")])
        assert len(a.index) == 0
        counted = fleet.m_kv_events.labels(a.id, "BlockStored")._value.get()
        assert counted == 1


class TestManifest:
    def test_missing_extra_is_named(self) -> None:
        """Without pyzmq and msgspec a backend with kv_events is refused at load, the
        extra named; with them it loads."""
        raw = {"backends": [{"url": "http://a:1", "kv_events": "tcp://a:5557"}]}
        if MISSING is None:
            assert load_backends((), raw)[0].kv_events == "tcp://a:5557"
        else:
            with pytest.raises(ManifestError, match=r"kvpolicy-tenancy\[kv-events\]"):
                load_backends((), raw)

    @needs_extra
    def test_kv_events_endpoint(self) -> None:
        (spec,) = load_backends(
            (), {"backends": [{"url": "http://a:1", "kv_events": "tcp://a:5557"}]}
        )
        assert spec.kv_events == "tcp://a:5557"

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("http://a:5557", r"backends\[0\]\.kv_events must be a ZMQ address"),
            ("tcp://a", r"backends\[0\]\.kv_events must be tcp://host:port: 'tcp://a'"),
            ("tcp://a:99999", r"must be tcp://host:port"),
            (5557, r"must be a ZMQ address like tcp://host:5557: 5557"),
        ],
    )
    def test_bad_endpoints_are_named(self, value: object, message: str) -> None:
        with pytest.raises(ManifestError, match=message):
            load_backends((), {"backends": [{"url": "http://a:1", "kv_events": value}]})


def test_text_hashes_are_the_same_in_another_process() -> None:
    """A backend and the gateway name the same text's blocks alike (Python's ``hash`` of
    None differs between processes before 3.12: the chain must not use it)."""
    text = "the same prompt in two processes " * 8
    code = (
        "from kvpolicy.tenancy import text_block_hashes; "
        f"print(list(text_block_hashes({text!r}, 64)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(list(text_block_hashes(text, 64)))
