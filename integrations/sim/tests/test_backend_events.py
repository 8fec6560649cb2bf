"""``kvpolicy sim backend --kv-events``: the prefix cache's changes as vLLM's KV cache
events, read back over ZMQ on loopback."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from click.testing import CliRunner

from kvpolicy.tenancy import KVEvent, decode_event_batch
from kvpolicy.tenancy._kv_events import kv_events_missing

MISSING = kv_events_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _subscriber(endpoint: str) -> Any:
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    return sub


def _next(sub: Any) -> tuple[int, list[KVEvent]]:
    assert sub.poll(5000), "no message"
    _topic, seq, payload = sub.recv_multipart()
    return int.from_bytes(seq, "big"), decode_event_batch(payload)[1]


class TestPublisher:
    def test_changes_go_out_as_runs_along_their_chains(self) -> None:
        """Stored blocks go out in runs along the prompts' chains, each naming the block
        before it; evicted ones as one BlockRemoved; no change, no message."""
        from kvpolicy.sim.backend import KVEventPublisher

        endpoint = _endpoint()
        pub = KVEventPublisher(endpoint, 16)
        sub = _subscriber(endpoint)
        try:
            pub.observe((1, 2, 3))
            pub.observe((1, 2, 4))
            # ZMQ drops what goes out before the subscription is up: publish until seen.
            deadline = time.monotonic() + 5
            while not sub.poll(50):
                assert time.monotonic() < deadline, "the subscription did not come up"
                pub._held = frozenset()
                pub.publish({1, 2, 3})
            while sub.poll(50):
                seq, events = _next(sub)
            assert events == [KVEvent("BlockStored", (1, 2, 3), None, 16)]
            assert pub.publish({1, 2, 3, 4}) == 1
            assert _next(sub) == (seq + 1, [KVEvent("BlockStored", (4,), 2, 16)])
            assert pub.publish({4}) == 1
            seq, events = _next(sub)
            assert [(e.kind, set(e.hashes)) for e in events] == [("BlockRemoved", {1, 2, 3})]
            assert pub.publish({4}) == 0
            assert not sub.poll(100)
        finally:
            sub.close(linger=0)
            pub.close()


class TestFlag:
    def test_bad_or_taken_addresses_are_named(self) -> None:
        """A value that is not a ZMQ address, or one already bound, is a usage error
        naming --kv-events."""
        pytest.importorskip("uvicorn", reason="the backend needs uvicorn (extra 'backend')")
        from kvpolicy.sim.backend import KVEventPublisher
        from kvpolicy.sim.cli._backend import backend_cmd

        runner = CliRunner()
        out = runner.invoke(backend_cmd, ["--kv-events", "http://127.0.0.1:5557"])
        assert out.exit_code == 2
        assert "'--kv-events'" in out.output
        assert "must be a ZMQ address" in out.output
        endpoint = _endpoint()
        taken = KVEventPublisher(endpoint, 16)
        try:
            out = runner.invoke(backend_cmd, ["--kv-events", endpoint])
        finally:
            taken.close()
        assert out.exit_code == 2
        assert f"cannot bind '{endpoint}'" in out.output
