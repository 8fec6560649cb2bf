"""A transformers ``Cache`` that holds any kvpolicy policy to a budget in tokens or in bytes
during ``model.generate``, batch-global across the rows of a batch.

```python
from kvpolicy.evict import MixedConfig, TokenPDMixed, TokenPDPolicy
from kvpolicy.evict.hf import PolicyCache

cache = PolicyCache(TokenPDPolicy, budget_tokens=256)   # per layer, all rows together
with cache.attached(model):                             # the attention that feeds the policy
    out = model.generate(**inputs, cache=cache, max_new_tokens=64)   # or past_key_values=

costs = PolicyCache.layer_costs(model.config)           # bytes of a token of one layer
mixed = MixedConfig(precisions=(16, 8, 4), costs=costs)
cache = PolicyCache(lambda: TokenPDMixed(mixed=mixed), budget_bytes=256 * costs.token_bytes[16])
```

* **One policy per decoder layer, one stream per row.** ``policy()`` builds a fresh policy
  for each layer; row ``r`` of the batch is its stream ``"row{r}"``. After every token each
  layer holds at most ``budget_tokens`` tokens *summed over the rows*: the policy ranks the
  tokens of all rows together (kvpolicy's batch-global eviction), so a row whose tokens
  are worth less gives up more of them.
* **Attention statistics.** ``cache.attached(model)`` switches the model to an eager
  attention function (:data:`ATTENTION`) that masks what a row does not hold, and, after
  each layer's attention, feeds the policy what the quality harness feeds it (one step per
  token: insert, observe the query's attention on the resident tokens averaged over the
  query heads, evict to the budget). A prompt is replayed token by token on its own
  attention, so the cache holds at most the budget once the prompt's forward returns.
* **Positions.** Keys are cached rotated at their true positions and ``get_seq_length()``
  counts the tokens seen, so ``generate`` numbers new tokens right however many were
  evicted; left padding of a batched prompt is read from the first forward's mask and
  never enters the policy.

* **Bytes and precisions.** With ``budget_bytes`` each layer holds at most that many bytes
  after every token, summed over the rows: the policy's ``allocate`` (kvmodel's
  ``DemotingPolicy``: ``TokenPDMixed``, ``UniformPrecision``) puts each resident token at
  one of its precisions (16, 8, 4, 2 bits) or evicts it, one price per byte across the
  rows; an eviction-only policy runs as ``UniformPrecision(policy, 16)``. A demoted token's
  keys and values in the cache are replaced by their quantized-then-dequantized values
  (``fake_quantize``, ``group_size`` channels per group, fp16 scales and zero points), so
  the model reads the quantization error, as in the quality harness's byte loop. Bytes are
  those of kvmodel's cost model (:meth:`PolicyCache.layer_costs`: 2 bytes per element at
  16 bits, codes plus scales and zero points below), not of the tensors (which keep the
  model's dtype); :meth:`PolicyCache.bytes_held` reports them per layer and row.

What it does not do: beam search, assisted decoding and ``crop`` (evicted tokens are gone;
each raises ``NotImplementedError``), return predictors (Token-PD runs without signals:
``R̂`` starts at ``default_return`` and is learned from the attention observed, the
harness's ``--predictor none``), token ids for ``ContentAware`` policies, one budget
pooled over the layers, and keys quantized per channel (KIVI's layout needs a block of
tokens quantized together; tokens here are demoted one at a time, keys per token).

Needs the ``hf`` extra (torch, transformers >= 5): ``pip install 'kvpolicy-evict[hf]'``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
from transformers.cache_utils import Cache

from kvpolicy.evict._gqa import grouped_output, grouped_scores
from kvpolicy.evict._hfcache import (
    ATTENTION,
    ByteBudget,
    PolicyLayer,
    layer_costs,
    register_attention,
)
from kvpolicy.evict._mixed import TokenPDMixed, UniformPrecision
from kvpolicy.evict._precision import PrecisionCosts
from kvpolicy.kvmodel import DemotingPolicy, EvictionPolicy

__all__ = ["ATTENTION", "PolicyCache", "PolicyLayer", "grouped_output", "grouped_scores"]


def _check_tokens(budget_tokens: object) -> int:
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1:
        raise ValueError(f"'budget_tokens' must be an int >= 1: {budget_tokens!r}")
    return budget_tokens


def _check_bytes(budget_bytes: object) -> float:
    if (
        isinstance(budget_bytes, bool)
        or not isinstance(budget_bytes, int | float | np.integer | np.floating)
        or not math.isfinite(float(budget_bytes))
        or budget_bytes <= 0
    ):
        raise ValueError(f"'budget_bytes' must be a finite number > 0: {budget_bytes!r}")
    return float(budget_bytes)


def _policy_costs(policy: EvictionPolicy) -> PrecisionCosts | None:
    """The costs a kvpolicy demoting policy counts with, where it says."""
    if isinstance(policy, TokenPDMixed):
        return policy.mixed.costs
    if isinstance(policy, UniformPrecision):
        return policy.costs
    return None


class PolicyCache(Cache):
    """A KV cache whose layers a kvpolicy policy holds to ``budget_tokens`` or
    ``budget_bytes`` (give one).

    Args:
        policy: builds one fresh policy per decoder layer (a class such as
            ``TokenPDPolicy`` or ``lambda: H2OPolicy(32)``; with ``budget_bytes`` a
            ``DemotingPolicy`` such as ``lambda: TokenPDMixed(mixed=...)``, or an eviction
            policy, then held at 16 bits by ``UniformPrecision``).
        budget_tokens: tokens each layer may hold after every token, summed over the rows
            of the batch (a demoting policy then only evicts, its tokens at 16 bits).
        budget_bytes: bytes each layer may hold after every token, summed over the rows,
            at ``costs``.
        costs: bytes of one token of one layer at each precision; None: from the model's
            keys on the first forward (:meth:`layer_costs`). A policy that says its costs
            (``TokenPDMixed``, ``UniformPrecision``) must count with the same ones.
        group_size: channels per quantization group of a demoted token (and of the
            derived ``costs``).

    Raises:
        TypeError: ``policy`` is not callable or ``costs`` not ``PrecisionCosts``.
        ValueError: neither or both budgets, ``budget_tokens`` not an int >= 1,
            ``budget_bytes`` not a finite number > 0, ``costs`` without 16 bits, or
            ``group_size`` not an int >= 1 (each named with its value).
    """

    def __init__(
        self,
        policy: Callable[[], EvictionPolicy],
        budget_tokens: int | None = None,
        *,
        budget_bytes: float | None = None,
        costs: PrecisionCosts | None = None,
        group_size: int = 32,
    ) -> None:
        if not callable(policy):
            raise TypeError(f"'policy' must build a policy (a class or function): {policy!r}")
        if (budget_tokens is None) == (budget_bytes is None):
            raise ValueError(
                "give one budget, 'budget_tokens' or 'budget_bytes': "
                f"budget_tokens={budget_tokens!r}, budget_bytes={budget_bytes!r}"
            )
        tokens = None if budget_tokens is None else _check_tokens(budget_tokens)
        in_bytes = None if budget_bytes is None else _check_bytes(budget_bytes)
        if costs is not None and not isinstance(costs, PrecisionCosts):
            raise TypeError(f"'costs' must be PrecisionCosts: {costs!r}")
        if costs is not None and 16 not in costs.token_bytes:
            raise ValueError(f"'costs' must price 16 bits: {dict(costs.token_bytes)}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"'group_size' must be an int >= 1: {group_size!r}")
        super().__init__(layers=[])
        self.make_policy = policy
        self.budget_tokens = tokens
        self.budget_bytes = in_bytes
        self.group_size = group_size
        self._costs = costs

    @staticmethod
    def layer_costs(config: Any, group_size: int = 32) -> PrecisionCosts:
        """Bytes of one token of one decoder layer of a model with transformers ``config``
        at 16, 8, 4 and 2 bits (every KV head, K and V, scales and zero points included):
        what a byte budget counts, and the ``costs`` to build a demoting policy with."""
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return layer_costs(kv, head_dim, group_size)

    @property
    def costs(self) -> PrecisionCosts | None:
        """The costs bytes are counted with (None before the first forward when derived)."""
        return self._costs

    def _new_layer(self, key_states: Any) -> PolicyLayer:
        if self._costs is None:
            heads, dim = int(key_states.shape[1]), int(key_states.shape[3])
            self._costs = layer_costs(heads, dim, self.group_size)
        costs = self._costs
        index = len(self.layers)
        policy = self.make_policy()
        if self.budget_bytes is None:
            return PolicyLayer(index, policy, cast(int, self.budget_tokens), costs)
        if not isinstance(policy, DemotingPolicy):
            policy = UniformPrecision(policy, 16, costs)
        own = _policy_costs(policy)
        if own is not None and any(
            costs.token_bytes.get(b) != c for b, c in own.token_bytes.items()
        ):
            raise ValueError(
                f"the policy counts a token's bytes as {dict(own.token_bytes)}, the cache as "
                f"{dict(costs.token_bytes)} ('costs'): build the policy with the cache's "
                "costs (PolicyCache.layer_costs(model.config))"
            )
        return PolicyLayer(index, policy, ByteBudget(self.budget_bytes, self.group_size), costs)

    def update(
        self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Append the new keys and values of ``layer_idx`` (building its layer and policy on
        first use); the attention function then evicts (and demotes)."""
        while len(self.layers) <= layer_idx:
            self.layers.append(self._new_layer(key_states))
        return self.policy_layers()[layer_idx].update(key_states, value_states)

    @contextlib.contextmanager
    def attached(self, model: Any) -> Iterator[PolicyCache]:
        """Run ``model`` with the attention that feeds this cache's policies, restoring its
        attention implementation on exit. Other caches (or none) under it get plain eager
        attention."""
        register_attention()
        previous = model.config._attn_implementation
        model.set_attn_implementation(ATTENTION)
        try:
            yield self
        finally:
            model.set_attn_implementation(previous)

    def policy_layers(self) -> list[PolicyLayer]:
        """The layers built so far (one per decoder layer the model has run)."""
        return cast(list[PolicyLayer], self.layers)

    def resident(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """(layers, rows) tokens each layer holds for each row now."""
        if not self.layers:
            return np.zeros((0, 0), dtype=np.int64)
        return np.stack([layer.held for layer in self.policy_layers()])

    def resident_positions(self, layer: int, row: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """True positions (0-based, padding not counted) of the tokens ``layer`` holds for
        ``row``, in the order of the cached keys."""
        return self.policy_layers()[layer].positions[row].copy()

    def resident_bits(self, layer: int, row: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Bits at which ``layer`` holds each token of ``row`` (the order of
        :meth:`resident_positions`)."""
        return np.array(self.policy_layers()[layer].bits[row], dtype=np.int64)

    def bytes_held(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """(layers, rows) bytes each layer holds for each row now, at :attr:`costs`
        (summed over the rows: what the budget in bytes bounds)."""
        if not self.layers:
            return np.zeros((0, 0), dtype=np.float64)
        return np.stack([layer.bytes_held() for layer in self.policy_layers()])

    @property
    def max_bytes(self) -> float:
        """The most bytes any layer held (all rows together) after any token's step."""
        return max((layer.max_bytes for layer in self.policy_layers()), default=0.0)

    @property
    def demoted(self) -> int:
        """Demotions applied so far (a token demoted twice counts twice), all layers and
        rows."""
        return sum(layer.demoted for layer in self.policy_layers())

    @property
    def max_resident(self) -> int:
        """The most tokens any layer held (all rows together) after any token's eviction."""
        return max((layer.max_resident for layer in self.policy_layers()), default=0)

    @property
    def evicted(self) -> int:
        """Tokens evicted so far, over all layers and rows."""
        return sum(layer.evicted for layer in self.policy_layers())
