"""Policy objects by name, from the packages that implement them.

The simulator has no policies of its own: every name below resolves to a class or factory of
kvpolicy-admit or kvpolicy-evict. ``none`` leaves the engine's own mechanics (admit while
blocks last, preempt the last admitted first, keep every token: vLLM's behaviour).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from attrs import frozen

from kvpolicy.kvmodel import (
    AdmissionPolicy,
    EvictionPolicy,
    PreemptionPolicy,
    PrefixStore,
    RequestGate,
)
from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._errors import ConfigError

__all__ = [
    "ADMISSION_NAMES",
    "PREEMPTION_NAMES",
    "Stack",
    "build_stack",
    "eviction_names",
]

ADMISSION_NAMES: dict[str, str] = {
    "greedy": "kvpolicy.admit:GreedyAdmission",
    "rate-limited": "kvpolicy.admit:RateLimitedAdmission",
}
"""Admission names and the ``module:attribute`` that builds each (besides ``none``)."""

PREEMPTION_NAMES: dict[str, str] = {
    "last-in-first-out": "kvpolicy.evict:LastInFirstOut",
    "least-progressed-first": "kvpolicy.evict:LeastProgressedFirst",
    "priority-aware": "kvpolicy.evict:PriorityAware",
    "cost-aware": "kvpolicy.evict:CostAware",
}
"""Preemption names and the ``module:attribute`` that builds each (besides ``none``)."""


@frozen
class Stack:
    """Built policy objects; ``None`` where the engine's own mechanics apply."""

    admission: AdmissionPolicy | None
    """How many waiting requests join each iteration."""
    eviction: EvictionPolicy | None
    """Token eviction to a budget."""
    preemption: PreemptionPolicy | None
    """Order of preemption."""
    gate: RequestGate | None = None
    """Gateway in front of the server (429 + Retry-After)."""
    prefix_store: PrefixStore | None = None
    """KV prefix tiers below HBM."""


def eviction_names() -> tuple[str, ...]:
    """Token eviction names: ``none`` and kvpolicy-evict's ``POLICY_NAMES`` when installed."""
    try:
        evict = importlib.import_module("kvpolicy.evict")
    except ImportError:
        return ("none",)
    return ("none", *tuple(getattr(evict, "POLICY_NAMES", ())))


def _resolve(kind: str, name: str, table: dict[str, str]) -> Callable[..., Any]:
    if name not in table:
        known = ", ".join(["none", *table])
        raise ConfigError(f"unknown {kind} policy {name!r}; known: {known}")
    module_name, attr = table[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{kind} policy {name!r} needs {module_name}, which is not installed"
        ) from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise ConfigError(
            f"{kind} policy {name!r} needs {module_name}.{attr}, which the installed "
            f"{module_name} does not provide yet"
        )
    if not callable(factory):
        raise ConfigError(f"{module_name}.{attr} is not callable")
    return factory  # type: ignore[no-any-return]


def _call(kind: str, name: str, factory: Callable[..., Any], params: dict[str, Any]) -> Any:
    try:
        return factory(**params)
    except TypeError as exc:
        raise ConfigError(f"{kind} policy {name!r}: bad params {params!r}: {exc}") from exc


def build_stack(config: StackConfig) -> Stack:
    """Build the policy objects ``config`` names.

    Raises:
        ConfigError: an unknown name (the message lists the known ones), a package that is
            not installed, or parameters the policy rejects.
    """
    if not isinstance(config, StackConfig):
        raise TypeError(f"'config' must be a StackConfig: {config!r}")
    adm = config.admission
    admission = None
    if adm.name != "none":
        factory = _resolve("admission", adm.name, ADMISSION_NAMES)
        admission = _call("admission", adm.name, factory, adm.params)
        if not isinstance(admission, AdmissionPolicy):
            raise ConfigError(f"admission {adm.name!r} does not implement AdmissionPolicy")
    ev = config.eviction
    eviction = None
    if ev.name != "none":
        names = eviction_names()
        if ev.name not in names:
            raise ConfigError(f"unknown eviction policy {ev.name!r}; known: {', '.join(names)}")
        evict = importlib.import_module("kvpolicy.evict")
        eviction = _call("eviction", ev.name, evict.make_policy, {"name": ev.name, **ev.params})
        if not isinstance(eviction, EvictionPolicy):
            raise ConfigError(f"eviction {ev.name!r} does not implement EvictionPolicy")
    pre = config.preemption
    preemption = None
    if pre.name != "none":
        factory = _resolve("preemption", pre.name, PREEMPTION_NAMES)
        preemption = _call("preemption", pre.name, factory, pre.params)
        if not isinstance(preemption, PreemptionPolicy):
            raise ConfigError(f"preemption {pre.name!r} does not implement PreemptionPolicy")
    return Stack(admission=admission, eviction=eviction, preemption=preemption)
