"""Names the command line lists in its options, in a module free of the simulator's imports,
so that ``kvpolicy sim run --help`` shows them without loading the simulator or numpy.

Each is also where its owner checks against: :func:`kvpolicy.sim.sweep` takes
:data:`EXECUTORS`; :data:`WORKLOAD_NAMES` equals the names of the named workloads
(``kvpolicy.sim.workloads.WORKLOAD_NAMES``, built from their builders; a test holds the two
equal).
"""

from __future__ import annotations

__all__ = ["EXECUTORS", "WORKLOAD_NAMES"]

EXECUTORS = ("local", "ray")
"""Where :func:`~kvpolicy.sim.sweep` runs its points: local processes or a Ray cluster."""

WORKLOAD_NAMES = (
    "azure-conv-like",
    "congestion-vidur",
    "long-context",
    "mooncake-like",
    "multi-tenant",
    "saturated",
    "sharegpt-like",
)
"""The named synthetic workloads, sorted."""
