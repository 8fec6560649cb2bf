"""kvpolicy-evict: batch-global KV eviction and preemption orders.

Token policies (FIFO, LRU, H2O, sink+window, Token-PD of seed 000) implement kvmodel's
``EvictionPolicy`` over one budget shared by every stream on a GPU; preemption orders
(least-progressed-first, last-in-first-out, priority-aware, cost-aware) implement
``PreemptionPolicy``. Policies compose: ``Periodic`` gives one a cadence, ``Protected``
sinks and a recent window, ``Composed`` runs several in successive rounds. A policy that
wants the token ids (``ContentAware``: Token-PD's ``copy_bonus`` keeps the latest occurrence
of each content, the source of later copies) gets them after each insert.

Tokens may also be held at lower precision under a budget in bytes (kvmodel's
``DemotingPolicy``): ``quantize``/``dequantize`` in torch (per-token or per-channel groups,
fp16 scales and zero points), ``PrecisionCosts`` (bytes per state), ``choose_states`` (the
multiple-choice knapsack at one price per byte), ``TokenPDMixed`` (Token-PD choosing 16, 8,
4, 2 bits or eviction per token), ``UniformPrecision`` (any eviction policy with every
token at one precision) and ``GroupedPrecision`` (a demoting policy whose demotions wait
until a group of tokens shares a precision: keys quantized per channel).

``attention_statistics`` (sink mass, decay with distance, heavy-hitter concentration and
persistence of a causal attention matrix, numpy only) is the one definition of the numbers
the policies' assumptions rest on, for recorded and synthetic attention alike.

The quality harness on a real LLM is a distribution of its own, kvpolicy-evict-quality
(``pip install kvpolicy-evict-quality``), that adds the subpackage ``kvpolicy.evict.quality``
and the ``kvpolicy evict`` command: this package's ``__path__`` is extended to the
``kvpolicy/evict`` folders of the other ``kvpolicy`` portions (``pkgutil.extend_path``), so
the subpackage is found whether the two are installed together, editable, or on
``PYTHONPATH`` as separate source folders.
"""

from __future__ import annotations

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)

from kvpolicy.evict.__about__ import __version__
from kvpolicy.evict._attention import (
    attention_statistics,
    heavy_hitter_statistics,
    validate_attention,
)
from kvpolicy.evict._baselines import FIFOPolicy, H2OPolicy, LRUPolicy, SinkWindowPolicy
from kvpolicy.evict._compose import Composed, Discarding, compose
from kvpolicy.evict._content import ContentAware, LatestOccurrences
from kvpolicy.evict._errors import EvictError
from kvpolicy.evict._grouped import GroupedPrecision
from kvpolicy.evict._knapsack import (
    KnapsackRun,
    clairvoyant_value,
    online_knapsack,
    settling_step,
)
from kvpolicy.evict._mixed import (
    DEFAULT_COSTS,
    MixedConfig,
    StateChanges,
    TokenPDMixed,
    UniformPrecision,
)
from kvpolicy.evict._precision import (
    EVICTED,
    PRECISIONS,
    PrecisionCosts,
    StateChoice,
    check_precisions,
    choose_states,
    retained_fraction,
)
from kvpolicy.evict._preempt import (
    CostAware,
    LastInFirstOut,
    LeastProgressedFirst,
    PriorityAware,
)
from kvpolicy.evict._quantize import (
    AXES,
    QUANT_BITS,
    Quantized,
    dequantize,
    fake_quantize,
    quantize,
    quantize_kv,
)
from kvpolicy.evict._returns import ReturnPredictor
from kvpolicy.evict._scored import ScoredPolicy
from kvpolicy.evict._table import PROTECTED_OFFSET, TokenTable
from kvpolicy.evict._tokenpd import TokenPDConfig, TokenPDPolicy, dual_update, excess_value
from kvpolicy.evict._wrappers import Periodic, Protected, default_policies

__all__ = [
    "AXES",
    "DEFAULT_COSTS",
    "EVICTED",
    "PRECISIONS",
    "PROTECTED_OFFSET",
    "QUANT_BITS",
    "Composed",
    "ContentAware",
    "CostAware",
    "Discarding",
    "EvictError",
    "FIFOPolicy",
    "GroupedPrecision",
    "H2OPolicy",
    "KnapsackRun",
    "LRUPolicy",
    "LastInFirstOut",
    "LatestOccurrences",
    "LeastProgressedFirst",
    "MixedConfig",
    "Periodic",
    "PrecisionCosts",
    "PriorityAware",
    "Protected",
    "Quantized",
    "ReturnPredictor",
    "ScoredPolicy",
    "SinkWindowPolicy",
    "StateChanges",
    "StateChoice",
    "TokenPDConfig",
    "TokenPDMixed",
    "TokenPDPolicy",
    "TokenTable",
    "UniformPrecision",
    "__version__",
    "attention_statistics",
    "check_precisions",
    "choose_states",
    "clairvoyant_value",
    "compose",
    "default_policies",
    "dequantize",
    "dual_update",
    "excess_value",
    "fake_quantize",
    "heavy_hitter_statistics",
    "online_knapsack",
    "quantize",
    "quantize_kv",
    "retained_fraction",
    "settling_step",
    "validate_attention",
]
