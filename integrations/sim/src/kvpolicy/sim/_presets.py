"""Named policy stacks: a vLLM-like baseline and the kvpolicy stack."""

from __future__ import annotations

import importlib
import pathlib

import attrs

from kvpolicy.sim._config import (
    AdmissionConfig,
    EvictionConfig,
    PreemptionConfig,
    StackConfig,
    load_stack,
)
from kvpolicy.sim._errors import ConfigError
from kvpolicy.sim._stack import build_stack

__all__ = ["STACK_PRESETS", "available_parts", "get_stack"]

STACK_PRESETS: dict[str, StackConfig] = {
    "vllm": StackConfig(name="vllm"),
    "kvpolicy": StackConfig(
        name="kvpolicy",
        admission=AdmissionConfig(name="rate-limited"),
        eviction=EvictionConfig(name="token-pd", budget_fraction=0.5),
        preemption=PreemptionConfig(name="least-progressed-first"),
    ),
}
"""``vllm``: admit while blocks last, last-in preemption by recomputation, no token
eviction, prefix caching on (vLLM's defaults). ``kvpolicy``: rate-limited admission (seed
002 §5.1) estimating the length mix online from completions (kvpolicy-admit's default
window), Token-PD eviction to half the pool (seed 000) and least-progressed-first
preemption."""


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


def available_parts(config: StackConfig) -> tuple[StackConfig, list[str]]:
    """``config`` with each policy whose package is missing replaced by ``none``.

    For a stack that must run whatever is installed (the demo, the benchmarks) while the
    policy packages are still landing.

    Returns:
        The runnable stack and one message per part dropped (empty when none was).
    """
    base = StackConfig()
    notes: list[str] = []
    cfg = config
    for part in ("admission", "eviction", "preemption"):
        try:
            build_stack(attrs.evolve(base, **{part: getattr(config, part)}))
        except ConfigError as exc:
            notes.append(f"without its {part} policy: {exc}")
            cfg = attrs.evolve(cfg, **{part: getattr(base, part)})
    for part, module in (("gateway", "kvpolicy.tenancy"), ("tiers", "kvpolicy.tiers")):
        if getattr(config, part).name == "none":
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            notes.append(f"without its {part}: {module} is not installed")
            cfg = attrs.evolve(cfg, **{part: getattr(base, part)})
    return cfg, notes
