"""Named workloads: :func:`get_workload` and :data:`WORKLOAD_NAMES`.

Each name maps to a :class:`SyntheticConfig` calibrated from a public trace (see
:mod:`kvpolicy.sim.workloads._calibration` for the statistics and their provenance). Lengths
are the traces' quantile tables (:class:`QuantileLengths`), so medians and tails match:

=================  ===========================================================================
name               what
=================  ===========================================================================
multi-tenant       the default: five tenants, one per seed 004 service class, with ServeGen
                   m-small's client shares and CVs, Azure conversation lengths (arXiv
                   lengths for the batch tenant), 5.53 req/s in all, 2,000 requests
azure-conv-like    Azure conversation trace: Gamma arrivals 5.53 req/s CV 1.09, its lengths
mooncake-like      Mooncake conversation trace: Gamma arrivals 3.40 req/s CV 3.03, long
                   prompts (mean about 12k tokens), prefix hashes (16-token blocks) with a
                   shared system prompt and conversation follow-ups (hit ratio about 0.37)
sharegpt-like      ShareGPT lengths, Poisson arrivals offering Azure's prompt tokens/s
long-context       arXiv-summarisation lengths (prompts about 2.6k tokens, short outputs),
                   Poisson arrivals offering Azure's prompt tokens/s
saturated          one class of requests (1024 prompt, 128 output tokens: the Azure
                   trace's medians rounded) all arriving at time 0, seed 002's setting
congestion-vidur   the Vidur experiment of *Service-Induced Congestion in Memory-Constrained
                   LLM Serving* (seed 002, its Table 3): 20,000 requests, Poisson
                   arrivals at 300 req/s, prompt 512 tokens, outputs 100, 125, 200 or 250
                   tokens (equally likely: the paper gives no proportions)
=================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kvpolicy.sim.workloads._arrivals import Poisson, Saturated
from kvpolicy.sim.workloads._calibration import (
    ARXIV_MEAN_PROMPT,
    ARXIV_QUANTILES,
    AZURE_CONV_ARRIVALS,
    AZURE_CONV_PROMPT_TOKENS_PER_S,
    AZURE_CONV_QUANTILES,
    MOONCAKE_CONV_ARRIVALS,
    MOONCAKE_CONV_PREFIX,
    MOONCAKE_CONV_QUANTILES,
    SERVEGEN_M_SMALL_TENANTS,
    SHAREGPT_MEAN_PROMPT,
    SHAREGPT_QUANTILES,
)
from kvpolicy.sim.workloads._lengthdist import EmpiricalLengths, FixedLengths
from kvpolicy.sim.workloads._synthetic import SyntheticConfig, generate
from kvpolicy.sim.workloads._tenants import TenantSpec
from kvpolicy.sim.workloads._workload import Workload

__all__ = ["WORKLOAD_NAMES", "get_workload", "workload_config"]

_DEFAULT_REQUESTS = 2000

# Tenant names and classes are modelling choices; shares and CVs are ServeGen's (by rank).
_TENANT_ROLES = (
    ("chat", "guaranteed"),
    ("copilot", "dedicated"),
    ("agents", "elastic"),
    ("batch", "preemptible"),
    ("long-tail", "spot"),
)


def _multi_tenant() -> SyntheticConfig:
    tenants = tuple(
        TenantSpec(
            name=name,
            share=share,
            service_class=service_class,
            cv=cv,
            # The batch tenant summarises documents: long prompts, short outputs.
            lengths=ARXIV_QUANTILES if name == "batch" else None,
        )
        for (name, service_class), (share, cv) in zip(
            _TENANT_ROLES, SERVEGEN_M_SMALL_TENANTS, strict=True
        )
    )
    return SyntheticConfig(
        name="multi-tenant",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=AZURE_CONV_ARRIVALS,
        lengths=AZURE_CONV_QUANTILES,
        tenants=tenants,
        # Each tenant's requests share its system prompt, and a conversation's next turn
        # re-sends its history (Mooncake's measured reuse), so prefix caching and the tiers
        # below HBM have work to do.
        prefix=MOONCAKE_CONV_PREFIX,
    )


def _azure() -> SyntheticConfig:
    return SyntheticConfig(
        name="azure-conv-like",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=AZURE_CONV_ARRIVALS,
        lengths=AZURE_CONV_QUANTILES,
    )


def _mooncake() -> SyntheticConfig:
    return SyntheticConfig(
        name="mooncake-like",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=MOONCAKE_CONV_ARRIVALS,
        lengths=MOONCAKE_CONV_QUANTILES,
        prefix=MOONCAKE_CONV_PREFIX,
    )


def _sharegpt() -> SyntheticConfig:
    return SyntheticConfig(
        name="sharegpt-like",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=Poisson(rate=round(AZURE_CONV_PROMPT_TOKENS_PER_S / SHAREGPT_MEAN_PROMPT, 4)),
        lengths=SHAREGPT_QUANTILES,
    )


def _long_context() -> SyntheticConfig:
    return SyntheticConfig(
        name="long-context",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=Poisson(rate=round(AZURE_CONV_PROMPT_TOKENS_PER_S / ARXIV_MEAN_PROMPT, 4)),
        lengths=ARXIV_QUANTILES,
    )


def _saturated() -> SyntheticConfig:
    return SyntheticConfig(
        name="saturated",
        num_requests=_DEFAULT_REQUESTS,
        arrivals=Saturated(),
        lengths=FixedLengths(prompt_len=1024, decode_len=128),
    )


def _congestion_vidur() -> SyntheticConfig:
    return SyntheticConfig(
        name="congestion-vidur",
        num_requests=20_000,
        arrivals=Poisson(rate=300.0),
        lengths=EmpiricalLengths((512, 512, 512, 512), (100, 125, 200, 250)),
    )


_PRESETS: dict[str, Callable[[], SyntheticConfig]] = {
    "azure-conv-like": _azure,
    "congestion-vidur": _congestion_vidur,
    "long-context": _long_context,
    "mooncake-like": _mooncake,
    "multi-tenant": _multi_tenant,
    "saturated": _saturated,
    "sharegpt-like": _sharegpt,
}

WORKLOAD_NAMES: tuple[str, ...] = tuple(sorted(_PRESETS))
"""The names :func:`get_workload` knows, sorted."""

_RENAMED = {"seed002-vidur": "congestion-vidur"}
"""Former names, still accepted."""


def workload_config(name: str, *, num_requests: int | None = None) -> SyntheticConfig:
    """The config behind a named workload, to inspect or modify with ``attrs.evolve``.

    Raises:
        ValueError: ``name`` is unknown (the message lists :data:`WORKLOAD_NAMES`), or
            ``num_requests`` < 1.
    """
    if not isinstance(name, str):
        raise TypeError(f"'name' must be str: {name!r}")
    factory = _PRESETS.get(_RENAMED.get(name, name))
    if factory is None:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOAD_NAMES)}")
    config = factory()
    if num_requests is not None:
        if isinstance(num_requests, bool) or not isinstance(num_requests, int):
            raise TypeError(f"'num_requests' must be int or None: {num_requests!r}")
        if num_requests < 1:
            raise ValueError(f"'num_requests' must be >= 1: {num_requests}")
        config = attrs.evolve(config, num_requests=num_requests)
    return config


def get_workload(name: str, *, seed: int = 0, num_requests: int | None = None) -> Workload:
    """Generate a named workload.

    Args:
        name: one of :data:`WORKLOAD_NAMES`; ``"multi-tenant"`` is the embedded default.
        seed: random seed (>= 0); the same name, seed and size give the same workload.
        num_requests: requests to draw (>= 1); ``None`` keeps the preset's (2,000; 20,000
            for ``congestion-vidur``).

    Raises:
        ValueError: unknown ``name`` (the message lists the known names), bad ``seed`` or
            ``num_requests``.
    """
    return generate(workload_config(name, num_requests=num_requests), seed=seed)
