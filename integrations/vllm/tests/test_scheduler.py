"""KVPolicyScheduler inside vLLM's real scheduler, driven by a fake model runner on CPU."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from kvpolicy.vllm import ConfigError


def _wl(specs: list[tuple[int, int, int]], **extra: Any) -> list[Any]:
    """Requests from (prompt_len, max_tokens, arrival_step) triples, distinct prompts."""
    from kvpolicy.vllm import WorkloadRequest

    return [
        WorkloadRequest(f"r{i}", [i % 97 + 3] * p, d, arrival_step=a, **extra)
        for i, (p, d, a) in enumerate(specs)
    ]


def _kv() -> Any:
    from kvpolicy.vllm import KVPolicyScheduler

    return KVPolicyScheduler


class TestStockEquivalence:
    def test_empty_config_schedules_like_vllm(self, vllm_sched: Callable[..., Any]) -> None:
        """With every feature off the subclass runs exactly as AsyncScheduler."""
        from kvpolicy.vllm import run_workload

        wl = _wl([(40 + 7 * i, 30 + 11 * (i % 5), i) for i in range(24)])
        stock = run_workload(vllm_sched(num_blocks=48), wl)
        ours = run_workload(vllm_sched(_kv(), num_blocks=48, kvpolicy={}), wl)
        assert stock.preemptions > 0
        assert ours == stock


class TestAdmissionCap:
    def test_fixed_cap_limits_joins_per_step(self, vllm_sched: Callable[..., Any]) -> None:
        """max_admissions_per_step=2: at most two requests join the running batch per step."""
        from kvpolicy.vllm import WorkloadRequest

        s = vllm_sched(_kv(), num_blocks=512, kvpolicy={"max_admissions_per_step": 2})
        from kvpolicy.vllm._harness import _vllm_request

        for i in range(7):
            s.add_request(_vllm_request(WorkloadRequest(f"r{i}", [i + 3] * 16, 8), 16, 1.0 + i))
        running = []
        for _ in range(4):
            out = s.schedule()
            running.append(len(s.running))
            s.update_from_output(out, _tokens(s, out))
        assert running == [2, 4, 6, 7]
        assert s.capped_admissions == 3

    def test_rate_limited_cuts_preemptions(self, vllm_sched: Callable[..., Any]) -> None:
        """kvpolicy-admit's rate-limited admission (x* from completions) avoids thrashing."""
        from kvpolicy.vllm import run_workload

        wl = _wl([(64, 200, 0) for _ in range(40)])
        stock = run_workload(vllm_sched(num_blocks=96), wl)
        cfg = {"admission": {"name": "rate-limited", "params": {"prior_decode_len": 200}}}
        ours = run_workload(vllm_sched(_kv(), num_blocks=96, kvpolicy=cfg), wl)
        assert stock.preemptions > 10
        assert ours.preemptions < stock.preemptions / 4
        assert set(ours.finish_step) == set(stock.finish_step)


def _tokens(s: Any, out: Any) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[] if s.requests[r].is_prefill_chunk else [7] for r in ids],
    )


class TestPreemptionOrder:
    def test_victim_is_policy_choice(self, vllm_sched: Callable[..., Any]) -> None:
        """cost-aware (attention-weighted) preempts the request with the least computed KV,
        where vLLM's FCFS preempts the last admitted one."""
        from kvpolicy.vllm import run_workload

        # r0 is short and admitted first; r1, r2 are long. When the pool runs out, vLLM
        # drops the last admitted (r2, long); cost-aware drops r0 (least to recompute).
        wl = _wl([(16, 200, 0), (160, 200, 0), (160, 200, 0)])
        stock = run_workload(vllm_sched(num_blocks=30), wl)
        cfg = {"preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}}}
        ours = run_workload(vllm_sched(_kv(), num_blocks=30, kvpolicy=cfg), wl)
        assert stock.preempted[0] == "r2"
        assert ours.preempted[0] == "r0"
        assert ours.recomputed_tokens < stock.recomputed_tokens

    def test_stock_vs_kvpolicy_recomputed_tokens(self, vllm_sched: Callable[..., Any]) -> None:
        """On a preemption-heavy workload the kvpolicy order recomputes fewer tokens
        (20,787 -> 16,515, -20.6%, in fewer steps)."""
        from kvpolicy.vllm import WorkloadRequest, run_workload

        rng = random.Random(0)
        wl = [
            WorkloadRequest(
                str(i),
                [i % 50 + 3] * rng.randint(16, 600),
                rng.randint(16, 400),
                arrival_step=rng.randint(0, 400),
            )
            for i in range(100)
        ]
        stock = run_workload(vllm_sched(num_blocks=256), wl)
        cfg = {"preemption": {"name": "cost-aware", "params": {"attention_weight": 0.01}}}
        ours = run_workload(vllm_sched(_kv(), num_blocks=256, kvpolicy=cfg), wl)
        assert stock.preemptions > 20
        assert ours.recomputed_tokens < 0.8 * stock.recomputed_tokens
        assert ours.steps <= stock.steps
        assert set(ours.finish_step) == set(stock.finish_step)

    def test_priority_policy_is_refused(self, vllm_sched: Callable[..., Any]) -> None:
        """A preemption order under vLLM's priority policy fails at startup, named."""
        with pytest.raises(ConfigError, match=r"'preemption'.*fcfs"):
            vllm_sched(
                _kv(),
                num_blocks=64,
                scheduling_policy="priority",
                kvpolicy={"preemption": {"name": "last-in-first-out"}},
            )

    def test_bad_config_fails_at_startup(self, vllm_sched: Callable[..., Any]) -> None:
        """An unknown policy name fails when vLLM builds the scheduler, not in the loop."""
        with pytest.raises(ConfigError, match=r"'admission'"):
            vllm_sched(_kv(), num_blocks=64, kvpolicy={"admission": {"name": "nope"}})


class TestTenancy:
    def test_quota_and_unknown_tenant(
        self, vllm_sched: Callable[..., Any], manifest: dict[str, Any]
    ) -> None:
        """gold runs at most 2 at once; an unentitled tenant is finished with an error."""
        from kvpolicy.vllm import WorkloadRequest, run_workload

        cfg = {"tenancy": {"manifest": manifest}}
        s = vllm_sched(_kv(), num_blocks=512, kvpolicy=cfg)
        most = {"gold": 0}
        schedule = s.schedule

        def watch() -> Any:
            out = schedule()
            gold = sum(1 for r in s.running if s.tenant(r.request_id) == "gold")
            most["gold"] = max(most["gold"], gold)
            return out

        s.schedule = watch
        wl = [
            WorkloadRequest(f"g{i}", [i + 3] * 20, 10, extra_args={"tenant": "gold"})
            for i in range(5)
        ]
        wl += [
            WorkloadRequest(f"f{i}", [i + 50] * 20, 10, extra_args={"tenant": "free"})
            for i in range(3)
        ]
        wl += [WorkloadRequest("x", [99] * 20, 10, extra_args={"tenant": "mallory"})]
        stats = run_workload(s, wl)
        assert most["gold"] == 2
        assert stats.errors == ("x",)
        assert set(stats.finish_step) == {f"g{i}" for i in range(5)} | {"f0", "f1", "f2"}
        # gold's later requests waited for quota: free ones finished first.
        assert max(stats.finish_step[f"f{i}"] for i in range(3)) < stats.finish_step["g4"]

    def test_priority_from_tenancy(
        self, vllm_sched: Callable[..., Any], manifest: dict[str, Any]
    ) -> None:
        """Under vLLM's priority policy the guaranteed tenant's request is preempted last."""
        from kvpolicy.vllm import WorkloadRequest, run_workload

        cfg = {"tenancy": {"manifest": manifest, "quotas": False}}
        s = vllm_sched(_kv(), num_blocks=30, scheduling_policy="priority", kvpolicy=cfg)
        wl = [
            WorkloadRequest("gold", [3] * 160, 200, extra_args={"tenant": "gold"}),
            WorkloadRequest("free", [4] * 160, 200, extra_args={"tenant": "free"}),
        ]
        stats = run_workload(s, wl)
        assert stats.preempted[0] == "free"
        assert stats.finish_order[0] == "gold"


class TestBlocks:
    def test_every_block_returns(self, vllm_sched: Callable[..., Any]) -> None:
        """After a preemption-heavy run every block is free again."""
        from kvpolicy.vllm import run_workload

        s = vllm_sched(
            _kv(),
            num_blocks=64,
            kvpolicy={
                "preemption": {"name": "least-progressed-first"},
                "max_admissions_per_step": 3,
            },
        )
        run_workload(s, _wl([(30 + 9 * i, 40 + 13 * i, 2 * i) for i in range(20)]))
        pool = s.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == 63
        assert not s.running
        assert not s.waiting


class TestBadInputAtStartup:
    """Each bad input of the config fails when vLLM builds the scheduler (or the offload
    cache policy), naming the field, before the engine loop runs."""

    @pytest.mark.parametrize(
        ("config", "match"),
        [
            ({"admission": {"name": "nope"}}, r"'admission'.*'nope'.*rate-limited"),
            ({"preemption": {"name": "fastest"}}, r"'preemption'.*'fastest'.*cost-aware"),
            ({"max_admissions_per_step": 0}, r"'max_admissions_per_step' must be >= 1"),
            ({"max_admissions_per_step": -3}, r"'max_admissions_per_step' must be >= 1"),
            ({"max_admissions_per_step": 2.5}, r"'max_admissions_per_step' must be an int"),
            ({"offload": {"group_ttls": {"7": -60}}}, r"offload.group_ttls\['7'\].*>= 0"),
            ({"offload": {"residual_ttl_s": -1}}, r"offload.residual_ttl_s"),
        ],
        ids=[
            "unknown-admission",
            "unknown-preemption",
            "zero-cap",
            "negative-cap",
            "fractional-cap",
            "negative-group-ttl",
            "negative-residual-ttl",
        ],
    )
    def test_bad_config_named(
        self, vllm_sched: Callable[..., Any], config: dict[str, Any], match: str
    ) -> None:
        with pytest.raises(ConfigError, match=match):
            vllm_sched(_kv(), num_blocks=64, kvpolicy=config)

    def test_tenant_without_entitlement(
        self, vllm_sched: Callable[..., Any], manifest: dict[str, Any]
    ) -> None:
        """A default tenant the pool does not entitle fails at startup, named."""
        cfg = {"tenancy": {"manifest": manifest, "default_tenant": "nobody"}}
        with pytest.raises(ConfigError, match=r"'tenancy.default_tenant'.*'nobody'"):
            vllm_sched(_kv(), num_blocks=64, kvpolicy=cfg)

    def test_untested_vllm_version(
        self, vllm_sched: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A vLLM release this package was not tested against is refused at startup, naming
        the config field that allows it; with the field set the scheduler builds."""
        import vllm

        from kvpolicy.vllm import UnsupportedVLLMError

        monkeypatch.setattr(vllm, "__version__", "0.99.0")
        with pytest.raises(
            UnsupportedVLLMError, match=r"0\.99\.0 is untested.*'allow_untested_vllm'"
        ):
            vllm_sched(_kv(), num_blocks=64, kvpolicy={})
        s = vllm_sched(_kv(), num_blocks=64, kvpolicy={"allow_untested_vllm": True})
        assert s.kvpolicy_config.allow_untested_vllm

    def test_offload_policy_negative_ttl_from_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The offload cache policy vLLM builds with its capacity only reads the config from
        the environment; a negative TTL there fails when it is built, named."""
        import json

        pytest.importorskip("vllm", reason="the offload cache policy subclasses vLLM's")
        from kvpolicy.vllm import ENV_VAR, GroupTTLCachePolicy

        monkeypatch.setenv(ENV_VAR, json.dumps({"offload": {"group_ttls": {"3": -5}}}))
        with pytest.raises(ConfigError, match=r"offload.group_ttls\['3'\].*>= 0"):
            GroupTTLCachePolicy(16)
