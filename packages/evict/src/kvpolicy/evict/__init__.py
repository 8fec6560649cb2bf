"""kvpolicy-evict: batch-global KV eviction and preemption orders.

Token policies (FIFO, LRU, H2O, sink+window, Token-PD of seed 000) implement kvmodel's
``EvictionPolicy`` over one budget shared by every stream on a GPU; preemption orders
(least-progressed-first, last-in-first-out, priority-aware, cost-aware) implement
``PreemptionPolicy``. Policies compose: ``Periodic`` gives one a cadence, ``Protected``
sinks and a recent window, ``Composed`` runs several in successive rounds. A policy that
wants the token ids (``ContentAware``: Token-PD's ``copy_bonus`` keeps the latest occurrence
of each content, the source of later copies) gets them after each insert.
"""

from __future__ import annotations

from kvpolicy.evict.__about__ import __version__
from kvpolicy.evict._baselines import FIFOPolicy, H2OPolicy, LRUPolicy, SinkWindowPolicy
from kvpolicy.evict._compose import Composed, Discarding, compose
from kvpolicy.evict._content import ContentAware, LatestOccurrences
from kvpolicy.evict._errors import EvictError
from kvpolicy.evict._knapsack import (
    KnapsackRun,
    clairvoyant_value,
    online_knapsack,
    settling_step,
)
from kvpolicy.evict._preempt import (
    CostAware,
    LastInFirstOut,
    LeastProgressedFirst,
    PriorityAware,
)
from kvpolicy.evict._returns import ReturnPredictor
from kvpolicy.evict._scored import ScoredPolicy
from kvpolicy.evict._table import PROTECTED_OFFSET, TokenTable
from kvpolicy.evict._tokenpd import TokenPDConfig, TokenPDPolicy, dual_update, excess_value
from kvpolicy.evict._wrappers import Periodic, Protected, default_policies

__all__ = [
    "PROTECTED_OFFSET",
    "Composed",
    "ContentAware",
    "CostAware",
    "Discarding",
    "EvictError",
    "FIFOPolicy",
    "H2OPolicy",
    "KnapsackRun",
    "LRUPolicy",
    "LastInFirstOut",
    "LatestOccurrences",
    "LeastProgressedFirst",
    "Periodic",
    "PriorityAware",
    "Protected",
    "ReturnPredictor",
    "ScoredPolicy",
    "SinkWindowPolicy",
    "TokenPDConfig",
    "TokenPDPolicy",
    "TokenTable",
    "__version__",
    "clairvoyant_value",
    "compose",
    "default_policies",
    "dual_update",
    "excess_value",
    "online_knapsack",
    "settling_step",
]
