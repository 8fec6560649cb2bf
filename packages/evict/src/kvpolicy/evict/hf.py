"""A transformers ``Cache`` that holds any kvpolicy eviction policy to a token budget during
``model.generate``, batch-global across the rows of a batch.

```python
from kvpolicy.evict import TokenPDPolicy
from kvpolicy.evict.hf import PolicyCache

cache = PolicyCache(TokenPDPolicy, budget_tokens=256)   # per layer, all rows together
with cache.attached(model):                             # the attention that feeds the policy
    out = model.generate(**inputs, cache=cache, max_new_tokens=64)   # or past_key_values=
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

What it does not do: beam search, assisted decoding and ``crop`` (evicted tokens are gone;
each raises ``NotImplementedError``), return predictors (Token-PD runs without signals:
``R̂`` starts at ``default_return`` and is learned from the attention observed, the
harness's ``--predictor none``), token ids for ``ContentAware`` policies, and one budget
pooled over the layers. A policy that also demotes tokens to a lower precision plugs in at
:meth:`PolicyLayer.after_attention <kvpolicy.evict._hfcache.PolicyLayer.after_attention>`
(the step that applies the policy's decisions to the keys and values).

Needs the ``hf`` extra (torch, transformers >= 5): ``pip install 'kvpolicy-evict[hf]'``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
from transformers.cache_utils import Cache

from kvpolicy.evict._hfcache import ATTENTION, PolicyLayer, register_attention
from kvpolicy.kvmodel import EvictionPolicy

__all__ = ["ATTENTION", "PolicyCache", "PolicyLayer"]


class PolicyCache(Cache):
    """A KV cache whose layers a kvpolicy eviction policy holds to ``budget_tokens``.

    Args:
        policy: builds one fresh :class:`~kvpolicy.kvmodel.EvictionPolicy` per decoder
            layer (a class such as ``TokenPDPolicy`` or ``lambda: H2OPolicy(32)``).
        budget_tokens: tokens each layer may hold after every token, summed over the rows
            of the batch.

    Raises:
        TypeError: ``policy`` is not callable.
        ValueError: ``budget_tokens`` is not an int >= 1.
    """

    def __init__(self, policy: Callable[[], EvictionPolicy], budget_tokens: int) -> None:
        if not callable(policy):
            raise TypeError(f"'policy' must build a policy (a class or function): {policy!r}")
        if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int):
            raise ValueError(f"'budget_tokens' must be an int >= 1: {budget_tokens!r}")
        if budget_tokens < 1:
            raise ValueError(f"'budget_tokens' must be an int >= 1: {budget_tokens!r}")
        super().__init__(layers=[])
        self.make_policy = policy
        self.budget_tokens = budget_tokens

    def update(
        self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        """Append the new keys and values of ``layer_idx`` (building its layer and policy on
        first use); the attention function then evicts."""
        while len(self.layers) <= layer_idx:
            self.layers.append(
                PolicyLayer(len(self.layers), self.make_policy(), self.budget_tokens)
            )
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

    @property
    def max_resident(self) -> int:
        """The most tokens any layer held (all rows together) after any token's eviction."""
        return max((layer.max_resident for layer in self.policy_layers()), default=0)

    @property
    def evicted(self) -> int:
        """Tokens evicted so far, over all layers and rows."""
        return sum(layer.evicted for layer in self.policy_layers())
