"""A stack file's five parts, built whole through kvmodel's one resolver.

The simulator keeps no table of policy names: every part resolves through
:func:`kvpolicy.kvmodel.build` from the entry points the libraries declare
(``kvpolicy.gateway``, ``kvpolicy.admission``, ``kvpolicy.eviction``,
``kvpolicy.preemption``, ``kvpolicy.tiers``). ``none`` leaves the engine's own mechanics
(every request enters, admit while blocks last, preempt the last admitted first, keep every
token, no tiers below HBM: vLLM's behaviour). The eviction section's ``every`` wraps its
policy in kvpolicy-evict's ``Periodic`` (cadence is a wrapper, not an engine setting).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from attrs import Attribute, field, frozen

from kvpolicy.evict import Periodic
from kvpolicy.kvmodel import (
    ADMISSION,
    EVICTION,
    GATEWAY,
    PREEMPTION,
    TIERS,
    AdmissionPolicy,
    EvictionPolicy,
    Group,
    PreemptionPolicy,
    PrefixStore,
    RegistryError,
    RequestGate,
    ServerContext,
    build,
    names,
)
from kvpolicy.sim._config import StackConfig
from kvpolicy.sim._errors import ConfigError

__all__ = ["Stack", "build_stack", "part_names"]

T = TypeVar("T")

_PARTS: dict[str, Group[Any]] = {
    "gateway": GATEWAY,
    "admission": ADMISSION,
    "eviction": EVICTION,
    "preemption": PREEMPTION,
    "tiers": TIERS,
}


def _implements(protocol: type) -> Callable[[object, Attribute[Any], object], None]:
    def check(_inst: object, attribute: Attribute[Any], value: object) -> None:
        if value is not None and not isinstance(value, protocol):
            raise TypeError(f"'{attribute.name}' must implement {protocol.__name__}: {value!r}")

    return check


@frozen
class Stack:
    """Built policy objects, one per part of a stack; ``None`` where the engine's own
    mechanics apply."""

    admission: AdmissionPolicy | None = field(default=None, validator=_implements(AdmissionPolicy))
    """How many waiting requests join each iteration."""
    eviction: EvictionPolicy | None = field(default=None, validator=_implements(EvictionPolicy))
    """Token eviction to a budget."""
    preemption: PreemptionPolicy | None = field(
        default=None, validator=_implements(PreemptionPolicy)
    )
    """Order of preemption."""
    gate: RequestGate | None = field(default=None, validator=_implements(RequestGate))
    """Gateway in front of the server (429 + Retry-After)."""
    prefix_store: PrefixStore | None = field(default=None, validator=_implements(PrefixStore))
    """KV prefix tiers below HBM."""


def part_names(part: str) -> tuple[str, ...]:
    """Names a stack's ``part`` section accepts: ``none`` and every installed implementation.

    Raises:
        ValueError: ``part`` is not one of gateway, admission, eviction, preemption, tiers.
    """
    if part not in _PARTS:
        raise ValueError(f"'part' must be one of {', '.join(_PARTS)}: {part!r}")
    return ("none", *names(_PARTS[part]))


def _part(
    section: str,
    group: Group[T],
    name: str,
    params: Mapping[str, Any],
    context: ServerContext | None,
) -> T | None:
    if name == "none":
        return None
    known = names(group)
    if name not in known:
        listed = ", ".join(("none", *known))
        raise ConfigError(f"{section}: unknown {group.kind} {name!r}; known: {listed}")
    try:
        return build(group, name, params, context=context)
    except RegistryError as exc:
        raise ConfigError(f"{section}: {exc}") from exc


def build_stack(config: StackConfig, context: ServerContext | None = None) -> Stack:
    """Build every part ``config`` names.

    Args:
        config: the stack.
        context: the server the gateway and the tiers are built for (its model, KV pool,
            rate and, for fitted TTLs, the workload); needed only when the stack names a
            gateway or tiers.

    Raises:
        ConfigError: an unknown name (the message lists the known ones), a param the
            implementation rejects (named), or a gateway or tiers without ``context``.
    """
    if not isinstance(config, StackConfig):
        raise TypeError(f"'config' must be a StackConfig: {config!r}")
    for section in ("gateway", "tiers"):
        if getattr(config, section).name != "none" and context is None:
            raise ConfigError(
                f"{section} {getattr(config, section).name!r} needs the server it is built "
                "for: pass a ServerContext (simulate() builds one)"
            )
    ev = config.eviction
    eviction = _part("eviction", EVICTION, ev.name, ev.params, context)
    if eviction is not None and ev.every is not None:
        eviction = Periodic(eviction, ev.every)
    return Stack(
        gate=_part("gateway", GATEWAY, config.gateway.name, config.gateway.params, context),
        admission=_part(
            "admission", ADMISSION, config.admission.name, config.admission.params, context
        ),
        eviction=eviction,
        preemption=_part(
            "preemption", PREEMPTION, config.preemption.name, config.preemption.params, context
        ),
        prefix_store=_part("tiers", TIERS, config.tiers.name, config.tiers.params, context),
    )
