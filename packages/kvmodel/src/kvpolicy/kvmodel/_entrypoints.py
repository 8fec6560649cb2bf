"""Entry-point groups and the installed names in each, without attrs: the registry builds on
these, and the ``kvpolicy`` commands list the installed names for their ``--help`` from here
without importing the registry."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

__all__ = [
    "ADMISSION_GROUP",
    "AUTOSCALING_GROUP",
    "EVICTION_GROUP",
    "GATEWAY_GROUP",
    "PREEMPTION_GROUP",
    "ROUTING_GROUP",
    "TIERS_GROUP",
    "WORKLOAD_FORMATS_GROUP",
    "entry_point_names",
    "group_entry_points",
]

ADMISSION_GROUP = "kvpolicy.admission"
EVICTION_GROUP = "kvpolicy.eviction"
PREEMPTION_GROUP = "kvpolicy.preemption"
GATEWAY_GROUP = "kvpolicy.gateway"
TIERS_GROUP = "kvpolicy.tiers"
WORKLOAD_FORMATS_GROUP = "kvpolicy.workload_formats"
ROUTING_GROUP = "kvpolicy.routing"
AUTOSCALING_GROUP = "kvpolicy.autoscaling"


@cache
def group_entry_points(group: str) -> dict[str, EntryPoint]:
    """The installed entry points of the entry-point group ``group``, by name."""
    return {ep.name: ep for ep in entry_points(group=group)}


def entry_point_names(group: str) -> tuple[str, ...]:
    """The names installed in the entry-point group ``group``, sorted."""
    return tuple(sorted(group_entry_points(group)))
