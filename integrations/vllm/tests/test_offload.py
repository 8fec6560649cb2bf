"""tiers' group TTL as vLLM's OffloadingConnector cache policy, and the KV events consumer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kvpolicy.vllm import KVEventsConsumer, OffloadConfig, block_key


def _key(n: int) -> Any:
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(n.to_bytes(32, "big"), 0)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.usefixtures("needs_vllm")
class TestGroupTTLCachePolicy:
    def _policy(self, clock: _Clock) -> Any:
        from vllm.v1.kv_offload.base import ReqContext

        from kvpolicy.vllm import GroupTTLCachePolicy

        # Group 1 (chain 1 -> 2) keeps its blocks 100 s, every other block 10 s.
        policy = GroupTTLCachePolicy(
            8,
            OffloadConfig(group_ttls={block_key(_key(1)[:-4]): 100.0}, residual_ttl_s=10.0),
            clock,
        )
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

        for i, n in enumerate((1, 2, 3, 4)):
            chunk = ChunkStatus(i)
            chunk.ref_cnt = 0
            policy.insert(_key(n), chunk)
        policy.touch([_key(1), _key(2)], ReqContext(req_id="a"))
        policy.touch([_key(3), _key(4)], ReqContext(req_id="b"))
        return policy

    def test_ttl_expiry_by_group(self) -> None:
        """After 50 s the residual group's blocks expired, the long-TTL group's did not."""
        clock = _Clock()
        policy = self._policy(clock)
        clock.now = 50.0
        assert policy.expired() == [_key(3), _key(4)]
        clock.now = 150.0
        assert set(policy.expired()) == {_key(n) for n in (1, 2, 3, 4)}

    def test_expired_go_first(self) -> None:
        """Eviction takes expired chunks first even when they were used more recently."""
        clock = _Clock()
        policy = self._policy(clock)
        clock.now = 20.0
        from vllm.v1.kv_offload.base import ReqContext

        policy.touch([_key(1)], ReqContext(req_id="c"))  # 1 was touched last of all
        clock.now = 40.0
        evicted = policy.evict(3, protected={_key(4)})
        assert [k for k, _ in evicted] == [_key(3), _key(2), _key(1)]
        assert policy.evict(2, protected=set()) is None  # one chunk left: atomic refusal
        assert list(policy.chunks) == [_key(4)]

    def test_pinned_chunks_stay(self) -> None:
        """A chunk being read (ref_cnt > 0) is never evicted."""
        clock = _Clock()
        policy = self._policy(clock)
        policy.get(_key(3)).ref_cnt = 1
        clock.now = 50.0
        assert [k for k, _ in policy.evict(1, protected=set())] == [_key(4)]

    def test_negative_ttl_refused(self) -> None:
        """A negative TTL never reaches the connector."""
        from kvpolicy.vllm import ConfigError

        with pytest.raises(ConfigError, match="residual_ttl_s"):
            OffloadConfig(residual_ttl_s=-1.0)

    def test_registered_through_plugin(self) -> None:
        """vLLM loads the plugin from its entry point; the policy resolves by name."""
        from importlib.metadata import entry_points

        from vllm.plugins import load_general_plugins
        from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

        from kvpolicy.vllm import CACHE_POLICY_NAME, GroupTTLCachePolicy, register

        eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
        assert eps["kvpolicy"] == "kvpolicy.vllm:register"
        load_general_plugins()
        register()  # idempotent
        assert CachePolicyFactory.get_cache_policy_cls(CACHE_POLICY_NAME) is GroupTTLCachePolicy


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestKVEvents:
    def test_chains_from_events(self) -> None:
        """Stored blocks rebuild prefix chains; a reuse of a prefix is a new chain entry."""

        class BlockStored:  # the fields of vLLM's event the consumer reads
            def __init__(self, block_hashes: list[int], parent_block_hash: int | None) -> None:
                self.block_hashes = block_hashes
                self.parent_block_hash = parent_block_hash

        stored = BlockStored

        c = KVEventsConsumer()
        c.feed(1.0, [stored([10], None), stored([11], 10), stored([12], 11)])
        c.feed(2.0, [stored([13], 11)])  # a second request reused 10 -> 11
        assert c.trace == [(1.0, (10, 11, 12)), (2.0, (10, 11, 13))]
        assert c.analysis().reuses == 2

    def test_live_scheduler_over_zmq(self, vllm_sched: Callable[..., Any]) -> None:
        """vLLM's scheduler publishes over ZMQ; the consumer sees every stored block and
        recommends TTLs for the shared-prefix group."""
        from kvpolicy.vllm import WorkloadRequest, run_workload

        port = _port()
        s = vllm_sched(
            num_blocks=256,
            enable_prefix_caching=True,
            kv_events={
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://*:{port}",  # "*" binds; a host would connect
            },
        )
        c = KVEventsConsumer()
        seen: list[int] = []
        t = threading.Thread(
            target=lambda: seen.append(c.subscribe(f"tcp://127.0.0.1:{port}", 4.0))
        )
        t.start()
        threading.Event().wait(1.0)  # ZMQ's slow joiner: let the subscriber connect
        system = [5] * 64  # 4 shared blocks
        wl = [
            WorkloadRequest(f"r{i}", system + [100 + i] * 32, 4, arrival_step=10 * i)
            for i in range(6)
        ]
        run_workload(s, wl)
        t.join()
        s.shutdown()
        assert seen[0] > 0
        assert c.stored == 4 + 6 * 2  # the shared prefix once, each request's own 2 blocks
        assert c.analysis().reuses >= 5 * 4
        alloc = c.recommend(budget=1e6, top_k=1)
        section = KVEventsConsumer.offload_section(alloc)
        assert len(section["group_ttls"]) == 1
        assert OffloadConfig(**section).group_ttls
