"""The gateway (kvpolicy-tenancy) and the prefix tiers (kvpolicy-tiers) inside the engine."""

from __future__ import annotations

import math
import pathlib
from types import SimpleNamespace

import attrs
import numpy as np
import pytest
import yaml

from kvpolicy.kvmodel import Request, ServerContext, chain_block_hashes
from kvpolicy.sim import (
    ConfigError,
    EngineConfig,
    Stack,
    StackConfig,
    TimingModel,
    build_stack,
    server_capacity,
    server_context,
    simulate,
    stack_from_dict,
)
from kvpolicy.sim._engine import Engine, pool_capacity_tokens
from kvpolicy.tenancy import TokenPoolGate
from kvpolicy.tiers import GroupTTL, TieredPrefixStore

_TWO_TENANTS = {
    "gold": {"service_class": "guaranteed", "share": 0.5, "slo_target_s": 1.0},
    "cheap": {"service_class": "spot", "share": 0.2, "slo_target_s": 30.0},
}


def _gateway(**params: object) -> StackConfig:
    return stack_from_dict(
        {
            "gateway": {"name": "token-pool", "params": {"tenants": _TWO_TENANTS, **params}},
            "engine": {"kv_capacity_tokens": 8192, "max_batch": 16},
        }
    )


def _burst(n: int, tenant: str, start: int = 0) -> list[Request]:
    return [Request(f"{tenant}{i}", 200, 64, 0.001 * (start + i), tenant) for i in range(n)]


def _run(cfg: StackConfig, reqs: list[Request], tm: TimingModel) -> tuple[object, TokenPoolGate]:
    cap = pool_capacity_tokens(tm, cfg.engine)
    context = ServerContext(
        model=tm.model,
        block_size=cfg.engine.block_size,
        kv_capacity_tokens=cap,
        max_batch=cfg.engine.max_batch,
        tokens_per_s=server_capacity(tm, cfg.engine, cap),
    )
    gate = build_stack(cfg, context).gate
    assert isinstance(gate, TokenPoolGate)
    stack = Stack(gate=gate)
    reqs = sorted(reqs, key=lambda r: r.arrival_time)
    return simulate(reqs, tm.model, tm.gpu, cfg, stack=stack, timing=tm), gate


class TestGateway:
    def test_overload_throttles_spot_not_guaranteed(self, tm: TimingModel) -> None:
        """Spot floods the server while the guaranteed tenant stays within its baseline (8
        sequences): spot takes every 429; every admitted request is released, so the gate
        holds nothing at the end."""
        cfg = _gateway()
        reqs = [*_burst(200, "cheap"), *_burst(8, "gold", start=100)]
        res, gate = _run(cfg, reqs, tm)
        rows = {t.tenant: t for t in res.summary.tenants}  # type: ignore[attr-defined]
        assert rows["cheap"].denials > 0
        assert rows["cheap"].gave_up > 0
        assert (rows["gold"].denials, rows["gold"].gave_up, rows["gold"].completed) == (0, 0, 8)
        for tenant in ("gold", "cheap"):
            assert gate.usage(tenant).in_flight == 0
            assert gate.usage(tenant).kv_bytes == 0

    def test_clients_honour_retry_after_then_give_up(self, tm: TimingModel) -> None:
        """A denied request comes back no sooner than the backoff; after ``max_retries``
        denials its client gives up, and a given-up request is never admitted."""
        # A drain rate of 500 tokens/s makes the gate's Retry-After long enough for some
        # retries to find a free slot.
        cfg = _gateway(tokens_per_s=500)
        reqs = _burst(200, "cheap")
        res, _ = _run(cfg, reqs, tm)
        rec = res.record  # type: ignore[attr-defined]
        arrival = np.array([r.arrival_time for r in rec.requests])
        assert rec.gave_up.any()
        assert np.all(rec.gate_denials[rec.gave_up] == cfg.gateway.max_retries + 1)
        assert np.all(np.isnan(rec.first_admitted[rec.gave_up]))
        retried = (rec.gate_denials > 0) & ~rec.gave_up
        assert retried.any()
        assert np.all(rec.first_admitted[retried] >= arrival[retried] + 0.05)
        assert res.summary.completed + res.summary.gave_up == 200  # type: ignore[attr-defined]

    def test_without_retries_every_denial_gives_up(self, tm: TimingModel) -> None:
        """``max_retries: 0``: a 429 ends the request."""
        base = _gateway()
        cfg = attrs.evolve(base, gateway=attrs.evolve(base.gateway, max_retries=0))
        res, _ = _run(cfg, _burst(200, "cheap"), tm)
        rec = res.record  # type: ignore[attr-defined]
        assert np.array_equal(rec.gate_denials > 0, rec.gave_up)

    def test_manifest_file(self, tm: TimingModel, tmp_path: pathlib.Path) -> None:
        """A kvpolicy-tenancy manifest in absolute units works as well as shares."""
        manifest = {
            "pool": {
                "name": "test",
                "capacity": {"tokens_per_s": 5000, "kv_bytes": 2**30, "concurrency": 8},
            },
            "entitlements": [
                {
                    "tenant": "gold",
                    "service_class": "guaranteed",
                    "baseline": {"tokens_per_s": 2000, "kv_bytes": 2**29, "concurrency": 4},
                }
            ],
        }
        path = tmp_path / "pool.yaml"
        path.write_text(yaml.safe_dump(manifest))
        cfg = stack_from_dict(
            {"gateway": {"name": "token-pool", "params": {"manifest": str(path)}}}
        )
        res, gate = _run(cfg, [*_burst(4, "gold"), *_burst(5, "stranger", start=4)], tm)
        rows = {t.tenant: t for t in res.summary.tenants}  # type: ignore[attr-defined]
        assert rows["stranger"].gave_up == 5  # no entitlement and no default
        assert rows["gold"].completed == 4
        assert gate.pool.capacity.concurrency == 8

    def test_no_gateway_changes_nothing(self, tm: TimingModel) -> None:
        """Without a gateway the run is the same as before gateways existed."""
        reqs = _burst(30, "gold")
        plain = simulate(reqs, tm.model, tm.gpu, StackConfig(), timing=tm)
        assert plain.summary.gate_denials == 0
        assert not plain.record.gave_up.any()

    def test_capacity_from_the_server(self, tm: TimingModel) -> None:
        """Shares are of the server's KV bytes and batch; tokens/s is the roofline's rate
        for the mean lengths at the batch that fits (7 sequences of 1024 + 256/2 here)."""
        eng = EngineConfig(kv_capacity_tokens=8192, max_batch=16)
        tps = server_capacity(tm, eng, 8192, 1024, 256)
        ctx = server_context([Request("r", 1024, 256)], tm, eng)
        assert (ctx.kv_capacity_tokens, ctx.max_batch) == (8192, 16)
        assert ctx.tokens_per_s == tps
        decode = tm.iteration_time(7, 7 * 1152, 7 * 1152)
        prefill = tm.iteration_time(1024, 0, 1024 * 1025 / 2) - tm.overhead_s
        assert tps == pytest.approx(1280 / (256 * decode / 7 + prefill))

    def test_capacity_matches_what_the_engine_sustains(self, tm: TimingModel) -> None:
        """The estimated tokens/s is within 25% of what the engine serves saturated."""
        eng = EngineConfig(kv_capacity_tokens=65536, max_batch=64)
        reqs = [Request(f"r{i}", 1024, 256, 0.0) for i in range(300)]
        res = simulate(reqs, tm.model, tm.gpu, StackConfig(engine=eng), timing=tm)
        served = 300 * 1280 / res.summary.duration_s
        tps = server_capacity(tm, eng, res.summary.capacity_tokens, 1024, 256)
        assert tps == pytest.approx(served, rel=0.25)

    @pytest.mark.parametrize(
        ("params", "match"),
        [
            ({"tenants": _TWO_TENANTS, "manifest": "x.yaml"}, "exactly one of"),
            ({}, "exactly one of"),
            ({"tenants": _TWO_TENANTS, "colour": 1}, r"unknown param 'colour'"),
            ({"tenants": {"a": {"share": 1.5}}}, r"'tenants\.a\.share' must be a number in"),
            ({"tenants": {"a": {"service_class": "gold", "share": 0.5}}}, "gold"),
            ({"tenants": {"a": {"service_class": "spot"}}}, "needs a 'share'"),
            ({"tenants": _TWO_TENANTS, "tokens_per_s": -1}, "'tokens_per_s' must be"),
            ({"manifest": "/nonexistent/pool.yaml"}, "pool.yaml"),
        ],
    )
    def test_bad_params(self, tm: TimingModel, params: dict[str, object], match: str) -> None:
        """Every mistake is a ConfigError naming what is wrong, before anything runs."""
        cfg = stack_from_dict({"gateway": {"name": "token-pool", "params": params}})
        with pytest.raises(ConfigError, match=match):
            simulate(_burst(2, "gold"), tm.model, tm.gpu, cfg, timing=tm)

    def test_unknown_gateway(self, tm: TimingModel) -> None:
        """An unknown gateway name lists the known ones."""
        cfg = stack_from_dict({"gateway": "nginx"})
        with pytest.raises(ConfigError, match="known: none, token-pool"):
            simulate(_burst(2, "gold"), tm.model, tm.gpu, cfg, timing=tm)


def _prefix_requests(n_groups: int, per_group: int, gap: float) -> list[Request]:
    """Groups of requests sharing a 1024-token system prompt, the groups interleaved so that
    a small HBM drops a group's blocks before it comes back."""
    out = []
    t = 0.0
    for round_ in range(per_group):
        for g in range(n_groups):
            prompt = [g * 100_000 + i for i in range(1024)] + [round_] * 64
            hashes = chain_block_hashes(prompt, 16)
            out.append(Request(f"g{g}r{round_}", len(prompt), 16, t, prefix_hashes=hashes))
            t += gap
    return out


class TestTiers:
    def _cfg(self, tiers: object) -> StackConfig:
        return stack_from_dict(
            {"tiers": tiers, "engine": {"kv_capacity_tokens": 4096, "max_batch": 4}}
        )

    def test_dropped_prefixes_come_back_from_dram(self, tm: TimingModel) -> None:
        """HBM holds two groups' prompts; DRAM keeps the rest, so later rounds load prompt
        blocks instead of recomputing them, and finish sooner."""
        reqs = _prefix_requests(6, 4, 0.05)
        none = simulate(reqs, tm.model, tm.gpu, self._cfg("none"), timing=tm)
        dram = simulate(
            reqs,
            tm.model,
            tm.gpu,
            self._cfg({"name": "tiered", "params": {"dram_gib": 4}}),
            timing=tm,
        )
        assert none.summary.tier_hit_tokens == 0
        assert dram.summary.tier_hit_tokens > 0
        assert dram.summary.tier_load_s > 0
        # Loading at 20 GB/s beats recomputing 1024 tokens of Llama-3-8B.
        assert dram.summary.ttft["mean"] < none.summary.ttft["mean"]
        assert dram.summary.completed == none.summary.completed == len(reqs)

    def test_expired_blocks_are_not_found(self, tm: TimingModel) -> None:
        """With a TTL far shorter than the gap between a group's rounds, DRAM finds nothing."""
        reqs = _prefix_requests(6, 3, 0.5)
        short = self._cfg({"name": "tiered", "params": {"dram_gib": 4, "ttl_s": 0.001}})
        res = simulate(reqs, tm.model, tm.gpu, short, timing=tm)
        assert res.summary.tier_hit_tokens == 0

    def test_store_sees_what_hbm_dropped(self, tm: TimingModel) -> None:
        """The store receives the blocks the pool reused, and its hits are the engine's."""
        cfg = self._cfg({"name": "tiered", "params": {"dram_gib": 4}})
        store = build_stack(cfg, server_context([], tm, cfg.engine)).prefix_store
        assert isinstance(store, TieredPrefixStore)
        eng = Engine(tm, cfg.engine, Stack(prefix_store=store))
        rec = eng.run(_prefix_requests(6, 4, 0.05))
        stats = store.stats()
        assert len(store) > 0
        assert rec.tier_hit_tokens > 0
        assert math.isclose(rec.tier_load_s, stats.fetch_seconds, rel_tol=1e-9)

    def test_a_slow_disk_is_not_worth_loading(self, tm: TimingModel) -> None:
        """Blocks found only on a 350 MB/s disk load slower than an H100 recomputes them,
        so the engine recomputes: the store finds them, the engine does not use them."""
        cfg = self._cfg({"name": "tiered", "params": {"dram_gib": 0, "disk_gib": 4}})
        store = build_stack(cfg, server_context([], tm, cfg.engine)).prefix_store
        assert isinstance(store, TieredPrefixStore)
        rec = Engine(tm, cfg.engine, Stack(prefix_store=store)).run(_prefix_requests(6, 4, 0.05))
        assert store.stats().tiers[0].hits > 0
        assert rec.tier_hit_tokens == 0
        assert rec.tier_load_s == 0.0

    def test_group_ttl_is_fitted_and_taught_every_prompt(self, tm: TimingModel) -> None:
        """``group_ttl`` fits Algorithm 2 on the workload's chains; the engine shows the store
        each prompt, so the blocks of the fitted groups are labelled with their group."""
        reqs = _prefix_requests(6, 4, 0.05)
        params = {"dram_gib": 4, "group_ttl": {"budget_block_s": 1e4, "top_k": 3}}
        cfg = self._cfg({"name": "tiered", "params": params})
        store = build_stack(cfg, server_context(reqs, tm, cfg.engine)).prefix_store
        assert isinstance(store, TieredPrefixStore)
        Engine(tm, cfg.engine, Stack(prefix_store=store)).run(reqs)
        policy = store.ttl
        assert isinstance(policy, GroupTTL)
        labelled = [policy.group_of(h) for r in reqs for h in r.prefix_hashes]
        assert any(g is not None for g in labelled)
        res = simulate(reqs, tm.model, tm.gpu, cfg, timing=tm)
        assert res.summary.completed == len(reqs)

    @pytest.mark.parametrize(
        ("group", "match"),
        [
            ({"top_k": 3}, "needs budget_block_s"),
            (
                {"budget_block_s": 1e4, "fit_fraction": 0},
                r"'group_ttl\.fit_fraction' must be in \(0, 1\]",
            ),
            ({"budget_block_s": 1e4, "rounds": 2}, r"unknown key 'group_ttl\.rounds'"),
        ],
    )
    def test_bad_group_ttl(self, tm: TimingModel, group: dict[str, object], match: str) -> None:
        """A bad group_ttl section is a ConfigError naming the problem."""
        cfg = self._cfg({"name": "tiered", "params": {"dram_gib": 4, "group_ttl": group}})
        with pytest.raises(ConfigError, match=match):
            simulate(_prefix_requests(2, 2, 0.1), tm.model, tm.gpu, cfg, timing=tm)

    def test_group_ttl_needs_prefix_hashes(self, tm: TimingModel, kit: SimpleNamespace) -> None:
        """A workload without prefix hashes cannot fit group TTLs."""
        params = {"dram_gib": 4, "group_ttl": {"budget_block_s": 1e4}}
        cfg = self._cfg({"name": "tiered", "params": params})
        with pytest.raises(ConfigError, match="prefix hashes"):
            simulate([kit.request(0)], tm.model, tm.gpu, cfg, timing=tm)

    def test_group_ttl_or_ttl_s(self, tm: TimingModel) -> None:
        """A fixed TTL and group TTLs exclude each other."""
        params = {"dram_gib": 4, "ttl_s": 5, "group_ttl": {"budget_block_s": 1e4}}
        cfg = self._cfg({"name": "tiered", "params": params})
        with pytest.raises(ConfigError, match="not both"):
            simulate(_prefix_requests(2, 2, 0.1), tm.model, tm.gpu, cfg, timing=tm)

    @pytest.mark.parametrize(
        ("params", "match"),
        [
            ({"dram_gib": -1}, r"'dram_gib' must be a number >= 0"),
            ({"dram_gib": 0, "disk_gib": 0}, "give 'dram_gib' or 'disk_gib' > 0"),
            ({"ssd_gib": 1}, r"unknown param 'ssd_gib'"),
            ({"ttl_s": "long"}, "'ttl_s' must be seconds"),
            ({"ttl_s": -5}, "ttl"),
        ],
    )
    def test_bad_params(self, tm: TimingModel, params: dict[str, object], match: str) -> None:
        """A bad size, key or TTL is a ConfigError naming it."""
        cfg = self._cfg({"name": "tiered", "params": params})
        with pytest.raises(ConfigError, match=match):
            simulate(_prefix_requests(1, 1, 0.1), tm.model, tm.gpu, cfg, timing=tm)

    def test_unknown_tiers(self, tm: TimingModel, kit: SimpleNamespace) -> None:
        """An unknown store name lists the known ones."""
        cfg = self._cfg("redis")
        with pytest.raises(ConfigError, match="known: none, tiered"):
            simulate([kit.request(0)], tm.model, tm.gpu, cfg, timing=tm)


class TestServerContext:
    def test_rate_ignores_requests_that_cannot_run(self, tm: TimingModel) -> None:
        """One row of 10^12 output tokens (longer than any context) does not size the
        gateway: the rate comes from the requests that can run."""
        eng = EngineConfig(kv_capacity_tokens=65536, max_batch=64)
        reqs = [Request(f"r{i}", 1024, 256, 0.0) for i in range(200)]
        huge = Request("huge", 1024, 10**12, 0.0)
        plain = server_context(reqs, tm, eng).tokens_per_s
        assert server_context([*reqs, huge], tm, eng).tokens_per_s == plain
        assert plain == server_capacity(tm, eng, 65536, 1024, 256)
