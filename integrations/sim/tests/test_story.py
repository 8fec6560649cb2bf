"""Words for the figures: stack descriptions, warnings and the "what happened" paragraph."""

from __future__ import annotations

import pytest

from kvpolicy.kvmodel import GateDecision, Request, get_gpu, get_model
from kvpolicy.sim import STACK_PRESETS, SimResult, Stack, StackConfig, simulate, stack_from_dict
from kvpolicy.sim._story import describe_stack, run_warnings, what_happened


class DenyTenant:
    """A gate that answers every request of some tenants with a 429 (Retry-After 0.1 s)."""

    def __init__(self, *tenants: str) -> None:
        self.tenants = tenants

    def check(self, request: Request, time: float) -> GateDecision:
        if request.tenant in self.tenants:
            return GateDecision(admitted=False, retry_after=0.1, reason="test")
        return GateDecision(admitted=True)

    def release(self, request: Request, time: float) -> None:
        pass


def _run(reqs: list[Request], cfg: StackConfig, stack: Stack | None = None) -> SimResult:
    return simulate(reqs, get_model("Llama-3-8B"), get_gpu("H100-SXM"), cfg, stack=stack)


def _too_long() -> SimResult:
    """100 requests on Llama-3-8B, every tenth longer than its context."""
    reqs = [
        Request(f"r{i}", 9000 if i % 10 == 0 else 100, 10, 0.01 * i, ("a", "b")[i % 2])
        for i in range(100)
    ]
    return _run(reqs, StackConfig(name="long"))


def _gated() -> tuple[SimResult, StackConfig]:
    """100 requests of four tenants; tenant b is always denied and gives up after 2 429s."""
    reqs = [Request(f"r{i}", 100, 10, 0.01 * i, "abcd"[i % 4]) for i in range(100)]
    cfg = stack_from_dict({"gateway": {"max_retries": 1}}, name="gated")
    return _run(reqs, cfg, Stack(gate=DenyTenant("b"))), cfg


class TestDescribeStack:
    def test_vllm_preset(self) -> None:
        """Every part of the vLLM-like preset says what the engine does without a policy."""
        assert describe_stack(STACK_PRESETS["vllm"]) == (
            ("gateway", "none: every request enters"),
            ("admission", "none: waiting requests join while KV blocks last"),
            ("eviction", "none: every token is kept"),
            ("preemption", "none: the last admitted first, by recompute (vLLM)"),
            ("tiers", "none: prefix blocks the GPU drops are lost (HBM prefix cache only)"),
            (
                "engine",
                "16-token blocks, prefix caching on, at most 256 running, 2,048 tokens per "
                "iteration, 90% of HBM",
            ),
            ("SLO", "TTFT <= 2 s and TPOT <= 100 ms"),
        )

    def test_named_parts_show_their_params(self) -> None:
        """Named parts list their params (mappings by their keys) and their settings."""
        cfg = stack_from_dict(
            {
                "gateway": {
                    "name": "token-pool",
                    "params": {"tenants": {"x": {}, "y": {}}, "default": "split"},
                },
                "eviction": {"name": "token-pd", "budget_fraction": 0.5},
                "preemption": {"name": "least-progressed-first", "mode": "swap"},
                "engine": {"kv_capacity_tokens": 4096, "prefix_caching": False},
            }
        )
        parts = dict(describe_stack(cfg))
        assert parts["gateway"] == (
            "token-pool (tenants=x, y; default=split): admits each request or answers 429 "
            "with a Retry-After; a denied client retries and gives up after 4 429s"
        )
        assert parts["eviction"] == (
            "token-pd: drops tokens of running requests to hold resident KV to 50% of the pool"
        )
        assert parts["preemption"] == (
            "least-progressed-first: picks whom to preempt when blocks run out, by swap"
        )
        assert parts["engine"].startswith("16-token blocks, prefix caching off")
        assert parts["engine"].endswith("a 4,096-token KV pool")


class TestWarnings:
    def test_too_long_for_the_context(self) -> None:
        """Requests over the context are counted, with a longer-context model to use."""
        assert run_warnings(_too_long()) == [
            "10 of 100 requests (10.0%) exceed Llama-3-8B's 8,192-token context and were "
            "rejected; the longest needs 9,010 tokens: use a longer-context model "
            "(--model Qwen3-8B or Mistral-7B, 32,768 tokens, holds 10 of them)"
        ]

    def test_too_big_for_the_pool(self) -> None:
        """Requests over the KV pool name the pool's size and the setting that fixed it."""
        reqs = [Request(f"r{i}", 3000 if i % 10 == 0 else 100, 10, 0.01 * i) for i in range(50)]
        cfg = stack_from_dict({"engine": {"kv_capacity_tokens": 2048}}, name="small")
        assert run_warnings(_run(reqs, cfg), cfg) == [
            "5 of 50 requests (10.0%) need more KV than the pool holds and were rejected; "
            "the longest needs 3,010 tokens of KV, the pool holds 2,048 (0.2 GiB): raise "
            "engine.kv_capacity_tokens or leave it unset to plan the pool"
        ]

    def test_gave_up_names_the_tenants(self) -> None:
        """Given-up requests are counted per tenant, with the gateway's knobs."""
        result, cfg = _gated()
        assert result.summary.gate_denials == 50
        assert run_warnings(result, cfg) == [
            "25 of 100 requests (25.0%) gave up after repeated 429s (b 25 of 25): the "
            "gateway's entitlements admit less than these tenants offer; raise their share "
            "in gateway.params, or let clients retry longer with gateway.max_retries"
        ]

    def test_many_tenants_are_cut_to_the_top_five(self) -> None:
        """Seven tenants that gave up: the five with most are named, the rest counted."""
        reqs = [Request(f"r{i}", 100, 10, 0.01 * i, "abcdefgh"[i % 8]) for i in range(8 * 4)]
        reqs += [Request("z", 100, 10, 1.0, "a")]
        cfg = stack_from_dict({"gateway": {"max_retries": 0}}, name="gated")
        result = _run(reqs, cfg, Stack(gate=DenyTenant(*"abcdefg")))
        (warning,) = run_warnings(result, cfg)
        assert "(a 5 of 5, b 4 of 4, c 4 of 4, d 4 of 4, e 4 of 4 and 2 more tenants)" in (warning)

    def test_one_percent_is_quiet(self) -> None:
        """One rejection in a hundred is no warning."""
        reqs = [Request(f"r{i}", 9000 if i == 0 else 100, 10, 0.01 * i) for i in range(100)]
        result = _run(reqs, StackConfig())
        assert result.summary.rejected == 1
        assert run_warnings(result) == []


class TestWhatHappened:
    def test_leader_denials_and_memory(self) -> None:
        """The paragraph names the goodput leader, who was denied and where memory went."""
        long, (gated, _) = _too_long(), _gated()
        text = what_happened([gated, long])
        g_long, g_gated = long.summary.goodput_rps, gated.summary.goodput_rps
        assert text.startswith(
            f"long led on goodput: {g_long:.2f} req/s finished within the SLO (90 of 100 "
            f"arrived, 90.0%), against gated's {g_gated:.2f} req/s (75.0%). "
        )
        assert (
            "gated's gateway answered 50 429s (b 50; by check: test 50) and 25 requests "
            "gave up (b 25 of 25)." in text
        )
        assert "long answered no 429s; 10 were rejected (10 longer than the context)." in text
        assert "long's KV peaked at 0.1 of 57.0 GiB (0%; mean 0.1 GiB), with no preemption" in (
            text
        )

    def test_tie(self) -> None:
        """Equal SLO-met counts are a tie."""
        r = _too_long()
        assert what_happened([r, r]).startswith(
            f"long and long tied on goodput: {r.summary.goodput_rps:.2f} req/s"
        )

    def test_empty(self) -> None:
        """No results is a ValueError."""
        with pytest.raises(ValueError, match="at least one result"):
            what_happened([])
