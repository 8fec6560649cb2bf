"""Named policy stacks: a vLLM-like baseline and the kvpolicy stack."""

from __future__ import annotations

import pathlib

from kvpolicy.sim._config import (
    AdmissionConfig,
    EvictionConfig,
    GatewayConfig,
    PreemptionConfig,
    StackConfig,
    TiersConfig,
    load_stack,
)
from kvpolicy.sim._errors import ConfigError

__all__ = ["STACK_PRESETS", "get_stack"]

_TENANTS: dict[str, dict[str, object]] = {
    # The tenants of the "multi-tenant" workload, one per seed 004 service class. Reserved
    # baselines (dedicated and guaranteed) are sized to their traffic: chat sends a third of
    # the requests, copilot a quarter.
    "copilot": {"service_class": "dedicated", "share": 0.25, "slo_target_s": 1.0},
    "chat": {"service_class": "guaranteed", "share": 0.5, "slo_target_s": 2.0},
    "agents": {"service_class": "elastic", "share": 0.2, "slo_target_s": 5.0},
    "batch": {"service_class": "preemptible", "share": 0.1, "slo_target_s": 30.0},
    "long-tail": {"service_class": "spot", "share": 0.1, "slo_target_s": 10.0},
}

STACK_PRESETS: dict[str, StackConfig] = {
    "vllm": StackConfig(name="vllm"),
    "kvpolicy": StackConfig(
        name="kvpolicy",
        gateway=GatewayConfig(
            name="token-pool",
            params={
                "tenants": _TENANTS,
                "default": "split",
                "overcommit": True,
            },
            refresh_s=15.0,
        ),
        admission=AdmissionConfig(name="greedy"),
        eviction=EvictionConfig(
            name="token-pd",
            params={"keep_rule": False},
            budget_fraction=0.9,
            every=512,
            idle_rounds=False,
        ),
        preemption=PreemptionConfig(name="least-progressed-first"),
        tiers=TiersConfig(name="tiered", params={"dram_gib": 64}),
    ),
}
"""``vllm``: admit while blocks last, last-in preemption by recomputation, no token
eviction, prefix caching on in HBM only (vLLM's defaults). ``kvpolicy``: every package,
adapted to the workload: a token-pool gateway (seed 004) in which the multi-tenant
workload's five tenants keep their entitlements and every other tenant of the workload gets
an equal elastic share of what they don't reserve (an untagged trace is one tenant owning
the whole pool), a request whose priority exceeds the threshold admitted over a full pool
(seed 004's over-commit: the server's queue holds it), its clients retrying three times
after each Retry-After, its throughput estimate refreshed every 15 s from the service
observed at the server; greedy admission (seed 002's one-step check; its rate-limited
admission delays requests on real traces, see integrations/sim/RESULTS.md); Token-PD
(seed 000) holding resident tokens to 90% of the pool only under pressure (no eviction
while the pool has room; rounds at most every 512 iterations); least-progressed-first
preemption; 64 GiB of DRAM below HBM's prefix cache (seed 003)."""


def get_stack(name_or_path: str | pathlib.Path) -> StackConfig:
    """A preset by name, or a YAML stack file by path.

    Raises:
        ConfigError: neither a preset nor an existing file (the message lists the presets),
            or a bad stack file.
    """
    key = str(name_or_path)
    if key in STACK_PRESETS:
        return STACK_PRESETS[key]
    path = pathlib.Path(name_or_path)
    if path.is_file():
        return load_stack(path)
    known = ", ".join(STACK_PRESETS)
    raise ConfigError(f"unknown stack {key!r}: not a preset ({known}) nor a file")
